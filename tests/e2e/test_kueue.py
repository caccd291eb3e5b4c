"""Kueue preemption on the real chain: Kueue -> Trainer -> JobSet -> Job -> pods.

The cluster (``kueue_stack``) runs Kueue v0.17.0 with its TrainJob integration in
front of the Trainer; the queues are :func:`localdev.cluster.kueue.queue_objects`
(a ClusterQueue of one CPU, preemption within it by priority).  The training is
``tests/e2e/stack_trainer.py`` with a checkpoint file on a path both of its runs
share (the pod runner runs pods as local processes).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from localdev.cluster import trainjobs
from localdev.cluster.kueue import (
    HIGH_PRIORITY,
    KUEUE_GROUP,
    KUEUE_VERSION,
    LOCAL_QUEUE,
    LOW_PRIORITY,
    PLURALS,
    PRIORITY_CLASS_LABEL,
    QUEUE_NAME_LABEL,
    queue_objects,
)
from localdev.cluster.stack import Cluster
from scraper.kube.events import COMPONENT
from scraper.stall.watch import REASON_STALLED
from tests.e2e.test_stack_scenarios import trainer_command
from tests.helpers.stack import Observation, recording, scraper

TIMEOUT = 180.0
STALL_AFTER = "5s"
#: Steps of the low-priority training and seconds per step: long enough to be
#: preempted part way (about 30 s of training in all).
LOW_STEPS, LOW_STEP_SECONDS = 60, 0.5


def _install_queues(api: client.ApiClient, namespace: str) -> None:
    custom = client.CustomObjectsApi(api)
    for obj in queue_objects(namespace):
        plural = PLURALS[obj["kind"]]
        with contextlib.suppress(client.ApiException):  # 409: the session made it before
            if obj["metadata"].get("namespace"):
                custom.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace,
                                                       plural, obj)
            else:
                custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, obj)


def _queued(body: dict[str, Any], priority: str, cpu: str = "1") -> dict[str, Any]:
    """``body`` put into :data:`LOCAL_QUEUE` with ``priority``, asking ``cpu`` per node."""
    body["metadata"]["labels"] = {QUEUE_NAME_LABEL: LOCAL_QUEUE, PRIORITY_CLASS_LABEL: priority}
    body["spec"].setdefault("trainer", {})["resourcesPerNode"] = {
        "requests": {"cpu": cpu}, "limits": {"cpu": cpu}}
    return body


@contextlib.contextmanager
def _scraper_events(api: client.ApiClient, namespace: str) -> Iterator[list[dict[str, Any]]]:
    """Every Event the scraper (source component :data:`COMPONENT`) posts in ``namespace``,
    with this machine's receive time under ``"_seen"`` (monotonic seconds)."""
    seen: list[dict[str, Any]] = []
    stop = threading.Event()

    def run() -> None:
        core = client.CoreV1Api(api)
        while not stop.is_set():
            with contextlib.suppress(Exception):
                for event in watch.Watch().stream(core.list_namespaced_event, namespace,
                                                  timeout_seconds=5):
                    obj = api.sanitize_for_serialization(event["object"])
                    if (obj.get("source") or {}).get("component") == COMPONENT:
                        seen.append({**obj, "_seen": time.monotonic()})
                    if stop.is_set():
                        return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=10)


def _suspended(o: Observation) -> bool:
    return bool(o.raw.get("spec", {}).get("suspend"))


