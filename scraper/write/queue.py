"""The write queue: at most one pending status per TrainJob, in priority order, fairly.

Like client-go's workqueue: a key is queued once; a newer status for a queued key
replaces the pending one (coalesced) and keeps its place; a key being written is not
handed out twice, and a status that arrives meanwhile is queued when that write is
:meth:`WriteQueue.done`.  No Kubernetes here: :class:`scraper.write.writer.StatusWriter`
feeds it, :class:`scraper.write.worker.WriteWorker` drains it.

Order of :meth:`WriteQueue.get` (the rule, tested in ``tests/scraper/test_write_queue.py``):

1. only items that are due: a retry's backoff has passed, and the write policy's waits
   (:mod:`scraper.shared.policy`): a progress or metrics-only change no sooner than its
   ``gap`` (the progress floor) after the key's last write ended, a metrics-only change
   not before its ``metrics_due`` (the staleness bound);
2. final statuses first, oldest first (in the order the pods ended);
3. then by class, first statuses (the TrainJob stores none of ours yet), progress
   changes, metrics-only changes (metrics or the remaining time), where each
   :data:`AGE_SECONDS` of waiting moves an item up one class: a metrics-only change
   that waited 20 s ranks with a fresh progress change, so under a saturated budget no
   TrainJob starves (a metrics-only change ages from the end of its wait: one
   that falls due does not jump ahead of fresh progress changes);
4. within a class, the TrainJob whose shown percentage is furthest behind its pending
   status, and among those the one whose last write through this queue ended longest
   ago (a key never written: from when it was queued): each point behind counts as
   :data:`POINT_SECONDS` of waiting, up to :data:`MAX_LEAD_SECONDS` in all, so no item
   waits more than that longer than its turn; then the key queued first, then the key
   itself (deterministic).  Under a saturated budget every waiting item has aged
   into the same class, so this is round robin weighted by how far behind each
   TrainJob is: each TrainJob gets its next write about N / QPS seconds after its last
   one (at most :data:`MAX_LEAD_SECONDS` later), whenever the scrape that found its
   change ran (``benchmarks/cluster_scale.py``, steady state); a TrainJob that moves
   faster than the others is written more often (``benchmarks/write_order_sim.py``).

The next item is found through indexes (:mod:`scraper.write.order`: heaps with lazy
deletion), never by a scan: :meth:`WriteQueue.take`, :meth:`WriteQueue.put` and
:meth:`WriteQueue.next_due` cost O(log n) in the items pending
(``benchmarks/event_cost.py``).

Coalescing: a pending final status is never replaced by a non-final one (the final
status wins); otherwise the newest status wins and the item takes the more urgent
class of the two.  A retry's backoff stays, except that a final status joining a
non-final item starts afresh, due at once (docs/decisions.md, "A final starts its
retries afresh"); a metrics-only change's wait ends when a more urgent change joins (a
progress change then carries the newest metrics), and a first or final status has no
gap.  :meth:`WriteQueue.resume` (the API server answers again after an outage) makes
every retry due at once, its backoff started over.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from exporter_lib.status import TrainerStatus
from scraper.shared.targets import Target
from scraper.shared.writes import Priority
from scraper.write.order import WriteOrder

#: Seconds of waiting that move a non-final item up one class.
AGE_SECONDS = 10.0
#: Seconds of waiting that one percentage point between the shown and the pending
#: progress is worth in the order (module doc, 4; ``benchmarks/write_order_sim.py``).
POINT_SECONDS = 2.0
#: The most that being behind can move an item ahead of its round-robin turn, seconds.
MAX_LEAD_SECONDS = 20.0

TrainJobKey = tuple[str, str]


@dataclass(frozen=True)
class Pending:
    """One TrainJob's pending status.

    Attributes:
        key: ``(namespace, name)`` of the TrainJob.
        status: the newest status to apply.
        priority: its class.
        uid: the TrainJob UID it is meant for (``""``: whichever exists).
        queued_at: when the key entered the queue (kept across coalescing).
        not_before: monotonic time before which a retry is not due.
        metrics_due: monotonic time before which a metrics-only change is not due.
        gap: seconds after the key's last write (``since``) before which a progress or
            metrics-only change is not due (the progress floor; 0 for first and final).
        fresh_at: monotonic time this status was put (the newest of a coalesced item).
        attempts: failed tries so far.
        since: monotonic time the key's last write ended (its queued time if none): the
            tie-break that makes a saturated queue round robin.
        seen: when the status's content was first seen (:class:`scraper.shared.writes.Report`).
        finished_at: a final's container end, epoch seconds (None: unknown or not final).
        arrived: epoch seconds the status arrived (the time written instead of a skewed one).
        behind: percentage points between ``status``'s progress and the progress the
            TrainJob shows (0: the same, or either has none).
        confirm: the target whose pod is read before the status is sent (an answer
            that stated no pod: :mod:`scraper.discovery.pod_confirm`); None: no read.
    """

    key: TrainJobKey
    status: TrainerStatus
    priority: Priority
    uid: str = ""
    queued_at: float = 0.0
    not_before: float = 0.0
    metrics_due: float = 0.0
    attempts: int = 0
    since: float = 0.0
    seen: float = float("-inf")
    finished_at: float | None = None
    arrived: float = 0.0
    gap: float = 0.0
    fresh_at: float = 0.0
    behind: int = 0
    confirm: Target | None = None

    def due(self) -> float:
        """Monotonic time from which the item may be handed out."""
        return max(self.not_before, self.metrics_due, self.since + self.gap)

    def ages_from(self) -> float:
        """Monotonic time from which a non-final item's waiting counts (module doc, 3)."""
        return max(self.queued_at, self.metrics_due)


