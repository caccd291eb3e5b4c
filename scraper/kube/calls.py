"""The one call path to the API server: off the event loop, rate limited, retried.

The official client is blocking, so every call runs in a worker thread
(:func:`asyncio.to_thread`), except the status writes' apply PATCH, a coroutine on
the loop (:mod:`scraper.kube.apply_request`).  :func:`call` adds, per call site's
needs, a client-side token bucket (:class:`aiolimiter.AsyncLimiter`), retries of
transient answers with capped exponential backoff and jitter (:class:`Backoff`,
driven by tenacity) and honours ``Retry-After``.  The pod watch, which lives in a
thread of its own, backs off with the same :class:`Backoff`.

Every try has a **deadline** (:func:`deadline_of`): the caller's wait ends then,
whatever the worker thread still waits for, so no decision waits longer than it
planned (docs/decisions.md, "Every API call has a deadline").  The client itself is
built without urllib3's own retries (:func:`scraper.kube.client.without_retries`), so
the thread ends within its ``_request_timeout`` too and does not keep a worker long
after the caller gave up.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import random
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import urllib3
from aiolimiter import AsyncLimiter
from kubernetes.client.exceptions import ApiException
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

T = TypeVar("T")

#: Longest ``Retry-After`` honoured (seconds); a longer one is capped so a stop stays prompt.
RETRY_AFTER_MAX_SECONDS = 30.0


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with jitter, as client-go's ``wait.Backoff``.

    The delay before retry ``n`` (0 for the first) is
    ``min(initial * factor**n, cap) * (1 + jitter * U[0, 1))`` seconds.
    """

    initial: float
    cap: float
    factor: float = 2.0
    jitter: float = 0.5

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds before retry ``retry``; never sooner than ``retry_after`` (capped at
        :data:`RETRY_AFTER_MAX_SECONDS`) when the server asked for it."""
        base = min(self.initial * self.factor ** retry, self.cap)
        seconds = base * (1 + self.jitter * random.random())
        if retry_after is not None:
            seconds = max(seconds, min(retry_after, RETRY_AFTER_MAX_SECONDS))
        return seconds


#: Status writes and Events: 0.2 s doubling up to 5 s.
WRITE_BACKOFF = Backoff(initial=0.2, cap=5.0)


def retry_after(exc: BaseException | None) -> float | None:
    """The ``Retry-After`` seconds of an API error, if it carries a readable one.

    The API server sends it with 429 (API Priority and Fairness) and some 5xx;
    retrying sooner only adds to the load that caused them.
    """
    if not isinstance(exc, ApiException) or not exc.headers:
        return None
    try:
        return float(exc.headers.get("Retry-After", ""))
    except ValueError:
        return None


def is_transient(exc: BaseException) -> bool:
    """409, 429, 5xx, connection errors and a try past its deadline: worth another try."""
    if isinstance(exc, ApiException):
        return exc.status in (409, 429) or (exc.status or 0) >= 500
    return isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


def deadline_of(request_timeout: Any) -> float | None:
    """Seconds one try may take given the client's ``_request_timeout``: connect plus
    read for a ``(connect, read)`` pair, twice a single number, None when unset.

    The read timeout bounds the wait between two bytes; the deadline bounds the whole
    answer (a server trickling bytes cannot stretch it).
    """
    if request_timeout is None:
        return None
    if isinstance(request_timeout, tuple):
        return float(sum(request_timeout))
    return 2.0 * float(request_timeout)


@dataclass(frozen=True)
class Retries:
    """How often a call is tried: ``attempts`` in all (1: no retry), waiting ``backoff``
    between tries of an exception ``retryable`` accepts."""

    attempts: int = 1
    backoff: Backoff = WRITE_BACKOFF
    retryable: Callable[[BaseException], bool] = is_transient


ONCE = Retries()


@overload
async def call(  # a coroutine function's result is awaited
    func: Callable[..., Awaitable[T]], *args: Any, limiter: AsyncLimiter | None = None,
    retries: Retries = ..., before_try: Callable[[], None] | None = None,
    deadline: float | None = None, executor: Executor | None = None, **kwargs: Any) -> T: ...


@overload
async def call(
    func: Callable[..., T], *args: Any, limiter: AsyncLimiter | None = None,
    retries: Retries = ..., before_try: Callable[[], None] | None = None,
    deadline: float | None = None, executor: Executor | None = None, **kwargs: Any) -> T: ...


async def call(
    func: Callable[..., Any],
    *args: Any,
    limiter: AsyncLimiter | None = None,
    retries: Retries = ONCE,
    before_try: Callable[[], None] | None = None,
    deadline: float | None = None,
    executor: Executor | None = None,
    **kwargs: Any,
) -> Any:
    """``func(*args, **kwargs)`` in a worker thread; the result of the first try that returns.

    A coroutine function (the status writes' aiohttp PATCH,
    :mod:`scraper.kube.apply_request`) is awaited on the loop instead, with the same
    token, fence, deadline and retries.

    Args:
        limiter: a token taken before every try (None: not rate limited).
        retries: which errors are tried again, how often and after how long.
        before_try: called before every try, after the token (a fence that raises to
            stop, e.g. when this replica no longer leads).
        deadline: seconds one try may take (default: :func:`deadline_of` the
            ``_request_timeout`` keyword); past it the try fails with TimeoutError.
        executor: the worker threads (default: the loop's default executor); a caller
            whose calls must not queue behind others' (the Lease) brings its own.

    Raises:
        The last try's exception, TimeoutError when a try passed its deadline, or what
        ``before_try`` raised.
    """
    limit = deadline if deadline is not None else deadline_of(kwargs.get("_request_timeout"))
    loop = asyncio.get_running_loop()
    on_loop = inspect.iscoroutinefunction(func)

    async def once() -> Any:
        job: Awaitable[Any] = (func(*args, **kwargs) if on_loop else
                               loop.run_in_executor(executor, functools.partial(func, *args,
                                                                                **kwargs)))
        if limit is None:
            return await job
        # asyncio.timeout, not wait_for: 3.11's wait_for returns the result and drops a
        # cancel that lands as the try ends, and a cancelled writer then never stops.
        async with asyncio.timeout(limit):
            return await job

    async def guarded() -> Any:
        if limiter is None:
            if before_try is not None:
                before_try()
            return await once()
        async with limiter:
            if before_try is not None:
                before_try()
            return await once()

    if retries.attempts <= 1:
        # One try (every status write: its retries are the write queue's): no retry
        # machinery around it (it cost about an eighth of a write's event-loop CPU).
        return await guarded()

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        return retries.backoff.delay(state.attempt_number - 1, retry_after(exc))

    async for attempt in AsyncRetrying(
        retry=retry_if_exception(retries.retryable),
        stop=stop_after_attempt(retries.attempts),
        wait=wait,
        reraise=True,
    ):
        with attempt:
            return await guarded()
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover
