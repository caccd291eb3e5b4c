"""CPU per changing scrape, ours against Prometheus, the targets on one core and the
scraper under test on the other.

``python -m benchmarks.scrape_cost [--targets 200 1000] [--window 15] [--profile DIR]``

For each N: one farm of N real exporter_lib exporters (:class:`benchmarks.farm.ExporterFarm`,
each updated every half interval) is started pinned to core 0; then Prometheus, then our
scraper (``benchmarks/our_scraper.py``, discovery bypassed, every change written to the
in-memory writer, waiting scrapes on as shipped) each run pinned to core 1 and are
measured the same way: utime+stime of the scraper process from ``/proc/<pid>/stat`` over
the window, divided by the scrapes done in it.  Our runs alternate with Prometheus's
twice, so a change of the machine's load hits both.  A run that did fewer than 97 % of its
expected scrapes, or skipped a run, is marked behind schedule.

Prints one JSON object per N and a Markdown table; the load average is in each row
(the machine is shared: the figures are not a quiet machine's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import prom
from benchmarks.__main__ import SUSTAINED_SHARE, behind, per_scrape_us, run_ours
from benchmarks.farm import ExporterFarm

FARM_CORE = 0
SCRAPER_CORE = 1


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


#: Our modes: name -> (``run_ours`` keywords, what the row includes).
MODES: dict[str, tuple[dict[str, bool], str]] = {
    "queue": ({"queue_only": True}, "the scrape path: fetch, read, decode, validate, "
              "compare, hand to the write queue (no writer runs)"),
    "budget": ({"default_budget": True}, "plus the writers at the default budget (QPS 20, "
               "burst 30) into the in-memory writer: no API request"),
    "written": ({}, "plus every change written to the in-memory writer (no API request)"),
}


def measure(n: int, interval: float, window: float, reps: int, modes: list[str],
            profile: Path | None = None) -> dict[str, Any]:
    """Prometheus and ours, ``reps`` times each, alternated, on a farm of ``n`` exporters."""
    warmup = 2 * interval + 1
    duration = reps * 2 * (warmup + window + 12) + 60
    os.sched_setaffinity(0, {FARM_CORE})  # the farm's children inherit it
    out: dict[str, Any] = {"targets": n, "interval": interval, "window": window,
                           "load_start": load(), "prometheus": [],
                           **{mode: [] for mode in modes}}
    with ExporterFarm(n, period=interval / 2, duration=duration) as farm:
        os.sched_setaffinity(0, {SCRAPER_CORE})  # Prometheus inherits it; ours is started on it
        try:
            for rep in range(reps):
                p = prom.measure(farm.urls(), interval, warmup + 5, window)
                p["load"] = load()
                out["prometheus"].append(p)
                print(f"[scrape_cost] N={n} rep {rep}: Prometheus {per_scrape_us(p):.0f} "
                      f"us (load {p['load']})", file=sys.stderr, flush=True)
                for mode in modes:
                    o = run_ours(farm.urls(), interval, warmup, window,
                                 cores=frozenset({SCRAPER_CORE}),
                                 profile=None if profile is None or rep else
                                 profile / f"ours-{mode}-{n}.txt", **MODES[mode][0])
                    o["load"] = load()
                    out[mode].append(o)
                    print(f"[scrape_cost] N={n} rep {rep}: ours {mode} "
                          f"{per_scrape_us(o):.0f} us (load {o['load']})",
                          file=sys.stderr, flush=True)
        finally:
            os.sched_setaffinity(0, {FARM_CORE, SCRAPER_CORE})
    out["load_end"] = load()
    return out


def total(runs: list[dict[str, Any]]) -> float:
    """CPU us per scrape over all runs (CPU summed, scrapes summed)."""
    return 1e6 * sum(x["cpu_seconds"] for x in runs) / max(1.0, sum(x["scrapes"] for x in runs))


def row(r: dict[str, Any], mode: str) -> str:
    p, o = total(r["prometheus"]), total(r[mode])
    late = [behind(x) for x in r[mode]]
    p_short = [x for x in r["prometheus"] if x["scrapes"] < SUSTAINED_SHARE * x["expected"]]
    notes = "; ".join(w for w in late if w) or "on schedule"
    if p_short:
        notes += f"; Prometheus short of schedule in {len(p_short)} run(s)"
    per = ", ".join(f"{per_scrape_us(x):.0f}" for x in r["prometheus"])
    ours = ", ".join(f"{per_scrape_us(x):.0f}" for x in r[mode])
    loads = ", ".join(x["load"] for x in r[mode])
    return (f"| {r['targets']} | {mode}: {MODES[mode][1]} | {p:.0f} ({per}) | {o:.0f} "
            f"({ours}) | {o / p:.2f}x | {notes} | {loads} |")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scrape_cost",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--window", type=float, default=15.0)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--modes", nargs="+", choices=sorted(MODES), default=["queue", "budget"])
    parser.add_argument("--profile", type=Path, default=None,
                        help="py-spy raw profile of our first run per N into this folder")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2 or os.cpu_count() is None:
        parser.error("needs two cores (farm on one, scraper on the other)")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    results = []
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    for n in args.targets:
        results.append(measure(n, args.interval, args.window, args.reps, args.modes,
                               args.profile))
        print(json.dumps(results[-1], default=str))
    print(f"\nRun of {started}, interval {args.interval:g} s, window {args.window:g} s, "
          f"{args.reps} runs each alternated; farm on core {FARM_CORE}, scraper on core "
          f"{SCRAPER_CORE}.\n")
    print("| targets | our row includes | Prometheus us/scrape (runs) | ours us/scrape (runs) "
          "| ratio | schedule | load (1/5/15 min) at our runs |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        for mode in args.modes:
            print(row(r, mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
