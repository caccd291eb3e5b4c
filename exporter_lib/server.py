"""The exporter's HTTP/1.1 server: one asyncio event loop on one daemon thread.

Why not the stdlib's ``ThreadingHTTPServer`` (prometheus-client's choice, used here
before): it starts one thread per connection inside the training process and
restarts its idle timeout on every byte, so 2000 idle or trickling connections from
any pod gave 2008 threads and 2011 descriptors, and with ``RLIMIT_NOFILE=1024`` the
training loop died of ``EMFILE`` (issue 13, input 10); a held (waiting) scrape would
pin a thread too.  Here a connection is a few objects on one loop (stdlib only), and
everything is bounded (constants below, documented in ``docs/exporter.md``):

* at most :data:`MAX_CONNECTIONS` open connections; a new one beyond that closes the
  connection that has waited longest for a request, or, when every one is busy,
  itself (counted as ``ConnectionLimit``);
* a request's whole head (request line and header fields, at most
  :data:`MAX_HEAD_BYTES`) must arrive within :data:`HEADER_TIMEOUT_SECONDS` of its
  first byte, whatever the pace (a trickle gets ``408``); a keep-alive connection
  without a request closes after :data:`IDLE_TIMEOUT_SECONDS`;
* a push body within :data:`BODY_TIMEOUT_SECONDS`; an answer must be taken by the
  client within :data:`WRITE_TIMEOUT_SECONDS`;
* at most :data:`MAX_HELD` waiting scrapes (below); listen backlog :data:`BACKLOG`.

Routes:

* ``GET|HEAD /metrics``: Prometheus text / OpenMetrics by ``Accept``; JSON
  (``TrainerStatus.to_json()``) when ``Accept`` lists ``application/json``, or
  ``204`` before the first report.  Strong ``ETag``; ``If-None-Match`` -> ``304``.
  **Waiting scrapes** (contract version 2): with ``Prefer: wait=N`` (RFC 7240
  section 4.3) a request whose answer would be ``304`` (or ``204``) is held until
  the status changes (then ``200``) or ``N`` seconds (at most :data:`MAX_WAIT_SECONDS`)
  pass (then ``304``/``204``); a held answer carries ``Preference-Applied: wait=N``.
  Beyond :data:`MAX_HELD` held requests the answer comes at once, without
  ``Preference-Applied``.  Every answer carries :data:`CONTRACT_HEADER`.
* ``GET|HEAD /healthz``: ``200 ok``.
* ``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status``:
  the push design's ``{"trainerStatus": {...}}`` (see :mod:`exporter_lib.push`).

Every refusal is a :class:`~exporter_lib.refusal.Refused`: a 4xx/5xx with a Kubernetes
``Status`` body, counted by reason in ``trainjob_exporter_http_refused_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import socket
import struct
import threading
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import urlsplit

from exporter_lib.exposition import Rendered, Renderer, etag_matches
from exporter_lib.push import MAX_BODY_BYTES, PushEndpoint
from exporter_lib.refusal import Refused

log = logging.getLogger("exporter_lib")

#: Open connections at most (a scraper, its standby, Prometheus, local push clients).
MAX_CONNECTIONS = 64
#: Accepted sockets beyond :data:`MAX_CONNECTIONS` that may exist at once while the
#: eviction rule decides; any further one is closed in the accepting callback itself,
#: before a task starts for it (a flood must not pile up descriptors between accepts).
ACCEPT_HEADROOM = 16
#: Sockets accepted per wake-up of the listening socket (then other work runs).
ACCEPTS_PER_WAKEUP = 16
#: Waiting scrapes held at once at most.
MAX_HELD = 8
#: Longest wait a scrape may ask for (seconds).
MAX_WAIT_SECONDS = 300
#: How often held scrapes look for a new status (seconds): the most a change waits.
WAIT_POLL_SECONDS = 0.1
#: A request's head must be complete this long after its first byte (seconds).
HEADER_TIMEOUT_SECONDS = 10.0
#: A keep-alive connection with no request in progress closes after this (seconds).
IDLE_TIMEOUT_SECONDS = 30.0
#: A push body must arrive within this (seconds).
BODY_TIMEOUT_SECONDS = 10.0
#: A client must take its answer within this (seconds).
WRITE_TIMEOUT_SECONDS = 10.0
#: Request line plus header fields, bytes.
MAX_HEAD_BYTES = 16 * 1024
#: Header fields per request.
MAX_HEADER_FIELDS = 100
#: Listen backlog (the stdlib server's 5 made 300 sequential connects take 44 s).
BACKLOG = 128
#: Bytes of a refused request body read and dropped before the answer (twice the push
#: limit): closing a socket with unread data sends a reset, which reaches a client
#: still sending its body as "broken pipe" instead of the answer.
DRAIN_MAX_BYTES = 2 * MAX_BODY_BYTES
#: Seconds the drain may take before the connection is closed anyway.
DRAIN_TIMEOUT_SECONDS = 2.0

#: Version of the wire contract this server speaks (docs/architecture.md, "Wire contract"):
#: 1 = JSON/text by Accept, ETag and 304; 2 = 1 plus waiting scrapes (``Prefer: wait``).
CONTRACT_VERSION = 2
#: Sent on every answer, so a scraper knows it may ask to wait, and for how long at most.
CONTRACT_HEADER = ("Trainjob-Exporter-Contract", f"{CONTRACT_VERSION};max-wait={MAX_WAIT_SECONDS}")

#: On every ``/metrics`` answer: ``<n>; start=<id>``, ``n`` the status generation the body
#: was rendered from (it only grows within one server), ``id`` a random name of this
#: server's start.  The scraper orders one target's answers by it, whatever the clocks
#: say (docs/scraper.md, "Other writers and time", rule 5).
SEQUENCE_HEADER = "Trainjob-Exporter-Sequence"

_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_WAIT = re.compile(r"^\s*wait\s*=\s*\"?(\d{1,9})\"?\s*$", re.IGNORECASE)


def requested_wait(prefer: str | None) -> int | None:
    """Seconds of the ``wait`` preference in a ``Prefer`` header (RFC 7240), else ``None``.

    Preferences are comma-separated, each ``token[=value]`` with ``;`` parameters; the
    first ``wait`` wins (RFC 7240 section 2).  A malformed one is ignored, as hints are.
    """
    if not prefer:
        return None
    for item in prefer.split(","):
        match = _WAIT.match(item.split(";")[0])
        if match:
            return int(match.group(1))
        if item.split(";")[0].split("=")[0].strip().lower() == "wait":
            return None
    return None


@dataclass
class Request:
    """One parsed request head: header names lower-case; repeated fields joined by ``, ``."""

    method: str
    path: str
    version: str
    headers: dict[str, str]

    @property
    def keep_alive(self) -> bool:
        """HTTP/1.1 unless ``Connection: close``; HTTP/1.0 only with ``keep-alive``."""
        tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        if self.version == "HTTP/1.1":
            return "close" not in tokens
        return "keep-alive" in tokens


def parse_head(block: bytes) -> Request:
    """Parse a request head (without its final empty line), strictly (RFC 9112).

    Raises:
        Refused: 400 malformed (bare obs-fold, whitespace before a colon, non-ASCII
            request line, too many fields), 505 a version other than HTTP/1.0 or 1.1.
    """
    lines = block.replace(b"\r\n", b"\n").split(b"\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not lines[0].isascii():
        raise Refused(HTTPStatus.BAD_REQUEST, "BadRequest",
                      f"malformed request line {lines[0][:80]!r}", close=True)
    method, target, version = (p.decode("ascii") for p in parts)
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        if not re.fullmatch(r"HTTP/\d(\.\d)?", version):
            raise Refused(HTTPStatus.BAD_REQUEST, "BadRequest",
                          f"malformed request line {lines[0][:80]!r}", close=True)
        raise Refused(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "HTTPVersionNotSupported",
                      f"{version} is not supported; use HTTP/1.1", close=True)
    if len(lines) - 1 > MAX_HEADER_FIELDS:
        raise Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "RequestHeaderFieldsTooLarge",
                      f"{len(lines) - 1} header fields exceed the limit of {MAX_HEADER_FIELDS}",
                      close=True)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise Refused(HTTPStatus.BAD_REQUEST, "BadRequest",
                          f"malformed header field {line[:80]!r}", close=True)
        key = name.decode("ascii").lower()
        text = value.strip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    try:
        path = urlsplit(target).path if target.startswith(("/", "http://", "https://")) else ""
    except ValueError:
        path = ""
    if not path.startswith("/"):
        raise Refused(HTTPStatus.BAD_REQUEST, "BadRequest",
                      f"request target {target[:80]!r} is not a path", close=True)
    return Request(method.upper() if method.isascii() else method, path, version, headers)


class _Connection:
    """One client connection: its stream, a read buffer, and whether it waits for a request."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buffer = bytearray()
        self.idle = True  # waiting for (the rest of) a request head: may be evicted
        self.evicted = False

    def abort(self) -> None:
        self.writer.transport.abort()

    async def head(self, deadline: asyncio.Timeout) -> bytes | None:
        """The next request head, or ``None`` when the peer closed between requests.

        Raises:
            Refused: 431 the head exceeds :data:`MAX_HEAD_BYTES`, 400 the peer closed mid-head.
            TimeoutError: ``deadline`` passed (rescheduled here to the header deadline
                at the first byte).
        """
        scanned = 0
        started = False
        while True:
            while self.buffer[:2] == b"\r\n" or self.buffer[:1] == b"\n":  # RFC 9112 2.2
                del self.buffer[:2 if self.buffer[:1] == b"\r" else 1]
            if self.buffer and not started:
                started = True
                deadline.reschedule(asyncio.get_running_loop().time() + HEADER_TIMEOUT_SECONDS)
            match = _HEAD_END.search(self.buffer, max(0, scanned - 3))
            if match and match.start() <= MAX_HEAD_BYTES:
                block = bytes(self.buffer[:match.start()])
                del self.buffer[:match.end()]
                return block
            scanned = len(self.buffer)
            if scanned > MAX_HEAD_BYTES:
                raise Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                              "RequestHeaderFieldsTooLarge",
                              f"request head exceeds the limit of {MAX_HEAD_BYTES} bytes",
                              close=True)
            chunk = await self.reader.read(65536)
            if not chunk:
                if self.buffer:
                    raise Refused(HTTPStatus.BAD_REQUEST, "BadRequest",
                                  "connection closed in the middle of a request head",
                                  close=True)
                return None
            self.buffer += chunk

    async def body(self, length: int) -> bytes:
        """Exactly ``length`` body bytes (buffered ones first)."""
        taken = bytes(self.buffer[:length])
        del self.buffer[:length]
        if len(taken) < length:
            taken += await self.reader.readexactly(length - len(taken))
        return taken

    async def drain(self, length: int) -> None:
        """Read and drop up to ``length`` bytes within :data:`DRAIN_TIMEOUT_SECONDS`."""
        remaining = min(length, DRAIN_MAX_BYTES) - len(self.buffer)
        self.buffer.clear()
        with contextlib.suppress(TimeoutError, ConnectionError, OSError):
            async with asyncio.timeout(DRAIN_TIMEOUT_SECONDS):
                while remaining > 0:
                    chunk = await self.reader.read(min(65536, remaining))
                    if not chunk:
                        return
                    remaining -= len(chunk)