def points_behind(pending: TrainerStatus, shown: TrainerStatus | None) -> int:
    """Percentage points between ``pending``'s progress and ``shown``'s; 0 when either
    has none (a first status ranks by its class, not by this)."""
    if shown is None or pending.progress_percentage is None \
            or shown.progress_percentage is None:
        return 0
    return abs(pending.progress_percentage - shown.progress_percentage)


def _coalesce(old: Pending, new: Pending) -> Pending:
    if old.priority is Priority.FINAL and new.priority is not Priority.FINAL:
        return old
    if new.priority is Priority.FINAL and old.priority is not Priority.FINAL:
        # A final never inherits a progress write's backoff (module doc).
        return replace(new, queued_at=old.queued_at, since=old.since)
    priority = min(old.priority, new.priority)
    metrics_due = new.metrics_due if priority is Priority.METRICS else 0.0
    gap = new.gap if priority > Priority.FIRST else 0.0
    return replace(new, priority=priority, queued_at=old.queued_at,
                   not_before=old.not_before, metrics_due=metrics_due, attempts=old.attempts,
                   since=old.since, gap=gap)


class WriteQueue:
    """Pending statuses by TrainJob (module doc for the rules).

    Args:
        clock: monotonic seconds (injectable for tests).
        age_seconds: see :data:`AGE_SECONDS`.
        point_seconds: see :data:`POINT_SECONDS` (0: plain round robin within a class).
        max_lead_seconds: see :data:`MAX_LEAD_SECONDS`.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 age_seconds: float = AGE_SECONDS, point_seconds: float = POINT_SECONDS,
                 max_lead_seconds: float = MAX_LEAD_SECONDS) -> None:
        self._clock = clock
        self._pending: dict[TrainJobKey, Pending] = {}
        # indexes _pending
        self._order = WriteOrder(self._pending, age_seconds,
                                 lead=lambda behind: min(behind * point_seconds,
                                                         max_lead_seconds))
        self._processing: set[TrainJobKey] = set()
        self._dirty: dict[TrainJobKey, Pending] = {}  # arrived while its key was being written
        self._written: dict[TrainJobKey, float] = {}  # when each key's last write ended
        self._resumed: set[TrainJobKey] = set()  # being written when the API came back
        # Forgotten (TrainJob gone) while being written: its write's end records nothing.
        self._forgotten: set[TrainJobKey] = set()
        # One future per writer task waiting in get(); an added item wakes one of them.
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return len(self._pending) + len(self._dirty)

    def sizes(self) -> dict[str, int]:
        """Entries of each map kept per TrainJob (and of the order's index)."""
        return {"pending": len(self._pending), "processing": len(self._processing),
                "dirty": len(self._dirty), "written": len(self._written),
                "resumed": len(self._resumed), "forgotten": len(self._forgotten),
                **{f"order.{k}": v for k, v in self._order.sizes().items()}}

    def unapplied(self) -> int:
        """TrainJobs with a status not applied yet: queued, or taken by a writer that is
        waiting on the budget or on the API (the pending-writes gauge; a key being
        written with a newer status queued behind it counts once)."""
        # Disjoint: a status for a key being written waits in _dirty, not in _pending.
        return len(self._pending) + len(self._processing)

    def resume(self) -> int:
        """Make every queued retry due now, its backoff started over (the API server
        answers again after an outage); returns how many were.  A write out at this
        moment (e.g. kept waiting by the restarting API server, then refused with 403 while
        its authorizer warms up) is retried at once when it fails, its backoff started
        over too."""
        now = self._clock()
        self._resumed |= self._processing
        resumed = 0
        for table in (self._pending, self._dirty):
            for key, item in table.items():
                if item.attempts or item.not_before > now:
                    table[key] = replace(item, attempts=0, not_before=0.0)
                    if table is self._pending:
                        self._order.add(key, now)
                    resumed += 1
        for _ in range(resumed):
            self._wake_one()
        return resumed

    def pending(self, key: TrainJobKey) -> Pending | None:
        """The item queued (or waiting for its key's write to end) for ``key``."""
        return self._dirty.get(key) or self._pending.get(key)

    def in_progress(self, key: TrainJobKey) -> bool:
        """True while a write of ``key`` is being made (handed out, not yet done)."""
        return key in self._processing

    def counts(self) -> dict[Priority, int]:
        """Queued items per class (for the queue-depth gauge)."""
        out = dict.fromkeys(Priority, 0)
        for item in (*self._pending.values(), *self._dirty.values()):
            out[item.priority] += 1
        return out

    def put(self, key: TrainJobKey, status: TrainerStatus, priority: Priority, *,
            uid: str = "", metrics_due: float = 0.0, seen: float = float("-inf"),
            finished_at: float | None = None, arrived: float = 0.0,
            gap: float = 0.0, shown: TrainerStatus | None = None,
            confirm: Target | None = None) -> None:
        """Queue ``status`` for ``key``, coalesced with what is pending (module doc).

        ``metrics_due`` counts for a metrics-only change, ``gap`` (seconds after the key's
        last write) for a progress or metrics-only change; both are ignored otherwise.
        ``shown`` is the status the TrainJob shows now (how far behind it is, module
        doc, 4).  ``confirm``: :attr:`Pending.confirm` (the newest status's own).
        """
        now = self._clock()
        item = Pending(key, status, priority, uid, queued_at=now,
                       metrics_due=metrics_due if priority is Priority.METRICS else 0.0,
                       since=self._written.get(key, now), seen=seen,
                       finished_at=finished_at, arrived=arrived,
                       gap=gap if priority > Priority.FIRST else 0.0, fresh_at=now,
                       behind=points_behind(status, shown), confirm=confirm)
        self._add(item)

    def _add(self, item: Pending) -> None:
        key = item.key
        table = self._dirty if key in self._processing else self._pending
        old = table.get(key)
        table[key] = item if old is None else _coalesce(old, item)
        if table is self._pending:
            self._order.add(key, self._clock())
        self._idle.clear()
        self._wake_one()

    def forget(self, key: TrainJobKey) -> None:
        """Drop what is pending for ``key`` (the TrainJob is gone)."""
        self._pending.pop(key, None)
        self._order.remove(key)
        self._dirty.pop(key, None)
        self._written.pop(key, None)
        self._resumed.discard(key)
        if key in self._processing:
            self._forgotten.add(key)
        self._check_idle()

    def clear(self) -> None:
        """Drop everything pending (leadership lost: the next leader re-derives it)."""
        self._pending.clear()
        self._order.clear()
        self._dirty.clear()
        self._written.clear()
        self._resumed.clear()
        self._check_idle()

    def take(self) -> Pending | None:
        """The next due item (module doc), now marked in progress; None if none is due."""
        key = self._order.pop(self._clock())
        if key is None:
            return None
        item = self._pending.pop(key)
        self._processing.add(key)
        return item

    def next_due(self) -> float | None:
        """Monotonic time the next queued item is due (None: nothing queued)."""
        return self._order.next_due()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def get(self) -> Pending:
        """Wait for the next due item (:meth:`take`).

        An added item wakes one waiting caller, not all of them (with 10 writer tasks a
        wake-all woke nine for nothing on every put).
        """
        loop = asyncio.get_running_loop()
        while True:
            item = self.take()
            if item is not None:
                return item
            due = self.next_due()
            timeout = None if due is None else max(0.0, due - self._clock())
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                # asyncio.timeout, not wait_for: wait_for wraps the wait in a new task.
                async with asyncio.timeout(timeout):
                    await waiter
            except TimeoutError:
                pass
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken, then cancelled: the wake goes to another
                raise
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def done(self, item: Pending, *, retry_in: float | None = None,
             shown: bool = True) -> None:
        """The write of ``item`` ended; ``retry_in`` seconds: try it again after that.

        A newer status that arrived during the write replaces the retry.  ``shown``: the
        TrainJob now shows ``item``'s status (written, or already there); False when the
        write ended without it (deferred to another writer, not leading, not stored,
        failed for good): a newer status then keeps its distance behind what is shown.
        """
        self._processing.discard(item.key)
        resumed = item.key in self._resumed
        self._resumed.discard(item.key)
        # Forgotten while written (its TrainJob gone): nothing is kept of this write, not
        # its end nor its retry; a status put for a new TrainJob of that name meanwhile is.
        forgotten = item.key in self._forgotten
        self._forgotten.discard(item.key)
        if retry_in is None and not forgotten:
            self._written[item.key] = self._clock()
        newer = self._dirty.pop(item.key, None)
        if newer is not None and retry_in is None and not forgotten:
            newer = replace(newer, since=self._written[item.key])
            if shown:
                newer = replace(newer, behind=points_behind(newer.status, item.status))
        retry = None
        if retry_in is not None and not forgotten:
            # The API came back while this try was out: the retry is the first after it.
            retry = (replace(item, attempts=0, not_before=0.0) if resumed else
                     replace(item, attempts=item.attempts + 1,
                             not_before=self._clock() + retry_in))
        if newer is not None:
            self._add(newer if retry is None else _coalesce(retry, newer))
        elif retry is not None:
            self._add(retry)
        self._check_idle()

    def _check_idle(self) -> None:
        if not self._pending and not self._dirty and not self._processing:
            self._idle.set()

    async def wait_idle(self, seconds: float) -> bool:
        """Wait up to ``seconds`` until nothing is queued or being written."""
        try:
            async with asyncio.timeout(seconds):  # not wait_for: see kube.calls.call
                await self._idle.wait()
        except TimeoutError:
            return False
        return True
