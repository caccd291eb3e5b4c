"""The in-memory status of one training process: cheap writes, lazy reads.

``update()`` runs inside the training loop, so it only does constant-time type
and range checks per value, stores the raw values under one lock and bumps a
generation counter.  Converting values to the API's strings and building the
validated :class:`~exporter_lib.status.TrainerStatus` happen at read time
(a scrape, a file write), once per generation.

Rules for values that break a Trainer API limit (each logged once per field or
metric name, with the reason; ``update()`` never raises):

* ``progress_percentage``: a real number; floats are floored (99.9 -> 99, so 100
  means done), then clamped to 0..100.  NaN, booleans and non-numbers are dropped.
* ``estimated_remaining_seconds``: a real number; rounded up to whole seconds,
  clamped to 0..2**31-1 (int32).  NaN, infinity, booleans and non-numbers are dropped.
* ``metrics``: a mapping of name -> value, merged into the metrics reported so
  far (a later value for a name replaces the earlier one).  Each rule below drops
  only the metric that breaks it, never the others.  A name that is not Unicode
  text of 1..64 code points is dropped.  Values: ``str`` (1..64 code points),
  ``bool``, ``int`` and ``float`` (NaN and infinities are kept as ``nan``/``inf``),
  any ``numbers.Real`` (numpy scalars) and objects with ``.item()`` returning a
  number (0-d tensors); anything else, and text longer than 64 code points, is
  dropped.  Text holding a lone surrogate (U+D800..U+DFFF, e.g. from
  ``os.fsdecode`` of undecodable bytes) is not Unicode text and is dropped: no
  UTF-8 or JSON carries it to the Trainer API.  Once 256 names are held, new
  names are dropped (existing ones still update).
"""

from __future__ import annotations

import logging
import math
import numbers
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from pydantic import ValidationError

from exporter_lib.status import (
    METRIC_NAME_MAX_LENGTH,
    METRIC_VALUE_MAX_LENGTH,
    METRICS_MAX_ITEMS,
    NOT_UNICODE,
    PROGRESS_MAX,
    PROGRESS_MIN,
    REMAINING_SECONDS_MAX,
    Metric,
    StatusError,
    TrainerStatus,
    describe_validation_error,
    is_unicode_text,
    metric_value_text,
)

log = logging.getLogger("exporter_lib")

# An int prints within 64 characters (sign included) strictly between these.
_INT_LOW = -(10**63)
_INT_HIGH = 10**64

#: A metric value as stored: already a type whose text fits the API.
MetricValue = str | bool | int | float


def progress_of(value: object) -> tuple[int | None, str | None]:
    """A reported ``progressPercentage`` as stored: floored to an int, clamped to
    ``PROGRESS_MIN..PROGRESS_MAX``; None for NaN or a non-number.  The second item says
    why the value was dropped or clamped (None: taken as it is).  Constant time."""
    if type(value) is int:
        number: float = value
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
        if math.isnan(number):
            return None, "NaN is not a percentage; dropped"
    else:
        return None, "not a number; dropped"
    if number < PROGRESS_MIN or number > PROGRESS_MAX:
        clamped = int(min(max(number, PROGRESS_MIN), PROGRESS_MAX))
        return clamped, f"outside {PROGRESS_MIN}..{PROGRESS_MAX}; clamped to {clamped}"
    return int(number), None  # floor for the non-negative numbers left


def remaining_of(value: object) -> tuple[int | None, str | None]:
    """A reported ``estimatedRemainingSeconds`` as stored: rounded up to an int, clamped
    to ``0..REMAINING_SECONDS_MAX`` (int32); None for a non-finite or non-number.  The
    second item as for :func:`progress_of`."""
    if type(value) is int:
        number: float = value
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
        if not math.isfinite(number):
            return None, "not a finite number; dropped"
    else:
        return None, "not a number; dropped"
    if number < 0 or number > REMAINING_SECONDS_MAX:
        clamped = 0 if number < 0 else REMAINING_SECONDS_MAX
        return clamped, f"outside 0..{REMAINING_SECONDS_MAX} (int32); clamped to {clamped}"
    return math.ceil(number), None


