"""The local Kubernetes cluster, built from Go modules (dev only).

Used by the tests and by ``python -m localdev.demo``:

* :class:`ControlPlane` starts and stops the processes and hands out clients,
  kubeconfigs and ServiceAccount tokens.
* :class:`localdev.cluster.stack.Cluster` adds kube-controller-manager,
  kube-scheduler, kwok, the JobSet and Kubeflow Trainer controllers (shipped
  CRDs, webhooks, runtimes) and the pod runner (:mod:`localdev.cluster.podrunner`):
  TrainJobs go through the real chain of controllers
  (:mod:`localdev.cluster.trainjobs` creates them as a user would).
* :mod:`localdev.cluster.crds` installs the CRDs: the shipped ones in two
  flavours, or the hand-written TrainJob (current or legacy) and JobSet CRDs.
* :mod:`localdev.cluster.objects` (hand-made mode, bare control plane only, for
  fast tests of one stage) creates TrainJobs and trainer pods and plays the
  kubelet's part for pod status.
"""

from localdev.cluster.assets import Assets, AssetsError, ensure_assets
from localdev.cluster.controlplane import ControlPlane, ControlPlaneError
from localdev.cluster.crds import CrdError, install_crd, install_trainjob_crds

__all__ = [
    "Assets",
    "AssetsError",
    "ControlPlane",
    "ControlPlaneError",
    "CrdError",
    "ensure_assets",
    "install_crd",
    "install_trainjob_crds",
]
