"""The scrape's HTTP exchange: one GET over a pooled keep-alive connection.

A scrape is one small GET answered by one small body: an :class:`asyncio.Protocol` per
connection with the llhttp parser of ``httptools`` (why not aiohttp's client:
docs/decisions.md, "The scrape has an HTTP client of its own").  aiohttp serves the
scraper's own ``/metrics`` and makes the status writes.

What it does, and nothing more: HTTP/1.1 GET to ``http://host:port/path``; a keep-alive
pool per ``(host, port)``; at most ``limit`` connections in use (0: no limit); an idle
connection lives :data:`KEEPALIVE_SECONDS`; the answer's head parsed before any of its
body is asked for; the body gathered up to a cap; no redirects, cookies, decompression,
proxies or timers (the caller bounds the whole exchange with ``asyncio.timeout``; a
cancelled exchange closes its connection).  A connection goes back to the pool only
when its answer ended cleanly and the answer allows it (``Connection: close`` and
HTTP/1.0 answers are honoured: llhttp's ``should_keep_alive``).

Errors: :class:`ConnectFailed` (no connection), :class:`StaleConnection` (a pooled
connection closed before any byte of the answer: the caller may retry once on a fresh
one), :class:`BadAnswer` (anything malformed or cut short), :class:`BodyTooLarge`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httptools

#: Seconds an idle pooled connection is kept: four default scrape intervals (30 s), so a
#: polled target reuses its connection.
KEEPALIVE_SECONDS = 120.0
#: Longest answer head (status line and headers) accepted, bytes; a chunked answer's
#: trailer section has the same bound.
HEAD_MAX_BYTES = 64 * 1024
#: Bytes on the wire an answer may take per byte of the body cap: chunk framing (sizes,
#: extensions, CRLFs) is the rest; past it the exchange fails, so no framing, however
#: long, costs memory or CPU without end.
WIRE_PER_BODY_BYTE = 8
#: Longest run of bytes without a body byte once the head is done (chunk framing,
#: trailers, a trailer line that never ends), bytes.
FRAMING_RUN_MAX_BYTES = HEAD_MAX_BYTES


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
    """A pooled connection ended before any byte of the answer: the exporter closed it
    while it sat idle.  Never raised for a fresh connection."""


class BadAnswer(ExchangeError):
    """The answer is not well-formed HTTP/1.x or ended before it was complete."""


class BodyTooLarge(ExchangeError):
    """The body went past the cap before its end; the connection is closed."""


@dataclass(frozen=True)
class Endpoint:
    """Where a URL's GET goes: ``host``/``port`` for the connect, ``request_head`` the
    request's first lines (request line, Host, User-Agent) as bytes."""

    host: str
    port: int
    request_head: bytes


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
    return Endpoint(parts.hostname, parts.port or 80, head.encode("latin-1"))


