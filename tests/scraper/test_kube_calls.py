"""The one call path (scraper.kube.calls) in-process: its retry rules, with a fake call.

The callables here stand in for the official client's blocking methods; the real
client against the real API server (and a fault proxy) is exercised in
test_scraper_faults.py and test_scraper_reconcile.py.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from aiolimiter import AsyncLimiter
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException

from scraper.kube.calls import (
    RETRY_AFTER_MAX_SECONDS,
    Backoff,
    Retries,
    call,
    is_transient,
    retry_after,
)

FAST = Backoff(initial=0.001, cap=0.002)


def _api_error(status: int, retry_after_header: str | None = None) -> ApiException:
    exc = ApiException(status=status, reason="test")
    exc.headers = {"Retry-After": retry_after_header} if retry_after_header else {}
    return exc


@given(st.integers(0, 30), st.floats(0.01, 10), st.floats(0.01, 100),
       st.none() | st.floats(0, 1000))
def test_backoff_delay_bounds(retry: int, initial: float, cap: float,
                              asked: float | None) -> None:
    backoff = Backoff(initial=initial, cap=cap)
    base = min(initial * 2 ** retry, cap)
    delay = backoff.delay(retry, asked)
    low = base if asked is None else max(base, min(asked, RETRY_AFTER_MAX_SECONDS))
    assert low <= delay <= max(low, base * 1.5)


def test_retry_after_read_from_the_answer() -> None:
    assert retry_after(_api_error(429, "3")) == 3.0
    assert retry_after(_api_error(429, "soon")) is None
    assert retry_after(_api_error(503)) is None
    assert retry_after(OSError()) is None


def test_which_errors_are_transient() -> None:
    assert all(is_transient(_api_error(s)) for s in (409, 429, 500, 503, 504))
    assert not any(is_transient(_api_error(s)) for s in (400, 403, 404, 422))
    assert is_transient(ConnectionResetError())
    assert not is_transient(ValueError())


async def test_transient_errors_retried_off_the_loop_then_the_result() -> None:
    answers: list[BaseException | str] = [_api_error(503), _api_error(429, "0"), "ok"]
    threads = []

    def blocking(arg: str, *, kw: int) -> str:
        threads.append(threading.current_thread())
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return f"{answer} {arg} {kw}"

    result = await call(blocking, "a", kw=1, retries=Retries(attempts=3, backoff=FAST))
    assert result == "ok a 1"
    assert len(threads) == 3 and threading.main_thread() not in threads


async def test_a_permanent_error_or_the_last_attempt_is_raised() -> None:
    tries = []

    def not_found() -> None:
        tries.append(1)
        raise _api_error(404)

    with pytest.raises(ApiException) as err:
        await call(not_found, retries=Retries(attempts=5, backoff=FAST))
    assert err.value.status == 404 and len(tries) == 1

    def unavailable() -> None:
        tries.append(2)
        raise _api_error(503)

    with pytest.raises(ApiException) as err:
        await call(unavailable, retries=Retries(attempts=3, backoff=FAST))
    assert err.value.status == 503 and tries.count(2) == 3


async def test_the_fence_is_checked_before_every_try_after_the_token() -> None:
    checks: list[str] = []
    limiter = AsyncLimiter(10, 1)

    class Closed(Exception):
        pass

    def fence() -> None:
        checks.append("fence")
        if checks.count("fence") == 2:
            raise Closed()

    def flaky() -> None:
        checks.append("call")
        raise _api_error(500)

    with pytest.raises(Closed):
        await call(flaky, limiter=limiter, before_try=fence,
                   retries=Retries(attempts=5, backoff=FAST))
    assert checks == ["fence", "call", "fence"]


async def test_a_cancel_is_never_lost_when_the_try_ends_at_the_same_moment() -> None:
    """A task cancelled while its try is finishing raises CancelledError, never the result.

    asyncio.wait_for of Python 3.11 returns the result and drops the cancel when both
    land in one loop pass (fixed in 3.12); the writer's stop() then waited forever on a
    worker that had gone back to the queue (the benchmark at 1000 changing targets).
    The cancel lands 0..7 loop passes after the try returned, across that window.
    """
    lost = []
    for passes in range(8):
        for _ in range(20):
            started, release = threading.Event(), threading.Event()

            def work(started: threading.Event = started,
                     release: threading.Event = release) -> str:
                started.set()
                release.wait(5)
                return "result"

            task = asyncio.ensure_future(call(work, deadline=5.0))
            await asyncio.to_thread(started.wait, 5)
            release.set()
            await asyncio.to_thread(lambda: None)  # the worker thread has returned
            for _ in range(passes):
                await asyncio.sleep(0)
            if not task.cancel():
                continue  # it had finished before the cancel: nothing to lose
            try:
                await task
            except asyncio.CancelledError:
                continue
            lost.append(passes)
    assert not lost, f"cancel dropped, the result returned instead, at passes {lost}"
