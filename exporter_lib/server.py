"""The exporter's HTTP/1.1 server: one asyncio event loop on one daemon thread.

A connection is a few objects on one loop, and everything is bounded: the connection
policy (:mod:`exporter_lib.connection_policy`: which sockets are accepted, kept and
evicted) and the protocol (:mod:`exporter_lib.protocol`: request heads parsed by h11,
their limits and deadlines) are their own modules; this one serves the routes.  Why
not the stdlib's threaded server, and why h11: ``docs/decisions.md``, "The exporter
parses requests with h11 on one asyncio loop".  The limits are listed in
``docs/exporter.md``.

Requests pipelined on one connection are answered one per turn of the loop, so a
client with 200 queued requests does not make the others wait for all of them.  A
keep-alive connection without a request closes after :data:`IDLE_TIMEOUT_SECONDS`; a
push body must arrive within :data:`BODY_TIMEOUT_SECONDS`, and an answer must be taken
within :data:`WRITE_TIMEOUT_SECONDS`; at most :data:`MAX_HELD` waiting scrapes.

Routes:

* ``GET|HEAD /metrics``: Prometheus text / OpenMetrics by ``Accept``; JSON
  (``TrainerStatus.to_json()``) when ``Accept`` lists ``application/json``, or
  ``204`` before the first report.  Strong ``ETag``; ``If-None-Match`` -> ``304``.
  **Waiting scrapes** (contract version 2): with ``Prefer: wait=N`` (RFC 7240
  section 4.3) a request whose answer would be ``304`` (or ``204``) is held until
  the status changes (then ``200``) or ``N`` seconds (at most :data:`MAX_WAIT_SECONDS`)
  pass (then ``304``/``204``); a held answer carries ``Preference-Applied: wait=N``.
  Beyond :data:`MAX_HELD` held requests the answer comes at once, without
  ``Preference-Applied``.  **Write policy** (contract version 3): a waiting scrape with
  ``If-None-Match`` and :data:`~exporter_lib.hold_policy.WRITE_POLICY_HEADER` is held
  through changes the scraper would not write yet, and answered when the percentage
  differs from the scraper's, when its metrics fall due, when the wait ends, or at
  once when the server stops (:mod:`exporter_lib.hold_policy`).
  Every answer carries :data:`CONTRACT_HEADER`, and
  :data:`~exporter_lib.pod.POD_HEADER` (which pod answers) when the pod states one.
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
import secrets
import socket
import threading
import time
from collections.abc import MutableMapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

from exporter_lib import protocol
from exporter_lib.connection_policy import (
    ACCEPT_HEADROOM,
    ACCEPT_RETRY_SECONDS,
    ACCEPTS_PER_WAKEUP,
    BACKLOG,
    MAX_CONNECTIONS,
    NEW_CONNECTION_GRACE_SECONDS,
    WRITE_BUFFER_BYTES,
    Acceptor,
    GuardedProtocol,
    Slots,
)
from exporter_lib.exposition import Renderer, etag_matches
from exporter_lib.hold_policy import WRITE_POLICY_HEADER, parse_policy
from exporter_lib.pod import POD_HEADER, pod_identity
from exporter_lib.protocol import (
    CONTRACT_HEADER,
    CONTRACT_VERSION,
    DRAIN_MAX_BYTES,
    DRAIN_TIMEOUT_SECONDS,
    HEADER_TIMEOUT_SECONDS,
    MAX_HEAD_BYTES,
    MAX_HEADER_FIELDS,
    MAX_WAIT_SECONDS,
    SEQUENCE_HEADER,
    Connection,
    Request,
    request_from,
    requested_wait,
)
from exporter_lib.push import PushEndpoint
from exporter_lib.refusal import Refused
from exporter_lib.waiting import WaitingScrapes

# The limits and wire names stay importable from here, where the server is.
__all__ = [
    "ACCEPTS_PER_WAKEUP", "ACCEPT_HEADROOM", "ACCEPT_RETRY_SECONDS", "BACKLOG",
    "BODY_TIMEOUT_SECONDS", "CONTRACT_HEADER", "CONTRACT_VERSION", "DRAIN_MAX_BYTES",
    "DRAIN_TIMEOUT_SECONDS", "HEADER_TIMEOUT_SECONDS", "IDLE_TIMEOUT_SECONDS", "MAX_CONNECTIONS",
    "MAX_HEADER_FIELDS", "MAX_HEAD_BYTES", "MAX_HELD", "MAX_WAIT_SECONDS",
    "NEW_CONNECTION_GRACE_SECONDS", "SEQUENCE_HEADER", "WRITE_BUFFER_BYTES",
    "WRITE_TIMEOUT_SECONDS", "Request", "ServerThread", "request_from", "requested_wait",
]

log = logging.getLogger("exporter_lib")

#: Waiting scrapes held at once at most.
MAX_HELD = 8
#: A keep-alive connection with no request in progress closes after this (seconds).
IDLE_TIMEOUT_SECONDS = 30.0
#: A push body must arrive within this (seconds).
BODY_TIMEOUT_SECONDS = 10.0
#: A client must take its answer within this (seconds).
WRITE_TIMEOUT_SECONDS = 10.0

_POLICY_KEY = WRITE_POLICY_HEADER.lower()  # request header names are kept lower-case


class _Server:
    """The event loop's side: connections (kept by :class:`Slots`), routes; waiting
    scrapes in :class:`~exporter_lib.waiting.WaitingScrapes`.  Loop thread only."""

    def __init__(self, renderer: Renderer, push: PushEndpoint,
                 refused: MutableMapping[str, int]) -> None:
        self._renderer = renderer
        self._push = push
        self._refused = refused
        self.slots = Slots(self._count)
        self._waiting = WaitingScrapes(renderer)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self._date = (0, "")
        # Which pod answers, on every answer: read once, at start.
        stated = pod_identity().header()
        self._pod_line = f"{POD_HEADER}: {stated}" if stated else None
        self._start_id = secrets.token_hex(8)

    # -- connections -----------------------------------------------------------

    async def connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one accepted connection until it closes (asyncio's stream callback).

        Never raises: a peer that vanishes ends the connection quietly (debug log), any
        other error is one warning in the training log and the server goes on.
        """
        conn = Connection(reader, writer)
        writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
        self.slots.admit(conn)
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
            try:
                if not conn.evicted:
                    await self._close(conn)
            finally:
                self.slots.discard(conn)
                conn.abort()

    async def _close(self, conn: Connection) -> None:
        """Close gracefully, the answer's last bytes first, within
        :data:`WRITE_TIMEOUT_SECONDS`.  The connection stays listed (evictable while its
        client does not read) until it is closed: a socket that is no longer listed could
        not be evicted, and one whose client never reads would hold its slot for good."""
        conn.idle = False
        conn.writer.close()
        with contextlib.suppress(TimeoutError, ConnectionError, OSError):
            async with asyncio.timeout(WRITE_TIMEOUT_SECONDS):
                await conn.writer.wait_closed()

    async def _serve(self, conn: Connection) -> None:
        while not self._stopping:
            conn.idle = True
            conn.since = asyncio.get_running_loop().time()
            try:
                async with asyncio.timeout(IDLE_TIMEOUT_SECONDS) as deadline:
                    event = await conn.head(deadline)
            except TimeoutError:
                if conn.buffer:  # a request had begun: it missed the header deadline
                    await self._refuse(conn, Refused(
                        HTTPStatus.REQUEST_TIMEOUT, "Timeout",
                        f"request head not complete within {protocol.HEADER_TIMEOUT_SECONDS:g} s",
                        close=True))
                return
            except Refused as err:
                await self._refuse(conn, err)
                return
            if event is None:
                return
            conn.idle = False
            try:
                request = request_from(event)
                keep = await self._dispatch(conn, request) and request.keep_alive
            except Refused as err:
                await self._refuse(conn, err)
                return
            if not keep:
                return
            # One pipelined request per turn: the other connections' requests go between.
            await asyncio.sleep(0)

    async def _refuse(self, conn: Connection, err: Refused, head: bool = False,
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

    async def _dispatch(self, conn: Connection, request: Request) -> bool:
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

    async def _post(self, conn: Connection, request: Request) -> None:
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

    async def _metrics(self, conn: Connection, request: Request, head: bool) -> None:
        accept = request.headers.get("accept")
        if_none_match = request.headers.get("if-none-match")
        # The generation is read before the body is rendered: the sequence sent is never
        # ahead of the body, so a lower sequence always means an older body.
        generation = self._renderer.version()[0]
        rendered = self._renderer.render(accept)
        wait = requested_wait(request.headers.get("prefer"))
        # Contract 3: a scraper that has a status (If-None-Match) may state its write
        # policy; then only a change it will write ends the hold (hold_policy.py).
        policy = (parse_policy(request.headers.get(_POLICY_KEY))
                  if wait and if_none_match else None)
        applied: int | None = None
        if (wait and not self._waiting.due(rendered, if_none_match, policy, 0.0)
                and self._waiting.waiting < MAX_HELD and not self._stopping):
            applied = min(wait, MAX_WAIT_SECONDS)
            await self._waiting.wait(
                lambda: conn.reader.at_eof() or conn.writer.transport.is_closing(),
                accept, if_none_match, applied, policy)
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

    # -- output ----------------------------------------------------------------

    async def _send(self, conn: Connection, code: int, body: bytes,
                    content_type: str | None, head: bool = False,
                    extra: list[tuple[str, str]] | None = None,
                    close: bool = False) -> None:
        lines = [f"HTTP/1.1 {code} {HTTPStatus(code).phrase}", "Server: trainjob-exporter",
                 f"Date: {self._http_date()}", "{}: {}".format(*CONTRACT_HEADER)]
        if self._pod_line is not None:
            lines.append(self._pod_line)
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
        conn.answered += 1

    def _http_date(self) -> str:
        second = int(time.time())
        if self._date[0] != second:
            self._date = (second, formatdate(second, usegmt=True))
        return self._date[1]

    @property
    def holding(self) -> bool:
        """Whether a scrape waits now (read from any thread: a hint, not a lock)."""
        return self._waiting.waiting > 0

    def progress_moved(self) -> None:
        """A report changed the percentage: the waiting scrapes look now (loop thread)."""
        self._waiting.poke()

    # -- shutdown --------------------------------------------------------------

    def stop(self) -> None:
        """Answer held scrapes at once and close idle connections (loop thread)."""
        self._stopping = True
        self._waiting.stop()
        for conn in list(self.slots.connections):
            if conn.idle:
                conn.abort()

    def abort_all(self) -> None:
        """Close every connection now (loop thread)."""
        for conn in list(self.slots.connections):
            conn.abort()

    def tasks(self) -> set[asyncio.Task[Any]]:
        """The tasks still serving connections or watching for held scrapes."""
        tasks = set(self._tasks)
        watcher = self._waiting.task()
        if watcher is not None:
            tasks.add(watcher)
        return tasks


def _int(header: str | None) -> int:
    return int(header) if header and header.isdigit() and header.isascii() else 0


class ServerThread:
    """The exporter's server on its own daemon thread (``trainjob-exporter``).

    The socket is bound here, in the caller's thread, so a busy port raises at once.

    Args:
        host: address to listen on (IPv6 when it holds a ``:``).
        port: TCP port; 0 picks a free one (read it from :attr:`port`).
        renderer: renders the status for ``/metrics``.
        push: the push endpoint (``POST``).
        refused: counts of refused requests by reason, incremented here.

    Raises:
        OSError: the address cannot be bound (``errno.EADDRINUSE`` when the port is taken),
            or the server did not start within 10 s.
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
        self._acceptor: Acceptor | None = None
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="trainjob-exporter", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._failed is not None:
            raise OSError(f"exporter server did not start: {self._failed!r}")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        loop = self._loop
        slots = self._server.slots

        def protocol() -> GuardedProtocol:
            reader = asyncio.StreamReader(limit=MAX_HEAD_BYTES * 2, loop=loop)
            return GuardedProtocol(slots, reader, self._server.connected)

        try:
            self._acceptor = Acceptor(self._socket, loop, slots, protocol)
            self._acceptor.start()
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

    def progress_moved(self) -> None:
        """Wake the waiting scrapes, from any thread (``State.on_progress``): a report
        changed the percentage.  Nothing is done while no scrape waits or once the loop
        has closed; never raises."""
        if not self._server.holding:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self._loop.call_soon_threadsafe(self._server.progress_moved)

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving: held scrapes are answered at once, then every connection closes.

        Waits up to ``grace`` seconds for answers in flight, then up to 5 s for the thread.
        """
        if self._loop.is_closed():
            return
        done = threading.Event()

        async def shutdown() -> None:
            if self._acceptor is not None:
                self._acceptor.close()
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

