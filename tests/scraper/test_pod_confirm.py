"""The verdict of a pod read before an unidentified answer is written
(scraper/kube/pod_confirm.py); the read itself on the real API server:
tests/scraper/test_reused_pod_ip.py (the pod watch held behind)."""

from __future__ import annotations

import pytest

from scraper.kube.pod_confirm import PodCheck, check_pod
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
