"""Fixtures for the kubectl plugin and SDK helper tests.

``plugin_dir`` installs the wheel built from this checkout into a scratch directory, so
``kubectl-trainjob`` is the console script exactly as pip writes it for users; putting
its ``bin/`` on ``PATH`` is all kubectl needs to find the plugin.  ``kubectl`` runs the
real kubectl (the pinned build of the local control plane) with that ``PATH``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml
from kubernetes import client

from localdev.cluster import crds, objects
from localdev.cluster.controlplane import ControlPlane
from tests.helpers.client import PLUGIN_TIMEOUT_SECONDS, REPO, Kubectl, PluginDir

if TYPE_CHECKING:
    from kubeflow.trainer import TrainerClient


@pytest.fixture(scope="session")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> PluginDir:
    """This checkout's wheel, installed (no dependencies) into a scratch directory."""
    wheels = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-q", "-w", str(wheels), str(REPO)],
                   check=True, timeout=300)
    (wheel,) = wheels.glob("trainjob_progress-*.whl")
    root = tmp_path_factory.mktemp("plugin")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                    "--disable-pip-version-check", "-q", "--target", str(root), str(wheel)],
                   check=True, timeout=300)
    installed = PluginDir(root)
    if not (installed.bin / "kubectl-trainjob").is_file():
        pytest.fail(f"the wheel installed no kubectl-trainjob into {installed.bin}: "
                    f"{sorted(p.name for p in installed.bin.glob('*'))}", pytrace=False)
    return installed


@pytest.fixture
def kubectl(control_plane: ControlPlane, plugin_dir: PluginDir) -> Kubectl:
    """Run the real kubectl with the plugin on PATH: ``kubectl("trainjob", "progress")``.

    ``kubeconfig`` (keyword) replaces the admin kubeconfig, passed as ``KUBECONFIG``
    (kubectl hands its environment to plugins, not its own flags).
    """
    def run(*args: str, kubeconfig: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(control_plane.kubectl_path), *args], capture_output=True, text=True,
            timeout=PLUGIN_TIMEOUT_SECONDS,
            env=plugin_dir.env(KUBECONFIG=str(kubeconfig or control_plane.kubeconfig_path),
                               **(env or {})))
    return run


@pytest.fixture
def trainjob(kube_api: client.ApiClient, trainjob_crd: None,
             namespace: str) -> Iterator[str]:
    """A TrainJob named ``train`` in the test's namespace, no status yet."""
    objects.create_trainjob(kube_api, namespace, "train")
    yield "train"


RUNTIME_CRD = REPO / "tests" / "client" / "manifests" / "clustertrainingruntime-crd.yaml"
#: The runtime :func:`localdev.cluster.objects.create_trainjob` refers to by default.
RUNTIME_NAME = "torch-distributed"


@pytest.fixture(scope="session")
def cluster_training_runtime(kube_api: client.ApiClient, trainjob_crd: None) -> str:
    """A ClusterTrainingRuntime ``torch-distributed`` as the Kubeflow SDK reads it.

    The CRD is installed only when the cluster serves none (the real Trainer CRD wins),
    and the runtime only when none of that name exists; its fields are those of
    Trainer's own torch-distributed runtime that the SDK needs (framework label, ML
    policy, a ``node`` container in the ancestor-labelled replicated job).
    """
    ext = client.ApiextensionsV1Api(kube_api)
    try:
        ext.read_custom_resource_definition("clustertrainingruntimes.trainer.kubeflow.org")
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        crds.install_crd(kube_api, yaml.safe_load(RUNTIME_CRD.read_text()))
    body = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
        "metadata": {"name": RUNTIME_NAME, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
            "template": {"spec": {"replicatedJobs": [{
                "name": "node", "replicas": 1,
                "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step":
                                            "trainer"}},
                    "spec": {"template": {"spec": {"containers": [{
                        "name": "node", "image": objects.TRAINER_IMAGE,
                        "command": ["torchrun"]}]}}},
                },
            }]}},
        },
    }
    try:
        client.CustomObjectsApi(kube_api).create_cluster_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", body)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    return RUNTIME_NAME


@pytest.fixture
def sdk(control_plane: ControlPlane, cluster_training_runtime: str,
        namespace: str) -> Iterator[TrainerClient]:
    """The Kubeflow SDK's TrainerClient on the test's namespace (admin kubeconfig)."""
    # Imported here: the unit tests of this folder need no SDK.
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient
    yield TrainerClient(backend_config=KubernetesBackendConfig(
        namespace=namespace, config_file=str(control_plane.kubeconfig_path)))
