"""Hung exporters take only the hung lane's slots (issue 13, input 12).

The real :class:`~scraper.scrape.exporter.ExporterScraper` against loopback servers: a
listener that accepts and never answers (a hung exporter) and an aiohttp server
answering at once (healthy).  Plus the hung lane's sharing rules alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from benchmarks.static_exporter import serve_on_loopback
from scraper.scrape.exporter import ExporterScraper, HungLane, ScrapeLimits, hung_slots
from scraper.shared.scrapes import Busy, Failure, FailureKind, Fresh
from scraper.shared.targets import Target

BODY = '{"progressPercentage": 5, "lastUpdatedTime": "2025-01-01T00:00:00Z"}'


def test_hung_lane_caps_and_shares() -> None:
    lane = HungLane(4)
    assert all(lane.try_take("a") for _ in range(4))  # alone, a namespace may use it all
    assert not lane.try_take("b")  # full
    lane.give("a")
    assert lane.try_take("b")
    lane.give("a")
    lane.give("a")
    # a holds 1, b holds 1: a may grow to half (2) while b is in, not beyond
    assert lane.try_take("a")
    assert not lane.try_take("a")
    assert lane.try_take("b")
    assert lane.in_use == 4
    assert hung_slots(32) == 8 and hung_slots(2) == 1


@pytest.fixture
async def servers() -> AsyncIterator[tuple[int, int]]:
    async def handle(request: web.Request) -> web.Response:
        return web.Response(text=BODY, content_type="application/json")

    app = web.Application()
    app.router.add_get("/{name}", handle)
    runner, healthy = await serve_on_loopback(app)
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        while await reader.read(65536):
            pass

    hung = await asyncio.start_server(hold, "127.0.0.1", 0, backlog=256)
    yield healthy, hung.sockets[0].getsockname()[1]
    hung.close()
    for w in held:
        w.close()
    await runner.cleanup()


def _target(namespace: str, pod: str, port: int) -> Target:
    return Target(namespace, pod, pod, f"uid-{pod}", f"http://127.0.0.1:{port}/{pod}", 10.0)


async def test_hung_targets_never_take_the_healthy_targets_slots(
        servers: tuple[int, int]) -> None:
    healthy_port, hung_port = servers
    scraper = ExporterScraper(ScrapeLimits(timeout=0.3, concurrency=4))
    try:
        hung = [_target("tenant-a", f"hung-{i}", hung_port) for i in range(12)]
        healthy = [_target("tenant-b", f"ok-{i}", healthy_port) for i in range(20)]
        # Every hung target times out once (in batches of the 4 regular slots).
        for i in range(0, len(hung), 4):
            results = await asyncio.gather(*(scraper.scrape(t) for t in hung[i:i + 4]))
            assert all(isinstance(r, Failure) and r.kind is FailureKind.TIMEOUT
                       for r in results), results
        assert all(scraper.is_hung(t.key) for t in hung)
        # Now all at once: the hung ones hold only the hung lane (1 slot of 4), the
        # healthy ones get every regular slot and all answer.
        results = await asyncio.gather(*(scraper.scrape(t) for t in hung + healthy))
        hung_results, healthy_results = results[:len(hung)], results[len(hung):]
        assert all(isinstance(r, Fresh) for r in healthy_results), healthy_results
        assert sum(isinstance(r, Failure) for r in hung_results) == hung_slots(4)
        assert sum(isinstance(r, Busy) for r in hung_results) == len(hung) - hung_slots(4)
        assert not any(scraper.is_hung(t.key) for t in healthy)
        # A hung target that answers again is back in the regular lane.
        back = _target("tenant-a", "hung-0", healthy_port)
        assert back.key == hung[0].key
        assert isinstance(await scraper.scrape(back), Fresh)
        assert not scraper.is_hung(back.key)
    finally:
        await scraper.close()
