"""The stall rule (:mod:`scraper.stall.rule`), in process: hypothesis over the threshold
settings, the ``auto`` threshold and whole timelines of one training's changes.

Pure code with an injected clock: nothing to mock.  The rule against the real stack
(real trainings, exporters, API server, Events) is ``tests/e2e/test_stall_stack.py``.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from exporter_lib.status import TrainerStatus
from scraper.config import ConfigError, load_settings
from scraper.stall.rule import (
    STALL_AFTER_ANNOTATION,
    STALL_AFTER_MAX_SECONDS,
    STALL_AFTER_MIN_SECONDS,
    STALL_FLOOR_SECONDS,
    STALL_GAP_FACTOR,
    STALL_INTERVALS_MIN,
    StallClock,
    StallSettingError,
    Transition,
    auto_threshold,
    describe_seconds,
    parse_stall_after,
)

BASE = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
intervals = st.floats(min_value=1.0, max_value=3600.0, allow_nan=False)
gaps = st.floats(min_value=0.5, max_value=4 * 3600.0, allow_nan=False)


def _status(progress: int | None, loss: str | None = None, at: float = 0.0) -> TrainerStatus:
    return TrainerStatus(progress_percentage=progress,
                         metrics=() if loss is None else ({"name": "loss", "value": loss},),
                         last_updated_time=BASE + timedelta(seconds=at))


# ---------------------------------------------------------------- settings


@given(seconds=st.integers(min_value=int(STALL_AFTER_MIN_SECONDS),
                           max_value=int(STALL_AFTER_MAX_SECONDS)))
def test_a_duration_within_the_bounds_is_its_seconds(seconds: int) -> None:
    assert parse_stall_after(f"{seconds}s", "f") == seconds
    assert parse_stall_after(seconds, "f") == seconds
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    assert parse_stall_after(f"{hours}h{minutes}m{secs}s", "f") == seconds


@given(seconds=st.floats(min_value=0.001, max_value=STALL_AFTER_MIN_SECONDS - 0.001)
       | st.floats(min_value=STALL_AFTER_MAX_SECONDS + 1, max_value=1e9))
def test_a_duration_outside_the_bounds_names_field_value_and_limit(seconds: float) -> None:
    with pytest.raises(StallSettingError) as err:
        parse_stall_after(seconds, STALL_AFTER_ANNOTATION)
    text = str(err.value)
    assert text.startswith(f"{STALL_AFTER_ANNOTATION}={seconds!r}: ")
    assert "between 5s and 30 days" in text and "0 (off)" in text and "auto" in text


@given(text=st.text(min_size=1, max_size=12).filter(
    lambda t: t.strip().lower() != "auto" and not any(c.isdigit() for c in t)))
def test_not_a_duration_is_refused_by_name(text: str) -> None:
    with pytest.raises(StallSettingError, match="not a duration"):
        parse_stall_after(text, "stall-after")


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "Infinity", float("inf")])
def test_infinity_is_not_a_duration(value: object) -> None:
    with pytest.raises(StallSettingError, match="not a duration"):
        parse_stall_after(value, "stall-after")


@pytest.mark.parametrize("value", ["auto", " AUTO ", None])
def test_auto(value: str | None) -> None:
    assert parse_stall_after(value, "f") is None


@pytest.mark.parametrize("value", ["0", 0, "0s", "0m"])
def test_zero_is_off(value: object) -> None:
    assert parse_stall_after(value, "f") == 0.0


def test_the_flag_refuses_a_bad_value_by_name() -> None:
    with pytest.raises(ConfigError) as err:
        load_settings({"stall_after": "3s"})
    assert "stall-after='3s': must be 0 (off), auto, or between 5s and 30 days" in str(err.value)
    assert load_settings({"stall_after": "10m"}).stall_after == 600.0
    assert load_settings({}).stall_after is None


# ---------------------------------------------------------------- the auto threshold


@given(gap=gaps, interval=intervals)
def test_auto_threshold_bounds(gap: float, interval: float) -> None:
    threshold = auto_threshold(gap, interval)
    assert threshold >= STALL_FLOOR_SECONDS
    assert threshold >= STALL_GAP_FACTOR * gap
    assert threshold >= STALL_GAP_FACTOR * interval
    assert threshold == max(STALL_FLOOR_SECONDS, STALL_GAP_FACTOR * max(gap, interval))


@given(a=gaps, b=gaps, interval=intervals)
def test_auto_threshold_grows_with_the_longest_gap(a: float, b: float, interval: float) -> None:
    assume(a <= b)
    assert auto_threshold(a, interval) <= auto_threshold(b, interval)


# ---------------------------------------------------------------- timelines


def _run(clock: StallClock, until: float, *, step: float, given_: float | None,
         interval: float, start: float) -> list[tuple[float, Transition]]:
    """Check ``clock`` every ``step`` seconds from ``start`` to ``until``."""
    out = []
    t = start
    while t <= until:
        moved = clock.check(t, watched=True, answers=True, given=given_, interval=interval)
        if moved is not None:
            out.append((t, moved))
        t += step
    return out


def _within(start: float, elapsed: float) -> float:
    """The latest clock reading ``now`` with ``now - start <= elapsed`` as the rule
    computes it (``start + elapsed`` rounds, and may measure a few ulps longer)."""
    now = start + elapsed
    while now - start > elapsed:
        now = math.nextafter(now, -math.inf)
    return now


@given(changes=st.lists(gaps, min_size=1, max_size=20), interval=intervals,
       pause_share=st.floats(min_value=0.0, max_value=1.0))
# Drawn once by a CI run: a pause of exactly 3x the longest gap came out STALLED, because
# the test derived the pause from the gap it fed in (4054.3364101711622), not from the gap
# the clock measured between two summed readings (4.5e-13 s shorter), and stepped to
# ``t + pause`` by repeated additions (measured 1.8e-12 s longer than the pause).
@example(changes=[166.9999899999998, 4054.3364101711622], interval=1.0, pause_share=1.0)
# Found by `make explore`: a pause below the clock's resolution at t.
@example(changes=[2731.0, 5461.0], interval=1.0, pause_share=2.220446049250313e-16)
def test_a_pause_no_longer_than_a_gap_already_seen_raises_nothing(
        changes: list[float], interval: float, pause_share: float) -> None:
    """An evaluation phase of a length already seen (or shorter) is no stall.

    Lengths are what the clock measures (differences of its readings), as in the
    scraper: the rule's promise is about measured gaps and pauses, so the pause is
    derived from the longest gap the clock measured and each check time is a reading
    whose distance from the last change is at most that pause.
    """
    clock = StallClock.start(_status(1), 0.0, 0.0)
    t = 0.0
    for n, gap in enumerate(changes):
        t += gap
        assert clock.observe(_status(1, f"{n}"), t, t)
    assert clock.longest_gap == pytest.approx(max(changes))
    pause = pause_share * clock.longest_gap * STALL_GAP_FACTOR  # up to 3x the longest gap
    step = max(1.0, pause / 50)
    checks = [_within(t, min(k * step, pause)) for k in range(math.ceil(pause / step) + 1)]
    raised = [(now, clock.check(now, watched=True, answers=True, given=None,
                                interval=interval)) for now in checks]
    assert [(now, e) for now, e in raised if e is not None] == []
    # The run reached the end of the pause (to the clock's resolution at ``t + pause``).
    assert checks[-1] - t == pytest.approx(pause, abs=2 * math.ulp(t + pause))


@given(changes=st.lists(gaps, min_size=0, max_size=10), interval=intervals)
def test_a_hang_raises_once_after_its_threshold_and_resumes_once(
        changes: list[float], interval: float) -> None:
    clock = StallClock.start(_status(3), 0.0, 0.0)
    t = 0.0
    for n, gap in enumerate(changes):
        t += gap
        clock.observe(_status(3, f"{n}"), t, t)
    threshold = auto_threshold(max(changes, default=0.0), interval)
    events = _run(clock, t + threshold * 1.5, step=threshold / 20, given_=None,
                  interval=interval, start=t)
    assert [e for _, e in events] == [Transition.STALLED]
    assert events[0][0] - t > threshold * (1 - 1e-9)
    assert events[0][0] - t <= threshold + threshold / 20 + 1e-6
    assert clock.stalled and clock.threshold == pytest.approx(threshold)
    resumed_at = t + threshold * 2
    assert clock.observe(_status(4, "x"), resumed_at, resumed_at)
    assert clock.check(resumed_at, watched=True, answers=True, given=None,
                       interval=interval) is Transition.RESUMED
    assert clock.last_gap == pytest.approx(threshold * 2)
    assert clock.longest_gap == pytest.approx(max([threshold * 2, *changes]))  # learned


@given(hang=st.floats(min_value=1.0, max_value=86400.0), interval=intervals)
def test_auto_is_not_armed_before_the_training_moved(hang: float, interval: float) -> None:
    """A slow first step (compilation, download) at 0 % is no stall under auto."""
    clock = StallClock.start(_status(0, "9.9"), 0.0, 0.0)
    assert clock.check(hang, watched=True, answers=True, given=None,
                       interval=interval) is None
    assert clock.threshold is None
    assert StallClock.start(_status(None), 0.0, 0.0).moved is False
    assert StallClock.start(_status(1), 0.0, 0.0).moved is True


@given(given_=st.floats(min_value=STALL_AFTER_MIN_SECONDS, max_value=86400.0),
       interval=intervals)
def test_a_given_threshold_applies_from_the_first_answer(given_: float, interval: float) -> None:
    clock = StallClock.start(_status(0), 0.0, 0.0)
    threshold = max(given_, STALL_INTERVALS_MIN * interval)
    assert clock.check(threshold, watched=True, answers=True, given=given_,
                       interval=interval) is None
    assert clock.check(threshold + 0.5, watched=True, answers=True, given=given_,
                       interval=interval) is Transition.STALLED


@given(hang=st.floats(min_value=0.0, max_value=10 * 86400.0), interval=intervals)
def test_off_suspended_or_gone_is_never_stalled(hang: float, interval: float) -> None:
    clock = StallClock.start(_status(50), 0.0, 0.0)
    assert clock.check(hang, watched=True, answers=True, given=0.0, interval=interval) is None
    assert clock.check(hang, watched=False, answers=True, given=None, interval=interval) is None
    assert not clock.stalled


def test_a_stalled_training_that_is_suspended_is_cleared_not_resumed() -> None:
    clock = StallClock.start(_status(50), 0.0, 0.0)
    assert clock.check(1000.0, watched=True, answers=True, given=None,
                       interval=30.0) is Transition.STALLED
    assert clock.check(1001.0, watched=False, answers=True, given=None,
                       interval=30.0) is Transition.CLEARED
    assert not clock.stalled


def test_a_target_down_keeps_the_state_it_had() -> None:
    """An exporter that stops answering is target down, not a stall (nor a resume)."""
    clock = StallClock.start(_status(50), 0.0, 0.0)
    assert clock.check(1000.0, watched=True, answers=False, given=None, interval=30.0) is None
    assert not clock.stalled
    assert clock.check(1000.0, watched=True, answers=True, given=None,
                       interval=30.0) is Transition.STALLED
    assert clock.check(2000.0, watched=True, answers=False, given=None, interval=30.0) is None
    assert clock.stalled


def test_a_larger_threshold_clears_without_a_resume() -> None:
    clock = StallClock.start(_status(50), 0.0, 0.0)
    assert clock.check(100.0, watched=True, answers=True, given=60.0,
                       interval=1.0) is Transition.STALLED
    assert clock.check(101.0, watched=True, answers=True, given=3600.0,
                       interval=1.0) is Transition.CLEARED


@given(at=st.floats(min_value=0.0, max_value=1e6))
def test_last_updated_time_alone_is_no_change(at: float) -> None:
    clock = StallClock.start(_status(10, "1.0"), 0.0, 0.0)
    assert not clock.observe(_status(10, "1.0", at=at), 5.0, 5.0)
    assert clock.changed_at == 0.0
    assert clock.observe(_status(10, "0.9", at=at), 6.0, 6.0)
    assert clock.observe(_status(11, "0.9", at=at), 7.0, 7.0)


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (45.4, "45s"), (60, "1m"), (754, "12m34s"), (3600, "1h"), (7500, "2h5m")])
def test_describe_seconds(seconds: float, text: str) -> None:
    assert describe_seconds(seconds) == text