class State:
    """Thread-safe holder of the latest reported status.

    ``generation`` increases by one with every accepted change; readers use it
    to cache what they derive from a status.  ``rejected`` counts values dropped
    or clamped, by field (``progressPercentage``, ``estimatedRemainingSeconds``,
    ``metrics``).
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._progress: int | None = None
        self._remaining: int | None = None
        self._metrics: dict[str, MetricValue] = {}
        self._updated: float | None = None
        self._checkpoint: float | None = None
        self.generation = 0
        self._cache: tuple[int, TrainerStatus | None] = (0, None)
        self._warned: set[str] = set()
        self.rejected: dict[str, int] = {}
        #: Told, after a report changed the integer percentage (on the reporting thread,
        #: outside the lock; what it raises is logged once, never raised): the server
        #: wakes its waiting scrapes through it, so a new percentage is answered at once
        #: rather than at the next poll (:mod:`exporter_lib.waiting`).  None: nobody.
        self.on_progress: Callable[[], None] | None = None

    # -- writes -----------------------------------------------------------------

    def update(
        self,
        progress_percentage: float | None = None,
        estimated_remaining_seconds: float | None = None,
        metrics: Mapping[str, object] | None = None,
    ) -> None:
        """Record a report; ``None`` leaves a field as it was.  Never raises.

        ``lastUpdatedTime`` becomes the wall-clock time of this call.
        """
        try:
            progress = self._checked("progressPercentage", progress_percentage, progress_of)
            remaining = self._checked("estimatedRemainingSeconds", estimated_remaining_seconds,
                                      remaining_of)
            clean = self._clean_metrics(metrics) if metrics else None
            stamp = self._clock()
            with self._lock:
                moved = progress is not None and progress != self._progress
                if progress is not None:
                    self._progress = progress
                if remaining is not None:
                    self._remaining = remaining
                if clean:
                    held = self._metrics
                    if len(held) + len(clean) <= METRICS_MAX_ITEMS:
                        held.update(clean)
                    else:
                        self._merge_capped(clean)
                self._updated = stamp
                self.generation += 1
            if moved:
                self._progress_moved()
        except Exception as exc:  # the training loop must never see our bugs
            self._warn_once("update", f"update() failed and was ignored: {exc!r}")

    def _progress_moved(self) -> None:
        told = self.on_progress
        if told is None:
            return
        try:
            told()
        except Exception as exc:  # a report must never fail for a listener
            self._warn_once("on_progress", f"waking the waiting scrapes failed: {exc!r}")

    def checkpoint_saved(self, when: float | None = None) -> None:
        """Record that the training saved a checkpoint at ``when`` (unix seconds; default
        now).  ``lastUpdatedTime`` becomes now, as for :meth:`update`.  A time that is not
        a finite real number, lies more than :data:`CHECKPOINT_AHEAD_SECONDS` ahead of
        this clock (a save cannot come from the future, and a future time would hide
        every real save after it), or is earlier than the checkpoint already recorded, is
        ignored and logged once (the last checkpoint never moves back).  Never raises."""
        try:
            stamp = self._clock()
            saved = stamp if when is None else _checkpoint_time(when, stamp)
            if saved is None:
                self._reject("lastCheckpointTime", when,
                             "not a unix time in seconds from 0 up to "
                             f"{CHECKPOINT_AHEAD_SECONDS:.0f} s ahead of this clock; dropped")
                return
            with self._lock:
                if self._checkpoint is not None and saved < self._checkpoint:
                    ignored = True
                else:
                    ignored = False
                    self._checkpoint = saved
                    self._updated = stamp
                    self.generation += 1
            if ignored:
                self._warn_once("checkpoint back", "checkpoint_saved(): a time earlier than "
                                "the last checkpoint was ignored (logged once)")
        except Exception as exc:  # the training loop must never see our bugs
            self._warn_once("checkpoint", f"checkpoint_saved() failed and was ignored: {exc!r}")

    def replace(self, status: TrainerStatus, stamp: float | None = None) -> None:
        """Make ``status`` (already validated) the whole current status.

        Used by the push endpoint and the sidecar: an unset field there is unset here.
        Metrics are kept by name: of repeated names, the last one wins.
        ``stamp`` (unix seconds) defaults to now.
        """
        metrics: dict[str, MetricValue] = {m.name: m.value for m in status.metrics}
        when = self._clock() if stamp is None else stamp
        with self._lock:
            moved = status.progress_percentage != self._progress
            self._progress = status.progress_percentage
            self._remaining = status.estimated_remaining_seconds
            self._metrics = metrics
            self._updated = when
            if status.last_checkpoint_time is not None:
                self._checkpoint = status.last_checkpoint_time.timestamp()
            self.generation += 1
        if moved:
            self._progress_moved()

    # -- reads ------------------------------------------------------------------

    def status(self) -> TrainerStatus | None:
        """The current status, validated; ``None`` before the first update.

        Built once per generation (lazily, on the reader's thread) and cached.
        """
        cached_generation, cached = self._cache
        if cached_generation == self.generation:
            return cached
        with self._lock:
            generation = self.generation
            progress, remaining, stamp = self._progress, self._remaining, self._updated
            metrics = list(self._metrics.items())
            checkpoint = self._checkpoint
        status = None if stamp is None else self._build(progress, remaining, metrics, stamp,
                                                        checkpoint)
        self._cache = (generation, status)
        return status

    def _build(
        self,
        progress: int | None,
        remaining: int | None,
        metrics: list[tuple[str, MetricValue]],
        stamp: float,
        checkpoint: float | None = None,
    ) -> TrainerStatus:
        # Validated again although the inline checks already hold: pydantic-core's
        # validation measured faster than model_construct() for 256 metrics, and it
        # guards the wire contract against a bug in those checks.
        data: dict[str, object] = {
            "lastUpdatedTime": datetime.fromtimestamp(stamp, UTC),
            "metrics": [{"name": n, "value": metric_value_text(v)} for n, v in metrics],
        }
        if progress is not None:
            data["progressPercentage"] = progress
        if remaining is not None:
            data["estimatedRemainingSeconds"] = remaining
        if checkpoint is not None:
            # Floored first: fromtimestamp rounds to microseconds (1.9999995 -> 2.0).
            data["lastCheckpointTime"] = datetime.fromtimestamp(math.floor(checkpoint), UTC)
        try:
            return TrainerStatus.from_api(data)
        except StatusError:  # unreachable unless an inline check has a bug
            data["metrics"] = self._valid_metrics(data["metrics"])  # type: ignore[arg-type]
            return TrainerStatus.from_api(data)

    def _valid_metrics(self, metrics: list[dict[str, str]]) -> list[dict[str, str]]:
        """The metrics that pass validation one by one; each other one is dropped and logged.

        A safety net behind the inline checks: one bad metric must never take the others
        with it.
        """
        kept = []
        for item in metrics:
            try:
                Metric.model_validate(item)
            except ValidationError as exc:
                problems = "; ".join(describe_validation_error(exc))
                self.rejected["metrics"] = self.rejected.get("metrics", 0) + 1
                self._warn_once(f"build {item['name']!r}",
                                f"metric {item['name']!r} dropped: {problems}")
                continue
            kept.append(item)
        return kept

    # -- checks (constant time per value) ---------------------------------------

    def _checked(self, field: str, value: object,
                 check: Callable[[object], tuple[int | None, str | None]]) -> int | None:
        """``value`` as ``check`` takes it (None: not reported or dropped); a value
        dropped or clamped is counted and logged once under ``field``."""
        if value is None:
            return None
        kept, why = check(value)
        if why is not None:
            self._reject(field, value, why)
        return kept

    def _clean_metrics(self, metrics: Mapping[str, object]) -> dict[str, MetricValue]:
        clean: dict[str, MetricValue] = {}
        if not isinstance(metrics, Mapping):
            self._reject("metrics", metrics, "must be a mapping of name to value; dropped",
                         key="metrics type")
            return clean
        for name, value in metrics.items():
            if type(name) is not str or not 0 < len(name) <= METRIC_NAME_MAX_LENGTH:
                self._reject("metrics", name, "name must be a string of "
                             f"1..{METRIC_NAME_MAX_LENGTH} characters; dropped",
                             key=f"metrics name {name!r}", label="metrics name")
                continue
            if not name.isascii() and not is_unicode_text(name):
                self._reject("metrics", name, f"name {NOT_UNICODE}; dropped",
                             key=f"metrics name {name!r}", label="metrics name")
                continue
            kind = type(value)
            if kind is float or kind is bool:
                clean[name] = value  # type: ignore[assignment]
            elif kind is int:
                if _INT_LOW < value < _INT_HIGH:  # type: ignore[operator]
                    clean[name] = value  # type: ignore[assignment]
                else:
                    self._reject_metric(name, value, "integer longer than 64 digits")
            elif kind is str:
                text: str = value  # type: ignore[assignment]
                if not 0 < len(text) <= METRIC_VALUE_MAX_LENGTH:
                    self._reject_metric(name, text, f"text must be 1..{METRIC_VALUE_MAX_LENGTH}"
                                        " characters")
                elif text.isascii() or is_unicode_text(text):
                    clean[name] = text
                else:
                    self._reject_metric(name, text, f"text {NOT_UNICODE}")
            else:
                converted = self._convert(value)
                if converted is None:
                    self._reject_metric(name, value, "not a string, bool or real number")
                else:
                    clean[name] = converted
        return clean

    @staticmethod
    def _convert(value: object) -> float | None:
        """numpy scalars and 0-d tensors -> float; anything else -> None."""
        if isinstance(value, numbers.Real):
            return float(value)
        item = getattr(value, "item", None)
        if callable(item):
            try:
                inner = item()
            except Exception:  # e.g. a tensor with more than one element
                return None
            if isinstance(inner, numbers.Real):
                return float(inner)
        return None

    def _merge_capped(self, clean: dict[str, MetricValue]) -> None:
        # Called under the lock, only when the cap might be reached.
        held = self._metrics
        for name, value in clean.items():
            if name in held or len(held) < METRICS_MAX_ITEMS:
                held[name] = value
            else:
                self.rejected["metrics"] = self.rejected.get("metrics", 0) + 1
                key = "metrics cap"
                if key not in self._warned:
                    self._warned.add(key)
                    log.warning("metric %r dropped: at most %d metrics (Trainer v1alpha1 API "
                                "limit); further new names are dropped silently",
                                name, METRICS_MAX_ITEMS)

    def _reject_metric(self, name: str, value: object, reason: str) -> None:
        self._reject("metrics", value, f"{reason}; dropped", key=f"metrics value {name!r}",
                     label=f"metrics[{name!r}]")

    def _reject(self, field: str, value: object, reason: str, key: str | None = None,
                label: str | None = None) -> None:
        self.rejected[field] = self.rejected.get(field, 0) + 1
        self._warn_once(key or field, f"{label or field}={_short(value)}: {reason} "
                        "(Trainer v1alpha1 API limits; logged once)")

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)


def _short(value: object) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


#: How far ahead of this process's clock a reported checkpoint time may lie: room for a
#: file time from another host's clock (a checkpoint on shared storage), not more.
CHECKPOINT_AHEAD_SECONDS = 60.0


def _checkpoint_time(when: object, now: float) -> float | None:
    """``when`` as unix seconds, or None when it is no real number, not finite, before 0,
    or more than :data:`CHECKPOINT_AHEAD_SECONDS` after ``now``."""
    if not isinstance(when, numbers.Real) or isinstance(when, bool):
        return None
    try:
        value = float(when)
    except (OverflowError, ValueError, TypeError):
        return None
    if not math.isfinite(value) or value < 0 or value > now + CHECKPOINT_AHEAD_SECONDS:
        return None
    return value
