"""How the write queue's order spends a saturated budget: round robin, or weighted by
how far each TrainJob's shown percentage is behind.

``python -m benchmarks.write_order_sim [--jobs N] [--rate R] [--seconds S] [--seeds K]
[--report STEM]`` (``STEM.md`` and ``STEM.json``: the table, the settings and the commit)

The real :class:`scraper.write.queue.WriteQueue` on a simulated clock, nothing else: N
trainings move one percentage point every ``p`` seconds each, ``p`` from a mix
(``uniform``: all 15 s; ``mixed``: a third each at 5, 15 and 60 s; ``spread``:
log-uniform 5-300 s, seeded).  Every simulated second each training whose percentage
moved is put (a progress change, no progress floor, ``shown`` = what its TrainJob holds,
which is what was last taken from the queue), and the budget takes ``R`` items per
second, each written at once.  Printed per order and mix:

* percent error p50 / p99 / max: ``|reported - shown|`` of every training, sampled every
  second after the first ``N / R`` seconds (the warm-up);
* progress freshness p50 / p99: seconds from a percentage being reported to a write that
  shows it or a later one (values never shown by the end are left out and counted);
* longest wait: the most seconds an item spent queued before it was taken (``N / R`` is
  plain round robin's turn).

It measures the order alone; ``benchmarks/cluster_scale.py`` and
``benchmarks/vs_push.py`` measure the scraper on a real API server.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from benchmarks.report import fmt, loadavg, source_commit
from benchmarks.vs_push_delivery import percentile
from exporter_lib.status import TrainerStatus
from scraper.shared.writes import Priority
from scraper.write.queue import MAX_LEAD_SECONDS, POINT_SECONDS, WriteQueue

STAMP = datetime(2026, 1, 1, tzinfo=UTC)
ORDERS = {"round robin": (0.0, 0.0),
          f"behind ({POINT_SECONDS:g} s/point, lead <= {MAX_LEAD_SECONDS:g} s, default)":
              (POINT_SECONDS, MAX_LEAD_SECONDS),
          "behind (5 s/point, lead <= 60 s)": (5.0, 60.0)}


def _status(percent: int) -> TrainerStatus:
    return TrainerStatus.from_api({"progressPercentage": percent, "metrics": [],
                                   "lastUpdatedTime": STAMP})


def periods(mix: str, jobs: int, seed: int) -> list[float]:
    """Seconds per percentage point of each training."""
    rng = random.Random(seed)
    if mix == "uniform":
        return [15.0] * jobs
    if mix == "mixed":
        return [(5.0, 15.0, 60.0)[i % 3] for i in range(jobs)]
    return [math.exp(rng.uniform(math.log(5.0), math.log(300.0))) for _ in range(jobs)]


def simulate(jobs: int, rate: float, seconds: int, every: Sequence[float],
             point_seconds: float, max_lead: float, seed: int) -> dict[str, Any]:
    """One run (module doc); the figures as a dict."""
    now = [0.0]
    queue = WriteQueue(clock=lambda: now[0], point_seconds=point_seconds,
                       max_lead_seconds=max_lead)
    rng = random.Random(seed)
    offset = [rng.uniform(0.0, p) for p in every]
    keys = [("ns", f"job-{i}") for i in range(jobs)]
    reported = [0] * jobs
    shown = [0] * jobs
    stamps: list[list[float]] = [[0.0] for _ in range(jobs)]  # report time of each point
    fresh: list[float] = []
    errors: list[int] = []
    longest = 0.0
    credit = 0.0
    for second in range(1, seconds + 1):
        now[0] = float(second)
        for i in range(jobs):
            percent = min(100, int((second + offset[i]) / every[i]))
            if percent != reported[i]:
                for _ in range(reported[i] + 1, percent + 1):
                    stamps[i].append(now[0])
                reported[i] = percent
                queue.put(keys[i], _status(percent), Priority.PROGRESS,
                          shown=_status(shown[i]))
        credit += rate
        while credit >= 1.0:
            item = queue.take()
            if item is None:
                credit = 0.0
                break
            credit -= 1.0
            longest = max(longest, now[0] - item.queued_at)
            i = int(item.key[1].split("-")[1])
            new = item.status.progress_percentage or 0
            fresh.extend(now[0] - stamps[i][p] for p in range(shown[i] + 1, new + 1))
            shown[i] = max(shown[i], new)
            queue.done(item)
        if second > jobs / rate:
            errors.extend(abs(r - s) for r, s in zip(reported, shown, strict=True))
    never = sum(r - s for r, s in zip(reported, shown, strict=True))
    return {"percent_error_p50": percentile(errors, 0.5),
            "percent_error_p99": percentile(errors, 0.99),
            "percent_error_max": max(errors, default=None),
            "progress_freshness_p50_s": percentile(fresh, 0.5),
            "progress_freshness_p99_s": percentile(fresh, 0.99),
            "values_never_shown": never, "longest_wait_s": longest}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.write_order_sim",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=20.0, help="writes per second")
    parser.add_argument("--seconds", type=int, default=900)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--report", metavar="STEM",
                        help="also write STEM.md and STEM.json")
    args = parser.parse_args(argv)
    for name, value, low in (("--jobs", args.jobs, 1), ("--rate", args.rate, 0.001),
                             ("--seconds", args.seconds, 1), ("--seeds", args.seeds, 1)):
        if not low <= value < math.inf:
            parser.error(f"{name}={value}: must be at least {low:g} and finite")
    rows = []
    lines = [f"N={args.jobs}, {args.rate:g} writes/s (round-robin turn "
             f"{args.jobs / args.rate:g} s), {args.seconds} s, seeds 0..{args.seeds - 1} "
             "(each figure: its worst over the seeds)", "",
             "| mix | order | error p50 / p99 / max (points) | freshness p50 / p99 (s) |"
             " longest wait (s) |", "|---|---|---|---|---|"]
    print("\n".join(lines))
    for mix in ("uniform", "mixed", "spread"):
        for name, (point, lead) in ORDERS.items():
            runs = [simulate(args.jobs, args.rate, args.seconds,
                             periods(mix, args.jobs, seed), point, lead, seed)
                    for seed in range(args.seeds)]
            worst = {k: max((r[k] for r in runs if r[k] is not None), default=None)
                     for k in runs[0]}
            rows.append({"mix": mix, "order": name, "point_seconds": point,
                         "max_lead_seconds": lead, **worst})
            # n/a: nothing sampled (a run no longer than one round-robin turn)
            lines.append(f"| {mix} | {name} | {fmt(worst['percent_error_p50'], 'd')} / "
                         f"{fmt(worst['percent_error_p99'], 'd')} / "
                         f"{fmt(worst['percent_error_max'], 'd')} | "
                         f"{fmt(worst['progress_freshness_p50_s'])} / "
                         f"{fmt(worst['progress_freshness_p99_s'])} | "
                         f"{fmt(worst['longest_wait_s'])} |")
            print(lines[-1])
    if args.report:
        commit = source_commit()
        with open(f"{args.report}.json", "w", encoding="utf-8") as out:
            json.dump({"commit": commit, "jobs": args.jobs, "rate": args.rate,
                       "seconds": args.seconds, "seeds": args.seeds, "rows": rows},
                      out, indent=1)
        with open(f"{args.report}.md", "w", encoding="utf-8") as out:
            out.write("# Write order under a saturated budget (simulated clock)\n\n"
                      f"Commit {commit}; `python -m benchmarks.write_order_sim "
                      f"--jobs {args.jobs} --rate {args.rate:g} --seconds {args.seconds} "
                      f"--seeds {args.seeds}`; load {loadavg()} (the figures do not depend "
                      "on it: the clock is simulated).  Measures in the module doc of "
                      "`benchmarks/write_order_sim.py`.\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
