"""The one write decision (scraper/decide/decision.py), a pure function: its answers
for each class, and that it agrees with the exporter's hold rule
(exporter_lib/hold_policy.py), which is the same rule (exporter_lib/write_rule.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from exporter_lib.hold_policy import HoldPolicy
from exporter_lib.status import TrainerStatus
from scraper.decide.decision import decide
from scraper.shared.policy import WritePolicy
from scraper.shared.trainjobs import Writer
from scraper.shared.writes import (
    Priority,
    Report,
    Skip,
    Stored,
    Wait,
    Write,
    WriteVerdict,
)

POLICY = WritePolicy(progress_floor=1.0, metrics_staleness=30.0, other_writer_grace=60.0)


def status(progress: int | None, loss: str = "1") -> TrainerStatus:
    return TrainerStatus.from_api({
        "progressPercentage": progress, "metrics": [{"name": "loss", "value": loss}],
        "lastUpdatedTime": datetime(2026, 1, 1, tzinfo=UTC)})


def test_a_final_and_a_first_status_are_written_at_once() -> None:
    assert decide(Stored(status(10), ours_taken_at=0.0), Report(status(10, "2"), final=True),
                  POLICY, 1.0) == Write(Priority.FINAL)
    assert decide(Stored(None), Report(status(10)), POLICY, 1.0) == Write(Priority.FIRST)
    # A status held that is not ours since the scraper started: a first status of ours.
    assert decide(Stored(status(5)), Report(status(10)), POLICY, 1.0) == Write(Priority.FIRST)


def test_a_new_percentage_is_written_after_the_floor() -> None:
    decision = decide(Stored(status(10), ours_taken_at=0.0), Report(status(11)), POLICY, 1.0)
    assert decision == Write(Priority.PROGRESS, floor=1.0)


def test_a_metrics_change_waits_until_the_staleness_after_our_last_status() -> None:
    stored = Stored(status(10), ours_taken_at=100.0)
    assert decide(stored, Report(status(10, "2")), POLICY, 110.0) == Wait(130.0, floor=1.0)
    # Past its time it is due at once; its turn in the queue counts from 130.
    assert decide(stored, Report(status(10, "2")), POLICY, 140.0) == Wait(130.0, floor=1.0)


def test_the_same_content_is_skipped_unless_a_status_of_ours_is_queued() -> None:
    stored = Stored(status(10), ours_taken_at=100.0)
    assert decide(stored, Report(status(10)), POLICY, 110.0) == Skip(WriteVerdict.UNCHANGED)
    queued = Stored(status(10), ours_taken_at=100.0, queued=True)
    assert isinstance(decide(queued, Report(status(10)), POLICY, 110.0), Wait)


def test_a_live_other_writer_keeps_the_field() -> None:
    other = Writer("trainer-status", time=1000.0, seen=100.0)
    decision = decide(Stored(status(10), other), Report(status(11), seen=105.0), POLICY, 110.0)
    assert decision == Skip(WriteVerdict.OTHER_WRITER)


_progress = st.none() | st.integers(0, 100)
_seconds = st.floats(0, 1000, allow_nan=False)


@given(_progress, _progress, _seconds, _seconds, _seconds)
def test_the_exporter_answers_a_held_scrape_exactly_when_the_scraper_writes_now(
        held: int | None, new: int | None, staleness: float, age: float,
        held_for: float) -> None:
    """A held scrape ends for a change exactly when the scraper would write that change
    without waiting: both sides apply one rule."""
    answers = HoldPolicy(held, staleness, age).answers(status(new, "2"), held_for)
    stored = Stored(status(held, "1"), ours_taken_at=-(age + held_for))
    decision = decide(stored, Report(status(new, "2")), WritePolicy(1.0, staleness), 0.0)
    assert isinstance(decision, Write | Wait)
    writes_now = isinstance(decision, Write) or decision.until <= 0.0
    assert answers is writes_now
