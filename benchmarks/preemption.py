"""Work lost to preemption with and without the scraper's priority boost (simulated).

    python -m benchmarks.preemption [--seeds 7] [--max-boost 10] [--out benchmarks/reports]

A mixed workload on one ClusterQueue of :data:`CAPACITY` accelerators: :data:`LOW_JOBS`
low-priority TrainJobs (1-8 accelerators, each with its own checkpoint period drawn
from 10-120 min; :data:`SILENT_FRACTION` of them report no progress, so they never get a
boost) run for :data:`HORIZON` seconds, while high-priority TrainJobs (8-24 accelerators,
10-40 min) arrive at random (a Poisson process, one per 20 min on average) and preempt.
Both arms of a seed draw the same jobs, periods, phases and arrivals; they differ only
in the boost.  That is the headline shape; :data:`SHAPES` also runs arrivals of 2-8
accelerators and workloads where every job reports progress, and two references bound
what any victim order could gain (:class:`OptimumSim`).

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
        self.evict(targets, now)

    def evict(self, victims: list[Job], now: float) -> None:
        """Preempt ``victims`` at ``now``: each loses its work at risk and queues again."""
        for job in victims:
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


@dataclass(frozen=True)
class Shape:
    """A workload's shape: the accelerators a high-priority arrival asks for (one drawn
    at random per arrival) and the share of low-priority TrainJobs that report no
    progress (they never get a boost)."""

    name: str
    arrival_accelerators: tuple[int, ...]
    silent_fraction: float


#: The headline shape first (``work_lost_reduction_median``), then the others reported.
SHAPES = (Shape("large arrivals, 20 % silent", (8, 16, 24), SILENT_FRACTION),
          Shape("large arrivals, none silent", (8, 16, 24), 0.0),
          Shape("small arrivals, 20 % silent", (2, 4, 8), SILENT_FRACTION),
          Shape("small arrivals, none silent", (2, 4, 8), 0.0))


def workload(seed: int, shape: Shape = SHAPES[0]) -> tuple[list[Job], list[Job]]:
    """The low-priority jobs and the high-priority arrivals of ``seed``."""
    rng = random.Random(seed)
    low = []
    for uid in range(LOW_JOBS):
        period = rng.uniform(10, 120) * 60
        low.append(Job(uid=uid, accelerators=rng.choice([1, 2, 2, 4, 4, 8]),
                       priority=LOW_PRIORITY, created=uid * 0.001, period=period,
                       phase=rng.uniform(0, period),
                       silent=rng.random() < shape.silent_fraction))
    arrivals, now, uid = [], 0.0, LOW_JOBS
    while True:
        now += rng.expovariate(1 / ARRIVAL_MEAN_SECONDS)
        if now >= HORIZON:
            break
        arrivals.append(Job(uid=uid, accelerators=rng.choice(shape.arrival_accelerators),
                            priority=HIGH_PRIORITY, created=now,
                            duration=rng.uniform(10, 40) * 60))
        uid += 1
    return low, arrivals


class OptimumSim(Sim):
    """A reference, not Kueue: each preemption takes the set of lower-priority jobs that
    frees room for the arrival with the least work lost (a 0/1 knapsack over the
    candidates, exact), knowing every job's work at risk; ``blind`` treats the jobs that
    report no progress as having none (what any rule fed by progress could know)."""

    blind = False

    def preempt_for(self, arrival: Job, now: float) -> None:
        candidates = [j for j in self.running if j.priority < arrival.priority]
        need = arrival.accelerators - self.free()
        if sum(j.accelerators for j in candidates) < need:
            return
        # freed accelerators (capped at need) -> (work lost, accelerators taken, victims):
        # among sets that lose as little, the one that takes the fewest accelerators
        best: dict[int, tuple[float, int, list[Job]]] = {0: (0.0, 0, [])}
        for job in candidates:
            risk = 0.0 if self.blind and job.silent else job.at_risk(now)
            for freed, (lost, taken, victims) in list(best.items()):
                after = min(need, freed + job.accelerators)
                option = (lost + risk, taken + job.accelerators, [*victims, job])
                if after not in best or best[after][:2] > option[:2]:
                    best[after] = option
        self.evict(best[need][2], now)


class BlindOptimumSim(OptimumSim):
    """:class:`OptimumSim` that sees no work at risk in silent jobs."""

    blind = True


def arm(seed: int, boost_of: Callable[[float], int], shape: Shape = SHAPES[0],
        sim: type[Sim] = Sim) -> dict[str, Any]:
    low, arrivals = workload(seed, shape)
    run_ = sim(low, arrivals, boost_of)
    run_.run()
    return {"accelerator_seconds_lost": sum(j.lost for j in low),
            "lost_by_silent_jobs": sum(j.lost for j in low if j.silent),
            "preemptions": run_.preemptions, "arrivals": len(arrivals)}


def _cut(before: float, after: dict[str, Any]) -> float:
    return (before - after["accelerator_seconds_lost"]) / before if before else 0.0


def run_shape(seeds: int, max_boost: int, shape: Shape) -> dict[str, Any]:
    """Every seed of ``shape``: Kueue alone, with the boost, and the two optimum
    references (:class:`OptimumSim`)."""
    per_seed: list[dict[str, Any]] = []
    for seed in range(seeds):
        without = arm(seed, lambda work: 0, shape)
        with_boost = arm(seed, lambda work: boost_for(work, max_boost), shape)
        optimum = arm(seed, lambda work: 0, shape, OptimumSim)
        blind = arm(seed, lambda work: 0, shape, BlindOptimumSim)
        before = without["accelerator_seconds_lost"]
        per_seed.append({"seed": seed, "without_boost": without, "with_boost": with_boost,
                         "reduction": _cut(before, with_boost), "optimum": optimum,
                         "optimum_reduction": _cut(before, optimum),
                         "optimum_blind_reduction": _cut(before, blind)})
    return {"shape": shape.name, "arrival_accelerators": list(shape.arrival_accelerators),
            "silent_fraction": shape.silent_fraction, "per_seed": per_seed,
            "work_lost_reduction_median": statistics.median(s["reduction"] for s in per_seed),
            "work_lost_median_without": statistics.median(
                s["without_boost"]["accelerator_seconds_lost"] for s in per_seed),
            "work_lost_median_with": statistics.median(
                s["with_boost"]["accelerator_seconds_lost"] for s in per_seed),
            "optimum_reduction_median": statistics.median(
                s["optimum_reduction"] for s in per_seed),
            "optimum_blind_reduction_median": statistics.median(
                s["optimum_blind_reduction"] for s in per_seed)}


def run(seeds: int, max_boost: int, shapes_run: tuple[Shape, ...] = SHAPES) -> dict[str, Any]:
    """Every shape of ``shapes_run`` (the first is the headline); the JSON's content."""
    started = time.monotonic()
    shapes = [run_shape(seeds, max_boost, shape) for shape in shapes_run]
    head = shapes[0]
    return {
        "benchmark": "preemption", "simulated": True, "started": started,
        "settings": {"capacity_accelerators": CAPACITY, "low_jobs": LOW_JOBS,
                     "silent_fraction": SILENT_FRACTION, "horizon_seconds": HORIZON,
                     "pass_seconds": PASS_SECONDS, "arrival_mean_seconds": ARRIVAL_MEAN_SECONDS,
                     "checkpoint_period_minutes": [10, 120],
                     "high_accelerators": list(shapes_run[0].arrival_accelerators),
                     "high_minutes": [10, 40], "max_boost": max_boost, "seeds": seeds},
        "per_seed": head["per_seed"],
        "work_lost_reduction_median": head["work_lost_reduction_median"],
        "work_lost_median_without": head["work_lost_median_without"],
        "work_lost_median_with": head["work_lost_median_with"],
        "optimum_reduction_median": head["optimum_reduction_median"],
        "target_met": head["work_lost_reduction_median"] >= 0.5,
        "shapes": shapes,
        "loadavg_start": loadavg(),
    }


