"""A TCP proxy on loopback that can hold the traffic of one client, for outage tests.

Put between one scraper and the real kube-apiserver (TLS passes through untouched:
the proxy only moves bytes), it makes the API server unreachable for that client
alone, as a stopped API server is (SIGSTOP): connections are still accepted, but
nothing moves.

* :meth:`HoldingProxy.hold_requests` - bytes from the client are no longer
  forwarded (requests, TLS handshakes of new connections); answers of requests
  already forwarded, and watch streams, still flow;
* :meth:`HoldingProxy.hold_answers` - bytes from the API server are no longer
  forwarded either;
* :meth:`HoldingProxy.release` - everything held is forwarded, in order, and
  traffic flows again.  A request the client sent before it gave up on it still
  reaches the API server then, as a request in a stopped API server's socket
  buffer does when it is continued.

Held bytes stay in the sockets' kernel buffers (a pump does not read past what it
may forward), so holding costs no memory here.  The proxy runs its own asyncio loop
in a daemon thread; the methods are thread-safe.  Loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType

#: Bytes moved per read.
CHUNK = 65536


class HoldingProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream_host:upstream_port`` (module doc).

    Use as a context manager (starts and closes it).
    """

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="holding-proxy")
        self._server: asyncio.Server | None = None
        self._requests_open = asyncio.Event()
        self._answers_open = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        #: Connections accepted so far (for a test's report).
        self.accepted = 0

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> HoldingProxy:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def start(self) -> None:
        """Listen on a free loopback port (:attr:`port`), traffic flowing."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    async def _start(self) -> None:
        self._requests_open.set()
        self._answers_open.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def close(self) -> None:
        """Stop listening, drop every connection and stop the thread."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        self._requests_open.set()  # lets the pumps see their closed sockets and end
        self._answers_open.set()

    # ------------------------------------------------------------ faults

    def hold_requests(self) -> None:
        """Stop forwarding the client's bytes (module doc)."""
        self._loop.call_soon_threadsafe(self._requests_open.clear)

    def hold_answers(self) -> None:
        """Stop forwarding the API server's bytes too (module doc)."""
        self._loop.call_soon_threadsafe(self._answers_open.clear)

    def release(self) -> None:
        """Forward what was held, and everything after it."""
        self._loop.call_soon_threadsafe(self._requests_open.set)
        self._loop.call_soon_threadsafe(self._answers_open.set)

    # ------------------------------------------------------------ the pumps

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.close()
            self._writers.discard(writer)
            return
        self._writers.add(up_writer)
        try:
            await asyncio.gather(self._pump(reader, up_writer, self._requests_open),
                                 self._pump(up_reader, writer, self._answers_open))
        finally:
            for w in (writer, up_writer):
                w.close()
                self._writers.discard(w)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    gate: asyncio.Event) -> None:
        """Move bytes one way while ``gate`` is open; a chunk read before a hold waits."""
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                await gate.wait()  # held: nothing is read, the bytes stay in the socket
                data = await reader.read(CHUNK)
                await gate.wait()
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
