"""The leader's pass that keeps each TrainJob's Workload priority boost current.

Every :data:`CHECK_SECONDS`, on the leader once pods and TrainJobs were listed: list the
Workloads owned by TrainJobs (one request per watched scope), and for each TrainJob
whose target pod has answered with a status (a progress signal), compute the work at
risk and its boost (:mod:`scraper.boost.rule`) and write the annotation when it differs
from what the Workload holds.  What it never does:

* boost a TrainJob without a progress signal (no target, or no status yet): its
  Workload is not touched, so its preemption order is Kueue's own;
* keep a boost on a Workload that is not admitted now (pending, or evicted by a
  preemption: nothing of it runs, nothing is at risk): it is set back to 0, so a
  preempted job waits in the queue at its own priority;
* reset a boost: a new leader (or a restarted scraper) writes nothing until its own
  scrape of the training answered, and then computes the same value from the same
  facts (the checkpoint time the exporter serves, the Workload's admission time), so
  the boost carries over a restart or a leader change unchanged.

Writes run in background tasks, at most one per Workload at a time, on their own token
bucket (:data:`BOOST_QPS`, :data:`BOOST_BURST`), never the status writes' budget.  The
boost moves one step per doubling of the work at risk, so a TrainJob costs at most
``max_boost`` writes between two checkpoints, plus one when it saves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from aiolimiter import AsyncLimiter
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter_lib.status import TrainerStatus
from scraper.boost.rule import boost_for, check_range, work_at_risk
from scraper.boost.workload import PRIORITY_BOOST_ANNOTATION, WorkloadView

log = logging.getLogger(__name__)

#: How often the boosts are recomputed (seconds).
CHECK_SECONDS = 15.0
#: Boost writes' own budget (per second, burst).
BOOST_QPS = 2.0
BOOST_BURST = 5
#: A failed list or write is tried again after this long (seconds).
RETRY_SECONDS = 30.0

TrainJobKey = tuple[str, str]


class Signal(Protocol):
    """A TrainJob's progress signal: its scraped target (:class:`scraper.stall.watch.Observed`)."""

    @property
    def trainjob(self) -> TrainJobKey: ...
    @property
    def trainjob_uid(self) -> str: ...
    @property
    def status(self) -> TrainerStatus | None: ...


@dataclass(frozen=True)
class Decision:
    """One TrainJob's boost as last computed: its Workload, the work at risk
    (resource-seconds), the boost, and the resource it is counted in."""

    workload: str
    work: float
    boost: int
    unit: str


ListWorkloads = Callable[[], Awaitable[list[WorkloadView]]]
#: Writes the boost of Workload ``(namespace, name, uid, value)``; raises on failure.
WriteBoost = Callable[[str, str, str, int], Awaitable[None]]


