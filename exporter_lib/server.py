"""The exporter's HTTP server: stdlib ``ThreadingHTTPServer`` in a daemon thread.

The same choice prometheus-client's ``start_http_server`` makes: no extra runtime
dependency, one short-lived thread per connection, HTTP/1.1 keep-alive.

Routes:

* ``GET|HEAD /metrics`` - Prometheus text / OpenMetrics by ``Accept``; JSON
  (``TrainerStatus.to_json()``) when ``Accept`` lists ``application/json``, or
  ``204`` before the first report.  Strong ``ETag``; ``If-None-Match`` -> ``304``.
* ``GET|HEAD /healthz`` - ``200 ok``.
* ``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status``
  - the push design's ``{"trainerStatus": {...}}`` (see :mod:`exporter_lib.push`).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from exporter_lib.exposition import Renderer, etag_matches
from exporter_lib.push import MAX_BODY_BYTES, PushEndpoint, PushError

log = logging.getLogger("exporter_lib")

#: Bytes of a refused request body read and dropped before the error response
#: (twice the push limit).  Closing a socket with unread data sends a reset, which
#: reaches a client still sending its body as "broken pipe" instead of the answer.
DRAIN_MAX_BYTES = 2 * MAX_BODY_BYTES
#: Seconds the drain may take before the connection is closed anyway.
DRAIN_TIMEOUT_SECONDS = 2.0


class ExporterHTTPServer(ThreadingHTTPServer):
    """Threading HTTP server carrying the renderer and the push endpoint."""

    daemon_threads = True  # a scrape in flight never holds the training process open
    allow_reuse_address = True  # rebinding after a restart while old sockets sit in TIME_WAIT

    def __init__(self, address: tuple[str, int], renderer: Renderer,
                 push: PushEndpoint) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.renderer = renderer
        self.push = push
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Log a failed request instead of the stdlib's traceback on stderr.

        A scraper that restarts, times out or closes with a reset is routine; its
        traceback would land in the training log on every occurrence, so peer
        disconnects are logged at DEBUG and anything else once per request at WARNING.
        """
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("exporter connection from %s ended: %r", client_address, exc)
            return
        log.warning("exporter request from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: ExporterHTTPServer
    protocol_version = "HTTP/1.1"
    timeout = 30  # seconds a connection may idle or trickle before it is closed
    server_version = "trainjob-exporter"

    def setup(self) -> None:
        super().setup()
        # Headers and body leave in separate writes; without TCP_NODELAY, Nagle's
        # algorithm and the peer's delayed ACK stall keep-alive responses by ~40 ms.
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        self._get(head=False)

    def do_HEAD(self) -> None:
        self._get(head=True)

    def do_POST(self) -> None:
        try:
            result = self.server.push.handle(
                urlsplit(self.path).path, self.headers.get("Authorization"),
                self.headers.get("Content-Type"), self.headers.get("Content-Length"),
                self.rfile)
        except PushError as err:
            if err.unread_body:
                self.close_connection = True  # the body was not consumed
                self._drain_body()
            self._send(err.code, err.body(), "application/json")
            return
        self._send(HTTPStatus.OK, result, "application/json")

    def _drain_body(self) -> None:
        """Read and drop the refused request's body (bounded in bytes and time)."""
        try:
            remaining = min(int(self.headers.get("Content-Length") or 0), DRAIN_MAX_BYTES)
        except ValueError:
            return
        with contextlib.suppress(OSError):
            self.connection.settimeout(DRAIN_TIMEOUT_SECONDS)
            while remaining > 0:
                chunk = self.rfile.read1(min(65536, remaining))
                if not chunk:
                    break
                remaining -= len(chunk)

    def _get(self, head: bool) -> None:
        path = urlsplit(self.path).path
        if path == "/healthz":
            self._send(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8", head=head)
            return
        if path != "/metrics":
            self._send(HTTPStatus.NOT_FOUND, b"not found: try /metrics or /healthz\n",
                       "text/plain; charset=utf-8", head=head)
            return
        rendered = self.server.renderer.render(self.headers.get("Accept"))
        if rendered is None:
            self._send(HTTPStatus.NO_CONTENT, b"", None, head=True)
            return
        extra = {"ETag": rendered.etag, "Cache-Control": "no-cache", "Vary": "Accept"}
        if etag_matches(self.headers.get("If-None-Match"), rendered.etag):
            self._send(HTTPStatus.NOT_MODIFIED, b"", None, head=True, extra=extra)
            return
        self._send(HTTPStatus.OK, rendered.body, rendered.content_type, head=head, extra=extra)

    def _send(self, code: int, body: bytes, content_type: str | None, head: bool = False,
              extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        if code not in (HTTPStatus.NO_CONTENT, HTTPStatus.NOT_MODIFIED):
            self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # The stdlib writes every request to stderr; a scrape every few seconds
        # would flood the training log.
        log.debug("%s - " + format, self.address_string(), *args)


class ServerThread:
    """An :class:`ExporterHTTPServer` serving in a daemon thread.

    Raises:
        OSError: the address cannot be bound (``errno.EADDRINUSE`` when the port is taken).
    """

    def __init__(self, host: str, port: int, renderer: Renderer, push: PushEndpoint) -> None:
        self.httpd = ExporterHTTPServer((host, port), renderer, push)
        self.port: int = self.httpd.server_address[1]
        self.host = host
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        kwargs={"poll_interval": 0.5},
                                        name="trainjob-exporter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket (waits up to 5 s for the loop to end)."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)
