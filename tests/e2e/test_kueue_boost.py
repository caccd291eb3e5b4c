"""Checkpoint-aware preemption on the real chain: scraper -> Workload annotation -> Kueue.

Kueue v0.17.0 with the ``PriorityBoost`` gate on (:data:`localdev.cluster.kueue.
KUEUE_FEATURE_GATES`), the TrainJob integration in front of the Trainer.  Two TrainJobs
of equal (low) priority run in a ClusterQueue with room for exactly two: ``saved``
stores a checkpoint at every step, ``stale`` reports a checkpoint 20 minutes old
(``--checkpoint-age``: the age is reported, not waited for) and is admitted second.  A
high-priority TrainJob then needs one of their slots.

* boost on (``--priority-boost-max 10``): ``stale`` (1200 s x 0.5 CPU at risk) gets a
  boost, ``saved`` (nothing at risk) none, so Kueue preempts ``saved``;
* boost off (``--priority-boost-max 0``): Kueue's own order, equal priority and the
  most recently admitted first (``pkg/scheduler/preemption/common/ordering.go``),
  preempts ``stale``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from localdev.cluster import trainjobs
from localdev.cluster.kueue import (
    HIGH_PRIORITY,
    KUEUE_GROUP,
    KUEUE_VERSION,
    LOW_PRIORITY,
    PLURALS,
    PRIORITY_CLASS_LABEL,
    QUEUE_NAME_LABEL,
    queue_objects,
)
from localdev.cluster.stack import Cluster
from scraper.boost.workload import PRIORITY_BOOST_ANNOTATION, view_of
from tests.e2e.test_stack_scenarios import trainer_command
from tests.helpers.stack import scraper

TIMEOUT = 180.0
#: Each TrainJob asks for half of the ClusterQueue's one CPU: two fit, a third preempts.
CPU = "500m"
#: The boost's range in the "on" run: far below the classes' gap (100 vs 1000).
BOOST_MAX = 10
#: The pass interval of scraper/boost/watch.py plus a scrape: the wait for a boost.
BOOST_WAIT = 60.0


def _install_queues(api: client.ApiClient, namespace: str, queue: str) -> None:
    """The shared ResourceFlavor and priority classes, and a ClusterQueue and
    LocalQueue of this test's own (named ``queue``), one CPU."""
    custom = client.CustomObjectsApi(api)
    for obj in queue_objects(namespace):
        kind = obj["kind"]
        if kind == "ClusterQueue":
            obj["metadata"]["name"] = queue
        elif kind == "LocalQueue":
            obj["metadata"]["name"] = queue
            obj["spec"]["clusterQueue"] = queue
        with contextlib.suppress(client.ApiException):  # 409: shared, made before
            if obj["metadata"].get("namespace"):
                custom.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace,
                                                       PLURALS[kind], obj)
            else:
                custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION,
                                                    PLURALS[kind], obj)


def _create(api: client.ApiClient, namespace: str, name: str, queue: str, priority: str,
            *args: str) -> str:
    body = trainjobs.trainjob_body(namespace, name, env={"RUN_ID": name},
                                   command=trainer_command(*args))
    body["metadata"]["labels"] = {QUEUE_NAME_LABEL: queue, PRIORITY_CLASS_LABEL: priority}
    body["spec"].setdefault("trainer", {})["resourcesPerNode"] = {
        "requests": {"cpu": CPU}, "limits": {"cpu": CPU}}
    uid: str = trainjobs.create(api, body)["metadata"]["uid"]
    return uid


def _workloads(api: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    """The namespace's Workloads by the UID of the TrainJob that owns them."""
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads")["items"]
    out = {}
    for item in items:
        view = view_of(item)
        if view is not None:
            out[view.owner_uid] = item
    return out


def _wait(what: str, check: Any, timeout: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def _admitted_at(api: client.ApiClient, namespace: str, uid: str) -> float | None:
    """When the Workload of the TrainJob ``uid`` was admitted (unix seconds), or None."""
    workload = _workloads(api, namespace).get(uid)
    view = view_of(workload) if workload is not None else None
    return view.admitted_at if view is not None else None


def _running(api: client.ApiClient, namespace: str, name: str) -> bool:
    return any(p.status.phase == "Running" for p in trainjobs.pods(api, namespace, name))


def _suspended(api: client.ApiClient, namespace: str, name: str) -> bool:
    return bool(trainjobs.get(api, namespace, name)["spec"].get("suspend"))


@pytest.mark.parametrize("boost_max", [BOOST_MAX, 0], ids=["boost-on", "boost-off"])
def test_preemption_takes_the_trainjob_that_loses_least(
        kueue_stack: Cluster, kueue_api: client.ApiClient, kueue_namespace: str,
        tmp_path: Path, boost_max: int) -> None:
    ns = kueue_namespace
    queue = f"boost-{uuid.uuid4().hex[:8]}"
    _install_queues(kueue_api, ns, queue)
    long_run = ("--steps", "100000", "--step-seconds", "0.5")
    with scraper(kueue_stack, ns, tmp_path,
                 options=["--priority-boost-max", str(boost_max)]):
        saved = _create(kueue_api, ns, "saved", queue, LOW_PRIORITY, *long_run,
                        "--checkpoint", str(tmp_path / "saved.ckpt"))
        _wait("saved running", lambda: _running(kueue_api, ns, "saved"))
        # Kueue's admission times have whole seconds, and the order without a boost
        # needs two: the second TrainJob is created once this machine's clock (Kueue's
        # too) has passed the first one's admission second.
        first = _wait("saved admitted", lambda: _admitted_at(kueue_api, ns, saved))
        _wait("the next second", lambda: time.time() >= first + 1.0, 5.0)
        # Admitted second: Kueue's own order would take it first.
        stale = _create(kueue_api, ns, "stale", queue, LOW_PRIORITY, *long_run,
                        "--checkpoint-age", "1200")
        _wait("stale running", lambda: _running(kueue_api, ns, "stale"))
        admitted = {uid: view_of(w).admitted_at  # type: ignore[union-attr]
                    for uid, w in _workloads(kueue_api, ns).items()}
        assert admitted[stale] > admitted[saved], admitted
        if boost_max:
            boosted = _wait("the stale Workload's boost", lambda: (
                _workloads(kueue_api, ns)[stale]["metadata"].get("annotations") or {}
            ).get(PRIORITY_BOOST_ANNOTATION), BOOST_WAIT)
            # 1200 s x 0.5 CPU = 600 CPU-seconds: floor(log2(1 + 10)) = 3.
            assert boosted == "3", boosted
            held = (_workloads(kueue_api, ns)[saved]["metadata"].get("annotations")
                    or {}).get(PRIORITY_BOOST_ANNOTATION)
            assert held in (None, "0"), held
        _create(kueue_api, ns, "high", queue, HIGH_PRIORITY, *long_run)
        victim = _wait("a low TrainJob preempted", lambda: next(
            (n for n in ("saved", "stale") if _suspended(kueue_api, ns, n)), None))
        _wait("high running", lambda: _running(kueue_api, ns, "high"))
        others = [n for n in ("saved", "stale") if n != victim]
        assert not any(_suspended(kueue_api, ns, n) for n in others)
        if not boost_max:
            annotations = [(w["metadata"].get("annotations") or {}).get(
                PRIORITY_BOOST_ANNOTATION) for w in _workloads(kueue_api, ns).values()]
            assert annotations == [None] * len(annotations), annotations
    assert victim == ("saved" if boost_max else "stale"), victim
