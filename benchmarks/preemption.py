"""Work lost to preemption with and without the scraper's priority boost (simulated).

    python -m benchmarks.preemption [--seeds 7] [--max-boost 10] [--out benchmarks/reports]

A mixed workload on one ClusterQueue of :data:`CAPACITY` accelerators: :data:`LOW_JOBS`
low-priority TrainJobs (1-8 accelerators, each with its own checkpoint period drawn
from 10-120 min; :data:`SILENT_FRACTION` of them report no progress, so they never get a
boost) run for :data:`HORIZON` seconds, while high-priority TrainJobs (8-24 accelerators,
10-40 min) arrive at random (a Poisson process, one per 20 min on average) and preempt.
Both arms of a seed draw the same jobs, periods, phases and arrivals; they differ only
in the boost.

What is simulated, and from where:

* victim choice, as Kueue v0.17.0 does within a ClusterQueue (``withinClusterQueue:
  LowerPriority``): candidates of lower effective priority than the arrival, ordered by
  effective priority (priority + ``kueue.x-k8s.io/priority-boost``), then the most
  recently admitted first, then UID (``pkg/scheduler/preemption/common/ordering.go``,
  ``CandidatesOrdering``); taken in that order until the arrival fits, then those not
  needed are given back in reverse order (``pkg/scheduler/preemption/preemption.go``,
  ``fillBackWorkloads``); effective priority from ``pkg/util/priority/priority.go``;
* admission: pending TrainJobs by effective priority, then creation, each one that fits
  (BestEffortFIFO); a preempted TrainJob queues again and restarts from its last
  checkpoint; a Workload not admitted has no boost (the scraper sets it to 0);
* the boost: the scraper's own rule (:mod:`scraper.boost.rule`), computed every
  :data:`PASS_SECONDS` (its pass interval) and used by Kueue one pass late;
* work lost: at a preemption, the seconds since the TrainJob's last checkpoint of its
  current run (or since the run began) times its accelerators.

What is not: no API server, controllers or pods (the real path is
``tests/e2e/test_kueue_boost.py``); Kueue's cohorts, borrowing, fair sharing, partial
admission and topology; the time an eviction, a re-admission or a restore takes; write
latency of the annotation (beyond the one pass); jobs that end.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.report import loadavg, write_report
from scraper.boost.rule import Resources, boost_for, work_at_risk

CAPACITY = 64
LOW_JOBS = 36
SILENT_FRACTION = 0.2
HORIZON = 12 * 3600.0
PASS_SECONDS = 15.0
LOW_PRIORITY, HIGH_PRIORITY = 100, 1000
ARRIVAL_MEAN_SECONDS = 20 * 60.0
DEFAULT_SEEDS = 7
DEFAULT_MAX_BOOST = 10
REPORTS = Path(__file__).resolve().parent / "reports"


@dataclass
class Job:
    """One TrainJob of the simulation."""

    uid: int
    accelerators: int
    priority: int
    created: float
    period: float = math.inf  # checkpoint period (s); inf: never saves
    phase: float = 0.0  # first save of the first run after this long
    silent: bool = False  # reports no progress: no boost
    duration: float = math.inf  # high-priority jobs end after this long
    admitted: float | None = None  # start of the current run
    runs: int = 0
    boost: int = 0  # the Workload annotation Kueue sees
    lost: float = 0.0  # accelerator-seconds lost to preemptions
    preempted: int = 0

    def last_save(self, now: float) -> float | None:
        """The last checkpoint of the current run at ``now`` (None: none yet)."""
        assert self.admitted is not None
        first = self.admitted + (self.phase if self.runs == 1 else self.period)
        if now < first:
            return None
        return first + math.floor((now - first) / self.period) * self.period

    def at_risk(self, now: float) -> float:
        assert self.admitted is not None
        return work_at_risk(now, started=self.admitted, checkpoint=self.last_save(now),
                            resources=Resources(accelerators=self.accelerators, cpus=0.0))

    def effective(self) -> int:
        return self.priority + self.boost


@dataclass
class Sim:
    """One arm of one seed."""

    low: list[Job]
    arrivals: list[Job]
    boost_of: Callable[[float], int]  # work at risk (acc-s) -> boost
    running: list[Job] = field(default_factory=list)
    pending: list[Job] = field(default_factory=list)
    preemptions: int = 0

    def free(self) -> int:
        return CAPACITY - sum(j.accelerators for j in self.running)

    def run(self) -> None:
        self.pending = sorted(self.low, key=lambda j: j.created)
        arrivals = sorted(self.arrivals, key=lambda j: j.created)
        steps = int(HORIZON / PASS_SECONDS)
        for step in range(steps + 1):
            now = step * PASS_SECONDS
            for job in [j for j in self.running if now - (j.admitted or 0) >= j.duration]:
                self.running.remove(job)  # a high-priority job ends
            while arrivals and arrivals[0].created <= now:
                job = arrivals.pop(0)
                self.pending.append(job)
                if job.accelerators > self.free():
                    self.preempt_for(job, now)
            self.admit(now)
            self.boost_pass(now)  # Kueue sees these from the next step on

    def boost_pass(self, now: float) -> None:
        for job in self.running:
            if job.priority == LOW_PRIORITY:
                job.boost = 0 if job.silent else self.boost_of(job.at_risk(now))

    def preempt_for(self, arrival: Job, now: float) -> None:
        candidates = [j for j in self.running if j.effective() < arrival.effective()]
        candidates.sort(key=lambda j: (j.effective(), -(j.admitted or 0.0), j.uid))
        free, targets = self.free(), []
        for job in candidates:
            targets.append(job)
            free += job.accelerators
            if free >= arrival.accelerators:
                break
        else:
            return  # cannot fit even with every candidate gone: it waits
        for job in reversed(targets[:-1]):  # fillBackWorkloads
            if free - job.accelerators >= arrival.accelerators:
                free -= job.accelerators
                targets.remove(job)
        for job in targets:
            job.lost += job.at_risk(now)
            job.preempted += 1
            job.admitted, job.boost = None, 0
            self.running.remove(job)
            self.pending.append(job)
            self.preemptions += 1

    def admit(self, now: float) -> None:
        for job in sorted(self.pending, key=lambda j: (-j.effective(), j.created, j.uid)):
            if job.accelerators <= self.free():
                self.pending.remove(job)
                job.admitted, job.runs = now, job.runs + 1
                self.running.append(job)


def workload(seed: int) -> tuple[list[Job], list[Job]]:
    """The low-priority jobs and the high-priority arrivals of ``seed``."""
    rng = random.Random(seed)
    low = []
    for uid in range(LOW_JOBS):
        period = rng.uniform(10, 120) * 60
        low.append(Job(uid=uid, accelerators=rng.choice([1, 2, 2, 4, 4, 8]),
                       priority=LOW_PRIORITY, created=uid * 0.001, period=period,
                       phase=rng.uniform(0, period), silent=rng.random() < SILENT_FRACTION))
    arrivals, now, uid = [], 0.0, LOW_JOBS
    while True:
        now += rng.expovariate(1 / ARRIVAL_MEAN_SECONDS)
        if now >= HORIZON:
            break
        arrivals.append(Job(uid=uid, accelerators=rng.choice([8, 16, 24]),
                            priority=HIGH_PRIORITY, created=now,
                            duration=rng.uniform(10, 40) * 60))
        uid += 1
    return low, arrivals


#: The finest ordering by work at risk that stays below the priority classes' gap
#: (HIGH - LOW - 1 levels): a reference for what any boost rule could reach here, not
#: a rule the scraper has.
FINEST_LEVELS = HIGH_PRIORITY - LOW_PRIORITY - 1
FINEST_SCALE = 36000.0  # acc-s at which it reaches half its range


def finest(work: float) -> int:
    """A near-exact rank of ``work`` in ``0..FINEST_LEVELS`` (see :data:`FINEST_LEVELS`)."""
    return int(FINEST_LEVELS * work / (work + FINEST_SCALE)) if work > 0 else 0


def arm(seed: int, boost_of: Callable[[float], int]) -> dict[str, Any]:
    low, arrivals = workload(seed)
    sim = Sim(low, arrivals, boost_of)
    sim.run()
    return {"accelerator_seconds_lost": sum(j.lost for j in low),
            "lost_by_silent_jobs": sum(j.lost for j in low if j.silent),
            "preemptions": sim.preemptions, "arrivals": len(arrivals)}


def run(seeds: int, max_boost: int) -> dict[str, Any]:
    started = time.monotonic()
    per_seed = []
    for seed in range(seeds):
        without = arm(seed, lambda work: 0)
        with_boost = arm(seed, lambda work: boost_for(work, max_boost))
        best = arm(seed, finest)
        before = without["accelerator_seconds_lost"]

        def cut(after: dict[str, Any], before: float = before) -> float:
            return (before - after["accelerator_seconds_lost"]) / before if before else 0.0

        per_seed.append({"seed": seed, "without_boost": without, "with_boost": with_boost,
                         "reduction": cut(with_boost), "finest_ordering": best,
                         "finest_reduction": cut(best)})
    reductions = [s["reduction"] for s in per_seed]
    return {
        "benchmark": "preemption", "simulated": True, "started": started,
        "settings": {"capacity_accelerators": CAPACITY, "low_jobs": LOW_JOBS,
                     "silent_fraction": SILENT_FRACTION, "horizon_seconds": HORIZON,
                     "pass_seconds": PASS_SECONDS, "arrival_mean_seconds": ARRIVAL_MEAN_SECONDS,
                     "checkpoint_period_minutes": [10, 120], "high_accelerators": [8, 16, 24],
                     "high_minutes": [10, 40], "max_boost": max_boost, "seeds": seeds},
        "per_seed": per_seed,
        "work_lost_reduction_median": statistics.median(reductions),
        "work_lost_median_without": statistics.median(
            s["without_boost"]["accelerator_seconds_lost"] for s in per_seed),
        "work_lost_median_with": statistics.median(
            s["with_boost"]["accelerator_seconds_lost"] for s in per_seed),
        "finest_reduction_median": statistics.median(s["finest_reduction"] for s in per_seed),
        "target_met": statistics.median(reductions) >= 0.5,
        "loadavg_start": loadavg(),
    }


def table(res: dict[str, Any]) -> str:
    s = res["settings"]
    lines = [
        "# Work lost to preemption, with and without the priority boost (simulated)",
        "",
        f"`python -m benchmarks.preemption --seeds {s['seeds']} --max-boost {s['max_boost']}`"
        f" on {time.strftime('%Y-%m-%d')}.  A simulation: see `benchmarks/preemption.py`'s "
        "docstring for what is modelled (Kueue v0.17.0's victim order: effective priority, "
        "then the most recently admitted, `pkg/scheduler/preemption/common/ordering.go`, "
        "and `fillBackWorkloads` in `pkg/scheduler/preemption/preemption.go`) and what is "
        "not (no API server, controllers or pods; no cohorts, borrowing, fair sharing; no "
        "eviction or restore time).  The real path is tested in "
        "`tests/e2e/test_kueue_boost.py`.",
        "",
        f"Settings: one ClusterQueue of {s['capacity_accelerators']} accelerators; "
        f"{s['low_jobs']} low-priority TrainJobs (1-8 accelerators, checkpoint every "
        f"{s['checkpoint_period_minutes'][0]}-{s['checkpoint_period_minutes'][1]} min, "
        f"{s['silent_fraction']:.0%} report no progress and get no boost); high-priority "
        f"arrivals every {s['arrival_mean_seconds'] / 60:.0f} min on average (8, 16 or 24 "
        f"accelerators, {s['high_minutes'][0]}-{s['high_minutes'][1]} min); "
        f"{s['horizon_seconds'] / 3600:.0f} h; boost range {s['max_boost']}, recomputed "
        f"every {s['pass_seconds']:.0f} s and seen by Kueue one pass late.  Both arms of a "
        "seed draw the same jobs and arrivals.",
        "",
        "| seed | arrivals | preemptions without | lost without (acc-h) | preemptions with "
        "| lost with (acc-h) | of which silent jobs (acc-h) | reduction | finest ordering: "
        "reduction |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in res["per_seed"]:
        w, b = row["without_boost"], row["with_boost"]
        lines.append(
            f"| {row['seed']} | {w['arrivals']} | {w['preemptions']} | "
            f"{w['accelerator_seconds_lost'] / 3600:.1f} | {b['preemptions']} | "
            f"{b['accelerator_seconds_lost'] / 3600:.1f} | "
            f"{b['lost_by_silent_jobs'] / 3600:.1f} | {row['reduction']:.0%} | "
            f"{row['finest_reduction']:.0%} |")
    lines += [
        "",
        f"Median work lost: {res['work_lost_median_without'] / 3600:.1f} accelerator-hours "
        f"without the boost, {res['work_lost_median_with'] / 3600:.1f} with it.  Median "
        f"reduction over the seeds (`work_lost_reduction_median`): "
        f"{res['work_lost_reduction_median']:.0%}; target >= 50 %: "
        f"{'met' if res['target_met'] else 'NOT met'}.",
        "",
        "Reference, not a rule the scraper has: the *finest ordering* column gives each "
        f"job a boost of `floor({FINEST_LEVELS} x work / (work + {FINEST_SCALE:.0f}))`, an "
        "almost exact ranking by work at risk that stays below the classes' gap (median "
        f"reduction {res['finest_reduction_median']:.0%}).  When it gains no more than "
        "the rule does, the limit is not the rule's resolution (one step per doubling) but "
        "how Kueue frees room: it takes the lowest-priority candidates first until the "
        "arrival fits, so an arrival needing many accelerators takes several jobs "
        "whatever their order, and without the boost it already takes the most recently "
        "admitted (least work done) first.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.preemption")
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS)
    parser.add_argument("--max-boost", type=int, default=DEFAULT_MAX_BOOST)
    parser.add_argument("--out", type=Path, default=REPORTS)
    args = parser.parse_args(argv)
    if args.seeds < 5:
        print(f"--seeds={args.seeds}: at least 5", file=sys.stderr)
        return 2
    if args.max_boost < 1:
        print(f"--max-boost={args.max_boost}: at least 1 (0 is the arm without)",
              file=sys.stderr)
        return 2
    res = run(args.seeds, args.max_boost)
    write_report(res, args.out, "preemption", table, res.pop("started"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
