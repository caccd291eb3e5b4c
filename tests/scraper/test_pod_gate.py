"""The writer's pod read before a status that stated no pod (scraper/write/pod_gate.py),
with the read replaced by a fixed answer (the read itself on the real API server:
tests/scraper/test_pod_confirm_writes.py)."""

from __future__ import annotations

import pytest

from scraper.shared.outcome import WriteOutcome
from scraper.shared.pod_check import PodCheck
from scraper.shared.targets import Target
from scraper.write.pod_gate import PodGate

TARGET = Target("ns", "a", "a-0", "uid-a", "http://10.0.0.7:28080/metrics", 30.0)


def _gate(check: PodCheck, reads: list[float | None],
          told: list[PodCheck]) -> PodGate:
    async def read(target: Target, answered_at: float | None) -> PodCheck:
        reads.append(answered_at)
        return check

    return PodGate(read, lambda target, found: told.append(found))


@pytest.mark.parametrize(("check", "verdict"), [
    (PodCheck.CONFIRMED, None),
    (PodCheck.GONE, (WriteOutcome.UNCONFIRMED, None)),
    (PodCheck.ENDED, (WriteOutcome.UNCONFIRMED, None)),
    # A failed read learns nothing: the status stays queued, as after a failed write,
    # and is told (a WARNING once, a relist), so a read that keeps failing is seen.
    (PodCheck.UNREAD, (WriteOutcome.RETRIED, 1.5)),
])
async def test_the_verdict_of_each_read(check: PodCheck,
                                        verdict: tuple[WriteOutcome, float | None] | None,
                                        ) -> None:
    reads: list[float | None] = []
    told: list[PodCheck] = []
    assert await _gate(check, reads, told).verdict(TARGET, 1_700_000_000.0,
                                                   lambda: 1.5) == verdict
    assert reads == [1_700_000_000.0] and told == [check]


async def test_a_status_with_no_pod_to_confirm_reads_nothing() -> None:
    reads: list[float | None] = []
    told: list[PodCheck] = []
    assert await _gate(PodCheck.GONE, reads, told).verdict(None, 1.0, lambda: 1.5) is None
    assert reads == [] and told == []


async def test_no_arrival_time_is_passed_as_unknown() -> None:
    # A queued status without its arrival (0) must not let an ended pod confirm it.
    reads: list[float | None] = []
    await _gate(PodCheck.CONFIRMED, reads, []).verdict(TARGET, 0.0, lambda: 1.5)
    assert reads == [None]
