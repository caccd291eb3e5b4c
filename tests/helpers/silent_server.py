"""A loopback TCP listener that accepts connections and never answers: a hung API
server, or a load balancer in front of a dead one, for timeout tests."""

from __future__ import annotations

import socket
import threading


class SilentServer:
    """Accepts TCP connections on 127.0.0.1 and never answers; closes them on stop."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(conn)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self._held:
            conn.close()
        self._sock.close()