class _ExporterConnection(asyncio.Protocol):
    """One TCP connection and its parser; serves one answer at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.active = False  # a request is out and its answer not yet released
        self._parser = httptools.HttpResponseParser(self)
        self._head: asyncio.Future[None] | None = None
        self._body_wait: asyncio.Future[None] | None = None
        self._reset(0)

    def _reset(self, cap: int) -> None:
        self.cap = cap
        self.got_bytes = 0
        self.headers: dict[str, str] = {}
        self.status = 0
        self.head_done = False
        self.complete = False
        # The body's first piece as it came; later pieces into one buffer (a list of
        # many tiny pieces joined costs about 80 bytes per piece: 90x a 1 MiB cap in
        # 1-byte chunks).
        self.body_first = b""
        self.body_rest: bytearray | None = None
        self.line_bytes = 0  # header lines of the head, then of the trailers
        self.wire_at_body = 0  # got_bytes when a body byte last came (or the head ended)
        self.body_size = 0
        self.too_large = False
        self.error: ExchangeError | None = None
        self.unsized = False  # the body ends with the connection (no length, not chunked)
        self.keep_alive = False
        self.wire_max = 2 * HEAD_MAX_BYTES + WIRE_PER_BODY_BYTE * cap

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if not self.active:
            # Bytes nobody asked for (after an answer ended, or while idle): the
            # connection is out of step, so it serves no further request.
            self.close()
            return
        self.got_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(BadAnswer("the answer switches protocols (not HTTP/1.x)"))
        except httptools.HttpParserError as exc:
            if self.complete:  # bytes past the answer's end: out of step, never pooled
                self.keep_alive = False
                self.close()
            elif self.error is None:  # a callback's own error is kept as it is
                self._fail(BadAnswer(f"malformed HTTP answer: {exc}"))
            else:
                self._fail(self.error)
        if not self.head_done and self.got_bytes > HEAD_MAX_BYTES:
            self._fail(BadAnswer(f"answer head longer than {HEAD_MAX_BYTES} bytes"))
        # The framing run before the wire's total: one large read can pass both, and
        # the run names the cause (the size of reads depends on the machine's load).
        elif (self.head_done and not self.complete
              and self.got_bytes - self.wire_at_body > FRAMING_RUN_MAX_BYTES):
            self._fail(BadAnswer(f"more than {FRAMING_RUN_MAX_BYTES} bytes of framing or "
                                 f"trailers without a body byte"))
        elif self.got_bytes > self.wire_max and not self.complete:
            self._fail(BadAnswer(f"answer longer than {self.wire_max} bytes on the wire "
                                 f"(the body cap {self.cap} plus framing)"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        if (self.head_done and not self.complete and self.unsized and not self.too_large
                and exc is None and self.error is None):
            self.complete = True  # a clean end of the connection is the body's end
        elif not self.complete and self.error is None:
            self.error = BadAnswer("the exporter closed the connection before a complete "
                                   "answer" + (f" ({exc})" if exc else ""))
        self._wake()

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self.complete:  # bytes past the answer's end: the parser stops here
            raise BadAnswer("bytes past the answer's end")
        # A 1xx answer ends before the real one begins: start over.
        self.headers = {}
        self.head_done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        # The head's lines (1xx answers' included) and then a chunked answer's trailers
        # are each bounded here too: lines that arrive whole in one read are parsed
        # before data_received could compare their size.
        self.line_bytes += len(name) + len(value) + 4
        if self.line_bytes > HEAD_MAX_BYTES:
            part = "trailers" if self.head_done else "answer head"
            self._fail(BadAnswer(f"{part} longer than {HEAD_MAX_BYTES} bytes"))
            raise BadAnswer(part)  # stops the parser on this buffer
        if self.head_done:
            return  # a trailer: never a header of the answer (its head was handed out)
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self.headers.get(key)
        if old is None:
            self.headers[key] = text
        elif key == "transfer-encoding":  # the framing needs every coding
            self.headers[key] = f"{old}, {text}"
        # else the first one counts, as aiohttp's ``headers.get`` gave it

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            return  # informational: the answer follows
        self.status = status
        self.head_done = True
        self.line_bytes = 0  # the trailers have a bound of their own
        self.wire_at_body = self.got_bytes
        self.unsized = ("content-length" not in self.headers
                        and "chunked" not in self.headers.get("transfer-encoding", "").lower()
                        and status not in (204, 304))
        if self._head is not None and not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        self.wire_at_body = self.got_bytes
        if self.body_size > self.cap:
            self.too_large = True
            self.body_first, self.body_rest = b"", None
            self._fail(BodyTooLarge(f"body exceeds the {self.cap}-byte cap"))
            raise BodyTooLarge("cap")  # stops the parser on this buffer
        if self.body_rest is not None:
            self.body_rest += body
        elif self.body_first:
            self.body_rest = bytearray(self.body_first)
            self.body_rest += body
        else:
            self.body_first = body

    def on_message_complete(self) -> None:
        if self.head_done:
            self.complete = True
            self.keep_alive = bool(self._parser.should_keep_alive())
            self._wake()

    # own
    def _fail(self, error: ExchangeError) -> None:
        if self.error is None:
            self.error = error
        self.close()
        self._wake()

    def _wake(self) -> None:
        for waiter in (self._head, self._body_wait):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        self.closed = True

    async def request(self, data: bytes, cap: int) -> None:
        """Send ``data`` and wait for the answer's head; raises :class:`ExchangeError`."""
        self._reset(cap)
        self.active = True
        self._parser = httptools.HttpResponseParser(self)
        assert self.transport is not None
        self._head = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        try:
            if not self.head_done and self.error is None:
                await self._head
        finally:
            self._head = None
        if not self.head_done:
            raise self.error or BadAnswer("no answer")

    async def read_body(self) -> bytes:
        """The whole body (up to the cap given to :meth:`request`)."""
        while not self.complete and self.error is None:
            self._body_wait = asyncio.get_running_loop().create_future()
            try:
                await self._body_wait
            finally:
                self._body_wait = None
        if self.error is not None and not self.complete:
            raise self.error
        if self.too_large:
            raise self.error or BodyTooLarge(f"body exceeds the {self.cap}-byte cap")
        return self.body_first if self.body_rest is None else bytes(self.body_rest)

    @property
    def reusable(self) -> bool:
        return self.complete and not self.closed and self.error is None and self.keep_alive


