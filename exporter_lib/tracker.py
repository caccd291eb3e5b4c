"""Progress percentage and remaining time from steps and measured step durations.

The estimate is ``remaining_steps x typical_seconds_per_step``, where the
typical duration is the median of the most recent per-step durations.  Why the
median of a window:

* warm-up (compilation, cache filling, first data loads) makes the first steps
  slow; the first ``warmup_steps`` intervals after a start or resume are not measured;
* evaluation, checkpointing or a stall show up as a few very long intervals; a
  median ignores them, and :meth:`ProgressTracker.paused` excludes a known pause outright;
* a resumed job starts at ``initial_step``; progress counts from step 0 of the
  whole run, speed only from what this process measured;
* speed changes (a new phase, a different sequence length) are followed as the
  window (``window`` intervals) moves.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from exporter_lib.status import PROGRESS_MAX, REMAINING_SECONDS_MAX

Reporter = Callable[..., None]


class ProgressTracker:
    """Derives ``progressPercentage`` and ``estimatedRemainingSeconds`` from steps.

    Args:
        total_steps: steps in the whole run (> 0); may be changed later via :attr:`total_steps`.
        initial_step: the step a resumed job starts at (0 for a fresh run).
        warmup_steps: intervals not measured at the start and after a step goes backwards
            (default 2).
        window: how many recent per-step durations the median is taken over (default 50).
        report: called as ``report(progress_percentage=..., estimated_remaining_seconds=...,
            metrics=...)`` after each step; defaults to :func:`exporter_lib.update`.
            Pass ``None`` to only compute.
        clock: monotonic seconds (tests pass a fake clock).

    Progress is ``floor(100 * step / total_steps)`` clamped to 0..100, so 100 means
    the last step is done.  The remaining time is ``None`` until one interval has been
    measured, then whole seconds rounded up, 0 once ``step >= total_steps``.
    """

    def __init__(self, total_steps: int, *, initial_step: int = 0, warmup_steps: int = 2,
                 window: int = 50, report: Reporter | str | None = "default",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total_steps = total_steps
        self.step_count = initial_step
        self._warmup = max(0, warmup_steps)
        self._skip = self._warmup
        self._durations: deque[float] = deque(maxlen=max(1, window))
        self._clock = clock
        self._last_time: float | None = None
        self._paused_at: float | None = None
        self._lock = threading.Lock()
        if report == "default":
            from exporter_lib import api  # late: api imports this module's users

            self._report: Reporter | None = api.update
        else:
            self._report = report if callable(report) else None

    # -- input ------------------------------------------------------------------

    def step(self, step: int | None = None, *, metrics: Mapping[str, object] | None = None,
             ) -> None:
        """Record that ``step`` (default: previous step + 1) has just finished, and report.

        A jump of several steps is measured as that many equal steps.  A step
        that goes backwards (a restart from a checkpoint) resets the measurements.
        Never raises into the training loop for bad input; a non-int step is ignored.
        """
        now = self._clock()
        with self._lock:
            current = self.step_count + 1 if step is None else step
            if not isinstance(current, int) or isinstance(current, bool):
                return
            advanced = current - self.step_count
            if advanced < 0:
                self._reset_measurements()
            elif self._paused_at is None and self._last_time is not None and advanced > 0:
                if self._skip > 0:
                    self._skip -= 1
                else:
                    per_step = (now - self._last_time) / advanced
                    self._durations.extend([per_step] * min(advanced, self._durations.maxlen or 1))
            if advanced != 0 or self._last_time is None:
                self._last_time = now
            self.step_count = current
            progress, remaining = self._estimate()
        if self._report is not None:
            self._report(progress_percentage=progress, estimated_remaining_seconds=remaining,
                         metrics=metrics)

    def start(self) -> None:
        """Mark the start of timing (the first step's duration is then measured from here)."""
        with self._lock:
            self._last_time = self._clock()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Exclude a known pause (evaluation, checkpoint) from the step durations."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def pause(self) -> None:
        """Start excluding time (see :meth:`paused`)."""
        with self._lock:
            if self._paused_at is None:
                self._paused_at = self._clock()

    def resume(self) -> None:
        """Stop excluding time; the interval in progress continues from here."""
        with self._lock:
            if self._paused_at is not None and self._last_time is not None:
                self._last_time += self._clock() - self._paused_at
            self._paused_at = None

    # -- output -----------------------------------------------------------------

    @property
    def progress_percentage(self) -> int | None:
        """``floor(100 * step / total)`` in 0..100, or ``None`` without a positive total."""
        with self._lock:
            return self._estimate()[0]

    @property
    def estimated_remaining_seconds(self) -> int | None:
        """Remaining seconds (rounded up), or ``None`` before any measurement."""
        with self._lock:
            return self._estimate()[1]

    def seconds_per_step(self) -> float | None:
        """The median measured step duration in seconds, or ``None`` before any."""
        with self._lock:
            return self._median()

    def _estimate(self) -> tuple[int | None, int | None]:
        total = self.total_steps
        if not isinstance(total, int) or total <= 0:
            return None, None
        step = self.step_count
        progress = min(PROGRESS_MAX, max(0, (PROGRESS_MAX * step) // total))
        if step >= total:
            return progress, 0
        median = self._median()
        if median is None:
            return progress, None
        remaining = math.ceil((total - step) * median)
        return progress, min(max(remaining, 0), REMAINING_SECONDS_MAX)

    def _median(self) -> float | None:
        if not self._durations:
            return None
        ordered = sorted(self._durations)
        middle = len(ordered) // 2
        if len(ordered) % 2:
            return ordered[middle]
        return (ordered[middle - 1] + ordered[middle]) / 2

    def _reset_measurements(self) -> None:
        self._durations.clear()
        self._skip = self._warmup
        self._last_time = None