class BoostWatch:
    """Keeps the priority boost of every signalling TrainJob's Workload current.

    Args:
        max_boost: the rule's range (the app builds no watch for 0).

    Raises:
        BoostRangeError: ``max_boost`` outside ``0..MAX_BOOST_LIMIT``.
        signals: the scraped target of every TrainJob now.
        uid_of: a TrainJob's UID from the informer's store (for a target whose owner
            chain did not name it), or None.
        list_workloads, write_boost: the API calls (:mod:`scraper.boost.workload`).
        leading, ready: as for the stall watch.
        spawn: runs a background coroutine.
        wall: epoch seconds (injectable for tests).
    """

    def __init__(self, *, max_boost: int, signals: Callable[[], Iterable[Signal]],
                 uid_of: Callable[[str, str], str | None], list_workloads: ListWorkloads,
                 write_boost: WriteBoost, leading: Callable[[], bool],
                 ready: Callable[[], bool],
                 spawn: Callable[[Coroutine[Any, Any, None]], object],
                 wall: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_boost = check_range(max_boost)
        self._signals = signals
        self._uid_of = uid_of
        self._list = list_workloads
        self._write = write_boost
        self._leading = leading
        self._ready = ready
        self._spawn = spawn
        self._wall = wall
        self._clock = clock
        self.decisions: dict[TrainJobKey, Decision] = {}
        self._busy: set[str] = set()  # Workload UIDs with a write in flight
        self._failed: dict[str, float] = {}  # Workload UID -> retry not before (monotonic)
        self._limiter = AsyncLimiter(BOOST_BURST, BOOST_BURST / BOOST_QPS)
        self._list_failed_until = float("-inf")
        self._forbidden_logged = False

    async def run(self) -> None:
        """Recompute every :data:`CHECK_SECONDS` until cancelled (a root task)."""
        while True:
            await asyncio.sleep(CHECK_SECONDS)
            try:
                await self.check()
            except Exception:  # a bug must not end the boost silently
                log.exception("priority boost pass failed")

    def sizes(self) -> dict[str, int]:
        """Entries of each map kept per TrainJob or Workload."""
        return {"decisions": len(self.decisions), "busy": len(self._busy),
                "failed": len(self._failed)}

    async def check(self) -> None:
        """One pass: list the Workloads, decide, start the writes that are due."""
        if not self._leading():
            self.decisions.clear()
            return
        if not self._ready() or self._clock() < self._list_failed_until:
            return
        try:
            workloads = await self._list()
        except Exception as exc:
            self._list_failed_until = self._clock() + RETRY_SECONDS
            self._log_failure("list Workloads", exc)
            return
        self.apply(workloads)

    def apply(self, workloads: Iterable[WorkloadView]) -> None:
        """Decide every signalling TrainJob's boost from ``workloads`` and start the
        writes that are due (what :meth:`check` does once it has listed them)."""
        by_owner = {w.owner_uid: w for w in workloads}
        now, mono = self._wall(), self._clock()
        decisions: dict[TrainJobKey, Decision] = {}
        for signal in self._signals():
            status = signal.status
            if status is None:
                continue  # no progress signal: no boost
            uid = signal.trainjob_uid or self._uid_of(*signal.trainjob) or ""
            workload = by_owner.get(uid) if uid else None
            if workload is None or workload.admitted_at is None or workload.resources is None:
                continue
            checkpoint = (None if status.last_checkpoint_time is None
                          else status.last_checkpoint_time.timestamp())
            work = work_at_risk(now, started=workload.admitted_at, checkpoint=checkpoint,
                                resources=workload.resources)
            boost = boost_for(work, self.max_boost)
            decisions[signal.trainjob] = Decision(workload.name, work, boost,
                                                  workload.resources.unit_name)
            if (workload.boost or "0") == str(boost) or workload.uid in self._busy:
                continue
            if mono < self._failed.get(workload.uid, float("-inf")):
                continue
            self._busy.add(workload.uid)
            self._spawn(self._write_one(f"TrainJob {signal.trainjob[0]}/{signal.trainjob[1]}",
                                        workload, boost, work))
        for workload in by_owner.values():
            if (workload.admitted_at is None and workload.boost not in (None, "0")
                    and workload.uid not in self._busy
                    and mono >= self._failed.get(workload.uid, float("-inf"))):
                self._busy.add(workload.uid)
                self._spawn(self._write_one("not admitted", workload, 0, 0.0))
        self.decisions = decisions
        live = {w.uid for w in by_owner.values()}
        for uid in [u for u in self._failed if u not in live]:
            del self._failed[uid]

    async def _write_one(self, why: str, workload: WorkloadView, boost: int,
                         work: float) -> None:
        try:
            async with self._limiter:
                await self._write(workload.namespace, workload.name, workload.uid, boost)
            self._failed.pop(workload.uid, None)
            log.info("Workload %s/%s (%s): %s set to %d (%.0f resource-seconds at risk)",
                     workload.namespace, workload.name, why, PRIORITY_BOOST_ANNOTATION, boost,
                     work)
        except Exception as exc:
            self._failed[workload.uid] = self._clock() + RETRY_SECONDS
            self._log_failure(f"set the priority boost of Workload {workload.namespace}/"
                              f"{workload.name}", exc)
        finally:
            self._busy.discard(workload.uid)

    def _log_failure(self, what: str, exc: Exception) -> None:
        status = getattr(exc, "status", None)
        if status == 403 and self._forbidden_logged:
            return
        self._forbidden_logged = self._forbidden_logged or status == 403
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log.warning("could not %s: %s%s", what, text,
                    " (needs list and patch on workloads.kueue.x-k8s.io: the chart's "
                    "config.priorityBoost.max)" if status == 403 else "")


class BoostCollector(Collector):
    """Per-TrainJob gauges of the boost (nothing on a standby, or with the boost off).

    * ``trainjob_work_at_risk_resource_seconds{namespace,trainjob,resource}``: the work a
      preemption would throw away now, in accelerator- or CPU-seconds;
    * ``trainjob_priority_boost{namespace,trainjob}``: the boost it maps to.
    """

    def __init__(self, watch: BoostWatch) -> None:
        self._watch = watch

    def collect(self) -> Iterable[Metric]:
        work = GaugeMetricFamily(
            "trainjob_work_at_risk_resource_seconds", "Work a preemption would throw away "
            "now: seconds since the last checkpoint (or admission) x accelerators (else "
            "CPUs)", labels=["namespace", "trainjob", "resource"])
        boost = GaugeMetricFamily(
            "trainjob_priority_boost", "The kueue.x-k8s.io/priority-boost the scraper "
            "computes for the TrainJob's Workload", labels=["namespace", "trainjob"])
        for key, decision in list(self._watch.decisions.items()):
            work.add_metric([key[0], key[1], decision.unit], decision.work)
            boost.add_metric([key[0], key[1]], decision.boost)
        yield from (work, boost)
