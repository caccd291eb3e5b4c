"""aiohttp's client behind the interface of ``scraper/scrape/http_exchange.py`` (benchmark side).

Not product code.  It exists so that ``benchmarks.scrape_client`` can measure the aiohttp
side of issue 28's rule (the scrape with the scraper's own HTTP/1.1 client against the
scrape with aiohttp's) from any tree: ``--aiohttp-of LABEL=PATH`` copies PATH's tracked
files and puts this file in place of ``scraper/scrape/http_exchange.py``, so everything
but the exchange (scheduler, scrape loop, :class:`~scraper.scrape.exporter.ExporterScraper`,
writer) is that tree's own.

Same public names as the own client: :class:`ExchangeError`, :class:`ConnectFailed`,
:class:`StaleConnection`, :class:`BadAnswer`, :class:`BodyTooLarge`, :class:`Endpoint`,
:func:`endpoint`, :class:`Response`, :class:`ConnectionPool` and the module constants.
Built on aiohttp's public API only: one ``ClientSession`` with its own ``TCPConnector``
per ``(host, port)``, made when the pool first needs it; ``allow_redirects=False``,
``auto_decompress=False``, ``DummyCookieJar``, no aiohttp timeouts (the caller bounds
each exchange with ``asyncio.timeout``), connector keep-alive :data:`KEEPALIVE_SECONDS`
and no connector limit (the pool's own semaphore holds at most ``limit`` exchanges at
once, counted from the request to :meth:`Response.release`, as the own client counts
connections in use).

What differs from the own client (none of it can be changed through aiohttp's public API):

* aiohttp retries a GET once when its connection ends before an answer (ServerDisconnected,
  reset), on a pooled and on a fresh connection alike: an exporter that closes at once
  sees two connections per exchange where the own client opens one.  The retry also
  covers most stale pooled connections before this module sees them.
* Idle connections cannot be listed: :meth:`ConnectionPool.idle_count` is this module's
  own count of answers released to the pool with keep-alive (minus those taken again and
  those past the keep-alive); a connection the exporter closed while idle is counted until
  it is taken or its keep-alive ends.  A GET is taken as "on a pooled connection" (for
  :class:`StaleConnection`) when that count was above 0.
* Closing one connection is only possible while the response still holds it.  aiohttp
  pools a connection by itself as soon as the body has arrived whole, so
  ``release(keep=False)`` of such an answer, ``close_idle(host, port)`` and ``get(...,
  fresh=True)`` retire the target's whole session: no new exchange uses it, and it is
  closed with ``ClientSession.close()`` once its exchanges in flight have ended (their
  connections close with it rather than being pooled).  The own client closes just the
  one connection and leaves the others pooled.
* Head bounds are aiohttp's (at most 128 header lines of at most 8190 bytes each) instead
  of 64 KiB in all; the wire bound on chunk framing (:data:`WIRE_PER_BODY_BYTE`,
  :data:`FRAMING_RUN_MAX_BYTES`) does not exist: llhttp skips chunk extensions without
  keeping them, so a flood of framing costs time up to the caller's timeout, not memory.
* A body without a length (it ends with the connection) that a reset cuts short may be
  taken as complete by aiohttp; the own client tells a reset from a clean close.
* Of a repeated header ``header()`` gives the first (as the own client), but
  Transfer-Encoding is not joined (only the caller's framing needs it, and aiohttp does
  the framing).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from yarl import URL

#: Seconds an idle pooled connection is kept (the connectors' keepalive_timeout).
KEEPALIVE_SECONDS = 120.0
#: Kept for the interface; aiohttp bounds the head by its own limits (module docstring).
HEAD_MAX_BYTES = 64 * 1024
#: Kept for the interface; not enforced by aiohttp (module docstring).
WIRE_PER_BODY_BYTE = 8
#: Kept for the interface; not enforced by aiohttp (module docstring).
FRAMING_RUN_MAX_BYTES = HEAD_MAX_BYTES

_NO_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=None, sock_read=None,
                                    sock_connect=None)


class ExchangeError(Exception):
    """The exchange gave no usable answer; ``str(exc)`` is one line for a failure."""


class ConnectFailed(ExchangeError):
    """No connection: ``os_error`` is what the connect raised (``refused`` when nothing
    listens)."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error
        self.refused = isinstance(os_error, ConnectionRefusedError)


class StaleConnection(ExchangeError):
    """The connection ended before an answer while a pooled one was there to be taken
    (aiohttp's own retry failed too).  Never raised for ``fresh=True``."""


class BadAnswer(ExchangeError):
    """The answer is not well-formed HTTP/1.x or ended before it was complete."""


class BodyTooLarge(ExchangeError):
    """The body went past the cap before its end; the connection is closed."""


