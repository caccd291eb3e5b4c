"""The local cluster with its controllers: shipped manifests, flavours, clean stop, a
stopped part reported and started again."""

from __future__ import annotations

import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client

from exporter_lib.status import (
    METRIC_NAME_MAX_LENGTH,
    METRIC_VALUE_MAX_LENGTH,
    METRICS_MAX_ITEMS,
)
from localdev.cluster import trainjobs
from localdev.cluster.assets import ensure_assets
from localdev.cluster.controlplane import ControlPlaneError
from localdev.cluster.crds import (
    FLAVOUR_CURRENT,
    FLAVOUR_LEGACY,
    trainer_manifests,
    trainjob_crd,
)
from localdev.cluster.stack import POD_RUNNER, RUNNER_NODE, Cluster, kwok_stages
from tests.controlplane.test_controlplane_lifecycle import _alive, _pids_running


def _manifests() -> Path:
    manifests = ensure_assets(parts=("trainer-legacy",)).manifests  # both flavours' CRDs
    assert manifests is not None, "scripts/stack-assets gave no manifests/"
    return manifests


def test_flavours_are_the_shipped_trainjob_crds_of_v2_3_0_and_v2_0_0() -> None:
    manifests = _manifests()
    legacy = trainjob_crd(manifests, FLAVOUR_LEGACY)
    current = trainjob_crd(manifests, FLAVOUR_CURRENT)
    for crd in (legacy, current):
        version = crd["spec"]["versions"][0]
        # The shipped printer columns: State and Age, no progress column upstream.
        assert [c["name"] for c in version["additionalPrinterColumns"]] == ["State", "Age"]
        # Exactly as shipped: nothing of ours (no label, no added field).
        assert "labels" not in crd["metadata"] or not any(
            k.startswith("trainjob-progress.dev/") for k in crd["metadata"]["labels"])
    old_status = legacy["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    new_status = current["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert "trainerStatus" not in old_status["properties"]
    # v2.3.0 declares trainerStatus with the limits exporter_lib.status enforces.
    schema = new_status["properties"]["trainerStatus"]
    props = schema["properties"]
    assert (props["progressPercentage"]["minimum"], props["progressPercentage"]["maximum"]) \
        == (0, 100)
    assert props["estimatedRemainingSeconds"]["minimum"] == 0
    metrics = props["metrics"]
    assert (metrics["maxItems"], metrics["x-kubernetes-list-type"]) == (METRICS_MAX_ITEMS,
                                                                        "atomic")
    for key, limit in (("name", METRIC_NAME_MAX_LENGTH), ("value", METRIC_VALUE_MAX_LENGTH)):
        item = metrics["items"]["properties"][key]
        assert (item["minLength"], item["maxLength"]) == (1, limit)
    assert [r["rule"] for r in schema["x-kubernetes-validations"]] == [
        "has(self.lastUpdatedTime)"]
    # Both versions of the module ship their own webhook and runtimes.
    for flavour in (FLAVOUR_CURRENT, FLAVOUR_LEGACY):
        directory = trainer_manifests(manifests, flavour)
        assert (directory / "webhook" / "kustomization.yaml").is_file()
        assert (directory / "runtimes" / "torch_distributed.yaml").is_file()


def test_kwok_ending_stages_skip_the_runner_node_and_nothing_else_changes() -> None:
    stages = {s["metadata"]["name"]: s for s in kwok_stages(_manifests() / "kwok" / "stage",
                                                              [RUNNER_NODE])}
    assert set(stages) == {"node-initialize", "node-heartbeat-with-lease", "pod-ready",
                           "pod-complete", "pod-delete"}
    exclusion = {"key": ".spec.nodeName", "operator": "NotIn", "values": [RUNNER_NODE]}
    for name in ("pod-complete", "pod-delete"):
        assert stages[name]["spec"]["selector"]["matchExpressions"][-1] == exclusion
    for name in ("node-initialize", "node-heartbeat-with-lease", "pod-ready"):
        assert exclusion not in stages[name]["spec"].get("selector", {}).get(
            "matchExpressions", [])


@pytest.mark.cluster  # starts a cluster of its own
def test_stop_leaves_no_controller_and_no_container_process(tmp_path: Path) -> None:
    marker = f"{secrets.randbelow(10**6) + 1000}.5"
    cluster = Cluster(workdir=tmp_path / "cluster")
    cluster.start()
    try:
        pids = cluster.pids
        # etcd, kube-apiserver, -controller-manager, -scheduler, kwok, JobSet, Trainer, runner
        assert len(pids) == 8, pids
        with cluster.api_client() as api:
            client.CoreV1Api(api).create_namespace({"metadata": {"name": "stop-test"}})
            trainjobs.create(api, trainjobs.trainjob_body(
                "stop-test", "sleeper",
                command=[sys.executable, "-c", f"import time; time.sleep({marker})"]))
            trainjobs.wait_pods(api, "stop-test", "sleeper", count=1, timeout=120)
        deadline = time.monotonic() + 30
        while not _pids_running(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _pids_running(marker), "the pod runner did not start the container process"
    finally:
        cluster.stop()
    assert [p for p in pids if _alive(p)] == []
    assert _pids_running(marker) == []



@pytest.mark.cluster  # starts a cluster of its own
def test_a_dead_pod_runner_is_reported_then_started_again_and_runs_pods(
        tmp_path: Path) -> None:
    marker = f"{secrets.randbelow(10**6) + 1000}.75"
    cluster = Cluster(workdir=tmp_path / "cluster")
    cluster.start()
    try:
        cluster.check_running()
        os.kill(cluster.process_pid(POD_RUNNER), signal.SIGKILL)
        deadline = time.monotonic() + 10
        with pytest.raises(ControlPlaneError, match=r"pod-runner exited with code -9"):
            while time.monotonic() < deadline:
                cluster.check_running()
                time.sleep(0.1)
        # Only the part that stopped is started again; then the stack is whole.
        assert cluster.restart_stopped() == [POD_RUNNER]
        cluster.check_running()
        with cluster.api_client() as api:
            client.CoreV1Api(api).create_namespace({"metadata": {"name": "revived"}})
            trainjobs.create(api, trainjobs.trainjob_body(
                "revived", "sleeper",
                command=[sys.executable, "-c", f"import time; time.sleep({marker})"]))
            trainjobs.wait_pods(api, "revived", "sleeper", count=1, timeout=120)
        deadline = time.monotonic() + 30
        while not _pids_running(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _pids_running(marker), "the restarted pod runner did not run the pod"
    finally:
        cluster.stop()
    assert _pids_running(marker) == []


_OWNER = """
import sys, time
from kubernetes import client
from exporter_lib.status import (
    METRIC_NAME_MAX_LENGTH,
    METRIC_VALUE_MAX_LENGTH,
    METRICS_MAX_ITEMS,
)
from localdev.cluster import trainjobs
from localdev.cluster.stack import Cluster
cluster = Cluster()
cluster.start()
with cluster.api_client() as api:
    client.CoreV1Api(api).create_namespace({"metadata": {"name": "owner"}})
    trainjobs.create(api, trainjobs.trainjob_body("owner", "sleeper", command=[
        sys.executable, "-c", "import time; time.sleep(%s)" % sys.argv[1]]))
    trainjobs.wait_pods(api, "owner", "sleeper", count=1, timeout=120)
print(cluster.workdir, *cluster.pids, flush=True)
time.sleep(600)
"""


@pytest.mark.cluster  # starts a cluster of its own
def test_sigkill_of_the_owner_leaves_no_controller_and_no_container_process() -> None:
    marker = f"{secrets.randbelow(10**6) + 1000}.25"
    workdir = ""
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, marker], stdout=subprocess.PIPE,
                             text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert owner.stdout is not None
        ready, _, _ = select.select([owner.stdout], [], [], 180)
        assert ready, "the owner did not start its cluster within 180 s"
        workdir, *words = owner.stdout.readline().split()
        pids = [int(p) for p in words]
        assert len(pids) == 8, pids
        deadline = time.monotonic() + 30
        while not _pids_running(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _pids_running(marker), "the pod runner did not start the container process"
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
    finally:
        owner.kill()
        owner.wait(timeout=10)
    # PR_SET_PDEATHSIG: the kernel kills each child, the pod runner's containers with it.
    deadline = time.monotonic() + 15
    while (any(_alive(p) for p in pids) or _pids_running(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in pids if _alive(p)] == []
    assert _pids_running(marker) == []
    if workdir:  # nothing but the kernel ran after SIGKILL
        shutil.rmtree(workdir, ignore_errors=True)
