"""The adaptive write rate's rule: additive increase, multiplicative decrease (AIMD).

A pure state machine (no I/O, no event loop): it is told the outcome of each status
write (:meth:`RateRule.observe`) and answers the rate the writes may use now.

* The rate starts at ``floor`` (``--write-qps``) and never leaves ``[floor, ceiling]``.
* Decrease: a write answered 429 (the API server's API Priority and Fairness rejected
  it, or another limiter did), a write that timed out, or a window whose median
  latency rose above what the writes have shown (over
  :data:`LATENCY_FACTOR` times the lowest window median of the last
  :data:`BASELINE_WINDOWS` windows, and at least :data:`LATENCY_MARGIN_SECONDS` above
  it; judged as soon as :data:`LATENCY_SAMPLES` writes of the window are in and most
  are over) multiplies the rate by :data:`DECREASE_FACTOR`, at most once per window (the
  writes in flight when the API server pushed back all come back with the same
  signal; one halving answers them all).
* ``Retry-After`` of a 429 holds every write until then (:attr:`RateRule.hold_until`;
  capped at :data:`RETRY_AFTER_MAX_SECONDS` so a stop stays prompt).
* Increase: a window (:data:`WINDOW_SECONDS`) that closes with no decrease signal,
  its median latency within the bound, and the budget in use (the writes that
  succeeded in it were at least :data:`DEMAND_SHARE` of what the rate allowed) adds
  ``(ceiling - floor) / RAMP_WINDOWS``: from the floor to the ceiling in
  :data:`RAMP_WINDOWS` windows.  An idle scraper never raises its rate, so a rate it
  has not tried is never spent at once.
* A 429 never raises the rate: a window that a decrease signal (or a failure that says
  nothing of load, e.g. a refused connection) closes is not counted for an increase.

Why AIMD and these constants: docs/decisions.md ("Adaptive write rate").
"""

from __future__ import annotations

import enum
import statistics
from collections import deque
from dataclasses import dataclass, field

__all__ = ["BASELINE_WINDOWS", "DECREASE_FACTOR", "DEMAND_SHARE", "LATENCY_FACTOR",
           "LATENCY_MARGIN_SECONDS", "LATENCY_SAMPLES", "RAMP_WINDOWS", "RETRY_AFTER_MAX_SECONDS",
           "WINDOW_SECONDS", "Change", "RateRule", "Reason", "Signal"]

#: Length of one window of observations (seconds).
WINDOW_SECONDS = 1.0
#: The rate after a decrease, as a share of the rate before.
DECREASE_FACTOR = 0.5
#: Windows from the floor to the ceiling while every window allows an increase.
RAMP_WINDOWS = 20
#: Share of the allowed writes a window must have used to count as demand.
DEMAND_SHARE = 0.5
#: A window's median latency over this many times the baseline is a decrease ...
LATENCY_FACTOR = 2.0
#: ... when it is also this many seconds above it (a 2 ms baseline doubling is noise).
LATENCY_MARGIN_SECONDS = 0.05
#: Writes of a window before its median is judged before the window ends.
LATENCY_SAMPLES = 5
#: Windows whose medians the baseline (their lowest) is taken from.
BASELINE_WINDOWS = 60
#: Longest ``Retry-After`` honoured (seconds).
RETRY_AFTER_MAX_SECONDS = 30.0


class Signal(enum.Enum):
    """What one write's answer said about the API server's load."""

    OK = "ok"  #: answered 2xx (or any answer that is no sign of load, e.g. 409)
    THROTTLED = "throttled"  #: 429 without API Priority and Fairness' headers
    APF_REJECTED = "apf_rejected"  #: 429 from API Priority and Fairness
    TIMEOUT = "timeout"  #: no answer in time (or 504)
    OTHER = "other"  #: a failure that says nothing about load (connection refused, 5xx)


class Reason(enum.Enum):
    """Why the rate changed: the ``reason`` label of the changes' counter."""

    WRITES_FAST = "writes_fast"
    THROTTLED = "throttled"
    APF_REJECTED = "apf_rejected"
    TIMEOUT = "timeout"
    LATENCY = "latency"


_DECREASES = {Signal.THROTTLED: Reason.THROTTLED, Signal.APF_REJECTED: Reason.APF_REJECTED,
              Signal.TIMEOUT: Reason.TIMEOUT}


