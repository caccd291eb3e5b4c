"""The writer tasks: take statuses off the write queue and apply them by server-side
apply, retrying until each is applied, superseded, or its TrainJob is gone.

* :func:`writers_for` worker tasks (10 at the default QPS 20) take items from the
  queue (:class:`scraper.write.queue.WriteQueue`); each write takes a token of the
  writes' bucket (``--write-qps``, ``--write-burst``; Events have a bucket of their own)
  and is one aiohttp request on the loop (:class:`StatusApply`,
  :mod:`scraper.kube.apply_request`).
* Writes are server-side apply patches on the ``status`` subresource with the
  field manager :data:`scraper.shared.outcome.FIELD_MANAGER` and ``force=true``
  (``trainerStatus`` belongs to the scraper by contract; fields outside it are never
  sent).  Before each write the TrainJob's UID in the informer's store must be the one
  the status is meant for (a ``metadata.uid`` in the apply body is no precondition:
  kube-apiserver v1.37 accepts a status apply with a wrong UID, measured, so the check
  is ours).
* A status from an answer that stated no pod carries its target: right before each try
  its pod is read once (:mod:`scraper.discovery.pod_confirm`, on the loop's default
  executor), and unless it is still the target's the status is dropped
  (``unconfirmed``, not retried: the next scrape brings it again) and ``on_pod_check``
  is told; a read that failed keeps the status queued, as a failed write does.
* Right before the request the decision is asked again, against the informer's newest
  (:class:`Decisions`: a report another writer's status now keeps out, or that the
  TrainJob already holds, is not sent; its timing was the queue's), and the
  ``lastUpdatedTime`` to write is settled (:meth:`scraper.write.notices.Notices.settled`).
* Every apply carries the ``metadata.resourceVersion`` its decision was made against:
  the API server answers 409 Conflict when the TrainJob changed since (measured on
  kube-apiserver v1.37.2, ``tests/scraper/test_writer_rules_api.py``), so a write still in
  flight (a dead leader's) can never land over a newer status.  On 409 the TrainJob is
  read again and the write decided again at once (a final is never dropped).
* A failed write stays queued and is retried with backoff (0.2 s doubling to 30 s,
  never sooner than ``Retry-After``) until it is applied, superseded by a newer
  status, the TrainJob is gone (404, or its UID changed) or this replica stops
  leading (the next leader re-derives final statuses from the pods).  So a final
  status survives an API outage of any length; 401 and 403 (e.g. an authorizer
  warming up after an API server restart) are retried the same way.  400/422 (the API
  refuses the body) are not retried.  A write that found the API server unreachable
  tells :class:`scraper.kube.health.ApiHealth`, and a write that lands tells it the API
  answers.
* A CRD without ``status.trainerStatus`` is detected from the apply's answer (pruned,
  or "not declared in schema"); under ``--status-target auto`` the status is tried again
  at once in the annotation, else a Warning Event per TrainJob.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import urllib3
from aiolimiter import AsyncLimiter
from kubernetes.client import ApiClient, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL, TrainerStatus
from exporter_lib.status_annotation import TRAINER_STATUS_ANNOTATION
from scraper.kube.apply_request import ApplyClient, encode_apply_body
from scraper.kube.calls import Backoff, call, deadline_of, is_transient, retry_after
from scraper.kube.client import REQUEST_TIMEOUT
from scraper.kube.crd import CrdSupport
from scraper.kube.health import ApiHealth, answering, unreachable
from scraper.shared.outcome import FIELD_MANAGER, NotLeader, WriteCounts, WriteOutcome
from scraper.shared.trainjobs import (
    TrainJobGone,
    TrainJobKey,
    TrainJobRecord,
    TrainJobStore,
    Writer,
    record_from_object,
    slim_trainjob,
    writers_of,
)
from scraper.shared.writes import Decision, Priority, Report, Skip, WriteVerdict
from scraper.write.annotation_target import (
    Place,
    StatusTarget,
    apply_request,
    status_in,
    stored,
    stored_after_apply,
    uid_precondition_failed,
    written,
)
from scraper.write.notices import Notices
from scraper.write.pod_gate import PodGate
from scraper.write.queue import Pending, WriteQueue
from scraper.write.rate import AdaptiveRate

__all__ = ["QUEUE_BACKOFF", "Decisions", "OurWrite", "StatusApply", "StatusRequest",
           "WriteWorker", "after_apply", "read_trainjob", "writers_for"]

log = logging.getLogger(__name__)

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
#: Outcomes after which the TrainJob shows the status of the write (the queue measures
#: how far behind a newer status is from it).
_SHOWN = frozenset({WriteOutcome.WRITTEN, WriteOutcome.UNCHANGED})


def writers_for(qps: float) -> int:
    """Writer tasks (and API connections) for a budget of ``qps`` writes per second:
    ``ceil(qps * REQUEST_ALLOWANCE_SECONDS)`` within ``[WRITERS, WRITERS_MAX]``, e.g. 10
    at QPS 20."""
    return min(WRITERS_MAX, max(WRITERS, math.ceil(qps * REQUEST_ALLOWANCE_SECONDS)))


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


async def read_trainjob(custom: CustomObjectsApi, limiter: AsyncLimiter | AdaptiveRate,
                        store: TrainJobStore, namespace: str, name: str) -> TrainJobRecord:
    """GET a TrainJob the informer has not delivered yet (rare: the pod watch was
    ahead), under the writes' ``limiter``, and keep it in ``store``.

    Raises:
        TrainJobGone: 404.
        ApiException, urllib3.exceptions.HTTPError, ConnectionError: the read failed.
    """
    try:
        async with limiter:
            obj = await call(custom.get_namespaced_custom_object, API_GROUP, API_VERSION,
                             namespace, TRAINJOB_PLURAL, name, _request_timeout=REQUEST_TIMEOUT)
    except ApiException as exc:
        if exc.status == 404:
            raise TrainJobGone(f"{namespace}/{name}") from None
        raise
    store.store(namespace, name, slim_trainjob(obj))
    return store.get(namespace, name) or record_from_object(obj)


def after_apply(obj: dict[str, Any], record: TrainJobRecord, place: Place,
                sent: TrainerStatus, now: float, wall: float) -> TrainJobRecord:
    """What the TrainJob holds after an apply answered with ``obj``: ``record`` with
    the status, UID, resourceVersion and writer now stored at ``place``.

    What it stores is what was sent (SSA with force owns every field sent), unless
    another manager keeps a field ``sent`` leaves unset: only then is the answer's
    trainerStatus read (no second validation on the common path).  ``now``: the store's
    clock (seconds); ``wall``: epoch seconds, the write's time when the answer has no
    managedFields entry of ours.
    """
    status = stored_after_apply(obj, place, sent)
    meta = obj.get("metadata") or {}
    uid, rv = meta.get("uid", record.uid), meta.get("resourceVersion", "")
    by_status, by_annotation = writers_of(meta.get("managedFields"), seen=now,
                                          prefer=FIELD_MANAGER)
    by = by_annotation if place is Place.ANNOTATION else by_status
    return written(record, place, status, uid, rv, by or Writer(FIELD_MANAGER, wall, now))


@dataclass(frozen=True)
class OurWrite:
    """The last status this replica applied to a TrainJob, and where it landed.

    ``at``: monotonic time the write ended; ``fresh_at``: when the written status was
    taken (put in the queue): what the TrainJob shows is current as of then.
    """

    uid: str
    status: TrainerStatus
    resource_version: str
    at: float
    place: Place = Place.STATUS
    fresh_at: float = 0.0


class Decisions(Protocol):
    """Where the writer tasks ask the decision for a report right before its request
    (:meth:`scraper.write.writer.StatusWriter.decision`)."""

    def decision(self, key: TrainJobKey, record: TrainJobRecord | None, place: Place,
                 report: Report, *, queued: bool = False) -> Decision: ...


class StatusRequest(Protocol):
    """The apply request of one status (:meth:`apply`: a coroutine function, so
    :func:`scraper.kube.calls.call` runs it on the loop) and its connections."""

    async def apply(self, namespace: str, name: str, status: TrainerStatus,
                    place: Place, uid: str, resource_version: str) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class StatusApply:
    """The apply request on the loop, over ``connections`` connections of its own.

    Its path and body (with the ``metadata.resourceVersion`` precondition):
    :func:`scraper.write.annotation_target.apply_request`; field manager
    :data:`~scraper.shared.outcome.FIELD_MANAGER`, ``force=true``.
    """

    def __init__(self, api_client: ApiClient, *, connections: int) -> None:
        self._client = ApplyClient(api_client, connections=connections)

    async def apply(self, namespace: str, name: str, status: TrainerStatus,
                    place: Place, uid: str, resource_version: str) -> dict[str, Any]:
        """Apply ``status`` to the TrainJob at ``place``; the TrainJob object the API
        server answered (JSON dict).

        Raises:
            ApiException: a non-2xx answer (:mod:`scraper.kube.apply_request`).
            ConnectionError: a connection, TLS or protocol error.
            TimeoutError: the request timed out.
        """
        path, params, body = apply_request(place, namespace, name, status, uid,
                                           resource_version)
        return await self._client.patch(
            path.format(**params),
            [("fieldManager", FIELD_MANAGER), ("force", "true")],
            encode_apply_body(body), request_timeout=REQUEST_TIMEOUT)

    async def close(self) -> None:
        """Close the connections."""
        await self._client.close()


class WriteWorker:
    """The writer tasks of a :class:`scraper.write.writer.StatusWriter` (module doc).

    Args:
        queue: the write queue it drains.
        store: the TrainJob informer's store (what each TrainJob stores).
        custom: the client that reads a TrainJob the informer has not delivered yet.
        crd: what is known of the TrainJob CRD.
        limiter: the token bucket of the writes.
        request: the apply request (:class:`StatusApply`).
        decisions: the decision, asked again before each request.
        notices: Events and log lines told once per TrainJob.
        ours: the last status this replica applied to each TrainJob, kept up to date here
            (shared with the queue side).
        place: where the next write goes (``status`` or the annotation).
        target: ``--status-target``.
        may_write: the leader fence, checked before every write.
        counts: where each try's outcome and each request's seconds are counted.
        on_answer: called with ``(seconds, exception or None)`` of each apply request
            that was sent (the adaptive rate's signal, :mod:`scraper.write.rate`).
        on_settled: called with ``(key, outcome)`` when a status leaves the queue
            (applied, refused, superseded), never for a retry.
        on_gone: called with ``(namespace, name)`` when a write finds the TrainJob gone.
        gate: reads the pod of an item's ``confirm`` target before each try
            (:class:`scraper.write.pod_gate.PodGate`); None: no read.
        health: told when a write finds the API server unreachable or gets an answer.
        clock: monotonic seconds.
        wall: epoch seconds (who wrote, when the answer has no managedFields entry).
    """

    def __init__(
        self,
        queue: WriteQueue,
        *,
        store: TrainJobStore,
        custom: CustomObjectsApi,
        crd: CrdSupport,
        limiter: AsyncLimiter | AdaptiveRate,
        request: StatusRequest,
        decisions: Decisions,
        notices: Notices,
        ours: dict[TrainJobKey, OurWrite],
        place: Callable[[], Place],
        target: StatusTarget,
        may_write: Callable[[], bool],
        counts: WriteCounts,
        on_settled: Callable[[TrainJobKey, WriteOutcome | BaseException], None],
        on_gone: Callable[[str, str], None],
        health: ApiHealth | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_answer: Callable[[float, BaseException | None], object] = lambda s, exc: None,
        gate: PodGate | None = None,
    ) -> None:
        self.queue = queue
        self._gate = gate
        self._on_answer = on_answer
        self.store = store
        self._custom = custom
        self.crd = crd
        self._limiter = limiter
        self._request = request
        self._decisions = decisions
        self._notices = notices
        self._ours = ours
        self._place = place
        self.target = target
        self._may_write = may_write
        self._counts = counts
        self._on_settled = on_settled
        self._on_gone = on_gone
        self._health = health
        self._clock = clock
        self._wall = wall
        self._failing_told: set[TrainJobKey] = set()
        self._tasks: list[asyncio.Task[None]] = []

    def sizes(self) -> dict[str, int]:
        """Entries of each map kept per TrainJob."""
        return {"failing_told": len(self._failing_told)}

    def start(self, workers: int) -> None:
        """Start ``workers`` worker tasks on the running loop.

        Each applies on the loop over connections of its own
        (:mod:`scraper.kube.apply_request`), never waiting for the default executor's
        threads (informers, Events, CRD probes); the pod read of :class:`PodGate` does.
        """
        for i in range(workers):
            self._tasks.append(asyncio.create_task(self._work(), name=f"status-writer-{i}"))

    async def stop(self) -> None:
        """Cancel the worker tasks and close the request's connections."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self._notices.cancel()
        await self._request.close()

    def forget(self, key: TrainJobKey) -> None:
        """Drop what is kept for a TrainJob (it is gone)."""
        self._failing_told.discard(key)

    async def _work(self) -> None:
        while True:
            item = await self.queue.get()
            retry_in: float | None = None
            outcome: WriteOutcome | None = None
            try:
                outcome, retry_in = await self._write(item)
            except Exception:
                log.exception("status write to TrainJob %s/%s raised", *item.key)
                outcome, retry_in = WriteOutcome.FAILED, QUEUE_BACKOFF.delay(item.attempts)
            finally:
                self.queue.done(item, retry_in=retry_in, shown=outcome in _SHOWN)
            if outcome is not None:
                self._counts.written(outcome)
                if outcome is not WriteOutcome.RETRIED:
                    self._on_settled(item.key, outcome)

    async def _write(self, item: Pending) -> tuple[WriteOutcome | None, float | None]:
        """One try of ``item``: ``(outcome or None when nothing was tried, retry in s)``."""
        namespace, name = item.key
        if not self._may_write():
            return WriteOutcome.NOT_LEADER, None
        await self.store.synced.wait()
        record = self.store.get(namespace, name)
        if record is None:
            try:
                record = await self._read(namespace, name)
            except TrainJobGone:
                self._gone(item, "it does not exist")
                return None, None
            except (ApiException, urllib3.exceptions.HTTPError, ConnectionError) as exc:
                return await self._failed(item, TrainJobRecord("", None), exc)
        if item.uid and record.uid != item.uid:
            self._gone(item, f"it was re-created (UID {record.uid}, the status was for "
                       f"{item.uid})")
            return None, None
        place = self._place()
        decision = self._decisions.decision(item.key, record, place, Report(
            item.status, item.seen, item.priority is Priority.FINAL, item.finished_at))
        if isinstance(decision, Skip):  # a Wait was the queue's to keep: it is due now
            return (WriteOutcome.UNCHANGED if decision.reason is WriteVerdict.UNCHANGED
                    else WriteOutcome.DEFERRED), None
        if (place is Place.STATUS and self.crd.supported is False
                and not self.crd.recheck_due()):
            await self._notices.unsupported(namespace, name, record.uid)
            return WriteOutcome.NOT_STORED, None
        # Only a try that will be sent reads the pod: none for a report coalesced in the
        # queue or found unchanged.
        if self._gate is not None and (held := await self._gate.verdict(
                item.confirm, item.arrived, lambda: QUEUE_BACKOFF.delay(item.attempts))):
            return held
        status = self._notices.settled(item, status_in(record, place), record.uid)
        try:
            async with self._limiter:
                self._fence()
                began = time.monotonic()
                answer: BaseException | None = None
                try:
                    obj = await call(self._request.apply, namespace, name, status, place,
                                     record.uid, record.resource_version,
                                     deadline=deadline_of(REQUEST_TIMEOUT))
                except BaseException as exc:  # cancelled too: no sign of a fast write
                    answer = exc
                    raise
                finally:
                    took = time.monotonic() - began
                    self._counts.request_took(took)
                    self._on_answer(took, answer)
        except NotLeader:
            return WriteOutcome.NOT_LEADER, None
        except (ApiException, urllib3.exceptions.HTTPError, ConnectionError,
                TimeoutError) as exc:  # TimeoutError: the try passed its deadline
            return await self._failed(item, record, exc, place)
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
            return await self._not_stored(item, record)
        if place is Place.STATUS and self.crd.supported is not True:
            self.crd.mark_supported()
        kept = after_apply(obj, record, place, status, self.store.clock(), self._wall())
        self.store.keep(namespace, name, kept)
        self._ours[item.key] = OurWrite(kept.uid, status_in(kept, place) or status,
                                        kept.resource_version, self._clock(), place,
                                        item.fresh_at or self._clock())
        if item.priority is Priority.FINAL:
            log.info("final status of TrainJob %s/%s applied (%d failed tries before)",
                     namespace, name, item.attempts)
        return WriteOutcome.WRITTEN, None

    async def _not_stored(self, item: Pending,
                          record: TrainJobRecord) -> tuple[WriteOutcome, float | None]:
        """The CRD cannot store trainerStatus: under ``auto`` the status goes to the
        annotation at once (kept queued, no delay), else a Warning Event and it is dropped."""
        if self.target is StatusTarget.AUTO:
            return WriteOutcome.RETRIED, 0.0
        await self._notices.unsupported(*item.key, record.uid)
        return WriteOutcome.NOT_STORED, None

    async def _failed(self, item: Pending, record: TrainJobRecord, exc: BaseException,
                      place: Place = Place.STATUS) -> tuple[WriteOutcome | None, float | None]:
        namespace, name = item.key
        detail = (f"HTTP {exc.status} {exc.reason}" if isinstance(exc, ApiException)
                  else f"{type(exc).__name__}: {str(exc)[:200]}")
        if isinstance(exc, ApiException) and exc.status == 404:
            self._gone(item, "the API answered 404")
            return WriteOutcome.FAILED, None
        if place is Place.ANNOTATION and uid_precondition_failed(exc):
            self._gone(item, f"the apply's UID precondition failed ({detail}; the status "
                       f"was for UID {record.uid})")
            return WriteOutcome.FAILED, None
        if isinstance(exc, ApiException) and exc.status == 409:
            return await self._conflict(item, record, detail)
        if _not_in_schema(exc):
            self.crd.mark_unsupported("server-side apply answered that "
                                      "status.trainerStatus is not declared in its schema")
            return await self._not_stored(item, record)
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

    async def _conflict(self, item: Pending, record: TrainJobRecord,
                        detail: str) -> tuple[WriteOutcome | None, float | None]:
        """409: the TrainJob changed since the write was decided (its resourceVersion
        precondition failed).  Read it again and decide again at once (the item stays
        queued, so a final is re-decided, never dropped); after
        :data:`CONFLICTS_AT_ONCE` in a row, with the queue's backoff."""
        namespace, name = item.key
        log.info("%sstatus write to TrainJob %s/%s: %s (it changed since resourceVersion "
                 "%s); reading it again to decide again",
                 "final " if item.priority is Priority.FINAL else "", namespace, name,
                 detail, record.resource_version or "?")
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

    async def _read(self, namespace: str, name: str) -> TrainJobRecord:
        return await read_trainjob(self._custom, self._limiter, self.store, namespace, name)

    def _gone(self, item: Pending, why: str) -> None:
        namespace, name = item.key
        log.info("TrainJob %s/%s is gone (%s): %sstatus dropped", namespace, name, why,
                 "final " if item.priority is Priority.FINAL else "")
        self._on_gone(namespace, name)

    def _fence(self) -> None:
        if not self._may_write():
            raise NotLeader()
