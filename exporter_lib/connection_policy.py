"""The exporter's connection policy: which sockets it accepts, keeps and evicts.

The training process must never run out of descriptors or threads because of its
exporter, so everything is bounded (``docs/exporter.md``, "Limits"; why:
``docs/decisions.md``, "The exporter parses requests with h11 on one asyncio loop"):

* at most :data:`MAX_CONNECTIONS` open connections; a new one beyond that closes a
  *stalled* one: waiting for a request or trickling its head, holding pipelined
  requests, or not reading its answers (bytes left in its write buffer).  The victim is
  taken first from a peer address holding more than its fair share of the slots, then
  from the worst-behaved (not reading, pipelining, trickling, or silent for
  :data:`NEW_CONNECTION_GRACE_SECONDS`; then new ones; last, keep-alive clients between
  requests whose answers were all read), then from the peer holding the most, then the
  one stalled longest: one source cannot take every slot from the others, and a flood
  from the scraper's own address loses its misbehaving sockets before the scraper's
  keep-alive connection or fresh request.  A new connection whose client has sent
  bytes not read yet is never the victim (the server is behind, not the client).
* When nothing is stalled (requests being answered, held scrapes, requests not read
  yet) the new connection is served over the cap; with :data:`MAX_CONNECTIONS` +
  :data:`ACCEPT_HEADROOM` sockets open nothing more is accepted until one closes (no
  reset for arriving when the server is full).  At the cap, a new socket that
  pipelines before its first answer is reset at accept (``ConnectionLimit``).
* An answer buffer above :data:`WRITE_BUFFER_BYTES` waits for the client to read;
  listen backlog :data:`BACKLOG`.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
from collections.abc import Awaitable, Callable

try:  # POSIX: how many bytes a socket holds unread (the exporter runs on Linux pods)
    import fcntl
    import termios
except ImportError:  # pragma: no cover - Windows: only what the loop has read counts
    fcntl = termios = None  # type: ignore[assignment]

from exporter_lib.protocol import MAX_HEAD_BYTES, Connection, pipelines

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
#: pipeliners reset at the cap do not count (:meth:`Acceptor.accept`).
ACCEPTS_PER_WAKEUP = 4
#: With the headroom full, the accept looks again after this long (seconds) even if no
#: socket closed.
ACCEPT_RETRY_SECONDS = 0.1
#: Listen backlog (the stdlib server's 5 made 300 sequential connects take 44 s).
BACKLOG = 128


def _bytes_waiting(transport: asyncio.BaseTransport) -> bool:
    """True when the kernel holds bytes from the client that the loop has not read yet
    (``FIONREAD``).  On a loaded machine a fresh scrape's request can sit there for a
    while after its connection was accepted; without this it looked silent, and a
    flood could get it evicted."""
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


class Slots:
    """The open connections and the socket counts the policy is kept by.  Loop thread only.

    Args:
        count: called with ``"ConnectionLimit"`` for each socket evicted or reset.
    """

    def __init__(self, count: Callable[[str], None]) -> None:
        self._count = count
        self.connections: dict[Connection, None] = {}  # the open ones
        self.open_sockets = 0  # accepted and not yet closed (see GuardedProtocol)
        self.closing = 0  # of those, evicted: closed at the next loop pass
        #: Called when a socket closes (the acceptor: accept again if it had paused).
        self.released: Callable[[], None] = lambda: None

    def admit(self, conn: Connection) -> None:
        """List a connection set up on a socket counted at accept.

        Over the cap only when no connection could be evicted as this one was accepted:
        evict one now if one has stalled since; else it is served over the cap, within
        the headroom the accept keeps.  Closing it would reset a client that did nothing
        wrong (a fresh scrape whose request has not arrived yet looks just like it).
        """
        if self.open_sockets - self.closing > MAX_CONNECTIONS:
            self.evict()
        self.connections[conn] = None

    def discard(self, conn: Connection) -> None:
        """Unlist a connection that is closing."""
        self.connections.pop(conn, None)

    def refuse_pipeliner(self) -> None:
        """Count a new socket closed at the cap for pipelining before its first answer."""
        self._count("ConnectionLimit")

    def make_room(self) -> None:
        """At accept time, with :data:`MAX_CONNECTIONS` or more live: close stalled
        connections (:meth:`evict`) until one slot is free for the new socket, or none
        is stalled.  More than one goes only after connections were kept over the cap
        (:meth:`admit`); the accept bounds the sockets open meanwhile."""
        while self.open_sockets - self.closing >= MAX_CONNECTIONS and self.evict():
            pass

    def evict(self) -> bool:
        """Close one stalled connection (module docstring); False when none is stalled.

        The victim: first of a peer holding more than its fair share (the slots over
        the peers seen), then the worst :func:`standing`, then of the peer holding the
        most, then the one stalled longest.
        """
        held = collections.Counter(conn.peer for conn in self.connections)
        # Only an open, not yet evicted socket: evicting one already lost frees nothing.
        stalled_ = [conn for conn in self.connections if stalled(conn) and alive(conn)]
        if not stalled_:
            return False
        share = max(1, MAX_CONNECTIONS // len(held))
        now = asyncio.get_running_loop().time()
        victim = min(stalled_, key=lambda conn: (held[conn.peer] <= share, standing(conn, now),
                                                 -held[conn.peer], conn.since))
        victim.evicted = True
        protocol = victim.writer.transport.get_protocol()
        if isinstance(protocol, GuardedProtocol):
            protocol.evict()
        del self.connections[victim]
        self._count("ConnectionLimit")
        victim.abort()
        return True


class GuardedProtocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol, keeping the socket counts of :class:`Slots` exact: a
    socket is counted (``open_sockets``) from its accept until :meth:`release`, which runs
    once, when the connection is lost or could not be set up; an evicted one also counts
    in ``closing`` until then."""

    def __init__(self, slots: Slots, reader: asyncio.StreamReader,
                 connected: Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                                     Awaitable[None]]) -> None:
        super().__init__(reader, connected)
        self._owner = slots
        self._counted = True  # counted at accept (Acceptor.accept)
        self.closing = False  # evicted; counted in the slots' ``closing`` until lost
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