def table(res: dict[str, Any]) -> str:
    s = res["settings"]
    lines = [
        "# Work lost to preemption, with and without the priority boost (simulated)",
        "",
        f"`python -m benchmarks.preemption --seeds {s['seeds']} --max-boost {s['max_boost']}`"
        f" on {time.strftime('%Y-%m-%d')} at commit {res.get('commit', 'unknown')}.  "
        "A simulation: see `benchmarks/preemption.py`'s "
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
        f"Per seed, shape \"{SHAPES[0].name}\" (the headline):",
        "",
        "| seed | arrivals | preemptions without | lost without (acc-h) | preemptions with "
        "| lost with (acc-h) | of which silent jobs (acc-h) | reduction | optimum: "
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
            f"{row['optimum_reduction']:.0%} |")
    lines += [
        "",
        f"Median work lost: {res['work_lost_median_without'] / 3600:.1f} accelerator-hours "
        f"without the boost, {res['work_lost_median_with'] / 3600:.1f} with it (medians "
        "of each arm, not of one seed).  Median of the per-seed reductions "
        "(`work_lost_reduction_median`): "
        f"{res['work_lost_reduction_median']:.0%}; target >= 50 %: "
        f"{'met' if res['target_met'] else 'NOT met'}.",
        "",
        "Every shape (the same seeds; medians over them):",
        "",
        "| shape | lost without (acc-h) | lost with (acc-h) | reduction with the boost | "
        "optimum, blind to silent jobs | optimum |",
        "| --- | --- | --- | --- | --- | --- |",
        *(f"| {sh['shape']} ({', '.join(map(str, sh['arrival_accelerators']))} "
          f"accelerators per arrival) | {sh['work_lost_median_without'] / 3600:.1f} | "
          f"{sh['work_lost_median_with'] / 3600:.1f} | "
          f"{sh['work_lost_reduction_median']:.0%} | "
          f"{sh['optimum_blind_reduction_median']:.0%} | "
          f"{sh['optimum_reduction_median']:.0%} |" for sh in res["shapes"]),
        "",
        "References, not rules the scraper has: the *optimum* frees room for each arrival "
        "with the least work lost (an exact knapsack over the candidates, knowing every "
        "job's work at risk, silent ones included); *blind to silent jobs* sees none in the "
        "jobs that report no progress, as any rule fed by progress must.  Each is the "
        "best choice one preemption at a time, not over a run (what a choice leaves "
        "running shapes the next preemption, so a rule can end up ahead of one), and "
        "shows what the workload allows.  Where the "
        "arrivals are large, each takes several jobs whatever their order, and Kueue "
        "alone already takes the most recently admitted (least work done) first, so even "
        "the optimum stays far from halving the loss; where some jobs report no progress, "
        "they are the first victims of any rule that boosts only the others.",
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
    if args.out.exists() and not args.out.is_dir():
        print(f"--out={args.out}: the report cannot be written there (not a directory)",
              file=sys.stderr)
        return 2
    res = run(args.seeds, args.max_boost)
    try:
        write_report(res, args.out, "preemption", table, res.pop("started"))
    except OSError as exc:
        print(f"--out={args.out}: the report cannot be written there ({exc.strerror or exc})",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
