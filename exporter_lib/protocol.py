"""The exporter's HTTP/1.1 protocol: request heads parsed by h11, bodies read by length.

h11 finds where each head ends and checks its request line and every header field, to
RFC 9112.  A :class:`Connection` keeps the bytes h11 has not used (pipelined requests, a
push body), reads a push body by its ``Content-Length`` itself, and bounds the head
(:data:`MAX_HEAD_BYTES`, :data:`HEADER_TIMEOUT_SECONDS`), because the connection policy
(:mod:`exporter_lib.connection_policy`) looks at the bytes waiting on each connection.

The choice of h11 and its evidence: ``docs/decisions.md``, "The exporter parses requests
with h11 on one asyncio loop".
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlsplit

import h11

from exporter_lib.push import MAX_BODY_BYTES
from exporter_lib.refusal import Refused

#: Request line plus header fields, bytes.
MAX_HEAD_BYTES = 16 * 1024
#: Header fields per request.
MAX_HEADER_FIELDS = 100
#: A request's head must be complete this long after its first byte (seconds).
HEADER_TIMEOUT_SECONDS = 10.0
#: Bytes of a refused request body read and dropped before the answer (twice the push
#: limit): closing a socket with unread data sends a reset, which reaches a client
#: still sending its body as "broken pipe" instead of the answer.
DRAIN_MAX_BYTES = 2 * MAX_BODY_BYTES
#: Seconds the drain may take before the connection is closed anyway.
DRAIN_TIMEOUT_SECONDS = 2.0
#: Longest wait a scrape may ask for (seconds).
MAX_WAIT_SECONDS = 300

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


class Connection:
    """One client connection: its stream, a read buffer, and what the connection policy
    judges it by (whether it waits for a request, since when, what it read and answered).
    """

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

    def abort(self) -> None:
        """Close the socket now, without sending what is buffered."""
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
        """Exactly ``length`` body bytes (buffered ones first).

        Raises:
            asyncio.IncompleteReadError: the peer closed before ``length`` bytes came.
        """
        taken = bytes(self.buffer[:length])
        del self.buffer[:length]
        if len(taken) < length:
            rest = await self.reader.readexactly(length - len(taken))
            self.taken += len(rest)
            taken += rest
        return taken

    async def drain(self, length: int) -> None:
        """Read and drop up to ``length`` bytes (at most :data:`DRAIN_MAX_BYTES`) within
        :data:`DRAIN_TIMEOUT_SECONDS`; never raises."""
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
