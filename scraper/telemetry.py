"""The scraper's own HTTP server: ``/metrics``, ``/healthz``, ``/readyz``.

Per-TrainJob series are produced at collection time from the current
:class:`JobView` map, so a TrainJob (or target) that goes away takes its
series with it.  Operational series are ordinary prometheus-client metrics in
a registry private to one :class:`Telemetry` (several scrapers can share a
process in tests).

``/metrics`` is rendered in a thread of its own, not on the event loop: the text grows
with the TrainJobs (docs/metrics.md gives its size), and while the loop rendered it nothing else
ran, not the status writes (whose token bucket lost the time past its burst), the
scrapes, nor the Lease renewal.  The collectors therefore read the scraper's maps from
that thread: each takes a copy of a map's items (one step under the GIL) before it
iterates, and reads only whole values off the entries.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter_lib.status import TrainerStatus


@dataclass
class JobView:
    """What /metrics shows for one TrainJob: its last status and whether its target is up."""

    namespace: str
    trainjob: str
    pod: str
    status: TrainerStatus | None = None
    #: None until the first scrape ends: no ``target_up`` series yet, since a target
    #: whose phase has not come round is neither up nor down.
    up: bool | None = None


class _JobCollector(Collector):
    def __init__(self, views: Callable[[], Iterable[JobView]]) -> None:
        self._views = views

    def collect(self) -> Iterable[Metric]:
        labels = ["namespace", "trainjob"]
        progress = GaugeMetricFamily("trainjob_progress_ratio",
                                     "Training progress, 0..1, as last scraped", labels=labels)
        remaining = GaugeMetricFamily("trainjob_estimated_remaining_seconds",
                                      "Estimated seconds until training ends", labels=labels)
        updated = GaugeMetricFamily("trainjob_last_update_timestamp_seconds",
                                    "When the job last reported (Unix seconds)", labels=labels)
        metric = GaugeMetricFamily("trainjob_metric", "Numeric training metrics by name",
                                   labels=[*labels, "name"])
        up = GaugeMetricFamily("trainjob_scraper_target_up",
                               "1 if the last scrape of the job's exporter succeeded",
                               labels=[*labels, "pod"])
        for view in self._views():
            key = [view.namespace, view.trainjob]
            if view.up is not None:
                up.add_metric([*key, view.pod], 1.0 if view.up else 0.0)
            status = view.status
            if status is None:
                continue
            if status.progress_percentage is not None:
                progress.add_metric(key, status.progress_percentage / 100.0)
            if status.estimated_remaining_seconds is not None:
                remaining.add_metric(key, float(status.estimated_remaining_seconds))
            updated.add_metric(key, status.last_updated_time.timestamp())
            for name, value in status.metrics_dict().items():
                try:
                    number = float(value)
                except ValueError:
                    continue  # non-numeric metrics have no Prometheus value
                metric.add_metric([*key, name], number)
        yield from (progress, remaining, updated, metric, up)


class Telemetry:
    """Operational metrics plus the HTTP server.

    Args:
        views: returns the current per-TrainJob views (called on every /metrics).
    """

    def __init__(self, views: Callable[[], Iterable[JobView]]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.scrape_duration = Histogram(
            "trainjob_scraper_scrape_duration_seconds", "Duration of one exporter scrape",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r)
        self.scrapes = Counter("trainjob_scraper_scrapes_total",
                               "Exporter scrapes by result", ["result"], registry=r)
        self.wrong_pod_answers = Counter(
            "trainjob_scraper_wrong_pod_answers_total", "Exporter answers from another pod "
            "than the target's (its pod IP reused), never written, by the first stated "
            "part that differs (uid, name, namespace, hostname)", ["reason"], registry=r)
        self.writes = Counter("trainjob_scraper_status_writes_total",
                              "Status write decisions by result", ["result"], registry=r)
        self.writes_deferred = Counter(
            "trainjob_scraper_status_writes_deferred_total", "Reports not written because "
            "another writer's status is kept (other_writer: it is live; not_news: the report "
            "did not change since it wrote; delivered: it wrote a final after the container "
            "ended)", ["reason"], registry=r)
        self.clock_skew = Counter(
            "trainjob_scraper_clock_skew_total", "Writes whose lastUpdatedTime is the "
            "scraper's arrival time instead of the report's own (back: older than the stored "
            "one; future: more than 60 s ahead of the scraper's clock)", ["direction"],
            registry=r)
        self.write_duration = Histogram(
            "trainjob_scraper_status_write_duration_seconds", "Duration of one status write "
            "request (apply PATCH) to the API server, whatever its answer",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r)
        self.write_rate = Gauge(
            "trainjob_scraper_status_write_rate_limit_per_second", "Status writes per second "
            "the write budget allows now (the adaptive rate, between --write-qps and "
            "--write-qps-max)", registry=r)
        self.write_rate_changes = Counter(
            "trainjob_scraper_status_write_rate_changes_total", "Changes of the status "
            "write rate by reason (writes_fast: raised; throttled, apf_rejected, timeout, "
            "latency: lowered)", ["reason"], registry=r)
        self.writes_pending = Gauge(
            "trainjob_scraper_status_writes_pending", "TrainJobs with a status waiting in "
            "the write queue (newest only per TrainJob; in flight not counted)", registry=r)
        self.targets = Gauge("trainjob_scraper_targets", "Targets being scraped", registry=r)
        self.watch_restarts = Counter("trainjob_scraper_watch_restarts_total",
                                      "Times the pod watch started over", ["reason"], registry=r)
        self.pod_apply_failures = Counter(
            "trainjob_scraper_pod_apply_failures_total", "Pod watch items (list: a full "
            "list, the other pods of it applied; event: one watch event) whose applying "
            "raised; each is answered with a relist", ["item"], registry=r)
        self.leader = Gauge("trainjob_scraper_leader", "1 while this replica leads",
                            registry=r)
        self.held_scrapes = Gauge("trainjob_scraper_held_scrapes", "Waiting scrapes "
                                  "(Prefer: wait) open now, at most one per target",
                                  registry=r)
        self.skipped_runs = Counter(
            "trainjob_scraper_skipped_runs", "Scheduled scrapes skipped because the "
            "target's previous scrape had not finished or no concurrency slot came free "
            "within the scrape timeout (the scraper is behind)", registry=r)
        self.log_reads = Counter(
            "trainjob_scraper_log_reads_total", "pods/log reads of log-sourced targets by "
            "result (ok; cut: reached limitBytes, read again with a shorter tail; "
            "forbidden; error)", ["result"], registry=r)
        self.log_read_bytes = Counter(
            "trainjob_scraper_log_read_bytes_total", "Bytes of pods/log answers read",
            registry=r)
        self.log_parse_failures = Counter(
            "trainjob_scraper_log_parse_failures_total", "Log reads whose readings broke a "
            "Trainer API limit (nothing written)", registry=r)
        r.register(_JobCollector(views))
        self.ready = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._render_pool: ThreadPoolExecutor | None = None
        self.port: int | None = None

    def count_log_read(self, result: str, size: int) -> None:
        """One pods/log read: its result label and the bytes it returned."""
        self.log_reads.labels(result).inc()
        self.log_read_bytes.inc(size)

    # The scrape loop's counts (scraper.shared.scrapes.ScrapeCounts; ``written`` below).

    def scraped(self, result: str) -> None:
        """One scrape came to ``result`` (the label)."""
        self.scrapes.labels(result).inc()

    def wrong_pod(self, reason: str) -> None:
        """One answer came from another pod, for ``reason``."""
        self.wrong_pod_answers.labels(reason).inc()

    # The write stage's counts (scraper.shared.outcome.WriteCounts).

    def written(self, outcome: enum.Enum) -> None:
        """One status write (or submission) came to ``outcome`` (its value: the label)."""
        self.writes.labels(outcome.value).inc()

    def write_rate_changed(self, before: float, after: float, reason: str) -> None:
        """The adaptive write rate moved from ``before`` to ``after`` writes/s for
        ``reason``: the gauge, the counter, and a log line (INFO for a decrease)."""
        self.write_rate.set(after)
        self.write_rate_changes.labels(reason).inc()
        logging.getLogger("scraper.write.rate").log(
            logging.INFO if after < before else logging.DEBUG,
            "status write rate %.1f -> %.1f writes/s (%s)", before, after, reason)

    def request_took(self, seconds: float) -> None:
        """One apply request took ``seconds``."""
        self.write_duration.observe(seconds)

    def deferred(self, reason: str) -> None:
        """One report kept out by another writer, for ``reason``."""
        self.writes_deferred.labels(reason).inc()

    def skewed(self, direction: str) -> None:
        """One write carries the arrival time (``direction``: ``back`` or ``future``)."""
        self.clock_skew.labels(direction).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of everything."""
        return generate_latest(self.registry)

    async def start(self, host: str, port: int,
                    middlewares: Iterable[Middleware] = ()) -> int:
        """Serve on ``host:port`` (0: any free port); return the bound port.

        ``middlewares`` wrap every handler, e.g. the /metrics guard of
        :mod:`scraper.metrics_auth`.
        """
        # One thread: renders never pile up, and a flood of /metrics requests waits
        # here instead of taking the default executor's threads from the informers.
        self._render_pool = ThreadPoolExecutor(max_workers=1,
                                               thread_name_prefix="metrics-render")
        app = web.Application(middlewares=list(middlewares))
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        # addresses: the bound (host, port, ...) of every listening socket.
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else port
        return self.port

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._render_pool is not None:
            self._render_pool.shutdown(wait=False, cancel_futures=True)
            self._render_pool = None

    async def _metrics(self, request: web.Request) -> web.Response:
        body = await asyncio.get_running_loop().run_in_executor(self._render_pool,
                                                                self.render)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        if self.ready.is_set():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="waiting for the first pod list\n")