class Response:
    """An answer whose head has arrived: ``status`` (int), ``headers`` (names in lower
    case, values as latin-1 text; of a repeated header the first, Transfer-Encoding's
    joined with ``", "``).  Read the body with :meth:`read`, then
    :meth:`release` exactly once (also after an error or a cancellation)."""

    def __init__(self, pool: ConnectionPool, key: tuple[str, int],
                 conn: _ExporterConnection) -> None:
        self._pool = pool
        self._key = key
        self._conn = conn
        self.status = conn.status
        self.headers = conn.headers

    def header(self, name: str) -> str | None:
        """A header's value by name, any case (``None`` when absent)."""
        return self.headers.get(name.lower())

    @property
    def content_length(self) -> int | None:
        """The Content-Length header as an int; None when absent (llhttp refuses a
        malformed one before the head is handed out)."""
        value = self.headers.get("content-length", "").split(",")[0].strip()
        return int(value) if value.isdigit() else None

    @property
    def content_type(self) -> str:
        """The media type of Content-Type, lower case, without parameters
        (``application/octet-stream`` when absent, as aiohttp gives)."""
        value = self.headers.get("content-type")
        if value is None:
            return "application/octet-stream"
        return value.split(";", 1)[0].strip().lower()

    async def read(self) -> bytes:
        """The body, whole.

        Raises:
            BodyTooLarge: past the cap given to :meth:`ConnectionPool.get`.
            BadAnswer: malformed or cut short.
        """
        return await self._conn.read_body()

    def release(self, keep: bool = True) -> None:
        """Give the connection back: pooled when ``keep`` and the answer ended cleanly
        and allows keep-alive, closed otherwise (a body not read to its end, a
        cancelled read, ``Connection: close``, HTTP/1.0)."""
        conn, self._conn = self._conn, None  # type: ignore[assignment]
        if conn is not None:
            self._pool._release(self._key, conn, keep)


class ConnectionPool:
    """Keep-alive connections per ``(host, port)``, at most ``limit`` in use (0: no
    limit).  Create and use inside one running loop; :meth:`close` at the end."""

    def __init__(self, limit: int = 0) -> None:
        self._idle: dict[tuple[str, int], list[_ExporterConnection]] = {}
        self._slots = asyncio.Semaphore(limit) if limit > 0 else None
        self._in_use: set[_ExporterConnection] = set()
        self._swept = time.monotonic()

    def idle_count(self, host: str | None = None, port: int | None = None) -> int:
        """Idle pooled connections (to ``host:port`` when given)."""
        if host is not None:
            return len(self._idle.get((host, port or 80), ()))
        return sum(len(v) for v in self._idle.values())

    async def get(self, where: Endpoint, headers: Mapping[str, str], cap: int, *,
                  fresh: bool = False) -> Response:
        """Send a GET with ``where.request_head`` plus ``headers`` and return once the
        answer's head has arrived.

        Args:
            where: the URL's :class:`Endpoint`.
            headers: more request headers (values without line breaks).
            cap: the longest body kept, bytes; a longer one fails the read.
            fresh: a new connection even when one is idle (the retry after a stale one).

        Raises:
            ConnectFailed, StaleConnection, BadAnswer; ValueError for a header value
            with a line break.
        """
        lines = [where.request_head]
        for name, value in headers.items():
            if "\r" in value or "\n" in value:
                raise ValueError(f"header {name}={value!r}: a line break in a header value")
            lines.append(f"{name}: {value}\r\n".encode("latin-1"))
        lines.append(b"\r\n")
        data = b"".join(lines)
        key = (where.host, where.port)
        if self._slots is not None:
            await self._slots.acquire()
        try:
            conn, reused = await self._connection(key, fresh)
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise
        self._in_use.add(conn)
        try:
            await conn.request(data, cap)
        except BaseException as exc:
            self._release(key, conn, keep=False)
            if reused and conn.got_bytes == 0 and isinstance(exc, BadAnswer):
                raise StaleConnection("the pooled connection was closed while idle") from exc
            raise
        return Response(self, key, conn)

    async def _connection(self, key: tuple[str, int],
                          fresh: bool) -> tuple[_ExporterConnection, bool]:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle and not fresh:
            conn = idle.pop()
            if not idle:
                del self._idle[key]
                idle = None
            if not conn.closed and now - conn.idle_since < KEEPALIVE_SECONDS:
                return conn, True
            conn.close()
        loop = asyncio.get_running_loop()
        try:
            _, proto = await loop.create_connection(_ExporterConnection, key[0], key[1])
        except OSError as exc:
            raise ConnectFailed(exc) from exc
        return proto, False

    def _release(self, key: tuple[str, int], conn: _ExporterConnection, keep: bool) -> None:
        conn.active = False
        if conn in self._in_use:
            self._in_use.discard(conn)
            if self._slots is not None:
                self._slots.release()
        if keep and conn.reusable:
            conn.idle_since = now = time.monotonic()
            self._idle.setdefault(key, []).append(conn)
            if now - self._swept > KEEPALIVE_SECONDS:
                self._sweep(now)
        else:
            conn.close()

    def _sweep(self, now: float) -> None:
        """Close idle connections past their keep-alive or closed by the other side."""
        self._swept = now
        for key in list(self._idle):
            kept = [c for c in self._idle[key]
                    if not c.closed and now - c.idle_since < KEEPALIVE_SECONDS]
            for c in self._idle[key]:
                if c not in kept:
                    c.close()
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]

    def close_idle(self, host: str, port: int) -> int:
        """Close the idle connections to ``host:port``; returns how many.  Connections
        in use are left alone (they close or pool when their request ends)."""
        conns = self._idle.pop((host, port), [])
        for conn in conns:
            conn.close()
        return len(conns)

    async def close(self) -> None:
        """Close every connection, idle or in use."""
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
        for conn in list(self._in_use):
            conn.close()
        await asyncio.sleep(0)  # let the transports' close callbacks run
