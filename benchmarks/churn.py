"""Scraper RSS under pod churn (issue 13, input 8): must reach a plateau.

``python -m benchmarks.churn [--targets 1000] [--rounds 10] [--cycles 2000]``

In one process, the scraper's real target manager, scheduler (APScheduler), scrape
loop and exporter scraper (aiohttp) get ``--targets`` Running pods, then rounds of
``--cycles`` pod create/delete cycles (a pod added Running, scheduled, scraped for
a moment, deleted), fed through :meth:`PodTargets.on_pod` as the pod watch feeds
them; discovery's list+watch against an API server is left out (the watch thread's
own memory is not measured here).  Targets point at 127.0.0.1 ports where nothing
listens (refused: backed off) or at one loopback exporter answering 304, and every
churned pod gets a new port, so the connector sees new hosts as in a cluster.

After each round, once settled (1 s), prints RSS (``/proc/self/statm``), the
tracemalloc total, scheduled jobs and the table sizes, as one JSON line.  A plateau
is what the issue asks: the last rounds within a few MiB of each other.

``--api`` runs the whole scraper process against the local control plane instead,
every pod a TrainJob of its own with its own pod IP (:mod:`benchmarks.churn_api`).

The last line is the series and the verdict: ``plateau`` is true when the rounds of
the series' second half spread by at most ``--bound`` MiB (:func:`plateau`); the exit
code is 1 otherwise, so ``make bench`` stops there.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
import tracemalloc
from typing import Any

from benchmarks.procstat import rss_bytes
from benchmarks.static_exporter import start_static_exporter
from exporter_lib.status import TrainerStatus
from scraper.discovery.pod_targets import PodTargets
from scraper.scrape.exporter import ExporterScraper, ScrapeLimits
from scraper.scrape.loop import ScrapeLoop
from scraper.scrape.manager import TargetManager
from scraper.scrape.scheduling import TargetScheduler
from scraper.shared.outcome import WriteOutcome

NAMESPACE = "churn"
#: Default bound of a plateau (MiB): the spread of the last half of the rounds.
PLATEAU_MIB = 4.0


class _Writer:
    async def apply(self, namespace: str, name: str, status: TrainerStatus) -> WriteOutcome:
        return WriteOutcome.UNCHANGED


class _Events:
    async def event(self, namespace: str, name: str, reason: str, message: str) -> None:
        return None


def _pod(name: str, uid: str, port: int) -> dict[str, Any]:
    return {
        "metadata": {"namespace": NAMESPACE, "name": name, "uid": uid, "annotations": {
            "trainjob-progress.dev/port": str(port), "trainjob-progress.dev/interval": "1s"},
            "labels": {"jobset.sigs.k8s.io/jobset-name": name}},
        "status": {"phase": "Running", "podIP": "127.0.0.1"},
    }


async def run(targets: int, rounds: int, cycles: int) -> list[dict[str, Any]]:
    runner, live_port = await start_static_exporter()

    scraper = ExporterScraper(ScrapeLimits(0.9, 1 << 20, 32))
    holder: dict[str, TargetManager] = {}

    async def job(key: str) -> None:
        await holder["m"].run(key)

    scheduler = TargetScheduler(job)
    loop = ScrapeLoop(scraper, _Writer(), _Events(), backoff_max=5.0, pacing=scheduler)
    manager = TargetManager(loop, scheduler, spawn=asyncio.ensure_future, leading=True,
                            on_dropped=scraper.forget)
    pods = PodTargets(manager, default_port=28080, default_path="/metrics",
                      default_interval=1.0)
    holder["m"] = manager
    scheduler.start()
    tracemalloc.start()
    out: list[dict[str, Any]] = []
    try:
        for i in range(targets):
            pods.on_pod(_pod(f"base-{i}", f"base-{i}", live_port), deleted=False)
        await asyncio.sleep(3)
        next_port = 40000
        for r in range(rounds + 1):
            if r:
                started = time.monotonic()
                for c in range(cycles):
                    # Every 4th churned pod answers; the others refuse (nothing listens).
                    port = live_port if c % 4 == 0 else next_port
                    next_port = 40000 + (next_port - 40000 + 1) % 20000
                    pod = _pod(f"churn-{r}-{c}", f"uid-{r}-{c}", port)
                    pods.on_pod(pod, deleted=False)
                    if c % 50 == 49:
                        await asyncio.sleep(0.05)  # let some runs happen
                    pods.on_pod(pod, deleted=True)
                took = time.monotonic() - started
            else:
                took = 0.0
            await asyncio.sleep(1.0)
            gc.collect()
            current, _ = tracemalloc.get_traced_memory()
            row = {"round": r, "rss_mib": round(rss_bytes() / 2**20, 1),
                   "tracemalloc_mib": round(current / 2**20, 1),
                   "jobs": len(scheduler._scheduler.get_jobs()),
                   "states": len(manager.states),
                   "scraper_timeouts": len(scraper._timeouts),
                   "connector_conns": scraper._pool.idle_count(),
                   "round_seconds": round(took, 1)}
            print(json.dumps(row), flush=True)
            out.append(row)
    finally:
        manager.stop_holding()
        scheduler.shutdown()
        await asyncio.sleep(0.2)
        await scraper.close()
        await runner.cleanup()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--api", action="store_true",
                        help="the whole scraper process against the local control plane")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after a round")
    parser.add_argument("--hold", type=float, default=1.5,
                        help="with --api: seconds a churned pod runs")
    parser.add_argument("--workers", type=int, default=48,
                        help="with --api: cycles at once")
    parser.add_argument("--trim", action="store_true",
                        help="with --api: malloc_trim(0) in the scraper after each report")
    parser.add_argument("--verbose", action="store_true", help="with --api: scraper's stderr")
    parser.add_argument("--bound", type=float, default=PLATEAU_MIB,
                        help="MiB the last half of the rounds may spread and still be a plateau")
    args = parser.parse_args()
    if args.api:
        from benchmarks.churn_api import run_api
        rows = run_api(args.targets, args.rounds, args.cycles, args.settle, hold=args.hold,
                       workers=args.workers, trim=args.trim, verbose=args.verbose)
    else:
        rows = asyncio.run(run(args.targets, args.rounds, args.cycles))
    rss = [row["rss_mib"] for row in rows]
    verdict = plateau(rss, args.bound)
    print(json.dumps({"rss_mib": rss, **verdict}))
    return 0 if verdict["plateau"] else 1


def plateau(rss: list[float], bound: float) -> dict[str, Any]:
    """Whether the RSS series settled: the rounds of its second half (from round
    ``len // 2``) spread by at most ``bound`` MiB and the last is no higher than the
    first of them plus ``bound``."""
    tail = rss[len(rss) // 2:]
    spread = round(max(tail) - min(tail), 1) if tail else 0.0
    return {"last_half_spread_mib": spread, "bound_mib": bound,
            "plateau": bool(tail) and spread <= bound}


if __name__ == "__main__":
    sys.exit(main())
