"""Prometheus (Debian's binary) scraping the farm: CPU seconds per scrape from /proc."""

from __future__ import annotations

import time
import urllib.request
from typing import Any

from benchmarks.pinning import affinity, pinned
from benchmarks.procstat import cpu_seconds, rss_bytes
from localdev.cluster.prometheus import PrometheusError, PrometheusServer, _duration


class FarmPrometheus(PrometheusServer):
    """One scrape job over all farm targets (one scrape pool, as for N pods)."""

    def __init__(self, addresses: list[str], *, scrape_interval: float) -> None:
        super().__init__([], scrape_interval=scrape_interval, startup_timeout=60)
        self.addresses = addresses

    def config(self) -> dict[str, Any]:
        interval = _duration(self.scrape_interval)
        return {
            "global": {"scrape_interval": interval,
                       "scrape_timeout": _duration(self.scrape_interval * 0.9),
                       "evaluation_interval": "1h"},
            # No targets: the same server with nothing to scrape (the RSS baseline).
            "scrape_configs": [{"job_name": "farm", "metrics_path": "/metrics",
                                "static_configs": [{"targets": self.addresses}]}]
            if self.addresses else [],
        }

    @property
    def pid(self) -> int:
        proc = self._proc
        assert proc is not None
        return proc.pid

    def scrapes_total(self) -> float:
        """Scrapes done so far (``prometheus_target_interval_length_seconds_count``)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("prometheus_target_interval_length_seconds_count"):
                total += float(line.rsplit(" ", 1)[1])
        return total


def measure(urls: list[str], interval: float, warmup: float, window: float,
            cores: frozenset[int] | None = None) -> dict[str, Any]:
    """Run Prometheus on ``urls`` (``http://host:port/metrics``) and measure one window.

    ``cores``: the CPUs Prometheus is started on (see :mod:`benchmarks.pinning`).  Returns
    CPU seconds and scrapes in the window, the scrapes the schedule called for
    (``expected``), resident memory at the end in bytes, targets up, and the cores the
    process was allowed (read back from it).
    """
    addresses = [u.split("//", 1)[1].split("/", 1)[0] for u in urls]
    prom = FarmPrometheus(addresses, scrape_interval=interval)
    with pinned(cores):
        prom.start()
    try:
        allowed = sorted(affinity(prom.pid))
        time.sleep(warmup)
        c0, s0, t0 = cpu_seconds(prom.pid), prom.scrapes_total(), time.monotonic()
        time.sleep(window)
        c1, s1, t1 = cpu_seconds(prom.pid), prom.scrapes_total(), time.monotonic()
        rss = rss_bytes(prom.pid)
        try:
            ups = (prom.query("sum(up)").get("result") or []) if urls else []
        except PrometheusError:
            # Too loaded to answer in time: targets up unknown, so the run gets no
            # ratio (benchmarks.__main__.problems), and the rest of the run goes on.
            ups = []
    finally:
        prom.stop()
    return {
        "targets": len(urls),
        "interval": interval,
        "window": t1 - t0,
        "cpu_seconds": c1 - c0,
        "scrapes": s1 - s0,
        "expected": len(urls) * (t1 - t0) / interval,
        "rss": rss,
        "up": float(ups[0]["value"][1]) if ups else None,
        "cores": allowed,
    }
