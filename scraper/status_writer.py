"""Writing ``TrainJob.status.trainerStatus``: a write queue under an API budget,
server-side apply, only on change.

* :meth:`StatusWriter.apply` never waits for the API: it decides at once whether the
  status is news (:func:`already_holds`, against the TrainJob informer's store,
  :mod:`scraper.trainjobs`) and queues it (:mod:`scraper.write_queue`: one pending
  status per TrainJob, newest wins; finals, then first statuses, then progress, then
  metrics-only changes; aging so none starves).  So a scrape never waits for a write.
* :func:`writers_for` worker tasks (10 at the default QPS 20) take items from the
  queue; each write takes a token of the writes' bucket (``--write-qps``,
  ``--write-burst``; Events have a bucket of their own) and is one aiohttp request on
  the loop (:mod:`scraper.kube.apply_request`).
* Writes are server-side apply patches on the ``status`` subresource with the
  field manager :data:`FIELD_MANAGER` and ``force=true`` (``trainerStatus`` belongs to
  the scraper by contract; fields outside it are never sent).  Before each write the
  TrainJob's UID in the informer's store must be the one the status is meant for
  (a ``metadata.uid`` in the apply body is no precondition: kube-apiserver v1.37
  accepts a status apply with a wrong UID, measured, so the check is ours).
* A failed write stays queued and is retried with backoff (0.2 s doubling to 30 s,
  never sooner than ``Retry-After``) until it is applied, superseded by a newer
  status, the TrainJob is gone (404, or its UID changed) or this replica stops
  leading (the next leader re-derives final statuses from the pods).  So a final
  status survives an API outage of any length; 403 (e.g. an authorizer warming up
  after an API server restart) is retried the same way.  400/422 (the API refuses
  the body) are not retried.  A write that found the API server unreachable tells
  :class:`scraper.kube.health.ApiHealth`, and a write that lands tells it the API
  answers; when an outage ends every queued retry is due at once
  (:meth:`scraper.write_queue.WriteQueue.resume`), so finals land within about a
  second of the API server's return, not when a backoff grown during the outage ends.
* Other writers and time (docs/scraper.md, "Other writers and time";
  :mod:`scraper.writer_rules` decides): while another writer (e.g. upstream's push
  status server, field manager ``trainer-status``) changed the field less than
  ``--other-writer-grace`` ago, no progress write; after that, only a report whose
  content changed after that write replaces it; a final is written unless the other
  writer wrote after the container ended.  The written ``lastUpdatedTime`` never moves
  back silently (:func:`scraper.writer_rules.settle_time`: the arrival time instead,
  a log line, ``clock_skew_total`` and a ``ClockSkew`` Event).  The decision is made
  again by the writer task right before the request, against the informer's newest.
* Every apply carries the ``metadata.resourceVersion`` its decision was made against:
  the API server answers 409 Conflict when the TrainJob changed since (measured on
  kube-apiserver v1.37.2, ``tests/scraper/test_writer_rules_api.py``), so a write held on the
  wire (a dead leader's) can never land over a newer status.  On 409 the TrainJob is
  read again and the write decided again at once (a final is never dropped).
* Drift: a status this scraper applied that somebody removed is applied again; one
  another writer replaced is that writer's (the rule above).
* A CRD without ``status.trainerStatus`` is detected from its schema
  (:class:`scraper.kube.crd.CrdSupport`) or from the apply's answer; either way a
  Warning Event per TrainJob.
* ``--status-target annotation|auto`` writes the same status to the TrainJob's
  annotation instead (:mod:`scraper.annotation_target`: the body, the path, where
  the informer's value is read from, and the place of each write); everything
  above holds for it unchanged.  Under ``auto`` a write the CRD prunes is tried again
  at once in the annotation, with no Event (nothing is lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

import urllib3
from aiolimiter import AsyncLimiter
from kubernetes.client import ApiClient, ApiextensionsV1Api, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from exporter_lib.status import (
    API_GROUP,
    API_VERSION,
    TRAINJOB_PLURAL,
    TrainerStatus,
    format_time,
)
from exporter_lib.status_annotation import TRAINER_STATUS_ANNOTATION
from scraper.annotation_target import (
    Place,
    StatusTarget,
    apply_request,
    held_in,
    holds_after_apply,
    place_for,
    stored,
    uid_precondition_failed,
    writer_in,
    written,
)
from scraper.kube.apply_body import encode_apply_body
from scraper.kube.apply_request import ApplyClient
from scraper.kube.calls import Backoff, call, deadline_of, is_transient, retry_after
from scraper.kube.client import REQUEST_TIMEOUT
from scraper.kube.crd import CRD_NAME, REASON_UNSUPPORTED, CrdSupport
from scraper.kube.events import EventRecorder
from scraper.kube.health import ApiHealth, answering, unreachable
from scraper.trainjobs import (
    OUR_FIELD_MANAGER,
    Held,
    TrainJobGone,
    TrainJobKey,
    TrainJobStore,
    Writer,
    held_from_object,
    older,
    slim_trainjob,
    writers_of,
)
from scraper.write_queue import Pending, Priority, WriteQueue
from scraper.writer_rules import (
    FUTURE_LIMIT_SECONDS,
    OTHER_WRITER_GRACE_SECONDS,
    Report,
    Skew,
    Verdict,
    decide,
    same_content,
    settle_time,
)

__all__ = ["FIELD_MANAGER", "NotLeader", "StatusWriter", "TrainJobGone", "WriteOutcome",
           "already_holds", "priority_of"]

log = logging.getLogger(__name__)

FIELD_MANAGER = OUR_FIELD_MANAGER
#: The Event recorded when the written ``lastUpdatedTime`` is not the report's own.
REASON_CLOCK_SKEW = "ClockSkew"
#: 409s in a row answered with a re-read and an immediate new decision; after that the
#: queue's backoff applies (a TrainJob changing faster than a write can land).
CONFLICTS_AT_ONCE = 3
#: Concurrent writes (worker tasks) at least; the token bucket sets the rate.
WRITERS = 4
#: Writer tasks at most: each holds an API connection open.
WRITERS_MAX = 32
#: Request time the writers allow for at a full budget: ``qps * this`` writers, so the
#: budget, not the writer count, caps the rate while a request takes up to this long.
REQUEST_ALLOWANCE_SECONDS = 0.5
#: Between two tries of a queued write: 0.2 s doubling up to 30 s, +50 % jitter.
QUEUE_BACKOFF = Backoff(initial=0.2, cap=30.0)


def writers_for(qps: float) -> int:
    """Writer tasks (and API connections) for a budget of ``qps`` writes per second:
    ``ceil(qps * REQUEST_ALLOWANCE_SECONDS)`` within ``[WRITERS, WRITERS_MAX]``, e.g. 10
    at QPS 20."""
    return min(WRITERS_MAX, max(WRITERS, math.ceil(qps * REQUEST_ALLOWANCE_SECONDS)))


class NotLeader(Exception):
    """The write fence closed: this replica may not write now."""


class WriteOutcome(enum.Enum):
    """Result of :meth:`StatusWriter.apply`; ``value`` is the metrics label."""

    WRITTEN = "written"
    UNCHANGED = "unchanged"
    NOT_STORED = "not_stored"  # the CRD has no trainerStatus: nothing can be written
    FAILED = "failed"
    NOT_LEADER = "not_leader"
    DEFERRED = "deferred"  # another writer's status is kept (writer_rules: deferred_total)
    QUEUED = "queued"  # apply(): news, queued for the writers (not counted as a write)
    RETRIED = "retried"  # a write failed and stays queued


def _not_in_schema(exc: BaseException) -> bool:
    """True for the API server's answer to applying a field the CRD does not declare.

    Server-side apply refuses such a patch with 500 "failed to create typed patch
    object ... field not declared in schema" instead of pruning the field.
    """
    return (isinstance(exc, ApiException) and exc.status == 500
            and "not declared in schema" in str(exc.body or ""))


def _retryable(exc: BaseException) -> bool:
    """Worth another try (the item stays queued): transient, 401 (a credential that
    expired or was revoked, until its refresh brings a valid one: the next try reads
    the credentials again), 403 (authorizer not ready after an API server restart,
    RBAC being granted), not a refusal of the body."""
    if isinstance(exc, ApiException) and exc.status in (401, 403):
        return True
    return is_transient(exc) and not _not_in_schema(exc)


def priority_of(held: TrainerStatus | None, new: TrainerStatus, *, final: bool) -> Priority:
    """The write class of ``new`` against what the TrainJob holds (:mod:`scraper.write_queue`)."""
    if final:
        return Priority.FINAL
    if held is None:
        return Priority.FIRST
    if (new.progress_percentage, new.estimated_remaining_seconds) != (
            held.progress_percentage, held.estimated_remaining_seconds):
        return Priority.PROGRESS
    return Priority.METRICS


@dataclass(frozen=True)
class _Ours:
    """The last status this replica applied to a TrainJob, and where it landed."""

    uid: str
    status: TrainerStatus
    resource_version: str
    at: float
    place: Place = Place.STATUS


def already_holds(held: TrainerStatus | None, new: TrainerStatus) -> bool:
    """True when applying ``new`` would not change what the TrainJob holds
    (:func:`scraper.writer_rules.same_content`; the exporter never unsets a field once
    reported, so ignoring unset fields cannot hide a removal of our own)."""
    return same_content(held, new)


class StatusWriter:
    """Queues and applies statuses to TrainJobs (module doc).

    Args:
        api_client: a configured Kubernetes client.
        store: the TrainJob informer's store (what each TrainJob holds).
        crd: what is known of the TrainJob CRD (shared with the CRD re-check).
        events: where "unsupported CRD" Events go.
        limiter: the token bucket shared with Events.
        may_write: the leader fence, checked before every write.
        on_write: called with each :class:`WriteOutcome` of a write (metrics).
        on_gone: called with ``(namespace, name)`` when a write finds the TrainJob gone.
        metrics_interval: a metrics-only change is written at most this often per
            TrainJob (seconds; 0: as soon as the budget allows).
        target: where statuses go (``--status-target``, :mod:`scraper.annotation_target`).
        clock: monotonic seconds.
        health: told when a write finds the API server unreachable or gets an answer;
            its recoveries make the queued retries due (module doc).
        other_writer_grace: ``--other-writer-grace`` (seconds, :mod:`scraper.writer_rules`).
        on_deferred: called with the reason (a :class:`~scraper.writer_rules.Verdict`
            value) of each report not written because of another writer.
        on_skew: called with ``"back"`` or ``"future"`` for each write whose
            ``lastUpdatedTime`` is the arrival time instead of the report's own.
        wall: epoch seconds (the arrival time of a report).
    """

    def __init__(
        self,
        api_client: ApiClient,
        *,
        store: TrainJobStore,
        crd: CrdSupport,
        events: EventRecorder,
        limiter: AsyncLimiter,
        may_write: Callable[[], bool] = lambda: True,
        on_write: Callable[[WriteOutcome], None] = lambda outcome: None,
        on_request: Callable[[float], None] = lambda seconds: None,
        on_gone: Callable[[str, str], None] = lambda namespace, name: None,
        metrics_interval: float = 0.0,
        target: StatusTarget = StatusTarget.STATUS,
        clock: Callable[[], float] = time.monotonic,
        health: ApiHealth | None = None,
        other_writer_grace: float = OTHER_WRITER_GRACE_SECONDS,
        on_deferred: Callable[[str], None] = lambda reason: None,
        on_skew: Callable[[str], None] = lambda direction: None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.other_writer_grace = other_writer_grace
        self._on_deferred = on_deferred
        self._on_skew = on_skew
        self._wall = wall
        self._deferring: set[TrainJobKey] = set()
        # (TrainJob, "back" | "future" | "held in the future"): logged and evented once.
        self._skew_told: set[tuple[TrainJobKey, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # ClockSkew Events being recorded
        self._api = api_client
        self._health = health
        self._custom = CustomObjectsApi(api_client)
        self.store = store
        self.crd = crd
        self.events = events
        self._limiter = limiter
        self._may_write = may_write
        self._on_write = on_write
        self._on_request = on_request
        self.on_gone = on_gone
        self._metrics_interval = metrics_interval
        self.target = target
        self._clock = clock
        self.queue = WriteQueue(clock=clock)
        self._ours: dict[TrainJobKey, _Ours] = {}
        self._unsupported_told: set[TrainJobKey] = set()
        self._failing_told: set[TrainJobKey] = set()
        self._workers: list[asyncio.Task[None]] = []
        self.writers = writers_for(limiter.max_rate / limiter.time_period)
        self._apply = ApplyClient(api_client, connections=self.writers)
        self._waiters: dict[TrainJobKey, list[asyncio.Future[WriteOutcome]]] = {}
        store.on_change = self.on_trainjob_change
        if health is not None:
            health.on_recovered(self.queue.resume)

    @classmethod
    def for_client(
        cls,
        api_client: ApiClient,
        *,
        identity: str,
        qps: float,
        burst: int,
        store: TrainJobStore,
        may_write: Callable[[], bool] = lambda: True,
        on_write: Callable[[WriteOutcome], None] = lambda outcome: None,
        on_request: Callable[[float], None] = lambda seconds: None,
        metrics_interval: float = 0.0,
        target: StatusTarget = StatusTarget.STATUS,
        health: ApiHealth | None = None,
        other_writer_grace: float = OTHER_WRITER_GRACE_SECONDS,
        on_deferred: Callable[[str], None] = lambda reason: None,
        on_skew: Callable[[str], None] = lambda direction: None,
    ) -> Self:
        """A writer with its own CRD knowledge and Event recorder; writes take tokens of a
        bucket of ``qps`` sustained, ``burst`` at once (Events have a bucket of their own:
        they never spend the writes' budget)."""
        limiter = AsyncLimiter(burst, burst / qps)
        events = EventRecorder(CoreV1Api(api_client), identity=identity, uid_of=store.uid_of)
        fallback = ("" if target is StatusTarget.STATUS
                    else f"{Place.ANNOTATION.value} (--status-target {target.value})")
        crd = CrdSupport(ApiextensionsV1Api(api_client), fallback=fallback)
        writer = cls(api_client, store=store, crd=crd, events=events, limiter=limiter,
                     may_write=may_write, on_write=on_write, on_request=on_request,
                     metrics_interval=metrics_interval,
                     target=target, health=health, other_writer_grace=other_writer_grace,
                     on_deferred=on_deferred, on_skew=on_skew)
        crd.on_supported = writer.supported_again
        return writer

    def place(self) -> Place:
        """Where the next write goes (:func:`scraper.annotation_target.place_for`)."""
        return place_for(self.target, self.crd.supported)

    def supported_again(self) -> None:
        """The CRD stores trainerStatus again: announce a later loss anew."""
        self._unsupported_told.clear()

    def forget(self, namespace: str, name: str) -> None:
        """Drop what is kept and queued for a TrainJob (it is gone)."""
        key = (namespace, name)
        self.queue.forget(key)
        self._ours.pop(key, None)
        self._unsupported_told.discard(key)
        self._failing_told.discard(key)
        self._deferring.discard(key)
        self._skew_told = {told for told in self._skew_told if told[0] != key}

    def stop_leading(self) -> None:
        """Drop every queued write: the next leader re-derives them from the pods."""
        self.queue.clear()
        self._ours.clear()

    # ------------------------------------------------------------ the queue side

    async def apply(self, namespace: str, name: str, status: TrainerStatus, *,
                    final: bool = False, uid: str = "", seen: float | None = None,
                    finished_at: float | None = None) -> WriteOutcome:
        """Queue ``status`` for the TrainJob unless it already holds the same report or
        the rule for other writers keeps what it holds (:mod:`scraper.writer_rules`).

        Returns at once: :attr:`WriteOutcome.UNCHANGED` (nothing to write),
        :attr:`WriteOutcome.DEFERRED` (another writer's status is kept),
        :attr:`WriteOutcome.QUEUED`, or :attr:`WriteOutcome.NOT_STORED`.

        Args:
            final: a final status (first in the queue, kept until applied).
            uid: the TrainJob UID the status is meant for (``""``: the one that exists).
            seen: when this content was first seen (the store's monotonic clock); None:
                now for a final or a caller that knows no order (tools, push-compat),
                ``-inf`` is "unknown, maybe old" (:class:`scraper.writer_rules.Report`).
            finished_at: a final's container end (``state.terminated.finishedAt``, epoch
                seconds), None when unknown.

        Raises:
            TrainJobGone: the informer knows the TrainJob with another UID (re-created):
                the caller drops the target.  A TrainJob the informer has not seen (yet:
                the pod watch may be ahead of the TrainJob watch) is queued; the writer
                reads it once and calls ``on_gone`` when it does not exist.
        """
        key = (namespace, name)
        held = self.store.get(namespace, name)
        if held is not None and uid and held.uid != uid:
            raise TrainJobGone(f"{namespace}/{name} (UID {held.uid}, not {uid})")
        pending = self.queue.pending(key)
        place = self.place()
        there = held_in(held, place)
        report = Report(status, self.store.clock() if seen is None else seen, final,
                        finished_at)
        if held is not None:
            verdict = self._verdict(key, held, place, report)
            if verdict is Verdict.UNCHANGED and pending is None:
                self._on_write(WriteOutcome.UNCHANGED)
                return WriteOutcome.UNCHANGED
            if verdict not in (Verdict.WRITE, Verdict.UNCHANGED):
                self._on_write(WriteOutcome.DEFERRED)
                return WriteOutcome.DEFERRED
        if (place is Place.STATUS and self.crd.supported is False
                and not self.crd.recheck_due()):
            await self._tell_unsupported(namespace, name, held.uid if held else "")
            self._on_write(WriteOutcome.NOT_STORED)
            return WriteOutcome.NOT_STORED
        priority = priority_of(there, status, final=final)
        if key not in self._ours and priority > Priority.FIRST:
            priority = Priority.FIRST  # nothing of ours there yet (e.g. after a restart)
        hold = 0.0
        if priority is Priority.METRICS and self._metrics_interval > 0:
            last = self._ours.get(key)
            hold = (last.at if last else 0.0) + self._metrics_interval
        self.queue.put(key, status, priority, uid=uid or (held.uid if held else ""),
                       hold_until=hold, seen=report.seen, finished_at=finished_at,
                       arrived=self._wall())
        return WriteOutcome.QUEUED

    def _verdict(self, key: TrainJobKey, held: Held, place: Place, report: Report) -> Verdict:
        """:func:`scraper.writer_rules.decide` for ``report``; counts a report kept out and
        logs when deferring to another writer starts and when it ends."""
        writer = writer_in(held, place)
        verdict = decide(held_in(held, place), writer, report, now=self.store.clock(),
                         grace=self.other_writer_grace)
        if verdict in (Verdict.WRITE, Verdict.UNCHANGED):
            if key in self._deferring:
                self._deferring.discard(key)
                log.info("TrainJob %s/%s: no longer deferring to another writer of %s: %s",
                         *key, place.value, "the status is written" if verdict is
                         Verdict.WRITE else "it holds the same content")
            return verdict
        self._on_deferred(verdict.value)
        if key not in self._deferring and writer is not None:
            self._deferring.add(key)
            why = {Verdict.OTHER_WRITER: f"it changed it {self.store.clock() - writer.seen:.0f}s "
                                         f"ago (< --other-writer-grace "
                                         f"{self.other_writer_grace:g}s)",
                   Verdict.NOT_NEWS: "no report changed since it wrote",
                   Verdict.DELIVERED: "it wrote after the container ended"}[verdict]
            log.info("TrainJob %s/%s: deferring to another writer of %s (field manager %s): "
                     "%s", *key, place.value, writer.manager, why)
        return verdict

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

    def on_trainjob_change(self, namespace: str, name: str, held: Held) -> None:
        """The informer saw the TrainJob change: restore our status if another writer
        replaced it with an older one or removed it (module doc, Drift)."""
        key = (namespace, name)
        ours = self._ours.get(key)
        if ours is None or ours.uid != held.uid or not self._may_write():
            return
        if ours.place is not self.place():
            return  # --status-target auto switched places: the old one is not ours to keep
        there = held_in(held, ours.place)
        if there is not None and already_holds(there, ours.status):
            return
        if older(held.resource_version, ours.resource_version):
            return
        if self.queue.pending(key) is not None or self.queue.in_progress(key):
            # A status of ours is on its way (the watch may show a write's result before
            # its answer is back): that write decides.
            return
        if there is not None:
            # Another writer's status: the rule decides our next write (writer_rules).
            writer = writer_in(held, ours.place)
            log.info("TrainJob %s/%s: %s changed by %s; the rule for other writers "
                     "decides the next write", namespace, name, ours.place.value,
                     f"field manager {writer.manager}" if writer else "another writer")
            del self._ours[key]
            return
        log.info("TrainJob %s/%s: %s was removed by another writer; restoring ours",
                 namespace, name, ours.place.value)
        self.queue.put(key, ours.status, Priority.PROGRESS, uid=ours.uid,
                       seen=self.store.clock(), arrived=self._wall())

    # ------------------------------------------------------------ the worker side

    def start(self, workers: int | None = None) -> None:
        """Start ``workers`` worker tasks (default :attr:`writers`) on the running loop.

        Each makes its apply request on the loop (:mod:`scraper.kube.apply_request`),
        over connections of the writer's own, so a request never waits for a thread of
        the loop's default executor (informer lists, Events, CRD probes) and those never
        wait for a write (a new connection's host-name lookup does; aiohttp caches it).
        """
        for i in range(self.writers if workers is None else workers):
            self._workers.append(asyncio.create_task(self._work(), name=f"status-writer-{i}"))

    async def stop(self) -> None:
        """Cancel the worker tasks."""
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers.clear()
        for event in list(self._tasks):
            event.cancel()
        await self._apply.close()

    async def _work(self) -> None:
        while True:
            item = await self.queue.get()
            retry_in: float | None = None
            try:
                outcome, retry_in = await self._write(item)
            except Exception:
                log.exception("status write to TrainJob %s/%s raised", *item.key)
                outcome, retry_in = WriteOutcome.FAILED, QUEUE_BACKOFF.delay(item.attempts)
            finally:
                self.queue.done(item, retry_in=retry_in)
            if outcome is not None:
                self._on_write(outcome)
                if outcome is not WriteOutcome.RETRIED:
                    self._settle(item.key, outcome)

    async def _write(self, item: Pending) -> tuple[WriteOutcome | None, float | None]:
        """One try of ``item``: ``(outcome or None when nothing was tried, retry in s)``."""
        namespace, name = item.key
        if not self._may_write():
            return WriteOutcome.NOT_LEADER, None
        await self.store.synced.wait()
        held = self.store.get(namespace, name)
        if held is None:
            try:
                held = await self._read(namespace, name)
            except TrainJobGone:
                self._gone(item, "it does not exist")
                return None, None
            except (ApiException, urllib3.exceptions.HTTPError, ConnectionError) as exc:
                return await self._failed(item, Held("", None), exc)
        if item.uid and held.uid != item.uid:
            self._gone(item, f"it was re-created (UID {held.uid}, the status was for "
                       f"{item.uid})")
            return None, None
        place = self.place()
        verdict = self._verdict(item.key, held, place, Report(
            item.status, item.seen, item.priority is Priority.FINAL, item.finished_at))
        if verdict is Verdict.UNCHANGED:
            return WriteOutcome.UNCHANGED, None
        if verdict is not Verdict.WRITE:
            return WriteOutcome.DEFERRED, None
        if (place is Place.STATUS and self.crd.supported is False
                and not self.crd.recheck_due()):
            await self._tell_unsupported(namespace, name, held.uid)
            return WriteOutcome.NOT_STORED, None
        status = self._settle_time(item, held_in(held, place), held.uid)
        try:
            async with self._limiter:
                self._fence()
                began = time.monotonic()
                try:
                    obj = await call(self._ssa, namespace, name, status, place,
                                     held.uid, held.resource_version,
                                     deadline=deadline_of(REQUEST_TIMEOUT))
                finally:
                    self._on_request(time.monotonic() - began)
        except NotLeader:
            return WriteOutcome.NOT_LEADER, None
        except (ApiException, urllib3.exceptions.HTTPError, ConnectionError,
                TimeoutError) as exc:  # TimeoutError: the try passed its deadline
            return await self._failed(item, held, exc, place)
        self._failing_told.discard(item.key)
        if self._health is not None:
            self._health.answered()
        if not stored(obj, place) and place is Place.ANNOTATION:
            # Annotations are never pruned: something in admission removed it.
            log.warning("annotation write to TrainJob %s/%s came back without %s (removed "
                        "by an admission webhook?); not retried", namespace, name,
                        TRAINER_STATUS_ANNOTATION)
            return WriteOutcome.FAILED, None
        if not stored(obj, place):
            self.crd.mark_unsupported("an apply response came back without it (pruned)")
            return await self._not_stored(item, held)
        if place is Place.STATUS and self.crd.supported is not True:
            self.crd.mark_supported()
        # What the TrainJob holds now is what was sent (SSA with force owns every field
        # sent), unless another manager keeps a field this status leaves unset: only then
        # is the answer's trainerStatus read (no second validation on the common path).
        status = holds_after_apply(obj, place, status)
        meta = obj.get("metadata") or {}
        uid, rv = meta.get("uid", held.uid), meta.get("resourceVersion", "")
        now = self.store.clock()
        by_status, by_annotation = writers_of(meta.get("managedFields"), seen=now,
                                              prefer=FIELD_MANAGER)
        by = by_annotation if place is Place.ANNOTATION else by_status
        self.store.keep(namespace, name, written(
            held, place, status, uid, rv, by or Writer(FIELD_MANAGER, self._wall(), now)))
        self._ours[item.key] = _Ours(uid, status, rv, self._clock(), place)
        if item.priority is Priority.FINAL:
            log.info("final status of TrainJob %s/%s applied (%d failed tries before)",
                     namespace, name, item.attempts)
        return WriteOutcome.WRITTEN, None

    async def _read(self, namespace: str, name: str) -> Held:
        """GET a TrainJob the informer has not delivered yet (rare: the pod watch was
        ahead); keep it in the store.

        Raises:
            TrainJobGone: 404.
        """
        try:
            async with self._limiter:
                obj = await call(self._custom.get_namespaced_custom_object, API_GROUP,
                                 API_VERSION, namespace, TRAINJOB_PLURAL, name,
                                 _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                raise TrainJobGone(f"{namespace}/{name}") from None
            raise
        self.store.store(namespace, name, slim_trainjob(obj))
        return self.store.get(namespace, name) or held_from_object(obj)

    async def _not_stored(self, item: Pending,
                          held: Held) -> tuple[WriteOutcome, float | None]:
        """The CRD cannot store trainerStatus: under ``auto`` the status goes to the
        annotation at once (kept queued, no delay), else a Warning Event and it is dropped."""
        if self.target is StatusTarget.AUTO:
            return WriteOutcome.RETRIED, 0.0
        await self._tell_unsupported(*item.key, held.uid)
        return WriteOutcome.NOT_STORED, None

    async def _failed(self, item: Pending, held: Held, exc: BaseException,
                      place: Place = Place.STATUS) -> tuple[WriteOutcome | None, float | None]:
        namespace, name = item.key
        detail = (f"HTTP {exc.status} {exc.reason}" if isinstance(exc, ApiException)
                  else f"{type(exc).__name__}: {str(exc)[:200]}")
        if isinstance(exc, ApiException) and exc.status == 404:
            self._gone(item, "the API answered 404")
            return WriteOutcome.FAILED, None
        if place is Place.ANNOTATION and uid_precondition_failed(exc):
            self._gone(item, f"the apply's UID precondition failed ({detail}; the status "
                       f"was for UID {held.uid})")
            return WriteOutcome.FAILED, None
        if isinstance(exc, ApiException) and exc.status == 409:
            return await self._conflict(item, held, detail)
        if _not_in_schema(exc):
            self.crd.mark_unsupported("server-side apply answered that "
                                      "status.trainerStatus is not declared in its schema")
            return await self._not_stored(item, held)
        if not _retryable(exc):
            log.warning("status write to TrainJob %s/%s refused: %s (not retried)",
                        namespace, name, detail)
            return WriteOutcome.FAILED, None
        delay = QUEUE_BACKOFF.delay(item.attempts, retry_after(exc))
        if self._health is not None and unreachable(exc):
            self._health.lost()
        elif self._health is not None and answering(exc):
            self._health.answered()  # a refusal: the server is back
        if item.key not in self._failing_told or item.priority is Priority.FINAL:
            self._failing_told.add(item.key)
            log.warning("%sstatus write to TrainJob %s/%s failed: %s; kept queued, next try "
                        "in %.1fs", "final " if item.priority is Priority.FINAL else "",
                        namespace, name, detail, delay)
        return WriteOutcome.RETRIED, delay

    async def _conflict(self, item: Pending, held: Held,
                        detail: str) -> tuple[WriteOutcome | None, float | None]:
        """409: the TrainJob changed since the write was decided (its resourceVersion
        precondition failed).  Read it again and decide again at once (the item stays
        queued, so a final is re-decided, never dropped); after
        :data:`CONFLICTS_AT_ONCE` in a row, with the queue's backoff."""
        namespace, name = item.key
        log.info("%sstatus write to TrainJob %s/%s: %s (it changed since resourceVersion "
                 "%s); reading it again to decide again",
                 "final " if item.priority is Priority.FINAL else "", namespace, name,
                 detail, held.resource_version or "?")
        try:
            await self._read(namespace, name)
        except TrainJobGone:
            self._gone(item, "it does not exist")
            return None, None
        except (ApiException, urllib3.exceptions.HTTPError, ConnectionError, TimeoutError):
            return WriteOutcome.RETRIED, QUEUE_BACKOFF.delay(item.attempts)
        if item.attempts < CONFLICTS_AT_ONCE:
            return WriteOutcome.RETRIED, 0.0
        return WriteOutcome.RETRIED, QUEUE_BACKOFF.delay(item.attempts - CONFLICTS_AT_ONCE + 1)

    def _settle_time(self, item: Pending, there: TrainerStatus | None,
                     uid: str) -> TrainerStatus:
        """``item.status`` with the ``lastUpdatedTime`` to write
        (:func:`scraper.writer_rules.settle_time`); a skew is logged once per TrainJob and
        direction (a held time in the future is its own case), counted each time and
        recorded as a ``ClockSkew`` Event."""
        arrived = datetime.fromtimestamp(item.arrived or self._wall(), UTC)
        reported = item.status.last_updated_time
        held_time = there.last_updated_time if there is not None else None
        settled, skew = settle_time(reported, held_time, arrived)
        if skew is None:
            return item.status
        self._on_skew(skew.value)
        namespace, name = item.key
        kind = skew.value
        if skew is Skew.FUTURE:
            why = (f"lastUpdatedTime {format_time(reported)} is more than "
                   f"{FUTURE_LIMIT_SECONDS:g}s ahead of the scraper's clock")
        elif held_time is not None and settled < held_time:
            kind = "held in the future"
            why = (f"the held lastUpdatedTime {format_time(held_time)} is in the future "
                   f"(the report says {format_time(reported)})")
        else:
            assert held_time is not None
            why = (f"lastUpdatedTime {format_time(reported)} is older than the held "
                   f"{format_time(held_time)}")
        message = (f"{why}; wrote the scraper's arrival time {format_time(settled)} "
                   "instead (the reported values are kept)")
        if (item.key, kind) not in self._skew_told:
            self._skew_told.add((item.key, kind))
            log.warning("TrainJob %s/%s: clock skew (%s): %s", namespace, name, skew.value,
                        message)
            task = asyncio.create_task(self.events.event(
                namespace, name, REASON_CLOCK_SKEW, message, uid=uid),
                name=f"clock-skew-event {namespace}/{name}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return item.status.model_copy(update={"last_updated_time": settled})

    def _gone(self, item: Pending, why: str) -> None:
        namespace, name = item.key
        log.info("TrainJob %s/%s is gone (%s): %sstatus dropped", namespace, name, why,
                 "final " if item.priority is Priority.FINAL else "")
        self.forget(namespace, name)
        self._settle(item.key, TrainJobGone(f"{namespace}/{name}"))
        self.on_gone(namespace, name)

    def _fence(self) -> None:
        if not self._may_write():
            raise NotLeader()

    async def _tell_unsupported(self, namespace: str, name: str, uid: str) -> None:
        if (namespace, name) in self._unsupported_told:
            return
        self._unsupported_told.add((namespace, name))
        await self.events.event(
            namespace, name, REASON_UNSUPPORTED,
            f"The TrainJob CRD ({CRD_NAME}) has no status.trainerStatus, so progress "
            "cannot be stored; upgrade the Kubeflow Trainer CRDs, or run trainjob-scraper "
            f"with --status-target auto (it then writes {Place.ANNOTATION.value}).",
            uid=uid,
        )

    async def _ssa(self, namespace: str, name: str, status: TrainerStatus,
                   place: Place = Place.STATUS, uid: str = "",
                   resource_version: str = "") -> dict[str, Any]:
        """The apply request itself, on the loop.  Its path and body (with the
        ``metadata.resourceVersion`` precondition):
        :func:`scraper.annotation_target.apply_request`."""
        path, params, body = apply_request(place, namespace, name, status, uid,
                                           resource_version)
        return await self._apply.patch(
            path.format(**params),
            [("fieldManager", FIELD_MANAGER), ("force", "true")],
            encode_apply_body(body), request_timeout=REQUEST_TIMEOUT)

    async def drain(self, deadline: float) -> bool:
        """Wait up to ``deadline`` seconds for queued and in-flight writes; True if done."""
        return await self.queue.wait_idle(deadline)
