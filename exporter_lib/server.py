"""The exporter's HTTP/1.1 server: one asyncio event loop on one daemon thread.

Why not the stdlib's ``ThreadingHTTPServer`` (prometheus-client's choice, used here
before): it starts one thread per connection inside the training process and
restarts its idle timeout on every byte, so 2000 idle or trickling connections from
any pod gave 2008 threads and 2011 descriptors, and with ``RLIMIT_NOFILE=1024`` the
training loop died of ``EMFILE`` (issue 13, input 10); a held (waiting) scrape would
pin a thread too.  Here a connection is a few objects on one loop, and everything is
bounded (constants below, documented in ``docs/exporter.md``).

Requests are parsed by h11 (:meth:`_ScraperConnection.head`, :func:`request_from`): h11 finds
where each head ends and checks its request line and every header field, to RFC 9112.
The server keeps the bytes h11 has not used (pipelined requests, a push body) on each
connection, reads a push body by its ``Content-Length`` itself, and bounds the head
(:data:`MAX_HEAD_BYTES`, its deadline), because its limits and its eviction rule look
at the bytes waiting on each connection.  Why h11: pure Python with no dependencies (the
training image gains no compiled wheel; Hugging Face's hub client already brings it),
and sans-I/O, so it fits this loop as it is; the stdlib's ``http.server`` parses only
from a blocking file inside a handler and accepts malformed fields (its header parser is
the e-mail one); httptools would add a compiled wheel for a parse that runs once per
scrape.
The bounds:

* at most :data:`MAX_CONNECTIONS` open connections; a new one beyond that closes a
  *stalled* one (issue 21, input 7): waiting for a request or trickling its head,
  holding pipelined requests, or not reading its answers (bytes left in its write
  buffer).  The victim is taken first from a peer address holding more than its
  fair share of the slots, then from the worst-behaved (not reading, pipelining,
  trickling, or silent for :data:`NEW_CONNECTION_GRACE_SECONDS`; then new ones;
  last, keep-alive clients between requests whose answers were all read), then from
  the peer holding the most, then the one stalled longest: one source cannot take
  every slot from the others, and a flood from the scraper's own address loses its
  misbehaving sockets before the scraper's keep-alive connection or fresh request.
  A new connection whose client has sent bytes not read yet is never the victim (the
  server is behind, not the client).  When nothing is stalled (requests being
  answered, held scrapes, requests not read yet) the new connection is served over the
  cap; with :data:`MAX_CONNECTIONS` + :data:`ACCEPT_HEADROOM` sockets open nothing more
  is accepted until one closes (no reset for arriving when the server is full).  At the
  cap, a new socket that pipelines before its first answer is reset at accept
  (``ConnectionLimit``);
* requests pipelined on one connection are answered one per turn of the loop, so a
  client with 200 queued requests does not make the others wait for all of them;
  an answer buffer above :data:`WRITE_BUFFER_BYTES` waits for the client to read;
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
import collections
import contextlib
import logging
import re
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import h11

try:  # POSIX: how many bytes a socket holds unread (the exporter runs on Linux pods)
    import fcntl
    import termios
except ImportError:  # pragma: no cover - Windows: only what the loop has read counts
    fcntl = termios = None  # type: ignore[assignment]

from exporter_lib.exposition import Renderer, etag_matches
from exporter_lib.hold_policy import WRITE_POLICY_HEADER, parse_policy
from exporter_lib.pod import POD_HEADER, pod_identity
from exporter_lib.push import MAX_BODY_BYTES, PushEndpoint
from exporter_lib.refusal import Refused
from exporter_lib.waiting import WaitingScrapes

log = logging.getLogger("exporter_lib")

#: Open connections at most (a scraper, its standby, Prometheus, local push clients).
MAX_CONNECTIONS = 64
#: Unsent answer bytes per connection before the server waits for the client to read
#: (asyncio's default is 64 KiB): a client that pipelines and never reads holds this.
WRITE_BUFFER_BYTES = 16 * 1024
#: A new connection counts as misbehaving for eviction once it has sent no complete
#: request for this long (seconds); before, it ranks above misbehaving ones.
NEW_CONNECTION_GRACE_SECONDS = 1.0
#: Sockets beyond :data:`MAX_CONNECTIONS` that may be open at once: the evicted ones
#: until they close (the next loop pass), and requests served over the cap.  With this
#: many open, nothing more is accepted until one closes (a flood must not pile up
#: descriptors; the kernel's backlog holds the rest).
ACCEPT_HEADROOM = 16
#: Sockets kept per wake-up of the listening socket (then other work runs); new
#: pipeliners reset at the cap do not count (:meth:`ServerThread._accept`).
ACCEPTS_PER_WAKEUP = 4
#: With the headroom full, the accept looks again after this long (seconds) even if no
#: socket closed.
ACCEPT_RETRY_SECONDS = 0.1
#: Waiting scrapes held at once at most.
MAX_HELD = 8
#: Longest wait a scrape may ask for (seconds).
MAX_WAIT_SECONDS = 300
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
#: 1 = JSON/text by Accept, ETag and 304; 2 = 1 plus waiting scrapes (``Prefer: wait``);
#: 3 = 2 plus the scraper's write policy (:data:`~exporter_lib.hold_policy.WRITE_POLICY_HEADER`):
#: a held scrape is answered only for a change the scraper will write.
CONTRACT_VERSION = 3
#: Sent on every answer, so a scraper knows it may ask to wait, and for how long at most.
CONTRACT_HEADER = ("Trainjob-Exporter-Contract", f"{CONTRACT_VERSION};max-wait={MAX_WAIT_SECONDS}")

#: On every ``/metrics`` answer: ``<n>; start=<id>``, ``n`` the status generation the body
#: was rendered from (it only grows within one server), ``id`` a random name of this
#: server's start.  The scraper orders one target's answers by it, whatever the clocks
#: say (docs/scraper.md, "Other writers and time", rule 5).
SEQUENCE_HEADER = "Trainjob-Exporter-Sequence"

_POLICY_KEY = WRITE_POLICY_HEADER.lower()  # request header names are kept lower-case
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


def request_from(event: h11.Request) -> Request:
    """The :class:`Request` of a head h11 parsed (RFC 9110/9112).

    h11 has checked the request line and every field (tokens, field syntax, whitespace
    before a colon, a continuation line with no field before it, ``Content-Length``,
    exactly one ``Host`` in HTTP/1.1 and at most one in HTTP/1.0); a continuation line
    after a field is joined to it with a space (RFC 9112 section 5.2).  Repeated fields
    are joined with ``, `` (RFC 9110 section 5.3).

    Raises:
        Refused: 431 more than :data:`MAX_HEADER_FIELDS` fields, 505 a version other
            than HTTP/1.0 or 1.1, 400 a target that is not a path.
    """
    version = "HTTP/" + event.http_version.decode("ascii")
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise Refused(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "HTTPVersionNotSupported",
                      f"{version} is not supported; use HTTP/1.1", close=True)
    if len(event.headers) > MAX_HEADER_FIELDS:
        raise Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "RequestHeaderFieldsTooLarge",
                      f"{len(event.headers)} header fields exceed the limit of "
                      f"{MAX_HEADER_FIELDS}", close=True)
    headers: dict[str, str] = {}
    for raw_name, raw_value in event.headers:  # names come lower-case
        key = raw_name.decode("ascii")
        text = raw_value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    target = event.target.decode("ascii")
    try:
        path = urlsplit(target).path if target.startswith(("/", "http://", "https://")) else ""
    except ValueError:
        path = ""
    if not path.startswith("/"):
        raise Refused(HTTPStatus.BAD_REQUEST, "BadRequest",
                      f"request target {target[:80]!r} is not a path", close=True)
    return Request(event.method.decode("ascii").upper(), path, version, headers)


def pipelines(first: bytes) -> bool:
    """True when ``first`` (the bytes a new connection sent before any answer) holds a
    whole ``GET``/``HEAD`` request head followed by more bytes: a client that sends its
    next request before reading an answer.  h11 finds the head; anything malformed is
    left to the server's own answer (False)."""
    parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    parser.receive_data(first)
    try:
        event = parser.next_event()
    except h11.RemoteProtocolError:
        return False
    return (isinstance(event, h11.Request) and event.method in (b"GET", b"HEAD")
            and bool(parser.trailing_data[0]))


