"""Exporter stand-ins for the cluster churn benchmark (``benchmarks.churn --api``).

Three kinds of pod, each answering on its own port of *every* loopback address (the
listeners bind the wildcard address, so a pod advertising ``127.a.b.c`` is answered
there: Linux routes the whole of 127.0.0.0/8 to ``lo``; the benchmark only connects
to loopback addresses, and a peer from anywhere else is cut off before its request is
answered):

* ``json``: the TrainerStatus JSON with an ETag (304 on ``If-None-Match``) and
  ``Trainjob-Exporter-Contract: 2;max-wait=30``, so the scraper holds one waiting
  scrape per target, as against a real exporter_lib exporter (which caps itself at 64
  connections, too few for one process standing in for thousands of pods);
* ``html``: ``200 text/html`` differing per request (a Warning Event per target);
* ``refused``: a port where nothing listens (backed off).

Runs its own event loop in a daemon thread; :meth:`stop` ends it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import socket
import threading

from aiohttp import web
from aiohttp.typedefs import Handler

BODY = '{"progressPercentage": 5, "lastUpdatedTime": "2025-01-01T00:00:00Z"}'
ETAG = '"1"'
CONTRACT = "2;max-wait=30"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@web.middleware
async def _loopback_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The wildcard listener answers loopback peers only: anyone else is cut off unread."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if not peer or not ipaddress.ip_address(peer[0]).is_loopback:
        if request.transport is not None:
            request.transport.abort()
        raise web.HTTPForbidden()
    return await handler(request)


class ChurnFarm:
    """The ``json`` and ``html`` listeners and a ``refused`` port (module doc)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="churn-farm",
                                        daemon=True)
        self._runners: list[web.AppRunner] = []
        self._requests = itertools.count()
        self.ports: dict[str, int] = {}

    def start(self) -> ChurnFarm:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        self.ports["refused"] = _free_port()  # nothing listens there (a race is harmless)
        return self

    async def _json(self, request: web.Request) -> web.Response:
        headers = {"ETag": ETAG, "Trainjob-Exporter-Contract": CONTRACT}
        if request.headers.get("If-None-Match") == ETAG:
            prefer = request.headers.get("Prefer", "")
            if prefer.startswith("wait="):  # a waiting scrape: nothing changes here
                await asyncio.sleep(min(30.0, float(prefer[5:] or 0)))
            return web.Response(status=304, headers=headers)
        return web.Response(text=BODY, content_type="application/json", headers=headers)

    async def _html(self, request: web.Request) -> web.Response:
        return web.Response(text=f"<html><!-- request {next(self._requests)} -->oops</html>",
                            content_type="text/html")

    async def _start(self) -> None:
        for kind, handler in (("json", self._json), ("html", self._html)):
            app = web.Application(middlewares=[_loopback_only])
            app.router.add_get("/{name}", handler)
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            # The wildcard address: every 127.x.y.z a pod advertises is answered here.
            await web.TCPSite(runner, "0.0.0.0", 0, backlog=4096).start()
            self.ports[kind] = int(runner.addresses[0][1])
            self._runners.append(runner)

    def stop(self) -> None:
        async def cleanup() -> None:
            for runner in self._runners:
                await runner.cleanup()
        asyncio.run_coroutine_threadsafe(cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
