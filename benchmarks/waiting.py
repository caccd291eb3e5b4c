"""Unchanged exporter_lib exporters: waiting scrapes versus polling versus Prometheus.

``python -m benchmarks.waiting [--targets 200] [--interval 1] [--window 20]``

One farm of real exporter_lib exporters (contract 2, ``Prefer: wait``) whose status
never changes after the first ``update()``; in turn Prometheus, our scraper polling
(``--no-wait-scrapes``) and our scraper with waiting scrapes (the default) scrape it.
Prints one JSON object with the CPU seconds of each scraper process over the window
and the CPU per target per interval (the issue 14 row: target <= 0.1x Prometheus).
Each process is measured from ``/proc/<pid>/stat`` (10 ms ticks: keep the window long
enough for a second of CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from benchmarks import prom
from benchmarks.__main__ import run_ours
from benchmarks.farm import ExporterFarm


def per_target_interval_us(r: dict[str, Any]) -> float:
    """CPU microseconds per target per interval."""
    intervals = float(r["window"]) / float(r["interval"])
    return 1e6 * float(r["cpu_seconds"]) / (float(r["targets"]) * intervals)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=200)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--no-prometheus", action="store_true")
    args = parser.parse_args()
    out: dict[str, Any] = {"targets": args.targets, "interval": args.interval}
    duration = 3 * (args.warmup + args.window) + 60
    # period >= duration: one update() at start, then unchanged.
    with ExporterFarm(args.targets, period=duration * 2, duration=duration) as farm:
        urls = farm.urls()
        if not args.no_prometheus:
            out["prometheus"] = prom.measure(urls, args.interval, args.warmup + 5, args.window)
        out["ours_polling"] = run_ours(urls, args.interval, args.warmup, args.window,
                                       wait=False)
        out["ours_waiting"] = run_ours(urls, args.interval, args.warmup, args.window)
    for key in ("prometheus", "ours_polling", "ours_waiting"):
        if key in out:
            out[f"{key}_us_per_target_interval"] = round(per_target_interval_us(out[key]), 1)
    if "prometheus" in out:
        base = out["prometheus_us_per_target_interval"]
        for key in ("ours_polling", "ours_waiting"):
            out[f"{key}_vs_prometheus"] = round(out[f"{key}_us_per_target_interval"] / base, 3)
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
