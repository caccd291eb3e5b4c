"""Writing by significance (scraper/shared/policy.py, scraper/decide/decision.py): which
change is significant, when a metrics-only change falls due in the write queue, the
per-TrainJob annotations and the flags' validation.  In-process, a fake clock; the real
stack: tests/e2e/test_write_policy.py."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter_lib.status import TrainerStatus
from scraper.config import ConfigError, load_settings
from scraper.decide.decision import priority_of
from scraper.shared.policy import (
    ANNOTATION_METRICS_STALENESS,
    ANNOTATION_PROGRESS_FLOOR,
    PolicyResolver,
    WritePolicy,
    overrides_of,
    significant,
)
from scraper.write.queue import Priority, WriteQueue


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def status(progress: int | None, remaining: int | None = None, **metrics: str) -> TrainerStatus:
    return TrainerStatus.from_api({
        "progressPercentage": progress, "estimatedRemainingSeconds": remaining,
        "metrics": [{"name": k, "value": v} for k, v in metrics.items()],
        "lastUpdatedTime": datetime(2026, 1, 1, tzinfo=UTC)})


_progress = st.none() | st.integers(0, 100)
_remaining = st.none() | st.integers(0, 10_000)
_loss = st.sampled_from(["0.1", "0.2", "nan"])


@given(_progress, _remaining, _loss, _progress, _remaining, _loss)
def test_only_a_new_percentage_is_significant(p1: int | None, r1: int | None, l1: str,
                                              p2: int | None, r2: int | None,
                                              l2: str) -> None:
    stored, new = status(p1, r1, loss=l1), status(p2, r2, loss=l2)
    assert significant(stored, new) is (p2 is not None and p2 != p1)
    klass = priority_of(stored, new, final=False)
    assert klass is (Priority.PROGRESS if significant(stored, new) else Priority.METRICS)
    assert priority_of(stored, new, final=True) is Priority.FINAL
    assert priority_of(None, new, final=False) is Priority.FIRST


def test_a_new_remaining_time_alone_waits_as_metrics_do() -> None:
    assert priority_of(status(40, 100), status(40, 90), final=False) is Priority.METRICS


def _written(q: WriteQueue, key: tuple[str, str]) -> None:
    item = q.take()
    assert item is not None and item.key == key
    q.done(item)


def test_progress_waits_for_the_floor_after_the_last_write() -> None:
    clock, key = Clock(), ("ns", "a")
    q = WriteQueue(clock=clock)
    q.put(key, status(1), Priority.FIRST, gap=1.0)  # a first status has no gap
    _written(q, key)
    clock.now += 0.3
    q.put(key, status(2), Priority.PROGRESS, gap=1.0)
    assert q.take() is None
    assert q.next_due() == pytest.approx(1001.0)
    clock.now = 1001.0
    _written(q, key)


def test_the_floor_counts_from_a_write_that_was_in_flight() -> None:
    clock, key = Clock(), ("ns", "a")
    q = WriteQueue(clock=clock)
    q.put(key, status(1), Priority.FIRST)
    item = q.take()
    assert item is not None
    clock.now += 0.5
    q.put(key, status(2), Priority.PROGRESS, gap=1.0)  # arrives during the write
    clock.now += 0.5
    q.done(item)  # the write ends at 1001.0
    clock.now += 0.9
    assert q.take() is None
    clock.now += 0.1
    _written(q, key)


@given(st.floats(0, 100), st.floats(0, 100), st.floats(0, 100))
def test_metrics_only_change_falls_due_at_its_hold(hold: float, floor: float,
                                                   later: float) -> None:
    clock, key = Clock(), ("ns", "a")
    q = WriteQueue(clock=clock)
    q.put(key, status(1, loss="1"), Priority.METRICS, metrics_due=clock.now + hold, gap=floor)
    due = max(clock.now + hold, clock.now + floor)  # never written: since = queued
    clock.now += later
    item = q.take()
    assert (item is not None) is (clock.now >= due)


def test_a_progress_change_ends_the_metrics_hold_and_carries_the_newest_metrics() -> None:
    clock, key = Clock(), ("ns", "a")
    q = WriteQueue(clock=clock)
    q.put(key, status(1), Priority.FIRST)
    _written(q, key)
    clock.now += 2
    q.put(key, status(1, loss="0.5"), Priority.METRICS, metrics_due=clock.now + 28, gap=1)
    assert q.take() is None
    q.put(key, status(2, loss="0.4"), Priority.PROGRESS, gap=1)
    item = q.take()
    assert item is not None and item.priority is Priority.PROGRESS
    assert item.status.progress_percentage == 2 and item.status.metrics[0].value == "0.4"


def test_a_metrics_change_joining_progress_keeps_it_due() -> None:
    clock, key = Clock(), ("ns", "a")
    q = WriteQueue(clock=clock)
    q.put(key, status(1), Priority.FIRST)
    _written(q, key)
    clock.now += 2
    q.put(key, status(2), Priority.PROGRESS, gap=1)
    q.put(key, status(2, loss="0.3"), Priority.METRICS, metrics_due=clock.now + 28, gap=1)
    item = q.take()
    assert item is not None and item.priority is Priority.PROGRESS
    assert item.status.metrics[0].value == "0.3"


def test_a_final_is_never_held() -> None:
    clock, key = Clock(), ("ns", "a")
    q = WriteQueue(clock=clock)
    q.put(key, status(1), Priority.FIRST)
    _written(q, key)
    q.put(key, status(1, loss="0.5"), Priority.METRICS, metrics_due=clock.now + 30, gap=1)
    q.put(key, status(100), Priority.FINAL, gap=1)
    item = q.take()
    assert item is not None and item.priority is Priority.FINAL


def test_held_metrics_falling_due_do_not_jump_ahead_of_fresh_progress() -> None:
    clock = Clock()
    q = WriteQueue(clock=clock)
    q.put(("ns", "m"), status(1, loss="1"), Priority.METRICS, metrics_due=clock.now + 30)
    clock.now += 30
    q.put(("ns", "p"), status(5), Priority.PROGRESS)
    item = q.take()
    assert item is not None and item.key == ("ns", "p")


# ---------------------------------------------------------------- annotations and flags

def test_pod_annotation_wins_over_the_trainjob_then_the_flags() -> None:
    resolver = PolicyResolver(WritePolicy(2.0, 60.0))
    pod = overrides_of({ANNOTATION_METRICS_STALENESS: "10s", "other": "x"})
    trainjob = overrides_of({ANNOTATION_METRICS_STALENESS: "20s",
                             ANNOTATION_PROGRESS_FLOOR: "500ms"})
    assert resolver.policy() == WritePolicy(2.0, 60.0)
    assert resolver.policy(trainjob=trainjob) == WritePolicy(0.5, 20.0)
    assert resolver.policy(pod, trainjob) == WritePolicy(0.5, 10.0)


@pytest.mark.parametrize(("annotation", "value", "limit"), [
    (ANNOTATION_PROGRESS_FLOOR, "0.01s", "between 0.1s and 60s"),
    (ANNOTATION_PROGRESS_FLOOR, "2m", "between 0.1s and 60s"),
    (ANNOTATION_METRICS_STALENESS, "2h", "between 0s and 3600s"),
    (ANNOTATION_METRICS_STALENESS, "soon", "not a duration"),
])
def test_a_bad_annotation_is_named_once_and_the_next_level_used(
        annotation: str, value: str, limit: str, caplog: pytest.LogCaptureFixture) -> None:
    resolver = PolicyResolver(WritePolicy(1.0, 30.0))
    pod = overrides_of({annotation: value})
    trainjob = overrides_of({ANNOTATION_METRICS_STALENESS: "5s"})
    with caplog.at_level(logging.WARNING, logger="scraper.shared.policy"):
        for _ in range(3):
            policy = resolver.policy(pod, trainjob, where="TrainJob ns/tj")
    assert policy == WritePolicy(1.0, 5.0)
    [record] = caplog.records
    message = record.getMessage()
    assert "TrainJob ns/tj" in message and annotation in message
    assert repr(value) in message and limit in message


@pytest.mark.parametrize(("flags", "expected"), [
    ({"progress_floor": "50ms"}, "progress-floor='50ms': must be between 0.1s and 60s"),
    ({"metrics_staleness": "2h"}, "metrics-staleness='2h': must be between 0s and 3600s"),
    ({"metrics_staleness": "later"}, "metrics-staleness='later': not a duration"),
])
def test_flags_are_validated_with_field_value_and_limit(flags: dict[str, str],
                                                        expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(flags)
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


def test_flag_defaults_and_values() -> None:
    assert load_settings({}).write_policy() == WritePolicy(1.0, 30.0)
    given_policy = load_settings({"progress_floor": "2s", "metrics_staleness": "0"})
    assert given_policy.write_policy() == WritePolicy(2.0, 0.0)
