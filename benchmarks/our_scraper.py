"""Child process: our scraper's scheduling + scraping + change detection, discovery bypassed.

``python -m benchmarks.our_scraper --urls-file F --interval S --warmup W --window D``

Target objects go straight into a :class:`scraper.app.ScraperApp`'s scheduler, so every
scrape runs the production path (``TargetManager.run`` -> ``ScrapeLoop.run``: APScheduler
job, aiohttp GET with ``If-None-Match``, JSON validation, telemetry, ``StatusWriter.apply``
with its same-report check, write queue and token bucket).  Only the Kubernetes API is
left out: the writer holds TrainJob statuses in memory and its server-side apply
returns the object it would have written (see :class:`OfflineRequest`), so **no request
is sent for a write**: the figures include the write queue, the token bucket and the
same-report check, not the HTTP request, TLS or the API server's answer.  Every report
row built on this child says so; the control-plane phase of the benchmark
(:mod:`benchmarks.cp`) measures real writes to the local API server.  By default every
change goes through the write path (a budget that never binds); ``--default-budget``
writes under the scraper's defaults (QPS 20, burst 30), where a TrainJob's changes
coalesce while it waits its turn.

Runs with ``metrics_staleness=0`` (every change answered and written at once, what
Prometheus does with every change it scrapes), not the default 30 s.

Prints one JSON object: scrapes by result, CPU seconds (utime+stime of this process
from ``/proc/self/stat``), RSS before and after scheduling the targets, writes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from kubernetes import client as k8s

from benchmarks.procstat import cpu_seconds, rss_bytes
from exporter_lib.status import TrainerStatus
from scraper.app import ScraperApp
from scraper.config import ScraperSettings
from scraper.scrape.target_state import TargetState
from scraper.shared.outcome import WriteOutcome
from scraper.shared.pod_check import PodCheck
from scraper.shared.targets import Target
from scraper.shared.trainjobs import TrainJobRecord, TrainJobStore
from scraper.telemetry import JobView
from scraper.write.annotation_target import Place
from scraper.write.writer import StatusWriter, already_stored

NAMESPACE = "bench"


class OfflineStore(TrainJobStore):
    """TrainJobs that live in memory instead of the API server (no informer)."""

    def __init__(self) -> None:
        super().__init__([None])
        self.synced.set()

    def get(self, namespace: str, name: str) -> TrainJobRecord | None:
        return self._records.setdefault((namespace, name), TrainJobRecord("uid", None))


class OfflineRequest:
    """An apply request (:class:`scraper.write.worker.StatusRequest`) that returns what
    it would have written.

    No request leaves the process: a row measured with it leaves out the write's HTTP
    request and must say so.
    """

    writes = 0

    async def apply(self, namespace: str, name: str, status: TrainerStatus,
                    place: Place, uid: str, resource_version: str) -> dict[str, Any]:
        OfflineRequest.writes += 1
        return {"metadata": {"uid": "uid"}, "status": {"trainerStatus": status.to_api()}}

    async def close(self) -> None:
        return None


class ScrapeOnlyWriter(StatusWriter):
    """Change detection without the write: how much of a changing scrape the write costs.

    Compares against the held status as :meth:`StatusWriter.apply` does, then stops before
    the retry wrapper, the token bucket and the worker-thread hop into the client.
    """

    async def apply(self, namespace: str, name: str, status: TrainerStatus, *,
                    final: bool = False, uid: str = "", seen: float | None = None,
                    finished_at: float | None = None,
                    confirm: Target | None = None) -> WriteOutcome:
        record = self.store.get(namespace, name)
        if record is None or not already_stored(record.status, status):
            self.store._records[(namespace, name)] = TrainJobRecord("uid", status)
        return WriteOutcome.UNCHANGED


async def _confirmed(target: Target, answered_at: float | None) -> PodCheck:
    return PodCheck.CONFIRMED


def skipped(app: ScraperApp) -> float:
    return app.telemetry.registry.get_sample_value("trainjob_scraper_skipped_runs_total") or 0.0


def scrape_counts(app: ScraperApp) -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in app.telemetry.scrapes.collect():  # this counter only: cheap
        if metric.name == "trainjob_scraper_scrapes":
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["result"]] = sample.value
    return out


#: A write budget that never binds at these rates: every change is written.
UNBUDGETED = (1000.0, 10000)


async def run(urls: list[str], interval: float, warmup: float, window: float,
              concurrency: int, writes: bool = True, wait: bool = True,
              budget: tuple[float, int] = UNBUDGETED, queue_only: bool = False) -> dict[str, Any]:
    """One measured window; ``budget`` is the writes' ``(QPS, burst)``; ``queue_only``:
    the writer's tasks are not started, so each change ends in the write queue (one
    pending status per TrainJob, the newest wins), the end of the scrape path."""
    # Metrics staleness 0: every change is answered and written, as Prometheus takes every
    # change it scrapes.  At the default (30 s) the exporter holds a metrics-only change
    # for up to 30 s, so a farm whose percentage moves every 50 s gets few scrapes at
    # all: no like-for-like CPU per scrape (2026-12-03 19:26: 10 scrapes in 10 s).
    settings = ScraperSettings(interval=interval, concurrency=concurrency,
                               write_qps=budget[0], write_qps_max=budget[0],
                               write_burst=budget[1],
                               listen_host="127.0.0.1", listen_port=0,
                               log_level="WARNING", wait_scrapes=wait,
                               metrics_staleness=0.0)
    api = k8s.ApiClient()
    # The rows state a fixed budget (write_qps_max = write_qps).  Discovery is bypassed,
    # so there are no pod objects to confirm an unidentified answer against: every pod is
    # taken as confirmed, as exporter_lib's answers in a pod (which state the pod) are.
    app = ScraperApp(settings, api_client=api, store=OfflineStore(), request=OfflineRequest(),
                     writer_class=StatusWriter if writes else ScrapeOnlyWriter,
                     confirm_pod=_confirmed)
    app.scheduler.start()
    if not queue_only:
        app.writer.start()
    rss_before = rss_bytes()
    try:
        for i, url in enumerate(urls):
            target = Target(NAMESPACE, f"job-{i}", f"job-{i}-node-0-0", f"uid-{i}", url, interval)
            app.manager.states[target.key] = TargetState(
                JobView(NAMESPACE, target.trainjob, target.pod_name), target=target,
                uid=target.pod_uid)
            app.scheduler.schedule(target)
        await asyncio.sleep(warmup)
        c0, w0, s0 = cpu_seconds(), OfflineRequest.writes, scrape_counts(app)
        k0 = skipped(app)
        t0 = time.monotonic()
        await asyncio.sleep(window)
        c1, w1, s1 = cpu_seconds(), OfflineRequest.writes, scrape_counts(app)
        k1 = skipped(app)
        t1 = time.monotonic()
        rss_after = rss_bytes()
        held = app.scraper.held
    finally:
        app.manager.stop_holding()
        app.scheduler.shutdown()
        await app.writer.stop()
        await asyncio.sleep(0.2)
        await app.scraper.close()
    results = {k: s1.get(k, 0.0) - s0.get(k, 0.0) for k in set(s0) | set(s1)}
    return {
        "targets": len(urls),
        "interval": interval,
        "window": t1 - t0,
        "cpu_seconds": c1 - c0,
        "scrapes": sum(results.values()),
        "results": results,
        "writes": w1 - w0,
        # Runs skipped: the target's previous scrape had not finished, or no slot came free.
        "skipped": k1 - k0,
        "expected": len(urls) * (t1 - t0) / interval,
        "rss_before": rss_before,
        "rss_after": rss_after,
        "held": held,  # waiting scrapes open at the end of the window
        "cores": sorted(os.sched_getaffinity(0)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--urls-file", required=True)
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--no-writes", action="store_true",
                        help="detect changes but leave out the status write path")
    parser.add_argument("--queue-only", action="store_true",
                        help="hand each change to the write queue but start no writer "
                        "(the scrape path: fetch, read, decode, validate, compare, queue)")
    parser.add_argument("--no-wait-scrapes", action="store_true",
                        help="poll every target (no Prefer: wait)")
    parser.add_argument("--default-budget", action="store_true",
                        help="the scraper's default write budget (QPS 20, burst 30: changes "
                        "coalesce per TrainJob) instead of one write per change")
    args = parser.parse_args()
    with open(args.urls_file) as handle:
        urls = json.load(handle)
    defaults = ScraperSettings()
    budget = ((defaults.write_qps, defaults.write_burst) if args.default_budget
              else UNBUDGETED)
    result = asyncio.run(run(urls, args.interval, args.warmup, args.window, args.concurrency,
                             writes=not args.no_writes, wait=not args.no_wait_scrapes,
                             budget=budget, queue_only=args.queue_only))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
