"""Waiting scrapes (issue 14.1) against a real exporter_lib exporter on loopback.

The real :class:`~scraper.scrape.exporter.ExporterScraper` and
:class:`~scraper.scrape.loop.ScrapeLoop`
scrape a real :class:`exporter_lib.api.Exporter` (contract 2: ``Prefer: wait``);
the status writer is an in-process fake recording when each status arrived (the
real one talks to the API server and is tested elsewhere).  A plain aiohttp
exporter without the contract header stands for text exporters and older
exporter_lib: it must be polled.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from benchmarks.static_exporter import serve_on_loopback
from exporter_lib.api import Exporter
from exporter_lib.state import State
from exporter_lib.status import TrainerStatus
from scraper.scrape.exporter import ExporterScraper, ScrapeLimits
from scraper.scrape.loop import ScrapeLoop
from scraper.scrape.target_state import TargetState
from scraper.shared.outcome import WriteOutcome
from scraper.shared.targets import Target
from scraper.telemetry import JobView
from tests.helpers.waits import until
from tests.scraper.test_loop import Counted

INTERVAL = 1.0
BODY = '{"progressPercentage": 3, "lastUpdatedTime": "2025-01-01T00:00:00Z"}'


@dataclass
class Writer:
    applied: list[tuple[float, int | None]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def apply(self, namespace: str, name: str, status: TrainerStatus, *,
                    final: bool = False, uid: str = "", seen: float | None = None,
                    finished_at: float | None = None,
                    confirm: Target | None = None) -> WriteOutcome:
        self.applied.append((time.monotonic(), status.progress_percentage))
        self.arrived.set()
        return WriteOutcome.WRITTEN


class Events:
    async def event(self, namespace: str, name: str, reason: str, message: str) -> None:
        return None


@pytest.fixture
def exporter() -> Iterator[tuple[State, int]]:
    state = State()
    exp = Exporter(state, state, host="127.0.0.1", port=0, status_file=None,
                   termination_message_path=None, serve=True)
    assert exp.port is not None
    state.update(progress_percentage=1)
    yield state, exp.port
    exp.stop()


@dataclass
class Rig:
    scraper: ExporterScraper
    loop: ScrapeLoop
    writer: Writer
    state: TargetState
    counted: list[str]
    leading: list[bool]

    task: asyncio.Task[None] | None = None

    async def runs(self, n: int) -> None:
        """``n`` scheduled runs, one interval apart, as the scheduler fires them: a run
        that holds the target's waiting scrape goes on in its task, and the target's
        runs are paused meanwhile (scraper/scrape/scheduling.py, ``holding``)."""
        for _ in range(n):
            if self.task is None or self.task.done():
                self.task = asyncio.create_task(self.loop.run(self.state))
            await asyncio.sleep(INTERVAL)


def _rig(port: int) -> Rig:
    scraper = ExporterScraper(ScrapeLimits(timeout=0.5, concurrency=4))
    writer, counted, leading = Writer(), [], [True]
    loop = ScrapeLoop(scraper, writer, Events(), backoff_max=1.0,
                      leading=lambda: leading[0], counts=Counted(counted))
    target = Target("ns", "tj", "tj-node-0-0", "uid", f"http://127.0.0.1:{port}/metrics",
                    INTERVAL)
    state = TargetState(JobView("ns", "tj", "tj-node-0-0"), target=target, uid="uid")
    return Rig(scraper, loop, writer, state, counted, leading)


@pytest.fixture
async def rig(exporter: tuple[State, int]) -> AsyncIterator[Rig]:
    r = _rig(exporter[1])
    yield r
    r.state.stop_holding()
    if r.task is not None:
        await asyncio.gather(r.task, return_exceptions=True)
    await r.scraper.close()


async def test_change_arrives_at_once_and_unchanged_costs_no_polls(
        rig: Rig, exporter: tuple[State, int]) -> None:
    state, _ = exporter
    await rig.runs(2)  # the first run polls and learns contract 2; the second holds
    assert rig.state.max_wait is not None and rig.state.max_wait > INTERVAL
    assert rig.state.held is not None and rig.scraper.held == 1
    assert [p for _, p in rig.writer.applied] == [1]
    # Unchanged for 4 intervals: the held request stays open, no answer, no poll.
    before = len(rig.counted)
    await rig.runs(4)
    assert len(rig.counted) == before
    assert rig.scraper.held == 1
    # A change: written well before the next scheduled run would have polled.
    rig.writer.arrived.clear()
    changed = time.monotonic()
    state.update(progress_percentage=2)
    await asyncio.wait_for(rig.writer.arrived.wait(), 5)
    at, progress = rig.writer.applied[-1]
    assert progress == 2
    latency = at - changed
    print(f"update() to write: {latency * 1000:.0f} ms (interval {INTERVAL:g}s)")
    assert latency < INTERVAL / 2  # ~0.1 s exporter poll + one round trip


async def test_schedule_is_the_floor_between_two_answers(
        rig: Rig, exporter: tuple[State, int]) -> None:
    state, _ = exporter
    await rig.runs(2)
    for progress in range(2, 12):  # ten changes 50 ms apart
        state.update(progress_percentage=progress)
        await asyncio.sleep(0.05)
    await until(lambda: rig.writer.applied[-1][1] == 11, 10, "the newest progress written")
    times = [t for t, _ in rig.writer.applied]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) >= 2
    assert min(gaps[1:] or [INTERVAL]) >= INTERVAL * 0.95, gaps  # one answer per interval
    assert rig.writer.applied[-1][1] == 11  # the newest lands


async def test_leadership_loss_and_drop_close_the_held_request(
        rig: Rig, exporter: tuple[State, int]) -> None:
    await rig.runs(2)
    assert rig.scraper.held == 1
    rig.state.stop_holding()  # what TargetManager.set_leading(False) does per state
    rig.leading[0] = False
    await until(lambda: rig.scraper.held == 0, 5, "the held request closed")
    assert rig.scraper.held == 0 and rig.state.held is None
    await rig.runs(1)  # not leading: nothing re-opened
    assert rig.scraper.held == 0
    rig.leading[0] = True  # a new term: the next run re-opens it
    await rig.runs(1)
    assert rig.scraper.held == 1
    rig.state.dropped = True
    rig.state.stop_holding()
    await until(lambda: rig.scraper.held == 0, 5, "the held request closed")


async def test_exporter_without_the_contract_is_polled() -> None:
    async def handle(request: web.Request) -> web.Response:
        assert "Prefer" not in request.headers
        if request.headers.get("If-None-Match") == '"1"':
            return web.Response(status=304)
        return web.Response(text=BODY, content_type="application/json", headers={"ETag": '"1"'})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner, port = await serve_on_loopback(app)
    r = _rig(port)
    try:
        await r.runs(3)
        assert r.state.max_wait is None and r.state.held is None and r.scraper.held == 0
        assert r.counted == ["ok", "not_modified", "not_modified"]
    finally:
        await r.scraper.close()
        await runner.cleanup()


def _established_to(port: int) -> int:
    """TCP connections of this machine in state ESTABLISHED whose remote port is
    ``port`` (the client ends of connections to a loopback server), from /proc/net/tcp."""
    count = 0
    with open("/proc/net/tcp") as handle:
        next(handle)
        for line in handle:
            fields = line.split()
            remote, state = fields[2], fields[3]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


async def test_one_connection_per_waiting_target(exporter: tuple[State, int]) -> None:
    """The poll that learns contract 2 does not leave its connection idle in the polled
    pool beside the held request's: one descriptor per target, not two."""
    _, port = exporter
    scraper = ExporterScraper(ScrapeLimits(timeout=0.5, concurrency=4), waiting=True)
    writer = Writer()
    loop = ScrapeLoop(scraper, writer, Events(), backoff_max=1.0)
    target = Target("ns", "tj", "tj-node-0-0", "uid", f"http://127.0.0.1:{port}/metrics",
                    INTERVAL)
    state = TargetState(JobView("ns", "tj", "tj-node-0-0"), target=target, uid="uid")
    try:
        # The run polls (contract 2 learnt), then holds: its request one interval after
        # the poll's answer.
        run = asyncio.create_task(loop.run(state))
        await until(lambda: state.max_wait is not None, 5, "contract 2 learnt")
        # the polled connection was closed, not pooled
        await until(lambda: _established_to(port) == 0, 5, "the polled connection closed")
        await until(lambda: scraper.held == 1 and _established_to(port) == 1, 5,
                    "the held request on one connection")
        # And it stays one over an interval: the absence of a second connection has no
        # event to wait for.
        await asyncio.sleep(INTERVAL)
        assert scraper.held == 1
        assert _established_to(port) == 1
        assert not run.done()
    finally:
        state.stop_holding()
        await scraper.close()