class _Server:
    """The event loop's side: connections, limits, held scrapes.  Loop thread only."""

    def __init__(self, renderer: Renderer, push: PushEndpoint,
                 refused: MutableMapping[str, int]) -> None:
        self._renderer = renderer
        self._push = push
        self._refused = refused
        self._connections: dict[_Connection, None] = {}  # insertion order: idle since
        self.open_sockets = 0  # accepted and not yet closed (see _GuardedProtocol)
        self._held = 0
        self._changed = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self._date = (0, "")
        self._start_id = secrets.token_hex(8)

    # -- connections -----------------------------------------------------------

    async def connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(reader, writer)
        if len(self._connections) >= MAX_CONNECTIONS and not self._evict():
            self._count("ConnectionLimit")
            conn.abort()
            return
        self._connections[conn] = None
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            await self._serve(conn)
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            log.debug("exporter connection ended: %r", exc)
        except Exception:  # a bug of ours: one line in the training log, the server goes on
            log.warning("exporter request failed", exc_info=True)
        finally:
            self._connections.pop(conn, None)
            if conn.evicted:
                conn.abort()
            else:
                writer.close()

    def refuse_at_accept(self) -> None:
        """Count a socket closed as it was accepted (over the cap and its headroom)."""
        self._count("ConnectionLimit")

    def _evict(self) -> bool:
        """Close the connection idle longest (waiting for a request); False when none is."""
        for conn in self._connections:
            if conn.idle:
                conn.evicted = True
                del self._connections[conn]
                self._count("ConnectionLimit")
                conn.abort()
                return True
        return False

    async def _serve(self, conn: _Connection) -> None:
        while not self._stopping:
            conn.idle = True
            self._connections.pop(conn, None)
            self._connections[conn] = None  # to the end: the newest idle one
            try:
                async with asyncio.timeout(IDLE_TIMEOUT_SECONDS) as deadline:
                    block = await conn.head(deadline)
            except TimeoutError:
                if conn.buffer:  # a request had begun: it missed the header deadline
                    await self._refuse(conn, Refused(
                        HTTPStatus.REQUEST_TIMEOUT, "Timeout",
                        f"request head not complete within {HEADER_TIMEOUT_SECONDS:g} s",
                        close=True))
                return
            except Refused as err:
                await self._refuse(conn, err)
                return
            if block is None:
                return
            conn.idle = False
            try:
                request = parse_head(block)
                keep = await self._dispatch(conn, request) and request.keep_alive
            except Refused as err:
                await self._refuse(conn, err)
                return
            if not keep:
                return

    async def _refuse(self, conn: _Connection, err: Refused, head: bool = False,
                      length: int = 0) -> None:
        self._count(err.reason)
        if err.unread_body and length:
            await conn.drain(length)
        extra = [("Allow", "GET, HEAD")] if err.code == HTTPStatus.METHOD_NOT_ALLOWED else []
        await self._send(conn, err.code, err.body(), "application/json", head=head,
                         extra=extra, close=err.close)

    def _count(self, reason: str) -> None:
        self._refused[reason] = self._refused.get(reason, 0) + 1

    # -- routes ----------------------------------------------------------------

    async def _dispatch(self, conn: _Connection, request: Request) -> bool:
        """Answer one request; False when the connection must close."""
        head = request.method == "HEAD"
        length_header = request.headers.get("content-length")
        if "transfer-encoding" in request.headers:
            raise Refused(HTTPStatus.LENGTH_REQUIRED, "LengthRequired",
                          "Transfer-Encoding is not supported: send Content-Length",
                          close=True)
        if request.method == "POST":
            await self._post(conn, request)
            return True
        if request.method not in ("GET", "HEAD"):
            await self._refuse(conn, Refused(
                HTTPStatus.METHOD_NOT_ALLOWED, "MethodNotAllowed",
                f"method {request.method[:20]!r} is not allowed on {request.path[:200]!r}",
                unread_body=bool(length_header)), length=_int(length_header))
            return not length_header
        if length_header not in (None, "0"):
            await self._refuse(conn, Refused(
                HTTPStatus.BAD_REQUEST, "BadRequest", f"a {request.method} carries no body",
                unread_body=True), head=head, length=_int(length_header))
            return False
        if request.path == "/healthz":
            await self._send(conn, HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8", head=head)
        elif request.path == "/metrics":
            await self._metrics(conn, request, head)
        else:
            await self._refuse(conn, Refused(
                HTTPStatus.NOT_FOUND, "NotFound",
                f"no such path: {request.path[:200]!r}; try /metrics or /healthz"), head=head)
        return True

    async def _post(self, conn: _Connection, request: Request) -> None:
        headers = request.headers
        length_header = headers.get("content-length")
        try:
            length = self._push.check(request.path, headers.get("authorization"),
                                      headers.get("content-type"), length_header)
        except Refused as err:
            await self._refuse(conn, err, length=_int(length_header))
            return
        try:
            async with asyncio.timeout(BODY_TIMEOUT_SECONDS):
                raw = await conn.body(length)
        except TimeoutError:
            raise Refused(HTTPStatus.REQUEST_TIMEOUT, "Timeout",
                          f"body of {length} bytes not complete within "
                          f"{BODY_TIMEOUT_SECONDS:g} s", close=True) from None
        try:
            answer = self._push.apply(raw)
        except Refused as err:
            await self._refuse(conn, err)
            return
        await self._send(conn, HTTPStatus.OK, answer, "application/json")

    async def _metrics(self, conn: _Connection, request: Request, head: bool) -> None:
        accept = request.headers.get("accept")
        if_none_match = request.headers.get("if-none-match")
        # The generation is read before the body is rendered: the sequence sent is never
        # ahead of the body, so a lower sequence always means an older body.
        generation = self._renderer.version()[0]
        rendered = self._renderer.render(accept)
        wait = requested_wait(request.headers.get("prefer"))
        applied: int | None = None
        if (wait and _unchanged(rendered, if_none_match) and self._held < MAX_HELD
                and not self._stopping):
            applied = min(wait, MAX_WAIT_SECONDS)
            await self._hold(conn, accept, if_none_match, applied)
            generation = self._renderer.version()[0]
            rendered = self._renderer.render(accept)
        extra = [(SEQUENCE_HEADER, f"{generation}; start={self._start_id}")]
        if applied is not None:
            extra.append(("Preference-Applied", f"wait={applied}"))
        if rendered is None:
            await self._send(conn, HTTPStatus.NO_CONTENT, b"", None, head=True, extra=extra)
            return
        extra += [("ETag", rendered.etag), ("Cache-Control", "no-cache"), ("Vary", "Accept")]
        if etag_matches(if_none_match, rendered.etag):
            await self._send(conn, HTTPStatus.NOT_MODIFIED, b"", None, head=True, extra=extra)
            return
        await self._send(conn, HTTPStatus.OK, rendered.body, rendered.content_type, head=head,
                         extra=extra)

    async def _hold(self, conn: _Connection, accept: str | None, if_none_match: str | None,
                    seconds: int) -> Rendered | None:
        """Wait until the answer differs, ``seconds`` pass, the peer leaves or we stop."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        self._held += 1
        if self._watcher is None:
            self._watcher = loop.create_task(self._watch(), name="trainjob-exporter-watch")
        try:
            while True:
                changed = self._changed
                remaining = end - loop.time()
                if remaining <= 0 or self._stopping:
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await changed.wait()
                if conn.reader.at_eof() or conn.writer.transport.is_closing():
                    break
                rendered = self._renderer.render(accept)
                if not _unchanged(rendered, if_none_match):
                    return rendered
        finally:
            self._held -= 1
        return self._renderer.render(accept)

    async def _watch(self) -> None:
        """While scrapes are held, look for a new status every :data:`WAIT_POLL_SECONDS`.

        Polling keeps ``update()`` free of any wake-up call (it stays one lock and a few
        assignments); the loop only wakes while somebody waits.
        """
        seen = self._renderer.version()
        try:
            while self._held > 0 and not self._stopping:
                await asyncio.sleep(WAIT_POLL_SECONDS)
                version = self._renderer.version()
                if version != seen:
                    seen = version
                    self._wake()
        finally:
            self._watcher = None

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # -- output ----------------------------------------------------------------

    async def _send(self, conn: _Connection, code: int, body: bytes, content_type: str | None,
                    head: bool = False, extra: list[tuple[str, str]] | None = None,
                    close: bool = False) -> None:
        lines = [f"HTTP/1.1 {code} {HTTPStatus(code).phrase}", "Server: trainjob-exporter",
                 f"Date: {self._http_date()}", "{}: {}".format(*CONTRACT_HEADER)]
        if content_type is not None:
            lines.append(f"Content-Type: {content_type}")
        lines.extend(f"{name}: {value}" for name, value in extra or ())
        if code not in (HTTPStatus.NO_CONTENT, HTTPStatus.NOT_MODIFIED):
            lines.append(f"Content-Length: {len(body)}")
        if close:
            lines.append("Connection: close")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        conn.writer.write(data if head or not body else data + body)
        async with asyncio.timeout(WRITE_TIMEOUT_SECONDS):
            await conn.writer.drain()

    def _http_date(self) -> str:
        second = int(time.time())
        if self._date[0] != second:
            self._date = (second, formatdate(second, usegmt=True))
        return self._date[1]

    # -- shutdown --------------------------------------------------------------

    def stop(self) -> None:
        """Answer held scrapes at once and close idle connections (loop thread)."""
        self._stopping = True
        self._wake()
        for conn in list(self._connections):
            if conn.idle:
                conn.abort()

    def abort_all(self) -> None:
        """Close every connection now (loop thread)."""
        for conn in list(self._connections):
            conn.abort()

    def tasks(self) -> set[asyncio.Task[Any]]:
        """The tasks still serving connections or watching for held scrapes."""
        tasks = set(self._tasks)
        if self._watcher is not None:
            tasks.add(self._watcher)
        return tasks


def _unchanged(rendered: Rendered | None, if_none_match: str | None) -> bool:
    """True when the answer would tell the client nothing new (304, or 204 again)."""
    if rendered is None:
        return True
    return etag_matches(if_none_match, rendered.etag)


def _int(header: str | None) -> int:
    return int(header) if header and header.isdigit() and header.isascii() else 0


class _GuardedProtocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol, counting open sockets: beyond the cap plus
    :data:`ACCEPT_HEADROOM` a socket is aborted in ``connection_made``, so its descriptor
    is gone in the same loop pass that accepted it."""

    def __init__(self, server: _Server, reader: asyncio.StreamReader) -> None:
        super().__init__(reader, server.connected)
        self._owner = server
        self._counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._owner.open_sockets >= MAX_CONNECTIONS + ACCEPT_HEADROOM:
            self._owner.refuse_at_accept()
            cast(asyncio.Transport, transport).abort()
            return
        self._counted = True
        self._owner.open_sockets += 1
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._counted:
            return
        self._counted = False
        self._owner.open_sockets -= 1
        super().connection_lost(exc)


class ServerThread:
    """The exporter's server on its own daemon thread (``trainjob-exporter``).

    The socket is bound here, in the caller's thread, so a busy port raises at once.

    Raises:
        OSError: the address cannot be bound (``errno.EADDRINUSE`` when the port is taken).
    """

    def __init__(self, host: str, port: int, renderer: Renderer, push: PushEndpoint,
                 refused: MutableMapping[str, int]) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.create_server((host, port), family=family, backlog=BACKLOG)
        self.port: int = self._socket.getsockname()[1]
        self.host = host
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(_quiet_exceptions)
        self._server = _Server(renderer, push, refused)
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._listening = False
        self._accepting = 0  # accepted, transport not made yet
        self._thread = threading.Thread(target=self._run, name="trainjob-exporter", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._failed is not None:
            raise OSError(f"exporter server did not start: {self._failed!r}")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        loop = self._loop

        def protocol() -> _GuardedProtocol:
            reader = asyncio.StreamReader(limit=MAX_HEAD_BYTES * 2, loop=loop)
            return _GuardedProtocol(self._server, reader)

        self._protocol = protocol
        try:
            # Our own accept callback instead of loop.create_server: asyncio's accepts up
            # to a backlog's worth of sockets per wake-up and closes a refused one only
            # passes later, so a flood briefly held hundreds of descriptors over the cap.
            # Here a socket over the cap is closed where it was accepted.
            self._socket.setblocking(False)
            loop.add_reader(self._socket.fileno(), self._accept)
            self._listening = True
        except BaseException as exc:
            self._failed = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            # As asyncio.run ends: no task may be left pending when the loop closes.
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    def _accept(self) -> None:
        """Accept what is queued (at most :data:`ACCEPTS_PER_WAKEUP`); runs in the loop."""
        for _ in range(ACCEPTS_PER_WAKEUP):
            try:
                conn, _peer = self._socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EMFILE, ECONNABORTED: the kernel keeps or drops the rest
                return
            if self._server.open_sockets + self._accepting >= MAX_CONNECTIONS + ACCEPT_HEADROOM:
                self._server.refuse_at_accept()
                # A reset, not a FIN: nothing was read, nothing will be answered.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
                continue
            conn.setblocking(False)
            self._accepting += 1
            self._loop.create_task(self._connect(conn))

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._protocol, conn)
        except OSError:
            conn.close()
        finally:
            self._accepting -= 1

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving: held scrapes are answered at once, then every connection closes.

        Waits up to ``grace`` seconds for answers in flight, then up to 5 s for the thread.
        """
        if self._loop.is_closed():
            return
        done = threading.Event()

        async def shutdown() -> None:
            if self._listening:
                self._loop.remove_reader(self._socket.fileno())
                self._listening = False
                self._socket.close()
            self._server.stop()
            if tasks := self._server.tasks():
                await asyncio.wait(tasks, timeout=grace)
            self._server.abort_all()
            if tasks := self._server.tasks():
                await asyncio.wait(tasks, timeout=1.0)
            done.set()
            self._loop.stop()

        try:
            self._loop.call_soon_threadsafe(lambda: self._loop.create_task(shutdown()))
        except RuntimeError:  # the loop already stopped
            return
        done.wait(grace + 5)
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self._socket.close()


def _quiet_exceptions(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    # asyncio's default handler prints tracebacks for peers that vanish mid-write; in a
    # training log that is noise on every scraper restart.
    exc = context.get("exception")
    if isinstance(exc, ConnectionError | TimeoutError):
        log.debug("exporter connection: %s", context.get("message"))
        return
    log.warning("exporter server: %s (%r)", context.get("message"), exc)

