"""A pod list is applied in slices that return to the event loop (issue 27, point 4).

The real :class:`TargetManager` and the real :class:`TargetScheduler` (not started: the
jobs are only registered); the scrape loop is never run here (``spawn`` closes it).
"""

from __future__ import annotations

from typing import Any

import pytest

from scraper.discovery.pod_targets import LIST_SLICE, PodsNotApplied, PodTargets
from scraper.discovery.pods import Synced
from scraper.scrape.manager import TargetManager
from scraper.scrape.scheduling import TargetScheduler


async def _never(key: str) -> None:
    return None


def _pod(i: int, ip: str = "10.0.0.1") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": f"tj-{i}-node-0", "uid": f"u{i}",
                         "resourceVersion": "1",
                         "labels": {"jobset.sigs.k8s.io/jobset-name": f"tj-{i}"}},
            "status": {"phase": "Running", "podIP": ip}}


def _manager() -> tuple[TargetManager, TargetScheduler, PodTargets]:
    scheduler = TargetScheduler(_never)
    manager = TargetManager(None, scheduler, spawn=lambda coro: coro.close(),  # type: ignore[arg-type]
                            leading=True)
    return manager, scheduler, PodTargets(manager, default_port=28080,
                                          default_path="/metrics", default_interval=30.0)


@pytest.mark.parametrize("size", [0, 1, LIST_SLICE - 1, LIST_SLICE, 2 * LIST_SLICE + 7])
def test_a_list_in_slices_ends_where_one_call_ends(size: int) -> None:
    pods = [_pod(i) for i in range(size)]
    whole, whole_scheduler, whole_pods = _manager()
    whole_pods.on_synced(Synced(None, pods))
    sliced, sliced_scheduler, sliced_pods = _manager()
    steps = list(sliced_pods.synced_steps(Synced(None, pods)))
    assert steps == [LIST_SLICE * (k + 1) for k in range(size // LIST_SLICE)]
    assert set(sliced.states) == set(whole.states) == {f"ns/tj-{i}-node-0"
                                                        for i in range(size)}
    assert sliced_scheduler.scheduled_keys() == whole_scheduler.scheduled_keys()


def test_a_relist_drops_the_absent_in_slices_too() -> None:
    manager, scheduler, found = _manager()
    found.on_synced(Synced(None, [_pod(i) for i in range(3 * LIST_SLICE)]))
    kept = [_pod(i) for i in range(LIST_SLICE // 2)]
    steps = list(found.synced_steps(Synced(None, kept)))
    # 2.5 slices dropped, then half a slice applied: three returns to the loop.
    assert steps == [LIST_SLICE, 2 * LIST_SLICE, 3 * LIST_SLICE]
    assert set(manager.states) == {f"ns/tj-{i}-node-0" for i in range(LIST_SLICE // 2)}
    assert scheduler.scheduled_keys() == set(manager.states)


def test_a_pod_that_fails_costs_no_other_pod_of_the_list() -> None:
    manager, _, found = _manager()
    pods = [_pod(i) for i in range(LIST_SLICE + 3)]
    pods[5]["metadata"]["labels"] = "not a mapping"  # classify() raises on it
    with pytest.raises(PodsNotApplied) as err:
        for _ in found.synced_steps(Synced(None, pods)):
            pass
    assert [key for key, _ in err.value.failed] == ["ns/tj-5-node-0"]
    assert len(manager.states) == LIST_SLICE + 2


def test_a_preempted_pod_confirmed_by_its_kubelet_starts_no_final() -> None:
    # The pod watch as Kueue's preemption shows it: Running, then deletion requested with
    # a grace period, then the containers' end (SIGTERM) with a termination message, then
    # the kubelet's grace-0 confirmation while the Job's finalizer holds the pod, then
    # DELETED.  The last two versions alone read as "ended before its deletion".
    spawned: list[str] = []

    def spawn(coro: Any) -> None:
        spawned.append(coro.__qualname__)
        coro.close()

    manager = TargetManager(None, TargetScheduler(_never), spawn=spawn,  # type: ignore[arg-type]
                            leading=True)
    pods = PodTargets(manager, default_port=28080, default_path="/metrics",
                      default_interval=30.0)
    running = _pod(1)
    pods.on_pod(running, deleted=False)
    assert "ns/tj-1-node-0" in manager.states
    meta = running["metadata"]
    deleting = {**running, "metadata": {**meta, "deletionTimestamp": "2027-01-15T08:00:30Z",
                                        "deletionGracePeriodSeconds": 30}}
    pods.on_pod(deleting, deleted=False)
    ended = {**deleting, "status": {"phase": "Failed", "containerStatuses": [
        {"name": "node", "state": {"terminated": {
            "exitCode": 143, "finishedAt": "2027-01-15T08:00:02Z",
            "message": '{"progressPercentage": 40}'}}}]}}
    pods.on_pod(ended, deleted=False)
    confirmed = {**ended, "metadata": {**meta, "deletionTimestamp": "2027-01-15T08:00:03Z",
                                       "deletionGracePeriodSeconds": 0}}
    pods.on_pod(confirmed, deleted=False)
    pods.on_pod(confirmed, deleted=True)
    assert [name for name in spawned if "final" in name.lower()] == []
    assert not manager.owed and "ns/tj-1-node-0" not in manager.states
    assert len(pods.deletions) == 0  # forgotten with the pod