async def test_polled_connection_kept_without_waiting(exporter: tuple[State, int]) -> None:
    """With waiting scrapes off (``--wait-scrapes false``) the polled connection is pooled
    as before, for the next poll."""
    _, port = exporter
    scraper = ExporterScraper(ScrapeLimits(timeout=0.5, concurrency=4))
    target = Target("ns", "tj", "tj-node-0-0", "uid", f"http://127.0.0.1:{port}/metrics",
                    INTERVAL)
    try:
        await scraper.scrape(target)
        await scraper.scrape(target)
        await until(lambda: _established_to(port) == 1, 5, "one pooled connection")
        assert _established_to(port) == 1
    finally:
        await scraper.close()


async def test_contract_3_new_percentage_within_the_floor_metrics_held(
        exporter: tuple[State, int]) -> None:
    """Contract 3 (issue 26.1): one scheduled run at a 30 s interval is all it takes;
    then every new percentage reaches the writer within about the progress floor (1 s),
    while changes of metrics and remaining time alone are not answered at all before
    the metrics staleness (30 s)."""
    state, port = exporter
    scraper = ExporterScraper(ScrapeLimits(timeout=0.5, concurrency=4), waiting=True)
    writer, counted = Writer(), []
    loop = ScrapeLoop(scraper, writer, Events(), backoff_max=1.0, counts=Counted(counted))
    target = Target("ns", "tj", "tj-node-0-0", "uid", f"http://127.0.0.1:{port}/metrics", 30.0)
    st = TargetState(JobView("ns", "tj", "tj-node-0-0"), target=target, uid="uid")
    try:
        # The only scheduled run: it polls, then holds at once.
        run = asyncio.create_task(loop.run(st))
        await until(lambda: st.held is run, 5, "the run holding")
        assert st.by_policy
        assert [p for _, p in writer.applied] == [1]
        latencies = []
        for progress in range(2, 6):
            for step in range(10):  # metrics and remaining time every 0.1 s
                state.update(estimated_remaining_seconds=100 - step,
                             metrics={"loss": 1 / (progress * 10 + step)})
                await asyncio.sleep(0.1)
            writer.arrived.clear()
            changed = time.monotonic()
            state.update(progress_percentage=progress)
            await asyncio.wait_for(writer.arrived.wait(), 5)
            latencies.append(writer.applied[-1][0] - changed)
        print(f"update() to writer: {[f'{v:.2f}' for v in latencies]} s")
        assert [p for _, p in writer.applied] == [1, 2, 3, 4, 5]  # no metric-only answer
        # The first change waits out the floor after the first answer; later ones came
        # more than a floor after the previous answer: at once (0.1 s look + a request).
        assert max(latencies[1:]) < 0.6, latencies
        assert counted.count("ok") == 5
    finally:
        st.stop_holding()
        await scraper.close()