@dataclass(frozen=True)
class Change:
    """A change of the rate: ``before`` and ``after`` in writes per second."""

    before: float
    after: float
    reason: Reason


@dataclass
class RateRule:
    """The AIMD rule (module doc).

    Args:
        floor: the lowest rate and the starting one (writes per second, > 0).
        ceiling: the highest rate (writes per second, >= floor).
        start: the time of the first window (seconds, the caller's monotonic clock).

    Raises:
        ValueError: ``floor`` not > 0 or ``ceiling`` below it.
    """

    floor: float
    ceiling: float
    start: float = 0.0
    rate: float = field(init=False)
    hold_until: float = field(init=False)
    _window_start: float = field(init=False)
    _latencies: list[float] = field(init=False, default_factory=list)
    _medians: deque[float] = field(init=False,
                                   default_factory=lambda: deque(maxlen=BASELINE_WINDOWS))
    _last_decrease: float = field(init=False, default=float("-inf"))
    _over: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not self.floor > 0:
            raise ValueError(f"write rate floor: {self.floor!r} is not above 0")
        if not self.ceiling >= self.floor:
            raise ValueError(f"write rate ceiling: {self.ceiling!r} is below the floor "
                             f"{self.floor!r}")
        self.rate = self.floor
        self.hold_until = self.start
        self._window_start = self.start

    @property
    def step(self) -> float:
        """The additive increase (writes per second per window)."""
        return (self.ceiling - self.floor) / RAMP_WINDOWS

    def baseline(self) -> float | None:
        """The lowest window median latency of the last :data:`BASELINE_WINDOWS` windows
        (seconds), None before the first window closed."""
        return min(self._medians) if self._medians else None

    def latency_bound(self) -> float | None:
        """Seconds a window's median latency may reach without a decrease."""
        base = self.baseline()
        if base is None:
            return None
        return max(base * LATENCY_FACTOR, base + LATENCY_MARGIN_SECONDS)

    def observe(self, at: float, signal: Signal, seconds: float = 0.0,
                retry_after: float | None = None) -> Change | None:
        """Take the outcome of one write that ended at ``at``, took ``seconds`` and said
        ``signal`` (``retry_after``: a 429's ``Retry-After`` seconds).

        Returns:
            The change of the rate this caused, or None.
        """
        if signal in _DECREASES:
            if retry_after is not None:
                held = min(max(retry_after, 0.0), RETRY_AFTER_MAX_SECONDS)
                self.hold_until = max(self.hold_until, at + held)
            self._reset_window(at)  # a window with a push-back never counts for a raise
            return self._decrease(at, _DECREASES[signal])
        if signal is Signal.OTHER:
            self._reset_window(at)  # nor does a window with a failure (API unreachable)
            return None
        change = self._close_window(at) if at - self._window_start >= WINDOW_SECONDS else None
        self._latencies.append(max(0.0, seconds))
        bound = self.latency_bound()
        if bound is not None and seconds > bound:
            self._over += 1
            # Most of the window's writes already slower than the bound: its median is,
            # whatever comes later in it; slow answers are few, so do not wait for its end.
            if len(self._latencies) >= LATENCY_SAMPLES and 2 * self._over > len(self._latencies):
                return self._decrease(at, Reason.LATENCY) or change
        return change

    def _close_window(self, at: float) -> Change | None:
        elapsed = at - self._window_start
        latencies = self._latencies
        self._reset_window(at)
        if not latencies:
            return None
        median = statistics.median(latencies)
        bound = self.latency_bound()
        self._medians.append(median)
        if bound is not None and median > bound:
            return self._decrease(at, Reason.LATENCY)
        if len(latencies) < DEMAND_SHARE * self.rate * elapsed:
            return None  # the budget did not bind: no evidence a higher rate is needed
        return self._set(min(self.ceiling, self.rate + self.step), Reason.WRITES_FAST)

    def _reset_window(self, at: float) -> None:
        self._window_start = at
        self._latencies = []
        self._over = 0

    def _decrease(self, at: float, reason: Reason) -> Change | None:
        if at - self._last_decrease < WINDOW_SECONDS:
            return None
        self._last_decrease = at
        return self._set(max(self.floor, self.rate * DECREASE_FACTOR), reason)

    def _set(self, rate: float, reason: Reason) -> Change | None:
        if rate == self.rate:
            return None
        change = Change(self.rate, rate, reason)
        self.rate = rate
        return change