@dataclass(frozen=True)
class Endpoint:
    """Where a URL's GET goes: ``host``/``port`` (the pool's key), ``request_head`` the
    request's first lines as the own client sends them (kept for the interface), ``url``
    the URL parsed once for aiohttp, ``user_agent`` its User-Agent."""

    host: str
    port: int
    request_head: bytes
    url: URL | None = None
    user_agent: str = ""


def endpoint(url: str, user_agent: str) -> Endpoint:
    """The :class:`Endpoint` of an ``http://`` URL.

    Raises:
        ValueError: not ``http``, no host, a bad port, or a line break in the URL.
    """
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"url={url!r}: only http://host[:port]/path is scraped")
    if any(c in url for c in "\r\n\0 "):
        raise ValueError(f"url={url!r}: a space or line break in the URL")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = parts.netloc.rpartition("@")[2]
    head = (f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {user_agent}\r\n")
    return Endpoint(parts.hostname, parts.port or 80, head.encode("latin-1"),
                    URL(f"http://{host}{path}"), user_agent)


class _Target:
    """One ``(host, port)``: its session, exchanges in flight on it, and this module's
    count of idle connections (release times, oldest first)."""

    __slots__ = ("idle", "in_flight", "retired", "session")

    def __init__(self, user_agent: str) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0,
                                         keepalive_timeout=KEEPALIVE_SECONDS)
        self.session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False, timeout=_NO_TIMEOUT,
            headers={"User-Agent": user_agent} if user_agent else None)
        self.in_flight = 0
        self.idle: list[float] = []
        self.retired = False

    def live_idle(self, now: float) -> list[float]:
        while self.idle and now - self.idle[0] >= KEEPALIVE_SECONDS:
            del self.idle[0]
        return self.idle


def _keeps_alive(resp: aiohttp.ClientResponse) -> bool:
    """Whether aiohttp pools the connection of an answer whose body arrived whole."""
    tokens = resp.headers.get("Connection", "").lower()
    if "close" in tokens:
        return False
    return resp.version != aiohttp.HttpVersion10 or "keep-alive" in tokens


class Response:
    """An answer whose head has arrived: ``status`` (int), ``headers`` (aiohttp's
    case-insensitive headers).  Read the body with :meth:`read`, then :meth:`release`
    exactly once (also after an error or a cancellation)."""

    def __init__(self, pool: ConnectionPool, key: tuple[str, int], target: _Target,
                 resp: aiohttp.ClientResponse, cap: int) -> None:
        self._pool = pool
        self._key = key
        self._target = target
        self._resp: aiohttp.ClientResponse | None = resp
        self._cap = cap
        self._broken = False
        self.status = resp.status
        self.headers = resp.headers

    def header(self, name: str) -> str | None:
        """A header's value by name, any case (``None`` when absent; of a repeated
        header the first)."""
        return self.headers.get(name)

    @property
    def content_length(self) -> int | None:
        """The Content-Length header as an int; None when absent."""
        value = self.headers.get("Content-Length", "").split(",")[0].strip()
        return int(value) if value.isdigit() else None

    @property
    def content_type(self) -> str:
        """The media type of Content-Type, lower case, without parameters
        (``application/octet-stream`` when absent)."""
        assert self._resp is not None
        return self._resp.content_type

    async def read(self) -> bytes:
        """The body, whole.

        Raises:
            BodyTooLarge: past the cap given to :meth:`ConnectionPool.get`.
            BadAnswer: malformed or cut short.
        """
        resp = self._resp
        assert resp is not None, "read after release"
        cap = self._cap
        try:
            length = self.content_length
            if length is not None and length <= cap:
                return await resp.read()  # aiohttp reads exactly Content-Length bytes
            if length is not None:
                raise BodyTooLarge(f"body exceeds the {cap}-byte cap")
            pieces: list[bytes] = []
            size = 0
            while piece := await resp.content.readany():
                size += len(piece)
                if size > cap:
                    raise BodyTooLarge(f"body exceeds the {cap}-byte cap")
                pieces.append(piece)
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)
        except BaseException as exc:
            self._broken = True
            resp.close()
            if isinstance(exc, aiohttp.ClientError):
                raise BadAnswer(f"malformed or cut-short answer: {exc}") from exc
            raise

    def release(self, keep: bool = True) -> None:
        """Give the connection back: pooled by aiohttp when ``keep`` and the answer
        ended cleanly and allows keep-alive, closed otherwise (module docstring: an
        answer aiohttp pooled already retires the target's session)."""
        resp, self._resp = self._resp, None
        if resp is not None:
            self._pool._release(self._key, self._target, resp, keep, self._broken)


