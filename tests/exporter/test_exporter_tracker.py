"""ProgressTracker with a fake clock: warm-up, pauses, resumes, jumps."""

from __future__ import annotations

from typing import Any

from exporter_lib.tracker import ProgressTracker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(total: int, **kwargs: Any) -> tuple[ProgressTracker, Clock, list[dict[str, Any]]]:
    clock = Clock()
    reports: list[dict[str, Any]] = []
    tracker = ProgressTracker(total, clock=clock, report=lambda **kw: reports.append(kw),
                              **kwargs)
    tracker.start()
    return tracker, clock, reports


def test_progress_floor_and_done() -> None:
    tracker, clock, reports = make(3)
    for _ in range(3):
        clock.now += 1
        tracker.step()
    assert [r["progress_percentage"] for r in reports] == [33, 66, 100]
    assert reports[-1]["estimated_remaining_seconds"] == 0


def test_warmup_steps_are_not_measured() -> None:
    tracker, clock, _ = make(100, warmup_steps=2)
    for duration in (30.0, 20.0, 1.0, 1.0, 1.0):  # two slow warm-up steps
        clock.now += duration
        tracker.step()
    assert tracker.seconds_per_step() == 1.0
    assert tracker.estimated_remaining_seconds == 95


def test_no_estimate_before_a_measurement() -> None:
    tracker, clock, reports = make(10, warmup_steps=1)
    clock.now += 5
    tracker.step()
    assert reports[-1]["estimated_remaining_seconds"] is None
    assert reports[-1]["progress_percentage"] == 10


def test_evaluation_pause_outlier_is_ignored_by_median() -> None:
    tracker, clock, _ = make(1000, warmup_steps=0)
    for i in range(20):
        clock.now += 600.0 if i == 10 else 2.0  # one evaluation of 10 minutes
        tracker.step()
    assert tracker.seconds_per_step() == 2.0


def test_explicit_pause_excluded() -> None:
    tracker, clock, _ = make(100, warmup_steps=0)
    clock.now += 1
    tracker.step()
    with tracker.paused():
        clock.now += 500
    clock.now += 1
    tracker.step()
    assert tracker.seconds_per_step() == 1.0


def test_resumed_job_counts_from_checkpoint() -> None:
    tracker, clock, reports = make(200, initial_step=150, warmup_steps=1)
    for _ in range(4):
        clock.now += 3
        tracker.step()
    assert reports[-1]["progress_percentage"] == 77  # 154 / 200
    assert reports[-1]["estimated_remaining_seconds"] == 46 * 3


def test_step_jumps_and_restarts() -> None:
    tracker, clock, _ = make(100, warmup_steps=0)
    clock.now += 10
    tracker.step(10)  # ten steps in 10 s
    assert tracker.seconds_per_step() == 1.0
    clock.now += 1
    tracker.step(5)  # went backwards: restarted from a checkpoint
    assert tracker.seconds_per_step() is None and tracker.progress_percentage == 5


def test_bad_total_reports_nothing_and_never_raises() -> None:
    tracker, clock, reports = make(0)
    clock.now += 1
    tracker.step()
    tracker.step("x")  # type: ignore[arg-type]
    assert reports[-1]["progress_percentage"] is None
