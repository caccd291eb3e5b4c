"""The writes' token bucket at an adaptive rate (:mod:`scraper.write.rate_rule`).

:class:`AdaptiveRate` is used like :class:`aiolimiter.AsyncLimiter` (``async with
rate:`` takes a token) and is told each write's outcome (:meth:`AdaptiveRate.observe`).
When the rule changes the rate, a new :class:`aiolimiter.AsyncLimiter` of ``burst``
tokens refilled at the new rate replaces the old one (aiolimiter's public API has no
way to change a bucket's rate); its tokens are taken at once, so a change never grants
a burst, and a write that waited on the old bucket takes a token of the new one.
``Retry-After`` holds every write until then.

:func:`signal_of` reads a write's answer: 429 with API Priority and Fairness' headers
(``X-Kubernetes-PF-PriorityLevel-UID``, set by kube-apiserver on each request APF
classified) is an APF rejection, any other 429 a throttle, a timeout or 504 a timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

import urllib3
from aiolimiter import AsyncLimiter
from kubernetes.client.exceptions import ApiException

from scraper.kube.calls import retry_after
from scraper.write.rate_rule import Change, RateRule, Signal

__all__ = ["APF_HEADER", "AdaptiveRate", "adapts", "signal_of", "write_limiter"]

#: A header kube-apiserver sets on a response of a request API Priority and Fairness
#: classified (k8s.io/apiserver's filters: the flow control filter).
APF_HEADER = "X-Kubernetes-PF-PriorityLevel-UID"
#: Buckets taken in turn by one write when the rate keeps changing while it waits.
_REACQUIRES = 4


def signal_of(exc: BaseException | None) -> Signal:
    """What a write's answer says of the API server's load (module doc); ``exc`` is the
    write's exception, None when it succeeded."""
    if exc is None:
        return Signal.OK
    if isinstance(exc, ApiException):
        if exc.status == 429:
            headers = exc.headers or {}
            return Signal.APF_REJECTED if APF_HEADER in headers else Signal.THROTTLED
        if exc.status == 504:
            return Signal.TIMEOUT
        return Signal.OK if exc.status in (404, 409) else Signal.OTHER
    if isinstance(exc, TimeoutError | urllib3.exceptions.TimeoutError):
        return Signal.TIMEOUT
    return Signal.OTHER


class AdaptiveRate:
    """A token bucket whose rate follows :class:`scraper.write.rate_rule.RateRule`.

    Args:
        floor: starting and lowest rate (writes per second, ``--write-qps``).
        ceiling: highest rate (writes per second).
        burst: tokens the bucket holds (``--write-burst``).
        on_change: called with each :class:`~scraper.write.rate_rule.Change`.
        clock: monotonic seconds (the rule's windows and ``Retry-After``).

    Raises:
        ValueError: floor not > 0, ceiling below floor, or burst below 1.
    """

    def __init__(self, floor: float, ceiling: float, burst: int, *,
                 on_change: Callable[[Change], None] = lambda change: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if burst < 1:
            raise ValueError(f"write burst: {burst!r} is below 1")
        self._clock = clock
        self.rule = RateRule(floor, ceiling, start=clock())
        self.burst = burst
        self._on_change = on_change
        self._limiter = AsyncLimiter(burst, burst / floor)
        self._fresh = False

    @property
    def rate(self) -> float:
        """The rate writes may use now (writes per second)."""
        return self.rule.rate

    @property
    def max_rate(self) -> float:
        """Tokens of the bucket (as :attr:`aiolimiter.AsyncLimiter.max_rate`)."""
        return float(self.burst)

    @property
    def time_period(self) -> float:
        """Seconds to refill the bucket at the ceiling (as
        :attr:`aiolimiter.AsyncLimiter.time_period`): ``max_rate / time_period`` is the
        ceiling, the most writes per second this bucket lets through."""
        return self.burst / self.rule.ceiling

    async def acquire(self) -> None:
        """Wait for ``Retry-After`` to pass and for a token."""
        for _ in range(_REACQUIRES):
            # A sleep, not an Event: Retry-After names a time, nothing signals its end.
            while (wait := self.rule.hold_until - self._clock()) > 0:  # noqa: ASYNC110
                await asyncio.sleep(wait)
            limiter = self._limiter
            if self._fresh and limiter is self._limiter:
                self._fresh = False
                await limiter.acquire(self.burst)  # drain: the change grants no burst
            await limiter.acquire()
            if limiter is self._limiter and self.rule.hold_until <= self._clock():
                return

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        return None

    def observe(self, seconds: float, exc: BaseException | None = None) -> Change | None:
        """Tell the rule a write that took ``seconds`` ended with ``exc`` (None: it
        succeeded); returns the change of rate it caused."""
        signal = signal_of(exc)
        change = self.rule.observe(self._clock(), signal, seconds,
                                   retry_after(exc) if exc is not None else None)
        if change is not None:
            self._limiter = AsyncLimiter(self.burst, self.burst / change.after)
            self._fresh = True
            self._on_change(change)
        return change


def adapts(qps: float, qps_max: float) -> bool:
    """Whether the write rate adapts: a ceiling above the start rate (else it is fixed)."""
    return qps_max > qps


def _no_change(change: Change) -> None:
    return None


@dataclass(frozen=True)
class WriteBudget:
    """The status writes' budget: ``qps`` writes/s to start from (and the floor),
    ``burst`` tokens, ``qps_max`` the adaptive rate's ceiling (None or not above ``qps``:
    a fixed rate), each change of the rate told to ``on_rate_change``."""

    qps: float
    burst: int
    qps_max: float | None = None
    on_rate_change: Callable[[Change], None] = field(default=_no_change)


def write_limiter(budget: WriteBudget) -> AsyncLimiter | AdaptiveRate:
    """The status writes' bucket of ``budget.burst`` tokens: an :class:`AdaptiveRate` from
    ``budget.qps`` (start and floor) to ``budget.qps_max`` (each change to
    ``budget.on_rate_change``), or, when ``qps_max`` is None or not above ``qps``, a fixed
    ``aiolimiter`` bucket of ``qps``."""
    if budget.qps_max is not None and adapts(budget.qps, budget.qps_max):
        return AdaptiveRate(budget.qps, budget.qps_max, budget.burst,
                            on_change=budget.on_rate_change)
    return AsyncLimiter(budget.burst, budget.burst / budget.qps)
