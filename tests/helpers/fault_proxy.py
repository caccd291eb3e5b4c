"""A fault-injecting HTTP proxy in front of the real kube-apiserver, for tests.

The proxy listens with plain HTTP on 127.0.0.1 and forwards every request to the
session's real kube-apiserver over HTTPS (TLS re-originated with the API
server's CA), passing the client's ``Authorization`` header through, so the
client authenticates as itself (a ServiceAccount bearer token).  Responses are
streamed back chunk by chunk: watches stay watches.

Everything is the real API server except the faults a test programs here, and
those are the faults a real API server produces only under load or after etcd
compaction, which a healthy test cluster never shows:

* :meth:`FaultProxy.fail` - the next N requests matching a method and a path
  regex are answered by the proxy with an HTTP status and a Kubernetes
  ``Status`` JSON body (429 with ``Retry-After``, 409, 5xx, 410 ...), without
  reaching the API server;
* :meth:`FaultProxy.delay` - the next N matching requests are held for a while
  before being forwarded (a slow API server: the request is "in flight");
* :meth:`FaultProxy.expire_next_watch` - the next watch request is answered
  as the API server answers a watch from a resourceVersion its watch cache no
  longer holds (after events were evicted or etcd compacted): HTTP 200 whose
  stream is one ``ERROR`` event with a ``Status`` of code 410, reason
  ``Expired``, message ``too old resource version: <asked> (<oldest>)``
  (k8s.io/apiserver pkg/storage/cacher/watch_cache_history.go, sent through
  the cacher's error watcher), then the end of the stream.  The proxy has to
  answer this one itself: the test control plane's pod watch cache starts at
  its first list, right after etcd was created, so even ``resourceVersion=1``
  is still servable and compaction does not change what the cache serves;
* :meth:`FaultProxy.end_watches` - the watch streams open now are cut: the TCP
  connection is dropped mid-stream (``abort=True``, a broken connection) or the
  stream ends cleanly (as the server-side watch timeout does).

Every request is recorded (:class:`Seen`: method, path, query, status answered,
whether a fault answered it, start and end times, ``ERROR`` events seen in a
watch stream), so tests can assert how many attempts were made and how many
writes really reached the API server.

The proxy runs its own asyncio loop in a daemon thread; the programming methods
are thread-safe.  Loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from yarl import URL

from localdev.cluster.processes import free_port

#: Headers that describe one hop, not the message: never forwarded.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})

#: The ``reason`` of a Kubernetes Status for each HTTP code the proxy may answer.
STATUS_REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
    409: "Conflict", 410: "Expired", 422: "Invalid", 429: "TooManyRequests",
    500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout",
}


def status_body(code: int, message: str) -> dict[str, Any]:
    """A ``metav1.Status`` failure object as the API server writes it."""
    body: dict[str, Any] = {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": STATUS_REASONS.get(code, "InternalError"), "code": code,
    }
    if code == 429:
        body["details"] = {"retryAfterSeconds": 1}
    return body


@dataclass
class Seen:
    """One request the proxy received, and what became of it."""

    method: str
    path: str
    query: dict[str, str]
    watch: bool
    started: float  # time.monotonic() on arrival
    body: bytes = b""
    status: int | None = None  # answered status; None while in flight or cut
    injected: bool = False  # answered (or altered) by a fault, not only forwarded
    finished: float | None = None  # time.monotonic() when the response ended
    answer: bytes = b""  # the API server's body (not for watches)
    watch_errors: list[dict[str, Any]] = field(default_factory=list)  # ERROR events' objects


@dataclass
class _Fault:
    kind: str  # "fail" | "delay" | "expire"
    method: str | None
    path: re.Pattern[str]
    remaining: int
    watch: bool | None
    status: int = 0
    message: str = ""
    seconds: float = 0.0

    def matches(self, method: str, path: str, watch: bool) -> bool:
        return (self.remaining > 0
                and (self.method is None or self.method == method)
                and (self.watch is None or self.watch == watch)
                and self.path.search(path) is not None)


class FaultProxy:
    """HTTP on 127.0.0.1 -> HTTPS to ``upstream`` (verified with ``ca_cert``), with faults.

    Use as a context manager, or :meth:`start` / :meth:`stop`.
    """

    def __init__(self, upstream: str, ca_cert: str | Path) -> None:
        self.upstream = URL(upstream)
        self._ca_cert = str(ca_cert)
        self.port = 0
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._seen: list[Seen] = []
        self._watches: dict[int, tuple[web.Request, asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    # ------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> FaultProxy:
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve(ready))
            except BaseException as exc:  # reported to start()'s caller
                failure.append(exc)
                ready.set()
            finally:
                loop.close()

        self._thread = threading.Thread(target=serve, name="fault-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10) or failure:
            raise RuntimeError(f"fault proxy did not start: {failure}")
        return self

    async def _serve(self, ready: threading.Event) -> None:
        ctx = ssl.create_default_context(cafile=self._ca_cert)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ctx, limit=0),
            auto_decompress=False,  # bytes pass through as the API server sent them
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
        )
        app = web.Application(client_max_size=16 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        self.port = free_port()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._stopped = asyncio.Event()
        ready.set()
        await self._stopped.wait()
        self._end_watches(abort=True)
        await runner.cleanup()
        await self._session.close()
        # Handlers still waiting (a held request, a stream being cut) end here, not
        # as "Task was destroyed but it is pending" when the loop closes.
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None and self._thread is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(10)
            self._loop = None

    # ------------------------------------------------------------ programming faults

    def fail(self, method: str | None, path: str, status: int, *, times: int = 1,
             watch: bool | None = None, message: str | None = None) -> None:
        """Answer the next ``times`` requests matching ``method`` and regex ``path``
        with ``status`` and a Kubernetes Status body (``watch``: only watch requests,
        only non-watch ones, or None for both)."""
        with self._lock:
            self._faults.append(_Fault(
                "fail", method, re.compile(path), times, watch, status=status,
                message=message or f"injected by the test's fault proxy: HTTP {status}"))

    def delay(self, method: str | None, path: str, seconds: float, *, times: int = 1) -> None:
        """Hold the next ``times`` matching requests ``seconds`` before forwarding them."""
        with self._lock:
            self._faults.append(_Fault("delay", method, re.compile(path), times, None,
                                       seconds=seconds))

    def expire_next_watch(self, path: str = r".*") -> None:
        """Answer the next watch matching ``path`` as for an expired resourceVersion:
        200 with one ERROR event whose object is a Status of code 410."""
        with self._lock:
            self._faults.append(_Fault("expire", "GET", re.compile(path), 1, True))

    def end_watches(self, *, abort: bool = True, path: str = r".*") -> int:
        """Cut every watch stream open now whose path matches ``path``; return how many.

        ``abort``: drop the TCP connection mid-stream (the client sees a broken
        connection); otherwise end the stream cleanly, as a server-side timeout does.
        """
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(self._end_watches_async(abort, path),
                                                  self._loop)
        return future.result(5)

    async def _end_watches_async(self, abort: bool, path: str = r".*") -> int:
        return self._end_watches(abort, path)

    def _end_watches(self, abort: bool, path: str = r".*") -> int:
        pattern = re.compile(path)
        cut = [(r, d) for r, d in self._watches.values() if pattern.search(r.path)]
        for request, done in cut:
            if abort and request.transport is not None:
                request.transport.abort()
            done.set()
        return len(cut)

    def pending_faults(self) -> int:
        """How many programmed fault uses are left."""
        with self._lock:
            return sum(f.remaining for f in self._faults)

    # ------------------------------------------------------------ records

    def requests(self, method: str | None = None, path: str | None = None,
                 watch: bool | None = None) -> list[Seen]:
        """Recorded requests (in arrival order) matching ``method`` and regex ``path``."""
        pattern = re.compile(path) if path is not None else None
        with self._lock:
            seen = list(self._seen)
        return [s for s in seen
                if (method is None or s.method == method)
                and (pattern is None or pattern.search(s.path))
                and (watch is None or s.watch == watch)]

    # ------------------------------------------------------------ forwarding

    def _take(self, method: str, path: str, watch: bool) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path, watch):
                    fault.remaining -= 1
                    return fault
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        watch = request.query.get("watch", "").lower() in ("true", "1")
        seen = Seen(request.method, request.path, dict(request.query), watch,
                    time.monotonic(), body=body)
        with self._lock:
            self._seen.append(seen)
        target = URL(str(self.upstream).rstrip("/") + request.raw_path, encoded=True)
        fault = self._take(request.method, request.path, watch)
        if fault is not None and fault.kind == "delay":
            seen.injected = True
            await asyncio.sleep(fault.seconds)
            fault = None
        if fault is not None and fault.kind == "fail":
            seen.injected = True
            headers = {"Retry-After": "1"} if fault.status == 429 else {}
            seen.status, seen.finished = fault.status, time.monotonic()
            return web.json_response(status_body(fault.status, fault.message),
                                     status=fault.status, headers=headers)
        if fault is not None and fault.kind == "expire":
            seen.injected = True
            return await self._expired_watch(request, seen)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            async with self._session.request(request.method, target, headers=headers,
                                             data=body or None,
                                             allow_redirects=False) as upstream:
                return await self._relay(request, upstream, seen)
        except (aiohttp.ClientError, ConnectionError) as exc:
            if seen.status is None:
                seen.finished = time.monotonic()
            # A cut stream: nothing more can be sent; otherwise tell the client.
            if request.transport is None or request.transport.is_closing():
                raise
            return web.json_response(status_body(502, f"fault proxy upstream: {exc}"),
                                     status=502)

    async def _relay(self, request: web.Request, upstream: aiohttp.ClientResponse,
                     seen: Seen) -> web.StreamResponse:
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for name, value in upstream.headers.items():
            if name.lower() not in HOP_BY_HOP:
                resp.headers.add(name, value)
        if upstream.content_length is not None:
            resp.content_length = upstream.content_length
        if not seen.watch:
            data = await upstream.read()
            # The API server's answer is recorded before it is relayed: a client that died
            # while its request was held (a SIGKILLed leader) cannot take it any more.
            seen.status, seen.finished = upstream.status, time.monotonic()
            seen.answer = data
            await resp.prepare(request)
            await resp.write(data)
            await resp.write_eof()
            return resp
        await resp.prepare(request)
        done = asyncio.Event()
        self._watches[id(request)] = (request, done)
        seen.status = upstream.status
        buffer = b""
        try:
            reader = asyncio.ensure_future(upstream.content.readany())
            cut = asyncio.ensure_future(done.wait())
            try:
                while True:
                    await asyncio.wait({reader, cut}, return_when=asyncio.FIRST_COMPLETED)
                    if cut.done():
                        break
                    chunk = reader.result()
                    if not chunk:
                        break
                    buffer = self._scan(buffer + chunk, seen)
                    await resp.write(chunk)
                    reader = asyncio.ensure_future(upstream.content.readany())
            finally:
                reader.cancel()
                cut.cancel()
            if request.transport is not None and not request.transport.is_closing():
                await resp.write_eof()
        except (ConnectionError, aiohttp.ClientError):
            pass  # the client went away, or the test cut the stream
        finally:
            self._watches.pop(id(request), None)
            seen.finished = time.monotonic()
        return resp

    @staticmethod
    async def _expired_watch(request: web.Request, seen: Seen) -> web.StreamResponse:
        asked = request.query.get("resourceVersion", "0")
        status = status_body(410, f"too old resource version: {asked} ({int(asked or 0) + 1})")
        event = {"type": "ERROR", "object": status}
        resp = web.StreamResponse(status=200)
        resp.content_type = "application/json"
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(json.dumps(event).encode() + b"\n")
        await resp.write_eof()
        seen.status, seen.finished = 200, time.monotonic()
        seen.watch_errors.append(status)
        return resp

    @staticmethod
    def _scan(data: bytes, seen: Seen) -> bytes:
        """Record ERROR watch events in ``data``; return the unfinished last line."""
        *lines, rest = data.split(b"\n")
        for line in lines:
            if b'"ERROR"' not in line:
                continue
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    seen.watch_errors.append(event.get("object") or {})
        return rest


def write_kubeconfig(path: Path, server: str, token: str) -> Path:
    """A kubeconfig for ``server`` (plain http) authenticating with bearer ``token``."""
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "proxy", "cluster": {"server": server}}],
        "users": [{"name": "user", "user": {"token": token}}],
        "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "user"}}],
        "current-context": "proxy",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
