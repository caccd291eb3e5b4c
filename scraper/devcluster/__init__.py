"""A local Kubernetes control plane (etcd + kube-apiserver built from Go modules).

Used by the tests and by ``trainjob-scraper demo``:

* :class:`ControlPlane` starts and stops the processes and hands out clients,
  kubeconfigs and ServiceAccount tokens.
* :mod:`scraper.devcluster.crds` installs the TrainJob (current or legacy) and
  JobSet CRDs.
* :mod:`scraper.devcluster.objects` creates TrainJobs and trainer pods and plays
  the kubelet's part for pod status.
"""

from scraper.devcluster.assets import Assets, AssetsError, ensure_assets
from scraper.devcluster.controlplane import ControlPlane, ControlPlaneError
from scraper.devcluster.crds import CrdError, install_crd, install_trainjob_crds

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