def unread(conn: Connection) -> bool:
    """Its client has sent bytes that this server has not read yet, and has had no
    answer: the server is behind, not the client (a fresh scrape waits for its first
    read here).  Such a connection is never evicted, whatever else arrives; it is read
    within a loop pass or two, and judged by what it sent from then on."""
    protocol = conn.writer.transport.get_protocol()
    return (not conn.answered and not conn.taken
            and isinstance(protocol, GuardedProtocol)
            and (protocol.sent or _bytes_waiting(conn.writer.transport)))


def standing(conn: Connection, now: float) -> int:
    """How well the client behaves, for eviction (lowest goes first): 0 it does not read
    its answers, pipelines, trickles a head or sent no request within
    :data:`NEW_CONNECTION_GRACE_SECONDS`; 1 new (within that grace, no answer yet); 2
    between requests, every answer read (a keep-alive scraper).  ``now``: loop time."""
    if conn.writer.transport.get_write_buffer_size() > 0:
        return 0
    if conn.buffer and (conn.answered or now - conn.since >= NEW_CONNECTION_GRACE_SECONDS):
        return 0
    if not conn.answered:
        return 0 if now - conn.opened >= NEW_CONNECTION_GRACE_SECONDS else 1
    return 2


def stalled(conn: Connection) -> bool:
    """Waiting for its client (for a request head, or to read the answers sent), or
    holding pipelined requests: each answered one per loop turn, the client has already
    been served and waits its turn as a new connection would.  Never while
    :func:`unread`."""
    return ((conn.idle or bool(conn.buffer)
             or conn.writer.transport.get_write_buffer_size() > 0) and not unread(conn))


def alive(conn: Connection) -> bool:
    """The socket is open and not evicted (see :class:`GuardedProtocol`)."""
    protocol = conn.writer.transport.get_protocol()
    return not isinstance(protocol, GuardedProtocol) or protocol.alive


