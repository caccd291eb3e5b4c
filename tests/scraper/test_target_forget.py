"""A target that is no longer scraped leaves no connection behind (issue 13, input 8).

Under pod churn every deleted pod's keep-alive connection stayed pooled until aiohttp's
keep-alive cleanup (up to 240 s): thousands of open sockets with their parsers and
buffers, and RSS that grew round after round.  The real
:class:`~scraper.scrape.exporter.ExporterScraper` against a real aiohttp server on loopback
(which counts its open connections), and the real :class:`~scraper.scrape.manager.TargetManager`
telling the scraper which targets are gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from scraper.discovery.pod_targets import PodTargets
from scraper.scrape.exporter import ExporterScraper, ScrapeLimits
from scraper.scrape.manager import TargetManager
from scraper.shared.scrapes import Fresh
from scraper.shared.targets import Target

pytestmark = pytest.mark.timeout(30)

BODY = '{"progressPercentage": 5, "lastUpdatedTime": "2025-01-01T00:00:00Z"}'


class _Exporter:
    """An aiohttp server on 127.0.0.1 that counts the connections open to it."""

    def __init__(self) -> None:
        self.open = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def handle(request: web.Request) -> web.Response:
            return web.Response(text=BODY, content_type="application/json")

        app = web.Application()
        app.router.add_get("/{name}", handle)
        self._runner = web.AppRunner(app, access_log=None, keepalive_timeout=300)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        server = self._runner.server
        assert server is not None
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: Any, transport: asyncio.BaseTransport) -> None:
            self.open += 1
            made(handler, transport)

        def connection_lost(handler: Any, exc: BaseException | None) -> None:
            self.open -= 1
            lost(handler, exc)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

    async def stop(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


@pytest.fixture
async def exporter() -> AsyncIterator[_Exporter]:
    server = _Exporter()
    await server.start()
    yield server
    await server.stop()


async def _until(check: Any, seconds: float = 5.0) -> bool:
    for _ in range(int(seconds / 0.05)):
        if check():
            return True
        await asyncio.sleep(0.05)
    return check()


def _target(port: int, pod: str = "p") -> Target:
    return Target("ns", "job", pod, f"uid-{pod}", f"http://127.0.0.1:{port}/metrics", 10.0)


async def test_forget_closes_the_targets_idle_pooled_connection(exporter: _Exporter) -> None:
    scraper = ExporterScraper(ScrapeLimits(5.0, 1 << 20, 4))
    try:
        target = _target(exporter.port)
        assert isinstance(await scraper.scrape(target), Fresh)
        assert await _until(lambda: exporter.open == 1)  # kept alive in the pool
        scraper.forget(target)
        assert await _until(lambda: exporter.open == 0), "the pooled connection stayed open"
        # A target scraped again later simply opens a new connection.
        assert isinstance(await scraper.scrape(target), Fresh)
    finally:
        await scraper.close()


async def test_forget_leaves_other_hosts_connections_pooled(exporter: _Exporter) -> None:
    other = _Exporter()
    await other.start()
    scraper = ExporterScraper(ScrapeLimits(5.0, 1 << 20, 4))
    try:
        gone, kept = _target(exporter.port, "gone"), _target(other.port, "kept")
        assert isinstance(await scraper.scrape(gone), Fresh)
        assert isinstance(await scraper.scrape(kept), Fresh)
        scraper.forget(gone)
        assert await _until(lambda: exporter.open == 0)
        await asyncio.sleep(0.2)
        assert other.open == 1
    finally:
        await scraper.close()
        await other.stop()


class _Loop:
    async def run(self, state: Any) -> None:
        return None

    async def finalize(self, final: Any, state: Any) -> None:
        return None


class _Scheduler:
    def __init__(self) -> None:
        self.keys: set[str] = set()

    def schedule(self, target: Target) -> None:
        self.keys.add(target.key)

    def unschedule(self, key: str) -> None:
        self.keys.discard(key)

    def scheduled_keys(self) -> set[str]:
        return set(self.keys)


def _pod(name: str, ip: str, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}",
                         "labels": {"jobset.sigs.k8s.io/jobset-name": name},
                         "annotations": {"trainjob-progress.dev/port": "9000"}},
            "status": {"phase": phase, "podIP": ip}}


@pytest.mark.parametrize("how", ["deleted", "ended", "moved"])
def test_manager_tells_which_targets_are_no_longer_scraped(how: str) -> None:
    dropped: list[str] = []
    manager = TargetManager(_Loop(), _Scheduler(), spawn=lambda coro: coro.close(),  # type: ignore[arg-type]
                            leading=True,
                            on_dropped=lambda target: dropped.append(target.url))
    pods = PodTargets(manager, default_port=8080, default_path="/metrics",
                      default_interval=10.0)
    pods.on_pod(_pod("a", "10.0.0.1"), deleted=False)
    pods.on_pod(_pod("b", "10.0.0.2"), deleted=False)
    assert dropped == []
    if how == "deleted":
        pods.on_pod(_pod("a", "10.0.0.1"), deleted=True)
    elif how == "ended":
        pods.on_pod(_pod("a", "10.0.0.1", phase="Succeeded"), deleted=False)
        pods.on_pod(_pod("a", "10.0.0.1", phase="Succeeded"), deleted=True)
    else:
        pods.on_pod(_pod("a", "10.0.0.9"), deleted=False)
    assert dropped == ["http://10.0.0.1:9000/metrics"]  # once, and only that pod's
