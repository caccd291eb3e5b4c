"""Loopback servers that are not API servers, for the tests of what a client says of
them: :class:`SilentServer` accepts connections and never answers (a hung API server,
or a load balancer in front of a dead one); :class:`PlainTextServer` answers every GET
with 200 ``text/plain`` (a proxy's page)."""

from __future__ import annotations

import http.server
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


class PlainTextServer:
    """Answers every GET on 127.0.0.1 with 200 ``text/plain`` "hello"; ``url`` is its
    address.  Stops on :meth:`stop`."""

    def __init__(self) -> None:
        class Plain(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b"hello"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Plain)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
