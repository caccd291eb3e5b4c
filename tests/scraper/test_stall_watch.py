"""Stall detection applied (:class:`scraper.stall.watch.StallWatch`), in process.

The TrainJob store is the real :class:`scraper.shared.trainjobs.TrainJobStore` fed TrainJob
dicts as its informer would; the Event recorder and the annotation writer are recording
fakes of their Protocols (the real ones against the real API server:
``tests/e2e/test_stall_stack.py``); the clock is injected.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter_lib.status import TrainerStatus
from scraper.shared.trainjobs import TrainJobStore
from scraper.stall.rule import STALL_AFTER_ANNOTATION, STALLED_SINCE_ANNOTATION
from scraper.stall.watch import (
    REASON_INVALID_THRESHOLD,
    REASON_RESUMED,
    REASON_STALLED,
    Observed,
    StallCollector,
    StallWatch,
)

KEY = ("ns", "tj")


def _trainjob(uid: str = "u1", *, suspend: bool = False,
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "tj", "uid": uid, "resourceVersion": "1",
                         "annotations": annotations or {}},
            "spec": {"suspend": suspend}}


def _status(progress: int, loss: str = "1.0") -> TrainerStatus:
    return TrainerStatus(progress_percentage=progress, metrics=({"name": "loss", "value": loss},),
                         last_updated_time=datetime(2026, 6, 1, tzinfo=UTC))


@dataclass
class Bench:
    now: float = 1000.0
    status: TrainerStatus | None = None
    answers: bool = True
    running: bool = True
    refuse_marks: bool = False  # the annotation writer fails (the API server refuses)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    marks: list[str | None] = field(default_factory=list)
    tasks: list[Coroutine[Any, Any, None]] = field(default_factory=list)
    store: TrainJobStore = field(default_factory=lambda: TrainJobStore([None]))
    watch: StallWatch | None = None
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)

    def make(self, given: float | None = None) -> StallWatch:
        async def event(namespace: str, name: str, reason: str, message: str, *,
                        uid: str | None = None, event_type: str = "Warning") -> None:
            self.events.append((reason, event_type, message))

        class Events:
            pass

        events = Events()
        events.event = event  # type: ignore[attr-defined]

        async def mark(namespace: str, name: str, uid: str, value: str | None) -> None:
            if self.refuse_marks:
                raise RuntimeError("the API server refused the patch")
            self.marks.append(value)  # a merge patch of that one key, as the real writer's
            held = self.store.get(namespace, name)
            assert held is not None
            annotations = {} if held.stall_after is None else {
                STALL_AFTER_ANNOTATION: held.stall_after}
            if value is not None:
                annotations[STALLED_SINCE_ANNOTATION] = value
            self.store.on_event("MODIFIED", _trainjob(uid, suspend=held.suspended,
                                                      annotations=annotations))

        self.watch = StallWatch(
            targets=self.targets, store=self.store, events=events,  # type: ignore[arg-type]
            write_marker=mark, given=given, leading=lambda: True, ready=lambda: True,
            spawn=self.tasks.append, clock=lambda: self.now, wall=lambda: self.now)
        return self.watch

    def targets(self) -> list[Observed]:
        if not self.running:
            return []
        return [Observed(KEY, "u1", "tj-node-0-0", "p1", 1.0, self.status, self.answers)]

    def step(self, seconds: float, status: TrainerStatus | None = None) -> None:
        """Let ``seconds`` pass in checks of 1 s; ``status`` seen at the start."""
        assert self.watch is not None
        if status is not None:
            self.status = status
        end = self.now + seconds
        while self.now < end:
            self.now += 1.0
            self.watch.check()
            self.loop.run_until_complete(self._drain())

    async def _drain(self) -> None:
        while self.tasks:
            await self.tasks.pop(0)


def test_a_hang_raises_stalled_then_resumed_with_the_annotation_and_gauges() -> None:
    bench = Bench()
    bench.store.on_list(None, [_trainjob(annotations={STALL_AFTER_ANNOTATION: "20s"})])
    watch = bench.make()
    for n in range(10):  # moving: a change every 2 s
        bench.step(2, _status(n + 1, f"{n}"))
    assert bench.events == [] and bench.marks == []
    bench.step(19)  # the last change was 20 s ago: not more than 20 s
    assert bench.events == []
    bench.step(3)
    assert [(r, t) for r, t, _ in bench.events] == [(REASON_STALLED, "Warning")]
    message = bench.events[0][2]
    assert "last progress 10 %" in message and "threshold 20s (from annotation)" in message
    assert "last change at 1970-01-01T00:16:59Z" in message
    assert bench.marks == ["1970-01-01T00:16:59Z"]
    registry = CollectorRegistry()
    registry.register(StallCollector(watch, clock=lambda: bench.now))
    text = generate_latest(registry).decode()
    assert 'trainjob_progress_stalled{namespace="ns",trainjob="tj"} 1.0' in text
    assert 'trainjob_progress_seconds_since_change{namespace="ns",trainjob="tj"} 23.0' in text
    assert 'trainjob_progress_stall_threshold_seconds{namespace="ns",trainjob="tj"} 20.0' in text
    bench.step(1, _status(11, "x"))
    assert [r for r, _, _ in bench.events] == [REASON_STALLED, REASON_RESUMED]
    assert bench.events[1][1] == "Normal" and "progress 11 %" in bench.events[1][2]
    assert bench.marks == ["1970-01-01T00:16:59Z", None]
    bench.running = False  # the pod ends: its series go
    bench.step(1)
    assert "trainjob_progress_stalled{" not in generate_latest(registry).decode()


def test_suspended_target_down_or_pod_gone_raise_nothing() -> None:
    bench = Bench()
    bench.store.on_list(None, [_trainjob(suspend=True,
                                         annotations={STALL_AFTER_ANNOTATION: "5s"})])
    bench.make()
    bench.step(30, _status(5))
    bench.store.on_event("MODIFIED", _trainjob(annotations={STALL_AFTER_ANNOTATION: "5s"}))
    bench.answers = False
    bench.step(30)
    bench.running = False
    bench.step(30)
    assert bench.events == [] and bench.marks == []


def test_auto_waits_for_the_first_move_and_learns_the_pace() -> None:
    bench = Bench()
    bench.store.on_list(None, [_trainjob()])
    bench.make()
    bench.step(600, _status(0))  # a slow first step at 0 %
    assert bench.events == []
    bench.step(200, _status(1, "a"))  # a phase of 200 s, then moving
    bench.step(10, _status(2, "b"))
    bench.step(590, _status(3, "c"))  # < 3 x 600 s: no stall
    bench.step(1, _status(4, "d"))
    assert bench.events == []
    bench.step(1801)  # > 3 x the longest gap seen (600 s)
    assert [r for r, _, _ in bench.events] == [REASON_STALLED]
    assert "threshold 30m (auto: 3 x the longest gap seen, 10m" in bench.events[0][2]


def test_a_bad_annotation_is_an_event_naming_it_and_the_flag_applies() -> None:
    bench = Bench()
    bench.store.on_list(None, [_trainjob(annotations={STALL_AFTER_ANNOTATION: "1s"})])
    bench.make(given=10.0)
    bench.step(12, _status(5))
    reasons = [r for r, _, _ in bench.events]
    assert reasons == [REASON_INVALID_THRESHOLD, REASON_STALLED]
    assert f"{STALL_AFTER_ANNOTATION}='1s': must be 0 (off), auto, or between 5s" \
        in bench.events[0][2]


def test_a_bad_annotation_is_logged_once_per_value_and_trainjob(
        caplog: pytest.LogCaptureFixture) -> None:
    bench = Bench()
    bench.store.on_list(None, [_trainjob(annotations={STALL_AFTER_ANNOTATION: "1s"})])
    bench.make(given=0.0)  # off: nothing but the warning to log

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and STALL_AFTER_ANNOTATION in r.getMessage()]

    with caplog.at_level(logging.DEBUG, logger="scraper"):
        bench.step(10, _status(5))  # ten checks of the same value
        assert len(warnings()) == 1, warnings()
        assert "'1s': must be 0 (off), auto, or between 5s" in warnings()[0]
        bench.store.on_event("MODIFIED", _trainjob(annotations={STALL_AFTER_ANNOTATION: "9d"}))
        bench.step(5)
        assert len(warnings()) == 2 and "'9d'" in warnings()[1], warnings()
        # The same bad value on a TrainJob re-created under the name is a new warning.
        bench.store.on_event("MODIFIED", _trainjob("u2", annotations={
            STALL_AFTER_ANNOTATION: "9d"}))
        bench.step(5)
    assert len(warnings()) == 3, warnings()
    assert [r for r, _, _ in bench.events] == [REASON_INVALID_THRESHOLD] * 3


def test_a_deleted_trainjob_leaves_no_entry_behind() -> None:
    """Its clock, its bad-annotation warning and a failed marker write's backoff go when
    the TrainJob and its pod do (issue 27: maps bounded by the live objects)."""
    bench = Bench()
    bench.store.on_list(None, [_trainjob(annotations={STALL_AFTER_ANNOTATION: "1s"})])
    bench.refuse_marks = True
    watch = bench.make(given=5.0)
    bench.step(10, _status(5))
    assert [r for r, _, _ in bench.events] == [REASON_INVALID_THRESHOLD, REASON_STALLED]
    sizes = watch.sizes()
    assert sizes["clocks"] == sizes["warned"] == sizes["marker_failed"] == 1, sizes
    bench.running = False  # the pod is gone, the TrainJob stays: its warning is kept
    bench.step(1)
    assert watch.sizes()["warned"] == 1
    bench.store.on_event("DELETED", _trainjob(annotations={STALL_AFTER_ANNOTATION: "1s"}))
    bench.step(1)
    assert watch.sizes() == {"clocks": 0, "busy": 0, "marker_failed": 0, "warned": 0}


def test_a_new_leader_keeps_an_annotation_until_it_sees_a_move_or_the_pod_goes() -> None:
    bench = Bench()
    bench.store.on_list(None, [_trainjob(annotations={
        STALLED_SINCE_ANNOTATION: "2026-06-01T00:00:00Z"})])
    bench.make()
    bench.step(5, _status(40))
    assert bench.marks == []  # not seen moving: it may well still be stalled
    assert bench.events == []
    bench.step(1, _status(41, "moved"))
    assert bench.marks == [None]
    # The stall it found ends like any other: with TrainingResumed, once.
    assert [(r, t) for r, t, _ in bench.events] == [(REASON_RESUMED, "Normal")]
    assert "stall recorded since 2026-06-01T00:00:00Z" in bench.events[0][2]
    assert "progress 41 %" in bench.events[0][2]
    bench.step(3, _status(42, "again"))
    assert len(bench.events) == 1
    bench.store.on_event("MODIFIED", _trainjob(annotations={
        STALLED_SINCE_ANNOTATION: "2026-06-01T00:00:00Z"}))
    bench.running = False
    bench.step(1)
    assert bench.marks == [None, None]
    assert len(bench.events) == 1  # the pod went: no training to call resumed
