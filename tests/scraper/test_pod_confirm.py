"""The verdict of a pod read before an unidentified answer is written
(scraper/discovery/pod_confirm.py); the read itself on the real API server:
tests/scraper/test_reused_pod_ip.py (the pod watch held behind)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kubernetes.client import (
    V1ContainerState,
    V1ContainerStateRunning,
    V1ContainerStateTerminated,
    V1ContainerStatus,
)

from scraper.discovery.pod_confirm import containers_ended_at
from scraper.shared.pod_check import PodCheck, check_pod
from scraper.shared.targets import Target

TARGET = Target(namespace="ns", trainjob="a", pod_name="a-0", pod_uid="uid-a",
                url="http://10.0.0.7:28080/metrics", interval=30.0)
V6 = Target(namespace="ns", trainjob="a", pod_name="a-0", pod_uid="uid-a",
            url="http://[fd00::7]:28080/metrics", interval=30.0)


@pytest.mark.parametrize(("target", "uid", "ip", "phase", "expected"), [
    (TARGET, "uid-a", "10.0.0.7", "Running", PodCheck.CONFIRMED),
    (TARGET, "uid-a", "10.0.0.7", None, PodCheck.CONFIRMED),
    (TARGET, "uid-b", "10.0.0.7", "Running", PodCheck.REPLACED),
    (TARGET, None, "10.0.0.7", "Running", PodCheck.REPLACED),
    (TARGET, "uid-a", "10.0.0.8", "Running", PodCheck.MOVED),
    (TARGET, "uid-a", None, "Running", PodCheck.MOVED),
    (TARGET, "uid-a", "", "Pending", PodCheck.MOVED),
    (TARGET, "uid-a", "10.0.0.7", "Succeeded", PodCheck.ENDED),
    (TARGET, "uid-a", "10.0.0.7", "Failed", PodCheck.ENDED),
    (V6, "uid-a", "fd00:0::7", "Running", PodCheck.CONFIRMED),  # one address, two spellings
    (V6, "uid-a", "fd00::8", "Running", PodCheck.MOVED),
])
def test_check_pod(target: Target, uid: str | None, ip: str | None, phase: str | None,
                   expected: PodCheck) -> None:
    assert check_pod(target, uid, ip, phase) is expected


ANSWERED = 1_700_000_100.4  # epoch seconds


@pytest.mark.parametrize(("phase", "ended_at", "answered_at", "expected"), [
    # Ended in the second of the answer or later: it held the address when it answered.
    ("Succeeded", 1_700_000_100.0, ANSWERED, PodCheck.CONFIRMED),
    ("Failed", 1_700_000_107.0, ANSWERED, PodCheck.CONFIRMED),
    # Ended in an earlier second, or when is unknown: its address may be another's.
    ("Succeeded", 1_700_000_099.0, ANSWERED, PodCheck.ENDED),
    ("Succeeded", None, ANSWERED, PodCheck.ENDED),
    ("Succeeded", 1_700_000_107.0, None, PodCheck.ENDED),
    # Not ended: the times do not matter.
    ("Running", 1_700_000_000.0, ANSWERED, PodCheck.CONFIRMED),
])
def test_an_ended_pod_confirms_an_answer_from_before_its_end(
        phase: str, ended_at: float | None, answered_at: float | None,
        expected: PodCheck) -> None:
    assert check_pod(TARGET, "uid-a", "10.0.0.7", phase, ended_at=ended_at,
                     answered_at=answered_at) is expected


def test_containers_ended_at_is_the_latest_finish() -> None:
    def status(finished: datetime | None) -> V1ContainerStatus:
        state = (V1ContainerState(terminated=V1ContainerStateTerminated(
            exit_code=0, finished_at=finished)) if finished else
            V1ContainerState(running=V1ContainerStateRunning()))
        return V1ContainerStatus(name="c", image="i", image_id="", ready=False,
                                 restart_count=0, state=state)
    early = datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    late = datetime(2026, 1, 1, 0, 0, 9, tzinfo=UTC)
    assert containers_ended_at([status(early), status(late), status(None)]) \
        == late.timestamp()
    assert containers_ended_at([status(None)]) is None
    assert containers_ended_at(None) is None