class Acceptor:
    """Accepts sockets from the listening one by this policy, on the server's loop.

    Our own accept callback instead of ``loop.create_server``: asyncio's accepts up to a
    backlog's worth of sockets per wake-up and closes a refused one only passes later,
    so a flood briefly held hundreds of descriptors over the cap.  Here a socket over
    the cap is closed where it was accepted.

    Args:
        listener: the bound, listening socket (set non-blocking by :meth:`start`).
        loop: the server's event loop (all methods run in it, but :meth:`start`).
        slots: the counts and connections the policy keeps.
        protocol: makes the protocol of one accepted socket.
    """

    def __init__(self, listener: socket.socket, loop: asyncio.AbstractEventLoop, slots: Slots,
                 protocol: Callable[[], GuardedProtocol]) -> None:
        self._socket = listener
        self._loop = loop
        self._slots = slots
        self._protocol = protocol
        self.listening = False
        self._paused = False  # the accept waits for a socket to close (the headroom is full)
        slots.released = self.resume

    def start(self) -> None:
        """Watch the listening socket for connections.

        Raises:
            OSError: the socket cannot be watched.
        """
        self._socket.setblocking(False)
        self._loop.add_reader(self._socket.fileno(), self.accept)
        self.listening = True

    def close(self) -> None:
        """Stop accepting and close the listening socket (loop thread)."""
        if self.listening:
            self._loop.remove_reader(self._socket.fileno())
            self.listening = False
            self._socket.close()

    def accept(self) -> None:
        """Accept what is queued (at most :data:`ACCEPTS_PER_WAKEUP` kept, and at most
        :data:`BACKLOG` looked at); runs in the loop.

        A socket counts in ``open_sockets`` from here until it is closed, so the count is
        the descriptors held, whatever stage each socket is in.  With
        :data:`MAX_CONNECTIONS` plus :data:`ACCEPT_HEADROOM` open, nothing more is
        accepted until one closes: the rest wait in the kernel's backlog (no descriptor
        here, and no client reset for arriving when the server was full).  At the cap, a
        new socket that already pipelines (more than one request before any answer) is
        closed at once (:func:`~exporter_lib.protocol.pipelines`): it would only take a
        slot from a client that behaves, and closing it here costs no task, so a flood of
        them drains the kernel's backlog quickly and a scrape's connect finds room there.
        """
        slots = self._slots
        kept = 0
        for _ in range(BACKLOG):
            if kept >= ACCEPTS_PER_WAKEUP:
                return
            if slots.open_sockets >= MAX_CONNECTIONS + ACCEPT_HEADROOM:
                slots.make_room()  # stalled ones over the cap go; their close resumes this
                self._pause()
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
            full = slots.open_sockets - slots.closing >= MAX_CONNECTIONS
            if full and pipelines(first):
                slots.refuse_pipeliner()
                # A reset, not a FIN: its requests are unread and will not be answered.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
                continue
            # Fair eviction happens here, where the new socket is: stalled connections
            # go, the new one stays.  Evicted sockets close at the next loop pass.
            if full:
                slots.make_room()
            slots.open_sockets += 1
            kept += 1
            self._loop.create_task(self._connect(conn, protocol))

    def _pause(self) -> None:
        if self.listening and not self._paused:
            self._paused = True
            self._loop.remove_reader(self._socket.fileno())
            # Also look again later: connections kept over the cap may turn stalled
            # (evictable) without any socket closing.
            self._loop.call_later(ACCEPT_RETRY_SECONDS, self.resume)

    def resume(self) -> None:
        """A socket closed, or :data:`ACCEPT_RETRY_SECONDS` passed: accept again if the
        accept had paused at the headroom (:meth:`accept` pauses again if still full)."""
        if self._paused and self.listening:
            self._paused = False
            self._loop.add_reader(self._socket.fileno(), self.accept)

    async def _connect(self, conn: socket.socket, protocol: GuardedProtocol) -> None:
        try:
            await self._loop.connect_accepted_socket(lambda: protocol, conn)
        except OSError:
            conn.close()
            protocol.release()
