"""Scenarios on the real stack that the scraper handles today.

Each test creates TrainJobs through the API on the shipped runtimes; the
Trainer, JobSet and Job controllers, the scheduler, kwok and the pod runner do
the rest (see :mod:`localdev.cluster.stack`).  The training is
``tests/e2e/stack_trainer.py``.  Scenarios the scraper still gets wrong are in
``test_stack_scraper_gaps.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL, TrainerStatus
from exporter_lib.status_annotation import TRAINER_STATUS_ANNOTATION, decode_annotation
from localdev.cluster import trainjobs
from localdev.cluster.objects import apply_trainjob_status
from localdev.cluster.stack import RUNNER_NODE, Cluster
from scraper.config import DEFAULT_SELECTOR
from tests.helpers import waits
from tests.helpers.stack import recording, scraper, scraper_metric

TRAINER = str(Path(__file__).with_name("stack_trainer.py"))
TIMEOUT = 120.0


def trainer_command(*args: str) -> list[str]:
    """The trainer command running ``stack_trainer.py`` with ``args``."""
    return [sys.executable, TRAINER, *args]


def _targets(child: object) -> float:
    line = scraper_metric(child, "trainjob_scraper_targets ")  # type: ignore[arg-type]
    return float(line.split()[-1]) if line else 0.0


def test_torch_three_nodes_only_rank0_is_the_target(
        kube_stack: Cluster, stack_api: client.ApiClient, stack_namespace: str,
        tmp_path: Path) -> None:
    ns = stack_namespace
    with scraper(kube_stack, ns, tmp_path) as child, recording(stack_api, ns, "torch3") as rec:
        trainjobs.create(stack_api, trainjobs.trainjob_body(
            ns, "torch3", num_nodes=3, env={"RUN_ID": "torch3"},
            command=trainer_command("--steps", "30", "--step-seconds", "0.3")))
        pods = trainjobs.wait_pods(stack_api, ns, "torch3", count=3, timeout=TIMEOUT)
        # The controllers made one Indexed Job with three pods on the runner node,
        # each with its own loopback IP and PET_NODE_RANK.
        assert {p.metadata.labels["batch.kubernetes.io/job-completion-index"] for p in pods} \
            == {"0", "1", "2"}
        assert {p.spec.node_name for p in pods} == {RUNNER_NODE}
        assert len({p.status.pod_ip for p in pods}) == 3
        rec.wait_for(lambda o: o.status is not None, TIMEOUT, "a first status")
        assert _targets(child) == 1
        trainjobs.wait_finished(stack_api, ns, "torch3", TIMEOUT)
        ranks = {s.metrics_dict()["rank"] for s in rec.statuses()}
        assert ranks == {"0"}, ranks


def test_suspend_then_resume(kube_stack: Cluster, stack_api: client.ApiClient,
                             stack_namespace: str, tmp_path: Path) -> None:
    ns = stack_namespace
    with scraper(kube_stack, ns, tmp_path), recording(stack_api, ns, "susp") as rec:
        trainjobs.create(stack_api, trainjobs.trainjob_body(
            ns, "susp", suspend=True, env={"RUN_ID": "susp"},
            command=trainer_command("--steps", "10", "--step-seconds", "0.3")))
        rec.wait_for(lambda o: trainjobs.condition(o.raw, "Suspended"), TIMEOUT,
                     "the Suspended condition")
        time.sleep(3)
        assert trainjobs.pods(stack_api, ns, "susp") == []
        assert rec.statuses() == []
        client.CustomObjectsApi(stack_api).patch_namespaced_custom_object(
            API_GROUP, API_VERSION, ns, TRAINJOB_PLURAL, "susp", {"spec": {"suspend": False}})
        rec.wait_for(lambda o: o.status is not None and o.status.progress_percentage is not None
                     and o.status.progress_percentage > 0, TIMEOUT, "progress after resume")
        trainjobs.wait_finished(stack_api, ns, "susp", TIMEOUT)
        progress = [s.progress_percentage for s in rec.statuses()]
        assert progress == sorted(progress), progress


def test_namespace_deleted_while_training(kube_stack: Cluster, stack_api: client.ApiClient,
                                          tmp_path: Path) -> None:
    core = client.CoreV1Api(stack_api)
    ns = f"t-nsdel-{int(time.time() * 1000) % 10**8}"
    core.create_namespace({"metadata": {"name": ns}})
    waits.default_service_account(stack_api, ns)
    with scraper(kube_stack, ns, tmp_path) as child, recording(stack_api, ns, "gone") as rec:
        trainjobs.create(stack_api, trainjobs.trainjob_body(
            ns, "gone", env={"RUN_ID": "gone"},
            command=trainer_command("--steps", "200", "--step-seconds", "0.3")))
        rec.wait_for(lambda o: o.status is not None, TIMEOUT, "a first status")
        core.delete_namespace(ns)
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                core.read_namespace(ns)
            except client.ApiException as exc:
                if exc.status == 404:
                    break
            time.sleep(0.5)
        else:
            raise AssertionError(f"namespace {ns} not deleted by the namespace controller")
        assert _targets(child) == 0
        assert child.running(), child.log_tail()
        # Nothing of the namespace is left on the runner node.
        assert [p for p in core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={RUNNER_NODE}").items
            if p.metadata.namespace == ns] == []


def test_before_v2_2_flavour_one_error_and_event_series_still_served(
        legacy_stack: Cluster, legacy_api: client.ApiClient, legacy_namespace: str,
        tmp_path: Path) -> None:
    ns = legacy_namespace
    with scraper(legacy_stack, ns, tmp_path) as child:
        trainjobs.create(legacy_api, trainjobs.trainjob_body(
            ns, "old", env={"RUN_ID": "old"},
            command=trainer_command("--steps", "40", "--step-seconds", "0.3"), legacy=True))
        deadline = time.monotonic() + TIMEOUT
        events: list[client.CoreV1Event] = []
        while time.monotonic() < deadline and not events:
            events = [e for e in client.CoreV1Api(legacy_api).list_namespaced_event(ns).items
                      if e.reason == "TrainerStatusUnsupported"]
            time.sleep(0.5)
        assert len(events) == 1, events
        assert events[0].involved_object.name == "old"
        assert events[0].type == "Warning"
        obj = trainjobs.get(legacy_api, ns, "old")
        assert "trainerStatus" not in (obj.get("status") or {})
        # The exporter's series are still served to Prometheus through the scraper.
        writes = scraper_metric(child, "trainjob_scraper_status_writes_total")
        assert 'result="not_stored"' in writes, writes
        assert scraper_metric(child, "trainjob_progress_ratio"), "no progress series"
        errors = [line for line in child.log_tail(400).splitlines()
                  if " ERROR " in line and "CRD" in line]
        assert len(errors) == 1, errors


def test_before_v2_2_flavour_auto_target_writes_progress_and_final_to_the_annotation(
        legacy_stack: Cluster, legacy_api: client.ApiClient, legacy_namespace: str,
        tmp_path: Path) -> None:
    """``--status-target auto`` on Trainer v2.0.0's CRD (docs/scraper.md, "Trainer before
    v2.2: the annotation"): the real controllers run the TrainJob, the status lands in the
    annotation, the final one (100 %) included, with no Event and no ERROR."""
    ns = legacy_namespace
    with scraper(legacy_stack, ns, tmp_path, ["--status-target", "auto"]) as child:
        trainjobs.create(legacy_api, trainjobs.trainjob_body(
            ns, "old", env={"RUN_ID": "old"},
            command=trainer_command("--steps", "20", "--step-seconds", "0.3"), legacy=True))

        def annotated() -> TrainerStatus | None:
            value = (trainjobs.get(legacy_api, ns, "old")["metadata"].get("annotations")
                     or {}).get(TRAINER_STATUS_ANNOTATION)
            return None if value is None else decode_annotation(value)

        deadline = time.monotonic() + TIMEOUT
        while (first := annotated()) is None:
            assert time.monotonic() < deadline, "no status in the annotation"
            time.sleep(0.3)
        assert first.metrics_dict()["run"] == "old"
        trainjobs.wait_finished(legacy_api, ns, "old", TIMEOUT)
        while (last := annotated()) is None or last.progress_percentage != 100:
            assert time.monotonic() < deadline, f"final status not in the annotation: {last}"
            time.sleep(0.3)
        obj = trainjobs.get(legacy_api, ns, "old")
        assert "trainerStatus" not in (obj.get("status") or {})
        assert [e for e in client.CoreV1Api(legacy_api).list_namespaced_event(ns).items
                if e.reason == "TrainerStatusUnsupported"] == []
        writes = scraper_metric(child, "trainjob_scraper_status_writes_total")
        assert 'result="not_stored"' not in writes, writes
        assert not [line for line in child.log_tail(400).splitlines() if " ERROR " in line]


def test_upstream_push_writer_then_scraper_takes_trainer_status(
        kube_stack: Cluster, stack_api: client.ApiClient, stack_namespace: str,
        tmp_path: Path) -> None:
    """docs/scraper.md: trainerStatus belongs to the scraper (force=true); a status the
    upstream status server applied (field manager ``trainer-status``) is taken over."""
    ns = stack_namespace
    trainjobs.create(stack_api, trainjobs.trainjob_body(
        ns, "push", env={"RUN_ID": "ours"}, suspend=True,
        command=trainer_command("--steps", "20", "--step-seconds", "0.3")))
    apply_trainjob_status(stack_api, ns, "push", {"trainerStatus": {
        "progressPercentage": 7, "lastUpdatedTime": "2026-01-01T00:00:00Z",
        "metrics": [{"name": "writer", "value": "upstream"}]}}, field_manager="trainer-status")
    with scraper(kube_stack, ns, tmp_path), recording(stack_api, ns, "push") as rec:
        client.CustomObjectsApi(stack_api).patch_namespaced_custom_object(
            API_GROUP, API_VERSION, ns, TRAINJOB_PLURAL, "push", {"spec": {"suspend": False}})
        seen = rec.wait_for(lambda o: o.status is not None
                            and o.status.metrics_dict().get("run") == "ours", TIMEOUT,
                            "the scraper's status")
        managers = {m["manager"]: m for m in seen.raw["metadata"]["managedFields"]
                    if m.get("subresource") == "status"}
        assert "trainjob-scraper" in managers
        owned = str(managers["trainjob-scraper"]["fieldsV1"])
        assert "f:trainerStatus" in owned
        assert "f:trainerStatus" not in str(managers.get("trainer-status", {}).get("fieldsV1"))
        assert "writer" not in seen.status.metrics_dict()


def test_torchtune_initializers_never_become_targets(
        kube_stack: Cluster, stack_api: client.ApiClient, stack_namespace: str,
        tmp_path: Path) -> None:
    """torchtune-llama3.2-1b: dataset- and model-initializer Jobs run first (on the kwok
    node, simulated), then ``node``; only the ``node`` rank-0 pod reports.  Trainer
    v2.3.0's runtime asks for a PersistentVolumeClaim ``initializer-<TrainJob>`` of its
    own (no storage class), which a cluster's provisioner or admin satisfies: here a
    hostPath PersistentVolume bound to it in advance."""
    ns = stack_namespace
    core = client.CoreV1Api(stack_api)
    core.create_persistent_volume({"metadata": {"name": f"pv-{ns}"}, "spec": {
        "capacity": {"storage": "1Ti"},
        "accessModes": ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"],
        "storageClassName": "", "hostPath": {"path": str(tmp_path / "pv")},
        "claimRef": {"namespace": ns, "name": "initializer-tune"}}})
    with scraper(kube_stack, ns, tmp_path) as child, recording(stack_api, ns, "tune") as rec:
        trainjobs.create(stack_api, trainjobs.trainjob_body(
            ns, "tune", runtime="torchtune-llama3.2-1b", run_jobs=("node",),
            env={"RUN_ID": "tune"},
            command=trainer_command("--steps", "15", "--step-seconds", "0.3")))
        finished = trainjobs.wait_finished(stack_api, ns, "tune", TIMEOUT)
        assert trainjobs.condition(finished, "Complete"), finished.get("status")
        jobs = {p.metadata.labels["jobset.sigs.k8s.io/replicatedjob-name"]
                for p in trainjobs.pods(stack_api, ns, "tune")}
        assert {"dataset-initializer", "model-initializer", "node"} <= jobs, jobs
        matched = kube_stack.kubectl("get", "pods", "-n", ns, "-l", DEFAULT_SELECTOR,
                                     "-o", "name").stdout.split()
        assert len(matched) == 1 and "-node-0-0-" in matched[0], matched
        assert {s.metrics_dict()["run"] for s in rec.statuses()} == {"tune"}
        assert _targets(child) == 0