def _malformed(block: bytes, exc: h11.RemoteProtocolError) -> Refused:
    """The refusal for a head h11 rejected (``block``: the buffer from the head's start):
    its reason, or the ``Host`` rule with the number of ``Host`` fields (counted here only
    to name it in the message)."""
    if exc.error_status_hint == HTTPStatus.NOT_IMPLEMENTED:  # an unknown Transfer-Encoding
        return Refused(HTTPStatus.LENGTH_REQUIRED, "LengthRequired",
                       "Transfer-Encoding is not supported: send Content-Length", close=True)
    if exc.error_status_hint == HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE:
        return Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                       "RequestHeaderFieldsTooLarge",
                       f"request head exceeds the limit of {MAX_HEAD_BYTES} bytes", close=True)
    ends = [at for at in (block.find(b"\n\r\n"), block.find(b"\n\n")) if at >= 0]
    lines = block[:min(ends, default=len(block))].split(b"\n")
    version = lines[0].rstrip(b"\r").rpartition(b" ")[2]
    hosts = sum(line.partition(b":")[0].lower() == b"host" for line in lines[1:])
    if hosts > 1 or (hosts == 0 and version == b"HTTP/1.1"):
        return Refused(HTTPStatus.BAD_REQUEST, "BadRequest",
                       f"{hosts} Host header fields in a {version.decode('latin-1')} request: "
                       f"at most one, and exactly one in HTTP/1.1 (RFC 9112 section 3.2)",
                       close=True)
    return Refused(HTTPStatus.BAD_REQUEST, "BadRequest",
                   f"malformed request head: {str(exc)[:200]}", close=True)