class ConnectionPool:
    """One aiohttp session per ``(host, port)``, at most ``limit`` exchanges at once (0:
    no limit).  Create and use inside one running loop; :meth:`close` at the end."""

    def __init__(self, limit: int = 0) -> None:
        self._targets: dict[tuple[str, int], _Target] = {}
        self._retired: set[_Target] = set()  # closed once their exchanges end
        self._slots = asyncio.Semaphore(limit) if limit > 0 else None
        self._closing: set[asyncio.Task[None]] = set()

    def idle_count(self, host: str | None = None, port: int | None = None) -> int:
        """Idle pooled connections as this module counts them (module docstring), to
        ``host:port`` when given."""
        now = time.monotonic()
        if host is not None:
            target = self._targets.get((host, port or 80))
            return len(target.live_idle(now)) if target is not None else 0
        return sum(len(t.live_idle(now)) for t in self._targets.values())

    async def get(self, where: Endpoint, headers: Mapping[str, str], cap: int, *,
                  fresh: bool = False) -> Response:
        """Send a GET with ``headers`` and return once the answer's head has arrived.

        Args:
            where: the URL's :class:`Endpoint`.
            headers: more request headers (values without line breaks).
            cap: the longest body kept, bytes; a longer one fails the read.
            fresh: a new connection even when one is idle (a new session for the target).

        Raises:
            ConnectFailed, StaleConnection, BadAnswer; ValueError for a header value
            with a line break.
        """
        for name, value in headers.items():
            if "\r" in value or "\n" in value:
                raise ValueError(f"header {name}={value!r}: a line break in a header value")
        key = (where.host, where.port)
        if self._slots is not None:
            await self._slots.acquire()
        target = self._targets.get(key)
        if target is not None and fresh:
            del self._targets[key]
            self._retire(target)
            target = None
        if target is None:
            target = self._targets[key] = _Target(where.user_agent)
        idle = target.live_idle(time.monotonic())
        pooled = bool(idle)
        if pooled:
            idle.pop()  # aiohttp takes the most recently released one
        target.in_flight += 1
        url = where.url
        if url is None:  # an Endpoint made by hand: its request line has the path
            path = where.request_head.split(b" ", 2)[1].decode("latin-1")
            url = URL(f"http://{where.host}:{where.port}{path}")
        try:
            resp = await target.session.get(url, headers=headers, allow_redirects=False)
        except BaseException as exc:
            self._done(target)
            if isinstance(exc, aiohttp.ClientConnectorError):
                raise ConnectFailed(exc.os_error) from exc
            if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError,
                                aiohttp.ClientConnectionResetError)):
                if pooled:
                    raise StaleConnection(f"the connection ended before an answer: "
                                          f"{exc}") from exc
                raise BadAnswer(f"the exporter closed the connection before a complete "
                                f"answer ({exc})") from exc
            if isinstance(exc, aiohttp.ClientError):
                raise BadAnswer(f"malformed HTTP answer: {exc}") from exc
            raise
        return Response(self, key, target, resp, cap)

    def _release(self, key: tuple[str, int], target: _Target,
                 resp: aiohttp.ClientResponse, keep: bool, broken: bool) -> None:
        held = resp.connection is not None  # False: aiohttp released it at the body's end
        whole = resp.content.is_eof()
        # A failed read closed what the response held; an answer not read whole, or not
        # to be kept, closes its connection.
        if broken or (held and not (keep and whole)):
            resp.close()
        else:
            resp.release()
            if whole and _keeps_alive(resp):
                if keep:
                    target.idle.append(time.monotonic())
                elif self._targets.get(key) is target:
                    # Pooled by aiohttp already: only the whole session can close it.
                    del self._targets[key]
                    self._retire(target)
        self._done(target)

    def _done(self, target: _Target) -> None:
        target.in_flight -= 1
        if self._slots is not None:
            self._slots.release()
        if target.retired and target.in_flight == 0:
            self._close_session(target)

    def _retire(self, target: _Target) -> None:
        target.retired = True
        target.idle.clear()
        if target.in_flight == 0:
            self._close_session(target)
        else:
            self._retired.add(target)

    def _close_session(self, target: _Target) -> None:
        self._retired.discard(target)
        task = asyncio.get_running_loop().create_task(target.session.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def close_idle(self, host: str, port: int) -> int:
        """Close the target's idle connections (its session, once its exchanges in
        flight have ended); returns how many were counted idle."""
        target = self._targets.pop((host, port), None)
        if target is None:
            return 0
        count = len(target.live_idle(time.monotonic()))
        self._retire(target)
        return count

    async def close(self) -> None:
        """Close every session, idle or in use."""
        sessions = [t.session for t in (*self._targets.values(), *self._retired)]
        self._targets.clear()
        self._retired.clear()
        for session in sessions:
            await session.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
