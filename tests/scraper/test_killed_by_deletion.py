"""A pod killed by its deletion (preemption, suspension, restart) gives no final status.

Pure decisions on pod dicts (the shapes the API server returns); the real chain
(Kueue preempting a TrainJob) is ``tests/e2e/test_kueue.py``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from scraper.discovery.deletions import DeletionRequests
from scraper.discovery.pods import (
    LABEL_JOBSET_NAME,
    Ignore,
    classify,
    final_from_deleted,
    killed_by_deletion,
)
from scraper.shared.targets import Final

BASE = 1_800_000_000  # epoch seconds of the deletion request
MESSAGE = '{"progressPercentage": 40}'


def _stamp(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(*, finished: int | None, grace: int | None, phase: str = "Failed") -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "name": "low-node-0-0-x", "uid": "u1",
                            "labels": {LABEL_JOBSET_NAME: "low"}}
    if grace is not None:
        meta["deletionTimestamp"] = _stamp(BASE + grace)
        meta["deletionGracePeriodSeconds"] = grace
    terminated: dict[str, Any] = {"message": MESSAGE, "exitCode": 143}
    if finished is not None:
        terminated["finishedAt"] = _stamp(finished)
    return {"metadata": meta,
            "spec": {"containers": [{"name": "node"}]},
            "status": {"phase": phase, "containerStatuses": [
                {"name": "node", "state": {"terminated": terminated}}]}}


def _classify(pod: dict[str, Any]) -> object:
    return classify(pod, default_port=28080, default_path="/", default_interval=15.0)


@given(after=st.integers(0, 120), grace=st.integers(0, 60),
       phase=st.sampled_from(["Failed", "Succeeded"]))
def test_containers_ended_after_the_deletion_request_are_no_final(
        after: int, grace: int, phase: str) -> None:
    pod = _pod(finished=BASE + after, grace=grace, phase=phase)
    assert killed_by_deletion(pod)
    decision = _classify(pod)
    assert isinstance(decision, Ignore) and "not the training's end" in decision.reason
    assert final_from_deleted(pod) is None


@given(before=st.integers(1, 3600), grace=st.integers(0, 60),
       phase=st.sampled_from(["Failed", "Succeeded"]))
def test_a_pod_that_ended_before_its_deletion_keeps_its_final(
        before: int, grace: int, phase: str) -> None:
    pod = _pod(finished=BASE - before, grace=grace, phase=phase)
    assert not killed_by_deletion(pod)
    assert isinstance(_classify(pod), Final)
    final = final_from_deleted(pod)
    assert final is not None and final.messages == (("node", MESSAGE),)


def test_no_deletion_or_no_end_time_is_not_a_kill() -> None:
    assert not killed_by_deletion(_pod(finished=BASE, grace=None))
    assert isinstance(_classify(_pod(finished=BASE, grace=None)), Final)
    # Without a finishedAt nothing says the deletion ended it: the final is kept.
    assert not killed_by_deletion(_pod(finished=None, grace=30))


def _confirmed(pod: dict[str, Any], at: int) -> dict[str, Any]:
    """The pod after the kubelet confirmed its deletion with grace period 0 while a
    finalizer (the Job's job-tracking) still holds it: the API server moves
    ``deletionTimestamp`` to that moment and the grace period to 0."""
    meta = {**pod["metadata"], "deletionTimestamp": _stamp(at),
            "deletionGracePeriodSeconds": 0}
    return {**pod, "metadata": meta}


@given(after=st.integers(0, 29), confirmed=st.integers(1, 60))
def test_a_kill_stays_a_kill_after_the_kubelet_shortens_the_grace_period(
        after: int, confirmed: int) -> None:
    # Seen while the deletion was graceful (requested at BASE, grace 30), the containers
    # ended `after` s later, and the kubelet's confirmation came `confirmed` s after that.
    graceful = _pod(finished=BASE + after, grace=30)
    shortened = _confirmed(graceful, BASE + after + confirmed)
    # The pod alone now reads as ended before its deletion (the race under load that let
    # a preempted pod's termination message through as a final in tests/e2e/test_kueue.py)
    assert not killed_by_deletion(shortened)
    requests = DeletionRequests()
    assert requests.seen(graceful) == BASE
    earliest = requests.seen(shortened)
    assert earliest == BASE
    assert killed_by_deletion(shortened, earliest)
    assert isinstance(classify(shortened, default_port=28080, default_path="/",
                               default_interval=15.0, deletion_requested=earliest), Ignore)
    assert final_from_deleted(shortened, earliest) is None


@given(before=st.integers(1, 3600), confirmed=st.integers(0, 60))
def test_a_training_that_ended_before_its_cleanup_keeps_its_final_after_confirmation(
        before: int, confirmed: int) -> None:
    graceful = _pod(finished=BASE - before, grace=30)
    requests = DeletionRequests()
    requests.seen(graceful)
    earliest = requests.seen(_confirmed(graceful, BASE + confirmed))
    assert final_from_deleted(_confirmed(graceful, BASE + confirmed), earliest) is not None


def test_deletion_requests_are_bounded_by_the_pods_being_deleted() -> None:
    requests = DeletionRequests()
    pods = [_pod(finished=BASE, grace=30) for _ in range(4)]
    for i, pod in enumerate(pods):
        pod["metadata"] = {**pod["metadata"], "uid": f"u{i}",
                           "namespace": "a" if i < 2 else "b"}
        requests.seen(pod)
    requests.seen(_pod(finished=BASE, grace=None))  # not being deleted: nothing kept
    assert len(requests) == 4
    requests.forget("u0")
    requests.keep_only("b", ["u2"])  # a list of namespace b without u3
    assert len(requests) == 2
    requests.keep_only(None, [])
    assert len(requests) == 0
