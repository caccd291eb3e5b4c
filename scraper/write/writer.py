"""Writing ``TrainJob.status.trainerStatus``: a write queue under an API budget,
server-side apply, only on change.  The queue side and the wiring of the write stage.

* :meth:`StatusWriter.apply` never waits for the API: it decides at once whether the
  status is news (:func:`already_stored`, against the TrainJob informer's store,
  :mod:`scraper.shared.trainjobs`) and queues it (:mod:`scraper.write.queue`: one pending
  status per TrainJob, newest wins; finals, then first statuses, then progress, then
  metrics-only changes; aging so none starves).  So a scrape never waits for a write.
* Writing by significance (:mod:`scraper.shared.policy`, per TrainJob through
  ``policy_of``): a change of the integer percentage is due at once, but no sooner
  than the progress floor after the TrainJob's last write; a change of metrics or the
  remaining time alone waits until the staleness bound after the status the TrainJob
  holds was taken (a progress change joining it ends the wait); finals and first
  statuses never wait.
* The writer tasks (:class:`scraper.write.worker.WriteWorker`) take items off the queue
  and apply them: the write budget, server-side apply with the ``resourceVersion``
  precondition, retries with backoff until applied, superseded, the TrainJob gone or
  leadership lost (its module doc).  When an API outage ends every queued retry is due
  at once (:meth:`scraper.write.queue.WriteQueue.resume`, on
  :class:`scraper.kube.health.ApiHealth`'s recovery), so finals land within about a
  second of the API server's return, not when a backoff grown during the outage ends.
* Other writers and time (docs/scraper.md, "Other writers and time";
  :mod:`scraper.decide.others` decides, :class:`scraper.write.deferral.Deferrals` counts
  and logs): while another writer (e.g. upstream's push status server, field manager
  ``trainer-status``) changed the field less than ``--other-writer-grace`` ago, no
  progress write; after that, only a report whose content changed after that write
  replaces it; a final is written unless the other writer wrote after the container
  ended.  The written ``lastUpdatedTime`` never moves back silently
  (:func:`scraper.write.notices.settle_time`: the arrival time instead, a log line,
  ``clock_skew_total`` and a ``ClockSkew`` Event, :mod:`scraper.write.notices`).  The
  decision is made here when a report arrives and again by the writer task right
  before the request, against the informer's newest.
* Drift: a status this scraper applied that somebody removed is applied again; one
  another writer replaced is that writer's (the rule above).
* A CRD without ``status.trainerStatus`` is detected from its schema
  (:class:`scraper.kube.crd.CrdSupport`) or from the apply's answer; either way a
  Warning Event per TrainJob.
* ``--status-target annotation|auto`` writes the same status to the TrainJob's
  annotation instead (:mod:`scraper.write.annotation_target`: the body, the path, where
  the informer's value is read from, and the place of each write); everything
  above holds for it unchanged.  Under ``auto`` a write the CRD prunes is tried again
  at once in the annotation, with no Event (nothing is lost).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Self

from aiolimiter import AsyncLimiter
from kubernetes.client import ApiClient, ApiextensionsV1Api, CoreV1Api, CustomObjectsApi

from exporter_lib.status import TrainerStatus
from scraper.kube.crd import CrdSupport
from scraper.kube.events import EventRecorder
from scraper.shared.outcome import WriteOutcome
from scraper.shared.targets import Target
from scraper.shared.trainjobs import (
    TrainJobGone,
    TrainJobKey,
    TrainJobRecord,
    TrainJobStore,
    older,
)
from scraper.shared.writes import (
    Decision,
    Priority,
    Report,
    Skip,
    Stored,
    Wait,
    WriteVerdict,
    same_content,
)
from scraper.write.annotation_target import Place, StatusTarget, place_for, status_in, writer_in
from scraper.write.deferral import Deferrals
from scraper.write.notices import Notices
from scraper.write.pod_gate import PodGate
from scraper.write.queue import WriteQueue
from scraper.write.rate import AdaptiveRate, WriteBudget, write_limiter
from scraper.write.rules import NO_HOOKS, WriterHooks, WriteRules
from scraper.write.worker import OurWrite, StatusApply, StatusRequest, WriteWorker, writers_for

__all__ = ["StatusWriter", "already_stored"]

log = logging.getLogger(__name__)


def already_stored(current: TrainerStatus | None, new: TrainerStatus) -> bool:
    """True when applying ``new`` would not change what the TrainJob stores
    (:func:`scraper.shared.writes.same_content`; the exporter never unsets a field once
    reported, so ignoring unset fields cannot hide a removal of our own)."""
    return same_content(current, new)


def _unheard(seconds: float, exc: BaseException | None) -> None:
    """A fixed bucket hears nothing of the answers."""


class StatusWriter:
    """Queues statuses for TrainJobs and runs the writer tasks that apply them (module doc).

    Args:
        api_client: a configured Kubernetes client.
        store: the TrainJob informer's store (what each TrainJob stores); the writer
            listens to its changes (:meth:`on_trainjob_change`, the drift check).
        crd: what is known of the TrainJob CRD (shared with the CRD re-check).
        events: where "unsupported CRD" and ``ClockSkew`` Events go.
        limiter: the token bucket of the writes.
        rules: the decision, the policies and where statuses go
            (:class:`scraper.write.rules.WriteRules`).
        hooks: the leader fence, the telemetry, the TrainJob-gone callback and the API's
            health, whose recoveries make the queued retries due (module doc;
            :class:`scraper.write.rules.WriterHooks`).
        clock: monotonic seconds.
        wall: epoch seconds (the arrival time of a report).
        request: the apply request (default :class:`scraper.write.worker.StatusApply`
            over :attr:`writers` connections of its own).
    """

    def __init__(
        self,
        api_client: ApiClient,
        *,
        store: TrainJobStore,
        crd: CrdSupport,
        events: EventRecorder,
        limiter: AsyncLimiter | AdaptiveRate,
        rules: WriteRules,
        hooks: WriterHooks = NO_HOOKS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        request: StatusRequest | None = None,
    ) -> None:
        self.store = store
        self.crd = crd
        self.events = events
        self._may_write = hooks.may_write
        self._counts = counts = hooks.counts
        self._on_gone = hooks.on_gone
        policy = rules.policy
        if rules.other_writer_grace is not None:
            policy = replace(policy, other_writer_grace=rules.other_writer_grace)
        self.policy = policy
        self._policy_of = rules.policy_of or (lambda namespace, name: self.policy)
        self._decide = rules.decide
        self.target = target = rules.target
        self._clock = clock
        self._wall = wall
        self.queue = WriteQueue(clock=clock)
        self._ours: dict[TrainJobKey, OurWrite] = {}
        self._waiters: dict[TrainJobKey, list[asyncio.Future[WriteOutcome]]] = {}
        self._deferrals = Deferrals(store.clock, grace=policy.other_writer_grace,
                                    on_deferred=counts.deferred)
        self._notices = Notices(events, on_skew=counts.skewed, wall=wall)
        self.writers = writers_for(limiter.max_rate / limiter.time_period)
        self._worker = WriteWorker(
            self.queue, store=store, custom=CustomObjectsApi(api_client), crd=crd,
            limiter=limiter,
            request=request or StatusApply(api_client, connections=self.writers),
            decisions=self, notices=self._notices, ours=self._ours,
            place=self.place, target=target, may_write=hooks.may_write, counts=counts,
            on_settled=self._settle, on_gone=self._dropped,
            health=hooks.health, clock=clock, wall=wall,
            gate=(PodGate(hooks.confirm_pod, hooks.on_pod_check)
                  if hooks.confirm_pod is not None else None),
            on_answer=limiter.observe if isinstance(limiter, AdaptiveRate) else _unheard)
        if hooks.health is not None:
            hooks.health.on_recovered(self.queue.resume)
        store.on_changed(self.on_trainjob_change)

    @classmethod
    def for_client(
        cls,
        api_client: ApiClient,
        *,
        identity: str,
        budget: WriteBudget,
        store: TrainJobStore,
        rules: WriteRules,
        hooks: WriterHooks = NO_HOOKS,
        request: StatusRequest | None = None,
    ) -> Self:
        """A writer with its own CRD knowledge and Event recorder; writes take tokens of
        :func:`scraper.write.rate.write_limiter` (``budget``: qps up to qps_max, burst);
        Events have a bucket of their own: they never spend the writes' budget."""
        limiter = write_limiter(budget)
        events = EventRecorder(CoreV1Api(api_client), identity=identity, uid_of=store.uid_of)
        fallback = ("" if rules.target is StatusTarget.STATUS
                    else f"{Place.ANNOTATION.value} (--status-target {rules.target.value})")
        # The writer is built next: the CRD's callback reads it when support returns.
        crd = CrdSupport(ApiextensionsV1Api(api_client), fallback=fallback,
                         on_supported=lambda: writer.supported_again())
        writer = cls(api_client, store=store, crd=crd, events=events, limiter=limiter,
                     rules=rules, hooks=hooks, request=request)
        return writer

    def place(self) -> Place:
        """Where the next write goes (:func:`scraper.write.annotation_target.place_for`)."""
        return place_for(self.target, self.crd.supported)

    def supported_again(self) -> None:
        """The CRD stores trainerStatus again: announce a later loss anew."""
        self._notices.supported_again()

    def sizes(self) -> dict[str, int]:
        """Entries of each map kept per TrainJob, the queue's included (``queue.*``)."""
        return {"ours": len(self._ours), "waiters": len(self._waiters),
                **self._deferrals.sizes(), **self._notices.sizes(), **self._worker.sizes(),
                **{f"queue.{k}": v for k, v in self.queue.sizes().items()}}

    def forget(self, namespace: str, name: str) -> None:
        """Drop what is kept and queued for a TrainJob (it is gone)."""
        key = (namespace, name)
        self.queue.forget(key)
        self._ours.pop(key, None)
        self._notices.forget(key)
        self._worker.forget(key)
        self._deferrals.forget(key)

    def stop_leading(self) -> None:
        """Drop every queued write: the next leader re-derives them from the pods."""
        self.queue.clear()
        self._ours.clear()

    # ------------------------------------------------------------ the queue side

    async def apply(self, namespace: str, name: str, status: TrainerStatus, *,
                    final: bool = False, uid: str = "", seen: float | None = None,
                    finished_at: float | None = None,
                    confirm: Target | None = None) -> WriteOutcome:
        """Queue ``status`` for the TrainJob unless it already holds the same report or
        the rule for other writers keeps what it holds (:func:`decision`).

        Returns at once: :attr:`WriteOutcome.UNCHANGED` (nothing to write),
        :attr:`WriteOutcome.DEFERRED` (another writer's status is kept),
        :attr:`WriteOutcome.QUEUED`, or :attr:`WriteOutcome.NOT_STORED`.

        Args:
            final: a final status (first in the queue, kept until applied).
            uid: the TrainJob UID the status is meant for (``""``: the one that exists).
            seen: when this content was first seen (the store's monotonic clock); None:
                now for a final or a caller that knows no order (tools, push-compat),
                ``-inf`` is "unknown, maybe old" (:class:`scraper.shared.writes.Report`).
            finished_at: a final's container end (``state.terminated.finishedAt``, epoch
                seconds), None when unknown.
            confirm: the target whose answer stated no pod: its pod is read right before
                the status is sent, and the status is not sent unless it is still the
                target's (:mod:`scraper.discovery.pod_confirm`).  None: no read.

        Raises:
            TrainJobGone: the informer knows the TrainJob with another UID (re-created):
                the caller drops the target.  A TrainJob the informer has not seen (yet:
                the pod watch may be ahead of the TrainJob watch) is queued; the writer
                reads it once and calls ``on_gone`` when it does not exist.
        """
        key = (namespace, name)
        record = self.store.get(namespace, name)
        if record is not None and uid and record.uid != uid:
            raise TrainJobGone(f"{namespace}/{name} (UID {record.uid}, not {uid})")
        place = self.place()
        report = Report(status, self.store.clock() if seen is None else seen, final,
                        finished_at)
        decision = self.decision(key, record, place, report,
                                 queued=self.queue.pending(key) is not None)
        if isinstance(decision, Skip):
            outcome = (WriteOutcome.UNCHANGED if decision.reason is WriteVerdict.UNCHANGED
                       else WriteOutcome.DEFERRED)
            self._counts.written(outcome)
            return outcome
        if (place is Place.STATUS and self.crd.supported is False
                and not self.crd.recheck_due()):
            await self._notices.unsupported(namespace, name, record.uid if record else "")
            self._counts.written(WriteOutcome.NOT_STORED)
            return WriteOutcome.NOT_STORED
        self.queue.put(key, status, decision.priority,
                       uid=uid or (record.uid if record else ""),
                       metrics_due=decision.until if isinstance(decision, Wait) else 0.0,
                       seen=report.seen, finished_at=finished_at, arrived=self._wall(),
                       gap=decision.floor, shown=status_in(record, place),
                       confirm=confirm)
        return WriteOutcome.QUEUED

    def decision(self, key: TrainJobKey, record: TrainJobRecord | None, place: Place,
                 report: Report, *, queued: bool = False) -> Decision:
        """The decision (:func:`scraper.decide.decision.decide`) for ``report`` against
        what ``record`` holds at ``place``: the one place it is asked, when a report
        arrives (:meth:`apply`) and right before its write is sent (the writer tasks).
        A report kept out by another writer is counted and logged here."""
        ours = self._ours.get(key)
        stored = Stored(status_in(record, place), writer_in(record, place),
                        None if ours is None else ours.fresh_at, queued)
        decision = self._decide(stored, report, self._policy_of(*key), self.store.clock())
        if record is not None:
            self._deferrals.told(key, decision, stored.writer, place)
        return decision

    async def apply_and_wait(self, namespace: str, name: str, status: TrainerStatus, *,
                             final: bool = False) -> WriteOutcome:
        """:meth:`apply`, then wait until the queue has settled that TrainJob's write.

        For tools and tests; the scrape loop never waits.  Returns the outcome of the
        write that took the status off the queue (never :attr:`WriteOutcome.RETRIED`).

        Raises:
            TrainJobGone: the TrainJob does not exist (or was re-created meanwhile).
        """
        outcome = await self.apply(namespace, name, status, final=final)
        if outcome is not WriteOutcome.QUEUED:
            return outcome
        future: asyncio.Future[WriteOutcome] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault((namespace, name), []).append(future)
        return await future

    def _settle(self, key: TrainJobKey, outcome: WriteOutcome | BaseException) -> None:
        if self.queue.pending(key) is not None and not isinstance(outcome, BaseException):
            return  # a newer status is queued: its write settles the waiters
        for future in self._waiters.pop(key, []):
            if future.done():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _dropped(self, namespace: str, name: str) -> None:
        """A write found the TrainJob gone: forget it, fail its waiters, tell ``on_gone``."""
        self.forget(namespace, name)
        self._settle((namespace, name), TrainJobGone(f"{namespace}/{name}"))
        self._on_gone(namespace, name)

    def on_trainjob_change(self, namespace: str, name: str, record: TrainJobRecord) -> None:
        """The informer saw the TrainJob change: restore our status if another writer
        replaced it with an older one or removed it (module doc, Drift)."""
        key = (namespace, name)
        ours = self._ours.get(key)
        if ours is None or ours.uid != record.uid or not self._may_write():
            return
        if ours.place is not self.place():
            return  # --status-target auto switched places: the old one is not ours to keep
        there = status_in(record, ours.place)
        if there is not None and already_stored(there, ours.status):
            return
        if older(record.resource_version, ours.resource_version):
            return
        if self.queue.pending(key) is not None or self.queue.in_progress(key):
            # A status of ours is on its way (the watch may show a write's result before
            # its answer is back): that write decides.
            return
        if there is not None:
            # Another writer's status: the rule decides our next write (decide.others).
            writer = writer_in(record, ours.place)
            log.info("TrainJob %s/%s: %s changed by %s; the rule for other writers "
                     "decides the next write", namespace, name, ours.place.value,
                     f"field manager {writer.manager}" if writer else "another writer")
            del self._ours[key]
            return
        log.info("TrainJob %s/%s: %s was removed by another writer; restoring ours",
                 namespace, name, ours.place.value)
        self.queue.put(key, ours.status, Priority.PROGRESS, uid=ours.uid,
                       seen=self.store.clock(), arrived=self._wall())

    # ------------------------------------------------------------ the writer tasks

    def start(self, workers: int | None = None) -> None:
        """Start ``workers`` writer tasks (default :attr:`writers`) on the running loop
        (:meth:`scraper.write.worker.WriteWorker.start`)."""
        self._worker.start(self.writers if workers is None else workers)

    async def stop(self) -> None:
        """Cancel the writer tasks and close their connections."""
        await self._worker.stop()

    async def drain(self, deadline: float) -> bool:
        """Wait up to ``deadline`` seconds for queued and in-flight writes; True if done."""
        return await self.queue.wait_idle(deadline)
