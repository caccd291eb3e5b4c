"""Whether the API server answers, and a cheap probe while it does not.

Each part that talks to the API server retries on a backoff of its own (queued writes:
0.2 s doubling to 30 s; watches: 0.5 s doubling to 30 s), and during an outage those
timers grow past its end (docs/decisions.md, "Retries follow the API server's
health").  :class:`ApiHealth` ties the retries to the API server's state instead:

* a call that finds the API server unreachable (:func:`unreachable`: connection refused
  or reset, a try past its deadline) reports it (:meth:`ApiHealth.lost`);
* while it is unreachable, :meth:`ApiHealth.run` probes ``GET /readyz`` every
  :data:`PROBE_PERIOD_SECONDS` (a few bytes; every authenticated user may read it
  through the default ``system:public-info-viewer`` ClusterRole, and a 401 or 403 still
  shows a server that answers);
* the first answer, a probe's or any call's (:meth:`ApiHealth.answered`), ends the
  outage: :attr:`ApiHealth.recoveries` grows, the listeners run on the loop (the write
  queue makes its retries due at once) and watch threads waiting in
  :meth:`ApiHealth.wait_recovered` retry at once.

An answer that is an error (403 while the authorizer warms up, 429, 5xx) is not an
outage: those keep their own backoff, started over at the first such answer after an
outage, so a request the server refuses is never retried in a tight loop.  A refusal
(:func:`answering`: 401, 403, 404, 409, 429) also ends an outage; a 5xx does not.
Thread-safe: watch threads and the loop report.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from scraper.kube.calls import call

log = logging.getLogger(__name__)

#: Seconds between two probes while the API server is unreachable.
PROBE_PERIOD_SECONDS = 0.5
#: ``(connect, read)`` seconds of one probe: a probe never outlasts its period much.
PROBE_TIMEOUT = (1.0, 1.0)


def unreachable(exc: BaseException) -> bool:
    """True when ``exc`` says the API server did not answer at all: a connection, TLS or
    protocol error (urllib3's, or :class:`ConnectionError` from the apply path) or a
    try past its deadline.  An HTTP answer, even an error, is not."""
    return (not isinstance(exc, ApiException)
            and isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError))


def answering(exc: BaseException) -> bool:
    """True when ``exc`` is an answer of a working API server, if a refusal (401, 403,
    404, 409, 429...): the server is back.  A 5xx (e.g. etcd unreachable behind it) is
    not: the probe decides then."""
    return isinstance(exc, ApiException) and 0 < (exc.status or 0) < 500


class ApiHealth:
    """The API server's reachability as the scraper's calls see it (module doc).

    Args:
        probe: one readiness probe; returns True when the API server answered, False or
            raises otherwise (default with :meth:`for_client`: ``GET /readyz``).
        period: seconds between two probes while unreachable.
    """

    def __init__(self, probe: Callable[[], Any], *,
                 period: float = PROBE_PERIOD_SECONDS) -> None:
        self._probe = probe
        self._period = period
        self._cond = threading.Condition()
        self._down = False
        self._down_since = 0.0
        self.recoveries = 0
        self._lost = asyncio.Event()  # set while down: wakes the probe loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: list[Callable[[], object]] = []

    @classmethod
    def for_client(cls, api_client: ApiClient, **kwargs: Any) -> ApiHealth:
        """Probing ``GET /readyz`` with ``api_client``'s server and credentials."""

        def readyz() -> bool:
            try:
                api_client.call_api("/readyz", "GET", auth_settings=["BearerToken"],
                                    _preload_content=False, _request_timeout=PROBE_TIMEOUT,
                                    _return_http_data_only=True)
            except ApiException as exc:
                # 401/403: the server answers (readiness is not ours to read).
                return exc.status in (401, 403)
            return True

        return cls(readyz, **kwargs)

    @property
    def down(self) -> bool:
        """True while the API server is believed unreachable."""
        return self._down

    def on_recovered(self, listener: Callable[[], object]) -> None:
        """Call ``listener`` (on the loop) each time an outage ends."""
        self._listeners.append(listener)

    def lost(self) -> int:
        """A call found the API server unreachable; returns :attr:`recoveries` as of now
        (the generation to pass to :meth:`wait_recovered`)."""
        with self._cond:
            if not self._down:
                self._down = True
                self._down_since = time.monotonic()
                log.warning("API server unreachable: probing /readyz every %gs",
                            self._period)
                if self._loop is not None:
                    self._loop.call_soon_threadsafe(self._lost.set)
            return self.recoveries

    def answered(self) -> None:
        """A call got an answer: an outage, if any, ends now."""
        if not self._down:  # the common case, without the lock
            return
        with self._cond:
            if not self._down:
                return
            self._down = False
            self.recoveries += 1
            log.info("API server answers again after %.1fs: retrying writes and watches now",
                     time.monotonic() - self._down_since)
            self._cond.notify_all()
        if self._loop is not None:
            for listener in self._listeners:
                self._loop.call_soon_threadsafe(listener)

    def wait_recovered(self, since: int, timeout: float, stop: threading.Event) -> bool:
        """Block (a watch thread) up to ``timeout`` s until an outage that began at
        generation ``since`` ended, or ``stop`` is set; True when it ended."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.recoveries == since and not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.2))  # 0.2 s: notices stop() soon
            return self.recoveries != since

    async def run(self) -> None:
        """Probe while the API server is unreachable, forever (a root task)."""
        self._loop = asyncio.get_running_loop()
        while True:
            if not self._down:
                self._lost.clear()
                if not self._down:
                    await self._lost.wait()
                continue
            began = time.monotonic()
            try:
                ok = await call(self._probe, deadline=sum(PROBE_TIMEOUT))
            except Exception as exc:
                log.debug("readiness probe: %s", type(exc).__name__)
                ok = False
            if ok:
                self.answered()
            else:
                await asyncio.sleep(max(0.0, self._period - (time.monotonic() - began)))
