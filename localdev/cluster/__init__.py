"""A local Kubernetes control plane (etcd + kube-apiserver built from Go modules).

Used by the tests and by ``python -m localdev.demo``:

* :class:`ControlPlane` starts and stops the processes and hands out clients,
  kubeconfigs and ServiceAccount tokens.
* :mod:`localdev.cluster.crds` installs the TrainJob (current or legacy) and
  JobSet CRDs.
* :mod:`localdev.cluster.objects` creates TrainJobs and trainer pods and plays
  the kubelet's part for pod status.
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
