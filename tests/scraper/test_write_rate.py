"""The adaptive write rate (scraper/write/rate_rule.py, scraper/write/rate.py).

The rule's properties are checked with hypothesis over any sequence of write outcomes on
a fake clock.  The hostile API server below is a stand-in by necessity: a real
kube-apiserver cannot be made to answer every write 429 with ``Retry-After: 0``, or 1 ms
and then 5 s; the writes' requests are replaced by coroutines that answer so, and the
token bucket, the rule and the event loop are the real ones.  The rise and fall against
a real kube-apiserver's API Priority and Fairness: tests/scraper/test_write_rate_apf.py.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException

from scraper.write.rate import APF_HEADER, AdaptiveRate, signal_of
from scraper.write.rate_rule import (
    RAMP_WINDOWS,
    RETRY_AFTER_MAX_SECONDS,
    WINDOW_SECONDS,
    Change,
    RateRule,
    Reason,
    Signal,
)

PUSH_BACK = (Signal.THROTTLED, Signal.APF_REJECTED, Signal.TIMEOUT)

events = st.lists(st.tuples(
    st.floats(min_value=0.0, max_value=3.0),  # seconds since the last outcome
    st.sampled_from(list(Signal)),
    st.floats(min_value=0.0, max_value=10.0),  # the write's latency
    st.one_of(st.none(), st.floats(min_value=0.0, max_value=120.0)),  # Retry-After
), max_size=300)
bounds = st.tuples(st.floats(min_value=0.01, max_value=1000.0),
                   st.floats(min_value=0.0, max_value=1000.0)).map(
                       lambda fc: (fc[0], fc[0] + fc[1]))


def too_many(retry_after: str | None = "1", apf: bool = True) -> ApiException:
    exc = ApiException(status=429, reason="Too Many Requests")
    headers = {APF_HEADER: "3b5f"} if apf else {}
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    exc.headers = headers
    return exc


@settings(max_examples=300, deadline=None)
@given(bounds, events)
def test_rate_stays_within_floor_and_ceiling_and_never_rises_on_push_back(
        fc: tuple[float, float], seq: list[tuple[float, Signal, float, float | None]]) -> None:
    floor, ceiling = fc
    rule = RateRule(floor, ceiling, start=0.0)
    now = 0.0
    for dt, signal, seconds, retry_after in seq:
        now += dt
        before, hold_before = rule.rate, rule.hold_until
        change = rule.observe(now, signal, seconds, retry_after)
        assert floor <= rule.rate <= ceiling
        if signal in PUSH_BACK:
            assert rule.rate <= before, "the rate rose on a 429 or a timeout"
            if retry_after is not None:
                assert rule.hold_until >= now + min(retry_after, RETRY_AFTER_MAX_SECONDS) - 1e-9
        else:
            assert rule.hold_until == hold_before
        if change is not None:
            assert (change.before, change.after) == (before, rule.rate)
            if change.after > change.before:
                assert change.reason is Reason.WRITES_FAST and signal is Signal.OK
                assert change.after - change.before <= rule.step + 1e-9


@settings(max_examples=200, deadline=None)
@given(bounds, events)
def test_at_most_one_decrease_per_window(
        fc: tuple[float, float], seq: list[tuple[float, Signal, float, float | None]]) -> None:
    rule = RateRule(*fc, start=0.0)
    now, decreases = 0.0, []
    for dt, signal, seconds, retry_after in seq:
        now += dt
        change = rule.observe(now, signal, seconds, retry_after)
        if change is not None and change.after < change.before:
            decreases.append(now)
    assert all(b - a >= WINDOW_SECONDS for a, b in itertools.pairwise(decreases))


def run_at_demand(rule: RateRule, start: float, windows: int, latency: float) -> float:
    """Writes as fast as the rule allows for ``windows`` windows; the time after."""
    now = start
    for _ in range(windows):
        n = max(1, int(rule.rate * WINDOW_SECONDS))
        for _ in range(n):
            now += WINDOW_SECONDS / n
            rule.observe(now, Signal.OK, latency)
    return now


def test_fast_writes_at_demand_raise_the_rate_to_the_ceiling_and_a_429_halves_it() -> None:
    rule = RateRule(20.0, 200.0, start=0.0)
    now = run_at_demand(rule, 0.0, RAMP_WINDOWS + 2, latency=0.02)
    assert rule.rate == 200.0
    change = rule.observe(now, Signal.APF_REJECTED, 0.001, retry_after=1.0)
    assert change == Change(200.0, 100.0, Reason.APF_REJECTED)
    assert rule.hold_until == now + 1.0
    now = run_at_demand(rule, now, 3, latency=0.02)
    assert 100.0 < rule.rate <= 100.0 + 3 * rule.step


def test_an_idle_scraper_does_not_raise_its_rate() -> None:
    rule = RateRule(20.0, 200.0, start=0.0)
    for i in range(100):  # 2 writes/s against a budget of 20
        rule.observe(i * 0.5, Signal.OK, 0.02)
    assert rule.rate == 20.0


def test_latency_rising_above_what_was_seen_lowers_the_rate() -> None:
    rule = RateRule(20.0, 200.0, start=0.0)
    now = run_at_demand(rule, 0.0, 10, latency=0.02)
    raised = rule.rate
    assert raised > 20.0
    changes = []
    for i in range(int(raised)):
        changes.append(rule.observe(now + (i + 1) / raised, Signal.OK, 0.5))
    changes.append(rule.observe(now + 1.0 + 1 / raised, Signal.OK, 0.5))
    made = [c for c in changes if c is not None]
    # The slow answer that closes the last fast window raises the rate (that window's
    # median was fast); the fifth of the new window halves it, without waiting for the
    # window's end.
    assert [c.reason for c in made] == [Reason.WRITES_FAST, Reason.LATENCY]
    assert made[1] == Change(raised + rule.step, (raised + rule.step) / 2, Reason.LATENCY)
    assert changes.index(made[1]) - changes.index(made[0]) == 4


def test_signals_of_answers() -> None:
    assert signal_of(None) is Signal.OK
    assert signal_of(too_many()) is Signal.APF_REJECTED
    assert signal_of(too_many(apf=False)) is Signal.THROTTLED
    assert signal_of(TimeoutError()) is Signal.TIMEOUT
    assert signal_of(ApiException(status=504)) is Signal.TIMEOUT
    assert signal_of(ApiException(status=409)) is Signal.OK
    assert signal_of(ApiException(status=500)) is Signal.OTHER
    assert signal_of(ConnectionRefusedError()) is Signal.OTHER


@pytest.mark.parametrize(("floor", "ceiling", "burst"), [(0.0, 1.0, 1), (2.0, 1.0, 1),
                                                         (1.0, 2.0, 0)])
def test_bad_bounds_are_refused_naming_the_value(floor: float, ceiling: float,
                                                 burst: int) -> None:
    with pytest.raises(ValueError, match=r"write (rate floor|rate ceiling|burst): "):
        AdaptiveRate(floor, ceiling, burst)


async def test_retry_after_holds_every_write() -> None:
    changes: list[Change] = []
    rate = AdaptiveRate(50.0, 100.0, 5, on_change=changes.append)
    async with rate:
        pass
    began = time.monotonic()
    rate.observe(0.001, too_many(retry_after="0.4"))
    async with rate:
        pass
    assert time.monotonic() - began >= 0.4
    assert [c.reason for c in changes] == []  # at the floor: no change, still held


async def test_a_change_of_rate_grants_no_burst() -> None:
    rate = AdaptiveRate(10.0, 100.0, 30)
    rate.rule.rate = 100.0  # as if it had risen
    rate.observe(0.001, too_many(retry_after=None))  # halves to 50/s
    assert rate.rate == 50.0
    began = time.monotonic()
    for _ in range(11):
        async with rate:
            pass
    # A fresh full bucket would pass 11 at once; drained, 10 take 10 / 50 s.
    assert time.monotonic() - began >= 0.15


async def hostile(rate: AdaptiveRate, answer: object, seconds: float,
                  writers: int = 10) -> tuple[list[float], float]:
    """``writers`` writers against a server that answers ``answer(at)`` for ``seconds``;
    the times of their attempts and the longest gap of a 20 ms heartbeat on the loop."""
    attempts: list[float] = []
    gaps = [0.0]
    end = time.monotonic() + seconds

    async def writer() -> None:
        while time.monotonic() < end:
            async with rate:
                began = time.monotonic()
                attempts.append(began)
                exc = await answer(began)  # type: ignore[operator]
                rate.observe(time.monotonic() - began, exc)

    async def heartbeat() -> None:
        last = time.monotonic()
        while time.monotonic() < end:
            await asyncio.sleep(0.02)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()

    tasks = [asyncio.create_task(writer()) for _ in range(writers)]
    await heartbeat()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return attempts, max(gaps)


async def test_every_write_429_with_retry_after_0_neither_spins_nor_starves() -> None:
    rate = AdaptiveRate(20.0, 400.0, 30)

    async def refuse(at: float) -> BaseException:
        await asyncio.sleep(0.001)
        return too_many(retry_after="0")

    attempts, gap = await hostile(rate, refuse, 3.0)
    # The bucket's burst, then the floor: 30 + 20 * 3 = 90 at most; spinning would be
    # thousands.  The floor keeps trying (a final status still gets through when the
    # server recovers).
    assert 20 <= len(attempts) <= 90 + 5
    assert rate.rate == 20.0
    assert gap < 0.5, "the loop was starved (a Lease renewal on it would be late)"


async def test_1ms_then_5s_latency_neither_spins_nor_starves() -> None:
    changes: list[Change] = []
    rate = AdaptiveRate(20.0, 400.0, 30, on_change=changes.append)
    slow_from = time.monotonic() + 2.0

    async def answer(at: float) -> None:
        await asyncio.sleep(0.001 if at < slow_from else 5.0)

    attempts, gap = await hostile(rate, answer, 7.5)
    fast = [a for a in attempts if a < slow_from]
    slow = [a for a in attempts if a >= slow_from]
    assert any(c.reason is Reason.WRITES_FAST for c in changes)  # it rose while fast
    assert any(c.reason is Reason.LATENCY for c in changes)  # and fell when slow
    assert len(fast) <= 30 + 2.0 * 400
    # 10 writers, each waiting 5 s for an answer: at most 2 attempts each in 5.5 s.
    assert len(slow) <= 2 * 10
    assert gap < 0.5