def _bytes_waiting(transport: asyncio.BaseTransport) -> bool:
    """True when the kernel holds bytes from the client that the loop has not read yet
    (``FIONREAD``).  On a loaded machine a fresh scrape's request can sit there for a
    while after its connection was accepted; without this it looked silent, and a
    flood could get it evicted (issue 27, deliverable 7)."""
    sock = transport.get_extra_info("socket")
    if sock is None or fcntl is None:
        return False
    count = bytearray(4)
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, count)
    except OSError:
        return False
    waiting: int = struct.unpack("i", count)[0]  # a C int, native byte order
    return waiting > 0


class _ScraperConnection:
    """One client connection: its stream, a read buffer, and whether it waits for a request."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buffer = bytearray()
        self.idle = True  # waiting for (the rest of) a request head: may be evicted
        self.evicted = False
        peer = writer.get_extra_info("peername")
        self.peer: str = peer[0] if isinstance(peer, tuple) and peer else "?"
        #: Loop time since which it waits for its client (a request, or a read).
        self.since = self.opened = asyncio.get_running_loop().time()
        self.answered = 0  # answers written and taken by the client
        self.taken = 0  # bytes this server has read from the client

    @property
    def unread(self) -> bool:
        """Its client has sent bytes that this server has not read yet, and has had no
        answer: the server is behind, not the client (a fresh scrape waits for its first
        read here).  Such a connection is never evicted, whatever else arrives; it is
        read within a loop pass or two, and judged by what it sent from then on."""
        protocol = self.writer.transport.get_protocol()
        return (not self.answered and not self.taken
                and isinstance(protocol, _GuardedProtocol)
                and (protocol.sent or _bytes_waiting(self.writer.transport)))

    def standing(self, now: float) -> int:
        """How well the client behaves, for eviction (lowest goes first): 0 it does not
        read its answers, pipelines, trickles a head or sent no request within
        :data:`NEW_CONNECTION_GRACE_SECONDS`; 1 new (within that grace, no answer
        yet); 2 between requests, every answer read (a keep-alive scraper)."""
        if self.writer.transport.get_write_buffer_size() > 0:
            return 0
        if self.buffer and (self.answered or now - self.since >= NEW_CONNECTION_GRACE_SECONDS):
            return 0
        if not self.answered:
            return 0 if now - self.opened >= NEW_CONNECTION_GRACE_SECONDS else 1
        return 2

    @property
    def stalled(self) -> bool:
        """Waiting for its client (for a request head, or to read the answers sent), or
        holding pipelined requests: each answered one per loop turn, the client has
        already been served and waits its turn as a new connection would.  Never while
        :attr:`unread`."""
        return ((self.idle or bool(self.buffer)
                 or self.writer.transport.get_write_buffer_size() > 0) and not self.unread)

    @property
    def alive(self) -> bool:
        """The socket is open and not evicted (see :class:`_GuardedProtocol`)."""
        protocol = self.writer.transport.get_protocol()
        return not isinstance(protocol, _GuardedProtocol) or protocol.alive

    def abort(self) -> None:
        self.writer.transport.abort()

    async def head(self, deadline: asyncio.Timeout) -> h11.Request | None:
        """The next request head, parsed by h11, or ``None`` when the peer closed between
        requests.  The bytes after the head (a push body, pipelined requests) stay in
        :attr:`buffer`.

        Raises:
            Refused: 431 the head exceeds :data:`MAX_HEAD_BYTES`, 400 the peer closed
                mid-head or the head is malformed (:func:`request_from`).
            TimeoutError: ``deadline`` passed (rescheduled here to the header deadline
                at the first byte).
        """
        parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        fed = 0  # bytes of the buffer given to the parser
        while True:
            if not fed:
                while self.buffer[:2] == b"\r\n" or self.buffer[:1] == b"\n":  # RFC 9112 2.2
                    del self.buffer[:2 if self.buffer[:1] == b"\r" else 1]
                if self.buffer:
                    deadline.reschedule(asyncio.get_running_loop().time()
                                        + HEADER_TIMEOUT_SECONDS)
            if len(self.buffer) > fed:
                parser.receive_data(bytes(self.buffer[fed:]))
                fed = len(self.buffer)
                try:
                    event = parser.next_event()
                except h11.RemoteProtocolError as exc:
                    raise _malformed(bytes(self.buffer[:MAX_HEAD_BYTES]), exc) from None
                if isinstance(event, h11.Request):
                    used = fed - len(parser.trailing_data[0])
                    if used > MAX_HEAD_BYTES + 4:  # complete, but past the limit
                        raise Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                                      "RequestHeaderFieldsTooLarge",
                                      f"request head exceeds the limit of {MAX_HEAD_BYTES} "
                                      f"bytes", close=True)
                    del self.buffer[:used]
                    return event
            chunk = await self.reader.read(65536)
            self.taken += len(chunk)
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
            rest = await self.reader.readexactly(length - len(taken))
            self.taken += len(rest)
            taken += rest
        return taken

    async def drain(self, length: int) -> None:
        """Read and drop up to ``length`` bytes within :data:`DRAIN_TIMEOUT_SECONDS`."""
        remaining = min(length, DRAIN_MAX_BYTES) - len(self.buffer)
        self.buffer.clear()
        with contextlib.suppress(TimeoutError, ConnectionError, OSError):
            async with asyncio.timeout(DRAIN_TIMEOUT_SECONDS):
                while remaining > 0:
                    chunk = await self.reader.read(min(65536, remaining))
                    self.taken += len(chunk)
                    if not chunk:
                        return
                    remaining -= len(chunk)


class _Server:
    """The event loop's side: connections, limits, routes; waiting scrapes in
    :class:`~exporter_lib.waiting.WaitingScrapes`.  Loop thread only."""

    def __init__(self, renderer: Renderer, push: PushEndpoint,
                 refused: MutableMapping[str, int]) -> None:
        self._renderer = renderer
        self._push = push
        self._refused = refused
        self._connections: dict[_ScraperConnection, None] = {}  # the open ones
        self.open_sockets = 0  # accepted and not yet closed (see _GuardedProtocol)
        self.closing = 0  # of those, evicted: closed at the next loop pass
        #: Called when a socket closes (ServerThread: accept again if it had paused).
        self.released: Callable[[], None] = lambda: None
        self._waiting = WaitingScrapes(renderer)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self._date = (0, "")
        # Which pod answers, on every answer (issue 21, input 2): read once, at start.
        stated = pod_identity().header()
        self._pod_line = f"{POD_HEADER}: {stated}" if stated else None
        self._start_id = secrets.token_hex(8)

    # -- connections -----------------------------------------------------------

    async def connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _ScraperConnection(reader, writer)
        writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
        # Over the cap only when no connection could be evicted as this one was accepted:
        # evict one now if one has stalled since; else it is served over the cap, within
        # the headroom the accept keeps.  Closing it would reset a client that did nothing
        # wrong (a fresh scrape whose request has not arrived yet looks just like it).
        if self.open_sockets - self.closing > MAX_CONNECTIONS:
            self._evict()
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
            try:
                if not conn.evicted:
                    await self._close(conn)
            finally:
                self._connections.pop(conn, None)
                conn.abort()

    async def _close(self, conn: _ScraperConnection) -> None:
        """Close gracefully, the answer's last bytes first, within
        :data:`WRITE_TIMEOUT_SECONDS`.  The connection stays listed (evictable while its
        client does not read) until it is closed: a socket that is no longer listed could
        not be evicted, and one whose client never reads would hold its slot for good."""
        conn.idle = False
        conn.writer.close()
        with contextlib.suppress(TimeoutError, ConnectionError, OSError):
            async with asyncio.timeout(WRITE_TIMEOUT_SECONDS):
                await conn.writer.wait_closed()

    def refuse_pipeliner(self) -> None:
        """Count a new socket closed at the cap for pipelining before its first answer."""
        self._count("ConnectionLimit")

    def make_room(self) -> None:
        """At accept time, with :data:`MAX_CONNECTIONS` or more live: close stalled
        connections (:meth:`_evict`) until one slot is free for the new socket, or none
        is stalled.  More than one goes only after connections were kept over the cap
        (:meth:`connected`); the accept bounds the sockets open meanwhile."""
        while self.open_sockets - self.closing >= MAX_CONNECTIONS and self._evict():
            pass

    def _evict(self) -> bool:
        """Close one stalled connection (module docstring); False when none is stalled.

        The victim: first of a peer holding more than its fair share (the slots over
        the peers seen), then the worst :meth:`_ScraperConnection.standing`, then of the peer
        holding the most, then the one stalled longest.
        """
        held = collections.Counter(conn.peer for conn in self._connections)
        # Only an open, not yet evicted socket: evicting one already lost frees nothing.
        stalled = [conn for conn in self._connections if conn.stalled and conn.alive]
        if not stalled:
            return False
        share = max(1, MAX_CONNECTIONS // len(held))
        now = asyncio.get_running_loop().time()
        victim = min(stalled, key=lambda conn: (held[conn.peer] <= share, conn.standing(now),
                                                -held[conn.peer], conn.since))
        victim.evicted = True
        protocol = victim.writer.transport.get_protocol()
        if isinstance(protocol, _GuardedProtocol):
            protocol.evict()
        del self._connections[victim]
        self._count("ConnectionLimit")
        victim.abort()
        return True

    async def _serve(self, conn: _ScraperConnection) -> None:
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
                        f"request head not complete within {HEADER_TIMEOUT_SECONDS:g} s",
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

    async def _refuse(self, conn: _ScraperConnection, err: Refused, head: bool = False,
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

    async def _dispatch(self, conn: _ScraperConnection, request: Request) -> bool:
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

    async def _post(self, conn: _ScraperConnection, request: Request) -> None:
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

    async def _metrics(self, conn: _ScraperConnection, request: Request, head: bool) -> None:
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

    async def _send(self, conn: _ScraperConnection, code: int, body: bytes,
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

    # -- shutdown --------------------------------------------------------------

    def stop(self) -> None:
        """Answer held scrapes at once and close idle connections (loop thread)."""
        self._stopping = True
        self._waiting.stop()
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
        watcher = self._waiting.task()
        if watcher is not None:
            tasks.add(watcher)
        return tasks


def _int(header: str | None) -> int:
    return int(header) if header and header.isdigit() and header.isascii() else 0


class _GuardedProtocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol, keeping the server's socket counts exact: a socket is
    counted (``open_sockets``) from its accept until :meth:`release`, which runs once,
    when the connection is lost or could not be set up; an evicted one also counts in
    ``closing`` until then."""

    def __init__(self, server: _Server, reader: asyncio.StreamReader) -> None:
        super().__init__(reader, server.connected)
        self._owner = server
        self._counted = True  # counted at accept (ServerThread._accept)
        self.closing = False  # evicted; counted in the server's ``closing`` until lost
        #: The client has sent bytes (seen at accept, or delivered since).
        self.sent = False

    @property
    def alive(self) -> bool:
        """Open and not evicted: closing it now frees a descriptor."""
        return self._counted and not self.closing

    def evict(self) -> bool:
        """Mark the socket evicted (counted in ``closing`` until it is lost); False when
        it is already evicted or lost, so evicting it frees nothing."""
        if not self.alive:
            return False
        self.closing = True
        self._owner.closing += 1
        return True

    def release(self) -> None:
        """Uncount the socket (once): it is closed."""
        if not self._counted:
            return
        self._counted = False
        self._owner.open_sockets -= 1
        if self.closing:
            self._owner.closing -= 1
        self._owner.released()

    def data_received(self, data: bytes) -> None:
        self.sent = True
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.release()
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
        self._paused = False  # the accept waits for a socket to close (the headroom is full)
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
        self._server.released = self._resume_accepting
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
        """Accept what is queued (at most :data:`ACCEPTS_PER_WAKEUP` kept, and at most
        :data:`BACKLOG` looked at); runs in the loop.

        A socket counts in ``open_sockets`` from here until it is closed, so the count is
        the descriptors held, whatever stage each socket is in.  With
        :data:`MAX_CONNECTIONS` plus :data:`ACCEPT_HEADROOM` open, nothing more is
        accepted until one closes: the rest wait in the kernel's backlog (no descriptor
        here, and no client reset for arriving when the server was full).  At the cap, a
        new socket that already pipelines (more than one request before any answer) is
        closed at once (:func:`pipelines`): it would only take a slot from a client that
        behaves, and closing it here costs no task, so a flood of them drains the
        kernel's backlog quickly and a scrape's connect finds room there.
        """
        server = self._server
        kept = 0
        for _ in range(BACKLOG):
            if kept >= ACCEPTS_PER_WAKEUP:
                return
            if server.open_sockets >= MAX_CONNECTIONS + ACCEPT_HEADROOM:
                server.make_room()  # stalled ones over the cap go; their close resumes this
                self._pause_accepting()
                return
            try:
                conn, _peer = self._socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EMFILE, ECONNABORTED: the kernel keeps or drops the rest
                return
            conn.setblocking(False)
            protocol = self._protocol()
            try:  # what the client has sent already (EAGAIN: nothing yet)
                first = conn.recv(MAX_HEAD_BYTES, socket.MSG_PEEK)
            except OSError:
                first = b""
            protocol.sent = bool(first)
            full = server.open_sockets - server.closing >= MAX_CONNECTIONS
            if full and pipelines(first):
                server.refuse_pipeliner()
                # A reset, not a FIN: its requests are unread and will not be answered.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
                continue
            # Fair eviction happens here, where the new socket is: stalled connections
            # go, the new one stays.  Evicted sockets close at the next loop pass.
            if full:
                server.make_room()
            server.open_sockets += 1
            kept += 1
            self._loop.create_task(self._connect(conn, protocol))

    def _pause_accepting(self) -> None:
        if self._listening and not self._paused:
            self._paused = True
            self._loop.remove_reader(self._socket.fileno())
            # Also look again later: connections kept over the cap may turn stalled
            # (evictable) without any socket closing.
            self._loop.call_later(ACCEPT_RETRY_SECONDS, self._resume_accepting)

    def _resume_accepting(self) -> None:
        """A socket closed, or :data:`ACCEPT_RETRY_SECONDS` passed: accept again if the
        accept had paused at the headroom (:meth:`_accept` pauses again if still full)."""
        if self._paused and self._listening:
            self._paused = False
            self._loop.add_reader(self._socket.fileno(), self._accept)

    async def _connect(self, conn: socket.socket, protocol: _GuardedProtocol) -> None:
        try:
            await self._loop.connect_accepted_socket(lambda: protocol, conn)
        except OSError:
            conn.close()
            protocol.release()

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

