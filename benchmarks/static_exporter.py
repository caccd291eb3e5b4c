"""An in-process stand-in for an answering exporter: one fixed status, ETag/304.

Used by the in-process benchmarks (``benchmarks.churn``, ``benchmarks.hung``) where the
cost under test is the scraper's, not the exporter's.
"""

from __future__ import annotations

from aiohttp import web

#: The status every path answers (JSON), with the strong ETag ``"1"``.
BODY = '{"progressPercentage": 5, "lastUpdatedTime": "2025-01-01T00:00:00Z"}'


async def start_static_exporter() -> tuple[web.AppRunner, int]:
    """Serve :data:`BODY` on every path of 127.0.0.1:<free port>; 304 on ``If-None-Match:
    "1"``.  Returns the runner (``await runner.cleanup()`` to stop) and the port."""

    async def handle(request: web.Request) -> web.Response:
        if request.headers.get("If-None-Match") == '"1"':
            return web.Response(status=304)
        return web.Response(text=BODY, content_type="application/json",
                            headers={"ETag": '"1"'})

    app = web.Application()
    app.router.add_get("/{name}", handle)
    return await serve_on_loopback(app, backlog=1024)


async def serve_on_loopback(app: web.Application, *,
                            backlog: int = 128) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on 127.0.0.1:<free port>; returns the runner (``await
    runner.cleanup()`` to stop) and the port, read from ``AppRunner.addresses``."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, backlog=backlog).start()
    port: int = runner.addresses[0][1]
    return runner, port
