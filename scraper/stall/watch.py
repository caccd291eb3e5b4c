"""Stall detection, applied: one :class:`~scraper.stall.rule.StallClock` per watched TrainJob,
checked every :data:`CHECK_SECONDS` on the leader.

What it reads (no API call): the targets the manager scrapes (their last status, whether
the last scrape answered, their interval) and the TrainJob informer's store (suspended,
the ``stall-after`` and ``stalled-since`` annotations).  What it does, on the leader only:

* a Warning Event ``TrainingStalled`` when a training stops moving for longer than its
  threshold (its last progress, the time of its last change, the threshold and where the
  threshold comes from), a Normal Event ``TrainingResumed`` when it moves again;
* the TrainJob annotation ``trainjob-progress.dev/stalled-since`` (the last change's
  time) while it is stalled, removed when it moves, is suspended, its pod is gone, or
  detection is turned off: the kubectl plugin and the SDK read it from the TrainJob they
  already read.  Two writes per stall, whatever its length; a new leader keeps an
  annotation it finds until it sees the training move (or stop being watched).  A stall
  found by its annotation (recorded by an earlier leader or process, or for an earlier
  pod) ends like any other: ``TrainingResumed`` when the training moves again;
* the gauges of :class:`StallCollector` on ``/metrics``, one series per watched TrainJob.

Who is watched: a TrainJob that is not suspended, whose target pod runs (a target of the
manager) and has answered with a status.  A target that stops answering keeps its clock
but is never called stalled (``trainjob_scraper_target_up`` says it is down).  A bad
``stall-after`` annotation is a Warning Event ``InvalidStallThreshold`` (once per value)
and the scraper's setting applies.

Every Event and annotation write runs in a background task, at most one per TrainJob at
a time, so a mass stall (a shared file system hangs) never holds the check.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from aiolimiter import AsyncLimiter
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter_lib.status import TrainerStatus
from scraper.shared.trainjobs import TrainJobKey, TrainJobRecord
from scraper.stall.rule import (
    STALL_AFTER_ANNOTATION,
    STALL_FLOOR_SECONDS,
    STALL_GAP_FACTOR,
    STALLED_SINCE_ANNOTATION,
    StallClock,
    StallSettingError,
    Transition,
    describe_seconds,
    parse_stall_after,
    rfc3339,
)

log = logging.getLogger(__name__)

#: How often every clock is checked (seconds): the detection's resolution.
CHECK_SECONDS = 2.0
#: A failed annotation write is tried again after this long (seconds).
MARKER_RETRY_SECONDS = 30.0
#: Annotation writes' own budget (per second, burst): never the status writes' one.
MARKER_QPS = 5.0
MARKER_BURST = 10

REASON_STALLED = "TrainingStalled"
REASON_RESUMED = "TrainingResumed"
REASON_INVALID_THRESHOLD = "InvalidStallThreshold"


@dataclass(frozen=True)
class Observed:
    """One TrainJob's target as the manager holds it now.

    Attributes:
        trainjob: ``(namespace, name)``.
        trainjob_uid: the UID its pod's owner chain leads to (``""``: unknown).
        pod: the target pod's name; pod_uid: its UID (a new pod starts a new clock).
        interval: the target's scrape interval (seconds).
        status: its exporter's last status (None: none yet).
        answers: its last scrape succeeded.
    """

    trainjob: TrainJobKey
    trainjob_uid: str
    pod: str
    pod_uid: str
    interval: float
    status: TrainerStatus | None
    answers: bool



class EventRecorder(Protocol):
    """:class:`scraper.kube.events.EventRecorder`."""

    async def event(self, namespace: str, name: str, reason: str, message: str, *,
                    uid: str | None = None, event_type: str = "Warning") -> None: ...


#: Writes the ``stalled-since`` annotation (None: removes it) of TrainJob ``uid``;
#: raises on failure.
MarkerWriter = Callable[[str, str, str, str | None], Awaitable[None]]


@dataclass
class _Watched:
    pod_uid: str
    clock: StallClock
    given: float | None = None
    source: str = "auto"
    watched: bool = False
    #: The ``stalled-since`` annotation the TrainJob carried when this clock started:
    #: a stall recorded before it, which ends with ``TrainingResumed`` when it moves.
    inherited: str | None = None


class StallWatch:
    """The clocks of every watched TrainJob and what their transitions record.

    Args:
        targets: the manager's targets now, one per TrainJob (:class:`Observed`).
        store: the TrainJob informer's store.
        events: records Events (best effort).
        write_marker: writes the annotation; None: no annotation (Events and gauges only).
        given: the scraper's ``--stall-after`` (None: auto; 0: off).
        leading: True while this replica leads (only the leader checks and records).
        ready: True once pods and TrainJobs were listed (before, "no target" means
            "not listed yet", not "pod gone").
        spawn: runs a background coroutine (the supervisor's background tasks).
        clock, wall: monotonic and epoch seconds (injectable for tests).
    """

    def __init__(self, *, targets: Callable[[], Iterable[Observed]], store: Any,
                 events: EventRecorder, write_marker: MarkerWriter | None,
                 given: float | None, leading: Callable[[], bool],
                 ready: Callable[[], bool],
                 spawn: Callable[[Coroutine[Any, Any, None]], object],
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self._targets = targets
        self._store = store
        self._events = events
        self._write_marker = write_marker
        self._given = given
        self._leading = leading
        self._ready = ready
        self._spawn = spawn
        self._clock = clock
        self._wall = wall
        self.clocks: dict[TrainJobKey, _Watched] = {}
        self._busy: set[TrainJobKey] = set()  # an Event or annotation write in flight
        self._marker_failed: dict[TrainJobKey, float] = {}
        # (TrainJob uid, invalid annotation value) warned of, per TrainJob
        self._warned: dict[TrainJobKey, tuple[str, str]] = {}
        self._limiter = AsyncLimiter(MARKER_BURST, MARKER_BURST / MARKER_QPS)
        self._forbidden_logged = False

    async def run(self) -> None:
        """Check every :data:`CHECK_SECONDS` until cancelled (a root task)."""
        while True:
            await asyncio.sleep(CHECK_SECONDS)
            try:
                self.check()
            except Exception:  # a bug must not end detection silently
                log.exception("stall check failed")

    def sizes(self) -> dict[str, int]:
        """Entries of each map kept per TrainJob."""
        return {"clocks": len(self.clocks), "busy": len(self._busy),
                "marker_failed": len(self._marker_failed), "warned": len(self._warned)}

    def stop_leading(self) -> None:
        """Forget every clock (a new term starts over; the annotations stay for it)."""
        self.clocks.clear()

    # ------------------------------------------------------------ the check

    def check(self) -> None:
        """One pass over every target and every TrainJob carrying the annotation."""
        if not self._leading():
            self.clocks.clear()
            return
        if not self._ready():
            return
        now, wall = self._clock(), self._wall()
        seen: set[TrainJobKey] = set()
        for obs in self._targets():
            seen.add(obs.trainjob)
            self._check_one(obs, now, wall)
        for key in [k for k in self.clocks if k not in seen]:
            entry = self.clocks.pop(key)
            if entry.clock.stalled:
                log.info("TrainJob %s/%s: no longer watched for stalls (its target pod "
                         "ended or is gone)", *key)
        # A deleted TrainJob's warning and marker backoff go with it (kept while it
        # exists, so a pod that comes back is not warned of the same value again).
        for table in (self._warned, self._marker_failed):
            for key in [k for k in table if k not in seen and self._store.get(*k) is None]:
                del table[key]
        self._reconcile_markers()

    def _check_one(self, obs: Observed, now: float, wall: float) -> None:
        key = obs.trainjob
        record: TrainJobRecord | None = self._store.get(*key)
        entry = self.clocks.get(key)
        if entry is None or entry.pod_uid != obs.pod_uid:
            if obs.status is None:
                self.clocks.pop(key, None)
                return
            entry = _Watched(obs.pod_uid, StallClock.start(obs.status, now, wall),
                             inherited=record.stalled_since if record is not None else None)
            self.clocks[key] = entry
        elif obs.status is not None:
            entry.clock.observe(obs.status, now, wall)
        entry.given, entry.source = self._setting(key, record)
        entry.watched = (record is not None and not record.suspended
                         and (not obs.trainjob_uid or record.uid == obs.trainjob_uid))
        transition = entry.clock.check(now, watched=entry.watched, answers=obs.answers,
                                       given=entry.given, interval=obs.interval)
        if transition is Transition.STALLED:
            entry.inherited = None  # this clock's own stall now; its end is its own Event
            self._record(key, record, REASON_STALLED, self._stalled_message(entry, obs, now),
                         "Warning")
        elif transition is Transition.RESUMED:
            self._record(key, record, REASON_RESUMED, self._resumed_message(entry), "Normal")
        elif transition is Transition.CLEARED:
            log.info("TrainJob %s/%s: stall ended without a change (suspended, detection "
                     "off or a longer threshold)", *key)
        elif (entry.inherited is not None and entry.watched
              and entry.clock.moved_since_start and not entry.clock.stalled):
            self._record(key, record, REASON_RESUMED, self._inherited_message(entry), "Normal")
            entry.inherited = None

    def _setting(self, key: TrainJobKey, record: TrainJobRecord | None) -> tuple[float | None, str]:
        """``(threshold setting, where it comes from)`` for one TrainJob."""
        raw = record.stall_after if record is not None else None
        if raw is not None:
            try:
                return parse_stall_after(raw, STALL_AFTER_ANNOTATION), "annotation"
            except StallSettingError as exc:
                warned = (record.uid, raw) if record is not None else ("", raw)
                if self._warned.get(key) != warned:  # once per value and TrainJob
                    self._warned[key] = warned
                    # _record logs it (once) and records the Event.
                    self._record(key, record, REASON_INVALID_THRESHOLD,
                                 f"{exc}; the scraper's --stall-after applies", "Warning")
        else:
            self._warned.pop(key, None)
        return self._given, "--stall-after"

    # ------------------------------------------------------------ messages

    def _threshold_text(self, entry: _Watched) -> str:
        threshold = entry.clock.threshold or 0.0
        if entry.given is None:
            gap = entry.clock.longest_gap
            return (f"{describe_seconds(threshold)} (auto: {STALL_GAP_FACTOR:g} x the longest "
                    f"gap seen, {describe_seconds(gap)}, at least "
                    f"{describe_seconds(STALL_FLOOR_SECONDS)})")
        return f"{describe_seconds(threshold)} (from {entry.source})"

    def _stalled_message(self, entry: _Watched, obs: Observed, now: float) -> str:
        status = entry.clock.status
        progress = ("no progress reported" if status.progress_percentage is None
                    else f"last progress {status.progress_percentage} %")
        return (f"training stalled: no change for "
                f"{describe_seconds(entry.clock.since_change(now))} while pod {obs.pod} runs "
                f"and its exporter answers; {progress}, last change at "
                f"{rfc3339(entry.clock.changed_wall)}; threshold "
                f"{self._threshold_text(entry)}")

    def _resumed_message(self, entry: _Watched) -> str:
        status = entry.clock.status
        progress = ("" if status.progress_percentage is None
                    else f": progress {status.progress_percentage} %")
        return (f"training moves again after {describe_seconds(entry.clock.last_gap)} "
                f"without a change{progress}")

    @staticmethod
    def _inherited_message(entry: _Watched) -> str:
        status = entry.clock.status
        progress = ("" if status.progress_percentage is None
                    else f": progress {status.progress_percentage} %")
        return (f"training moves again after the stall recorded since {entry.inherited} "
                f"(found on the TrainJob when this scraper took it over){progress}")

    # ------------------------------------------------------------ I/O

    def _record(self, key: TrainJobKey, record: TrainJobRecord | None, reason: str, message: str,
                event_type: str) -> None:
        uid = record.uid if record is not None else None
        log.log(logging.WARNING if event_type == "Warning" else logging.INFO,
                "TrainJob %s/%s: %s", *key, message)
        self._spawn(self._events.event(key[0], key[1], reason, message, uid=uid,
                                       event_type=event_type))

    def _desired(self, key: TrainJobKey) -> str | bool | None:
        """The annotation value TrainJob ``key`` should carry; True: keep whatever it has
        (a new leader that has not seen the training move yet)."""
        entry = self.clocks.get(key)
        if entry is None or not entry.watched or entry.clock.threshold is None:
            return None
        if entry.clock.stalled:
            return rfc3339(entry.clock.changed_wall)
        return None if entry.clock.moved_since_start else True

    def _reconcile_markers(self) -> None:
        if self._write_marker is None:
            return
        keys = {k for k, e in self.clocks.items() if e.clock.stalled}
        keys.update(k for k, record in self._store.items() if record.stalled_since is not None)
        now = self._clock()
        for key in keys:
            if key in self._busy or now < self._marker_failed.get(key, float("-inf")):
                continue
            record = self._store.get(*key)
            if record is None:
                continue
            desired = self._desired(key)
            if desired is True or desired == record.stalled_since:
                continue
            assert desired is None or isinstance(desired, str)
            self._busy.add(key)
            self._spawn(self._mark(key, record.uid, desired))

    async def _mark(self, key: TrainJobKey, uid: str, value: str | None) -> None:
        assert self._write_marker is not None
        try:
            async with self._limiter:
                await self._write_marker(key[0], key[1], uid, value)
            self._marker_failed.pop(key, None)
            log.info("TrainJob %s/%s: annotation %s %s", *key, STALLED_SINCE_ANNOTATION,
                     "removed" if value is None else f"set to {value}")
        except Exception as exc:
            self._marker_failed[key] = self._clock() + MARKER_RETRY_SECONDS
            status = getattr(exc, "status", None)
            if status == 403 and self._forbidden_logged:
                return
            self._forbidden_logged = self._forbidden_logged or status == 403
            log.warning("TrainJob %s/%s: could not %s annotation %s: %s%s", *key,
                        "remove" if value is None else "set", STALLED_SINCE_ANNOTATION,
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                        " (needs patch on trainjobs: the chart's stall.annotate)"
                        if status == 403 else "")
        finally:
            self._busy.discard(key)


class StallCollector(Collector):
    """The per-TrainJob stall gauges (nothing on a standby: it has no clocks).

    * ``trainjob_progress_seconds_since_change``: seconds since the training's status
      last changed, as this scraper saw it (its first answer counts as a change);
    * ``trainjob_progress_stalled``: 1 while it is stalled, else 0;
    * ``trainjob_progress_stall_threshold_seconds``: its threshold now (absent while
      detection is off for it or ``auto`` is not armed).
    """

    def __init__(self, watch: StallWatch, clock: Callable[[], float] = time.monotonic) -> None:
        self._watch = watch
        self._clock = clock

    def collect(self) -> Iterable[Metric]:
        labels = ["namespace", "trainjob"]
        since = GaugeMetricFamily(
            "trainjob_progress_seconds_since_change", "Seconds since the training's status "
            "(progress, remaining time or a metric) last changed, as the scraper saw it",
            labels=labels)
        stalled = GaugeMetricFamily(
            "trainjob_progress_stalled", "1 while the training is stalled: no change for "
            "longer than its threshold while its pod runs and its exporter answers",
            labels=labels)
        threshold = GaugeMetricFamily(
            "trainjob_progress_stall_threshold_seconds", "The training's stall threshold "
            "now (auto: from its own pace; or its annotation or the scraper's setting)",
            labels=labels)
        now = self._clock()
        # Runs in the /metrics render thread (scraper/telemetry.py): a copy of the map,
        # and each value read once.
        for key, entry in list(self._watch.clocks.items()):
            labelled = [key[0], key[1]]
            clock = entry.clock
            since.add_metric(labelled, clock.since_change(now))
            stalled.add_metric(labelled, 1.0 if clock.stalled else 0.0)
            if (limit := clock.threshold) is not None:
                threshold.add_metric(labelled, limit)
        yield from (since, stalled, threshold)
