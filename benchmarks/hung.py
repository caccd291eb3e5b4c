"""Hung exporters beside healthy ones: who gets the scrape slots (issue 13, input 12).

``python -m benchmarks.hung [--seconds 20]`` runs, in one process on loopback, the
real scheduler (:class:`scraper.scrape.scheduling.TargetScheduler`), scrape loop and
exporter scraper at the default ``--concurrency`` (32) and a 1 s interval (so a
0.9 s scrape timeout) against:

* hung exporters: one loopback listener that accepts every connection and never
  answers (each scrape holds its slot until the timeout);
* healthy exporters: an aiohttp server answering 200 with an ETag, then 304.

Scenarios: ``one-tenant`` (48 hung in namespace ``tenant-a``, 20 healthy in
``tenant-b``) and ``many-hung`` (100 hung in ``tenant-a``, 10 hung and 20 healthy in
``tenant-b``).  Prints, per scenario and namespace, scrapes answered, timeouts and
skipped runs; the status writer is an in-memory fake (writes are not measured here).
Uses only the scraper's public classes, so the same file measures older versions.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import time
from typing import Any

from benchmarks.static_exporter import start_static_exporter
from exporter_lib.status import TrainerStatus
from scraper.scrape.exporter import ExporterScraper, ScrapeLimits
from scraper.scrape.loop import ScrapeLoop
from scraper.scrape.scheduling import TargetScheduler
from scraper.scrape.target_state import TargetState
from scraper.shared.outcome import WriteOutcome
from scraper.shared.scrapes import ScrapeResult
from scraper.shared.targets import Target
from scraper.telemetry import JobView

INTERVAL = 1.0
CONCURRENCY = 32

SCENARIOS: dict[str, list[tuple[str, str, int]]] = {
    # (namespace, kind, count)
    "one-tenant": [("tenant-a", "hung", 48), ("tenant-b", "healthy", 20)],
    "many-hung": [("tenant-a", "hung", 100), ("tenant-b", "hung", 10),
                  ("tenant-b", "healthy", 20)],
}


class _Writer:
    async def apply(self, namespace: str, name: str, status: TrainerStatus) -> WriteOutcome:
        return WriteOutcome.WRITTEN


class _Events:
    async def event(self, namespace: str, name: str, reason: str, message: str) -> None:
        return None


async def _hung_server() -> tuple[asyncio.Server, int, set[asyncio.StreamWriter]]:
    held: set[asyncio.StreamWriter] = set()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.add(writer)
        try:
            while await reader.read(65536):
                pass  # read and never answer
        finally:
            held.discard(writer)
            writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0, backlog=1024)
    return server, server.sockets[0].getsockname()[1], held


async def run_scenario(name: str, seconds: float) -> dict[str, Any]:
    """One scenario for ``seconds``; the counts per namespace and kind."""
    runner, healthy_port = await start_static_exporter()
    hung, hung_port, held = await _hung_server()
    scraper = ExporterScraper(ScrapeLimits(10.0, 1 << 20, CONCURRENCY))
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    group_of: dict[str, str] = {}
    states: dict[str, TargetState] = {}

    class Counting:
        async def scrape(self, target: Target, etag: str | None = None) -> ScrapeResult:
            result = await scraper.scrape(target, etag)
            counts[group_of[target.key]][type(result).__name__ if not hasattr(
                result, "kind") else result.kind.value] += 1  # type: ignore[union-attr]
            return result

    async def run(key: str) -> None:
        await loop.run(states[key])

    scheduler = TargetScheduler(
        run, on_skipped=lambda key: counts[group_of[key]].update(["skipped"]))

    class BusyCounted:
        """Pacing that only counts a run without a slot as skipped (no held scrapes here)."""

        def busy(self, key: str) -> None:
            scheduler.note_skipped(key, "busy")

        def holding(self, key: str, held: bool) -> None:
            pass

        def run_within(self, key: str, seconds: float) -> None:
            pass

    loop = ScrapeLoop(Counting(), _Writer(), _Events(),  # type: ignore[arg-type]
                      backoff_max=INTERVAL, pacing=BusyCounted())
    for namespace, kind, n in SCENARIOS[name]:
        port = hung_port if kind == "hung" else healthy_port
        for i in range(n):
            pod = f"{kind}-{i}"
            target = Target(namespace, pod, pod, f"uid-{namespace}-{pod}",
                            f"http://127.0.0.1:{port}/{namespace}-{pod}", INTERVAL)
            group_of[target.key] = f"{namespace} {kind}"
            states[target.key] = TargetState(JobView(namespace, pod, pod), target=target,
                                             uid=target.pod_uid)
    scheduler.start()
    started = time.monotonic()
    for state in states.values():
        assert state.target is not None
        scheduler.schedule(state.target)
    await asyncio.sleep(seconds)
    elapsed = time.monotonic() - started
    scheduler.shutdown()
    await asyncio.sleep(1.0)  # let runs in flight end (bounded by the 0.9 s timeout)
    await scraper.close()
    hung.close()
    for writer in list(held):
        writer.close()
    await runner.cleanup()
    out: dict[str, Any] = {"scenario": name, "seconds": round(elapsed, 1), "groups": {}}
    for namespace, kind, n in SCENARIOS[name]:
        group = f"{namespace} {kind}"
        c = counts[group]
        answered = c["NotModified"] + c["Fresh"]
        out["groups"][group] = {
            "targets": n, "expected_runs": int(n * elapsed / INTERVAL),
            "answered": answered, "timeouts": c["timeout"],
            "skipped": c["skipped"],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), action="append")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # a WARNING per timeout would drown the numbers
    for name in args.scenario or sorted(SCENARIOS):
        result = asyncio.run(run_scenario(name, args.seconds))
        print(json.dumps(result))


if __name__ == "__main__":
    main()
