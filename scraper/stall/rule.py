"""Stall detection, the rule: when a training that runs and answers has stopped moving.

A training is *stalled* when its status has not changed (neither progress, nor the
remaining time, nor any metric; ``lastUpdatedTime`` alone is not a change) for longer
than its threshold, while its target pod runs and its exporter answers.  This module is
the pure part (no I/O, injectable clock), tested with hypothesis in
``tests/scraper/test_stall_rule.py``; :mod:`scraper.stall.watch` applies it to every
TrainJob and records Events, the ``stalled-since`` annotation and the gauges.

The threshold (docs/scraper.md, "Stall detection"):

* ``auto`` (default): derived from the training's own pace,
  ``max(STALL_FLOOR_SECONDS, STALL_GAP_FACTOR * max(longest gap, interval))``, where the
  longest gap is the longest time between two changes this scraper has seen (the first
  one counted from its first answer).  An evaluation or checkpoint phase of a length
  already seen makes a gap of that length, and the threshold is three times the longest
  one: the next phase of the same length, or up to three times as long, raises nothing.
  The floor covers trainings whose pace is not known yet; the interval term keeps the
  threshold above what polling can resolve.  ``auto`` is armed only once the training
  was seen moving (a change, or a first status above 0 %): a slow first step
  (compilation, download, NCCL set-up) is not a stall.
* a duration (the TrainJob annotation :data:`STALL_AFTER_ANNOTATION`, or the scraper's
  ``--stall-after``): that threshold, armed from the first answer, never below
  :data:`STALL_INTERVALS_MIN` scrape intervals (a change cannot be seen more often
  than once per interval);
* ``0``: off.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import UTC, datetime

from exporter_lib.status import TrainerStatus
from scraper.shared.stall_setting import AUTO as AUTO
from scraper.shared.stall_setting import STALL_AFTER_MAX_SECONDS as STALL_AFTER_MAX_SECONDS
from scraper.shared.stall_setting import STALL_AFTER_MIN_SECONDS as STALL_AFTER_MIN_SECONDS
from scraper.shared.stall_setting import STALL_FLOOR_SECONDS as STALL_FLOOR_SECONDS
from scraper.shared.stall_setting import STALL_GAP_FACTOR as STALL_GAP_FACTOR
from scraper.shared.stall_setting import STALL_INTERVALS_MIN as STALL_INTERVALS_MIN
from scraper.shared.stall_setting import StallSettingError as StallSettingError
from scraper.shared.stall_setting import parse_stall_after as parse_stall_after

# The TrainJob annotations (defined with the store that reads them): the one that sets a
# TrainJob's threshold (``auto``, ``0`` for off, or a duration such as ``10m``), and the
# one the scraper writes while the training is stalled (the time of its last change, RFC
# 3339 UTC; removed when it moves again or stops being watched).
from scraper.shared.trainjobs import STALL_AFTER_ANNOTATION as STALL_AFTER_ANNOTATION
from scraper.shared.trainjobs import STALLED_SINCE_ANNOTATION as STALLED_SINCE_ANNOTATION


def auto_threshold(longest_gap: float, interval: float) -> float:
    """The ``auto`` threshold (seconds) for the longest gap seen and the scrape interval."""
    return max(STALL_FLOOR_SECONDS, STALL_GAP_FACTOR * max(longest_gap, interval))


def given_threshold(seconds: float, interval: float) -> float:
    """A given threshold, raised to :data:`STALL_INTERVALS_MIN` scrape intervals."""
    return max(seconds, STALL_INTERVALS_MIN * interval)


def describe_seconds(seconds: float) -> str:
    """``seconds`` as ``45s``, ``12m``, ``2h5m`` (whole seconds, for Events and logs)."""
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{secs}s" if secs else f"{minutes}m"
    return f"{secs}s"


def rfc3339(epoch: float) -> str:
    """``epoch`` seconds as an RFC 3339 UTC time, whole seconds (``...Z``)."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Transition(enum.Enum):
    """What one :meth:`StallClock.check` changed."""

    STALLED = "stalled"  # it stopped moving for longer than its threshold
    RESUMED = "resumed"  # a stalled training changed again
    CLEARED = "cleared"  # a stalled training is no longer watched (suspended, pod gone...)


@dataclass
class StallClock:
    """The pace of one target's training, as this scraper saw it.

    Times are monotonic seconds except ``changed_wall`` (epoch seconds, for Events and
    the annotation).  The first answer starts the clock: when the status changed before
    it is unknown, so it counts as a change then (the safe side after a scraper start).

    Attributes:
        status: the last status seen.
        changed_at: when it last changed (or the first answer).
        changed_wall: the same instant on the wall clock.
        longest_gap: the longest time between two changes seen (0: none yet).
        last_gap: the time between the last two changes (0: none yet).
        moved: a change was seen, or the first status was above 0 %.
        moved_since_start: a change was seen by this clock (not only a first status).
        stalled: the last :meth:`check` found it stalled.
        threshold: the threshold of the last :meth:`check` (None: off).
    """

    status: TrainerStatus
    changed_at: float
    changed_wall: float
    longest_gap: float = 0.0
    last_gap: float = 0.0
    moved: bool = False
    moved_since_start: bool = False
    stalled: bool = False
    threshold: float | None = field(default=None)
    _stalled_at_change: float = field(default=float("-inf"), repr=False)

    @classmethod
    def start(cls, status: TrainerStatus, now: float, wall: float) -> StallClock:
        """The clock of a target's first status (seen at ``now``, ``wall``)."""
        return cls(status, now, wall, moved=(status.progress_percentage or 0) > 0)

    def observe(self, status: TrainerStatus, now: float, wall: float) -> bool:
        """Take the status seen at ``now``; True when it is a change (lastUpdatedTime
        alone is not)."""
        if status is self.status or status.same_report(self.status):
            self.status = status
            return False
        self.last_gap = now - self.changed_at
        self.longest_gap = max(self.longest_gap, self.last_gap)
        self.status, self.changed_at, self.changed_wall = status, now, wall
        self.moved = self.moved_since_start = True
        return True

    def threshold_for(self, given: float | None, interval: float) -> float | None:
        """The threshold (seconds) under setting ``given`` (None: auto; 0: off); None
        when off or, for auto, not armed yet."""
        if given is None:
            return auto_threshold(self.longest_gap, interval) if self.moved else None
        if given == 0:
            return None
        return given_threshold(given, interval)

    def check(self, now: float, *, watched: bool, answers: bool, given: float | None,
              interval: float) -> Transition | None:
        """Decide at ``now``; return the transition, if any.

        Args:
            watched: the TrainJob is not suspended and its target pod runs (False:
                any stall ends as CLEARED, never RESUMED).
            answers: its exporter's last scrape succeeded (False: target down, a
                different signal; the stall state is kept as it is).
            given: the threshold setting (None: auto; 0: off).
            interval: the target's scrape interval (seconds).
        """
        self.threshold = self.threshold_for(given, interval)
        if not watched or self.threshold is None:
            if self.stalled:
                self.stalled = False
                return Transition.CLEARED
            return None
        if not answers:
            return None
        stalled = now - self.changed_at > self.threshold
        if stalled == self.stalled:
            return None
        self.stalled = stalled
        if stalled:
            self._stalled_at_change = self.changed_at
            return Transition.STALLED
        # Not stalled any more without a change: a larger threshold (the setting changed).
        moved = self.changed_at != self._stalled_at_change
        return Transition.RESUMED if moved else Transition.CLEARED

    def since_change(self, now: float) -> float:
        """Seconds since the last change (or the first answer)."""
        return max(0.0, now - self.changed_at)