def test_preempted_trainjob_resumes_from_its_checkpoint(
        kueue_stack: Cluster, kueue_api: client.ApiClient, kueue_namespace: str,
        tmp_path: Path) -> None:
    ns = kueue_namespace
    _install_queues(kueue_api, ns)
    checkpoint = tmp_path / "low.ckpt"
    # The shortest stall threshold the scraper takes: a suspended TrainJob's unchanged
    # status would pass it several times over while it waits in the queue.
    with scraper(kueue_stack, ns, tmp_path, options=["--stall-after", STALL_AFTER]) as child, \
            recording(kueue_api, ns, "low") as low, _scraper_events(kueue_api, ns) as events:
        trainjobs.create(kueue_api, _queued(trainjobs.trainjob_body(
            ns, "low", env={"RUN_ID": "low"},
            command=trainer_command("--steps", str(LOW_STEPS), "--step-seconds",
                                    str(LOW_STEP_SECONDS), "--checkpoint", str(checkpoint))),
            LOW_PRIORITY))
        # Kueue's webhook suspends it on creation; admission unsuspends it.
        low.wait_for(_suspended, TIMEOUT, "the low TrainJob suspended by Kueue at creation")
        low.wait_for(lambda o: o.status is not None and (o.status.progress_percentage or 0) >= 20,
                     TIMEOUT, "the low TrainJob admitted and at 20 %")

        trainjobs.create(kueue_api, _queued(trainjobs.trainjob_body(
            ns, "high", env={"RUN_ID": "high"},
            command=trainer_command("--steps", "40", "--step-seconds", "0.3")), HIGH_PRIORITY))
        preempted = low.wait_for(
            lambda o: _suspended(o) and o.status is not None, TIMEOUT,
            "the low TrainJob suspended by preemption")
        suspended_at = time.monotonic()
        preempted_pods = [p.metadata.name for p in trainjobs.pods(kueue_api, ns, "low")]
        deadline = time.monotonic() + TIMEOUT
        while trainjobs.pods(kueue_api, ns, "low"):
            assert time.monotonic() < deadline, "the preempted TrainJob's pods stayed"
            time.sleep(0.2)
        gone_at, gone_seen = time.monotonic(), datetime.now(UTC)
        saved_step = int(checkpoint.read_text())
        saved_progress = 100 * saved_step // LOW_STEPS
        assert 0 < saved_progress < 100, saved_progress

        trainjobs.wait_finished(kueue_api, ns, "high", TIMEOUT)
        readmitted = low.wait_for(
            lambda o: o.seen_at > preempted.seen_at and not _suspended(o), TIMEOUT,
            "the low TrainJob re-admitted")
        readmitted_at = time.monotonic()
        done = trainjobs.wait_finished(kueue_api, ns, "low", TIMEOUT)
        assert trainjobs.condition(done, "Complete"), done["status"]
        low.wait_for(lambda o: o.status is not None and o.status.progress_percentage == 100,
                     TIMEOUT, "the low TrainJob at 100 %")
        time.sleep(2)  # late writes or Events would show now

    # Between the suspension and the pods' end the training still ran (its steps are
    # real, and in the checkpoint): nothing written then is past the checkpoint.
    ending = [o.status.progress_percentage or 0 for o in low.seen
              if preempted.seen_at <= o.seen_at < gone_seen and o.status is not None]
    assert max(ending) <= saved_progress, (ending, saved_progress)
    # Once its pods were gone (preempted, queued again) the scraper wrote nothing: every
    # version up to the re-admission holds the same trainerStatus, and the preempted
    # pod's termination message was not taken as a final.
    window = [o for o in low.seen if gone_seen <= o.seen_at < readmitted.seen_at]
    held = {json.dumps((o.raw.get("status") or {}).get("trainerStatus"), sort_keys=True)
            for o in window}
    assert len(held) == 1, f"trainerStatus changed while suspended: {held}"
    log = child.log_path.read_text(errors="replace")
    finals = [line for line in log.splitlines()
              if f"final status of TrainJob {ns}/low from pod" in line]
    taken = [line for line in finals if any(f"pod {p} " in line for p in preempted_pods)]
    assert taken == [], f"a final taken from a preempted pod: {taken}"
    assert finals, "no final status from the re-admitted run's pod"
    quiet = [e for e in events if gone_at <= e["_seen"] < readmitted_at
             and (e.get("involvedObject") or {}).get("name") == "low"]
    assert quiet == [], f"scraper Events while suspended: {quiet}"
    stalled = [e for e in events if suspended_at <= e["_seen"] < readmitted_at
               and e.get("reason") == REASON_STALLED]
    assert stalled == [], f"{REASON_STALLED} while suspended: {stalled}"
    assert readmitted_at - suspended_at > 2 * 5, "suspended for less than twice the threshold"

    # Resumed from the checkpoint, never below it, and ended at 100 %.
    progress = [s.progress_percentage for s in low.statuses()]
    assert progress == sorted(progress), f"progress went back: {progress}"
    # What the TrainJob held at the re-admission (the preempted run's last write; its
    # watch event may come after the pods were seen gone on a loaded machine) is at most
    # the checkpoint (the training stores each step after reporting it); every status
    # written after the re-admission comes from the resumed run: at or above the
    # checkpoint.
    held_then = [o.status for o in low.seen if o.seen_at < readmitted.seen_at][-1]
    assert held_then is not None and (held_then.progress_percentage or 0) <= saved_progress
    after = [o.status.progress_percentage or 0 for o in low.seen
             if o.seen_at >= readmitted.seen_at and o.status is not None
             and o.status != held_then]
    assert after and min(after) >= saved_progress, \
        f"below the checkpoint's {saved_progress} % after re-admission: {after}"
    assert progress[-1] == 100
    steps = [int(s.metrics_dict()["step"]) for s in low.statuses()
             if s.metrics_dict().get("step")]
    assert steps == sorted(steps), f"steps went back: {steps}"
