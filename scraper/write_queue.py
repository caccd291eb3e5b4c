"""The write queue: at most one pending status per TrainJob, in priority order, fairly.

Like client-go's workqueue: a key is queued once; a newer status for a queued key
replaces the pending one (coalesced) and keeps its place; a key being written is not
handed out twice, and a status that arrives meanwhile is queued when that write is
:meth:`WriteQueue.done`.  No Kubernetes here; :class:`scraper.status_writer.StatusWriter`
feeds and drains it.

Order of :meth:`WriteQueue.get` (the rule, tested in ``tests/scraper/test_write_queue.py``):

1. only items that are due (a retry's backoff and a metrics-only hold have passed);
2. final statuses first, oldest first (in the order the pods ended);
3. then by class, first statuses (the TrainJob holds none of ours yet), progress
   changes, metrics-only changes, where each :data:`AGE_SECONDS` of waiting moves an
   item up one class: a metrics-only change that waited 20 s ranks with a fresh progress
   change, so under a saturated budget no TrainJob starves;
4. ties: the TrainJob whose last write through this queue ended longest ago (a key
   never written: from when it was queued), then the key queued first, then the key
   itself (deterministic).  Under a saturated budget every waiting item has aged
   into the same class, so this is round robin: each TrainJob gets its next write
   about N / QPS seconds after its last one, whenever the scrape that found its
   change ran (``benchmarks/cluster_scale.py``, steady state).

Coalescing: a pending final status is never replaced by a non-final one (the final
status wins); otherwise the newest status wins and the item takes the more urgent
class of the two.  A retry's backoff stays; a metrics-only hold ends when a more urgent
change joins.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from exporter_lib.status import TrainerStatus

#: Seconds of waiting that move a non-final item up one class.
AGE_SECONDS = 10.0

TrainJobKey = tuple[str, str]


class Priority(enum.IntEnum):
    """Write classes, most urgent first; ``name.lower()`` is the metrics label."""

    FINAL = 0
    FIRST = 1
    PROGRESS = 2
    METRICS = 3


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
        hold_until: monotonic time before which a metrics-only change is not due.
        attempts: failed tries so far.
        since: monotonic time the key's last write ended (its queued time if none): the
            tie-break that makes a saturated queue round robin.
        seen: when the status's content was first seen (:class:`scraper.writer_rules.Report`).
        finished_at: a final's container end, epoch seconds (None: unknown or not final).
        arrived: epoch seconds the status arrived (the time written instead of a skewed one).
    """

    key: TrainJobKey
    status: TrainerStatus
    priority: Priority
    uid: str = ""
    queued_at: float = 0.0
    not_before: float = 0.0
    hold_until: float = 0.0
    attempts: int = 0
    since: float = 0.0
    seen: float = float("-inf")
    finished_at: float | None = None
    arrived: float = 0.0

    def due(self) -> float:
        """Monotonic time from which the item may be handed out."""
        return max(self.not_before, self.hold_until)


def _coalesce(old: Pending, new: Pending) -> Pending:
    if old.priority is Priority.FINAL and new.priority is not Priority.FINAL:
        return old
    priority = min(old.priority, new.priority)
    hold = new.hold_until if priority is Priority.METRICS else 0.0
    return replace(new, priority=priority, queued_at=old.queued_at,
                   not_before=old.not_before, hold_until=hold, attempts=old.attempts,
                   since=old.since)


class WriteQueue:
    """Pending statuses by TrainJob (module doc for the rules).

    Args:
        clock: monotonic seconds (injectable for tests).
        age_seconds: see :data:`AGE_SECONDS`.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 age_seconds: float = AGE_SECONDS) -> None:
        self._clock = clock
        self._age = age_seconds
        self._pending: dict[TrainJobKey, Pending] = {}
        self._processing: set[TrainJobKey] = set()
        self._dirty: dict[TrainJobKey, Pending] = {}  # arrived while its key was being written
        self._written: dict[TrainJobKey, float] = {}  # when each key's last write ended
        # One future per writer task waiting in get(); an added item wakes one of them.
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return len(self._pending) + len(self._dirty)

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
            uid: str = "", hold_until: float = 0.0, seen: float = float("-inf"),
            finished_at: float | None = None, arrived: float = 0.0) -> None:
        """Queue ``status`` for ``key``, coalesced with what is pending (module doc)."""
        now = self._clock()
        item = Pending(key, status, priority, uid, queued_at=now,
                       hold_until=hold_until if priority is Priority.METRICS else 0.0,
                       since=self._written.get(key, now), seen=seen,
                       finished_at=finished_at, arrived=arrived)
        self._add(item)

    def _add(self, item: Pending) -> None:
        key = item.key
        table = self._dirty if key in self._processing else self._pending
        old = table.get(key)
        table[key] = item if old is None else _coalesce(old, item)
        self._idle.clear()
        self._wake_one()

    def forget(self, key: TrainJobKey) -> None:
        """Drop what is pending for ``key`` (the TrainJob is gone)."""
        self._pending.pop(key, None)
        self._dirty.pop(key, None)
        self._written.pop(key, None)
        self._check_idle()

    def clear(self) -> None:
        """Drop everything pending (leadership lost: the next leader re-derives it)."""
        self._pending.clear()
        self._dirty.clear()
        self._written.clear()
        self._check_idle()

    def _rank(self, item: Pending,
              now: float) -> tuple[int, float, float, float, TrainJobKey]:
        if item.priority is Priority.FINAL:
            return (0, 0.0, 0.0, item.queued_at, item.key)
        aged = item.priority - (now - item.queued_at) / self._age
        return (1, max(aged, float(Priority.FIRST)), item.since, item.queued_at, item.key)

    def take(self) -> Pending | None:
        """The next due item (module doc), now marked in progress; None if none is due."""
        now = self._clock()
        ready = [p for p in self._pending.values() if p.due() <= now]
        if not ready:
            return None
        item = min(ready, key=lambda p: self._rank(p, now))
        del self._pending[item.key]
        self._processing.add(item.key)
        return item

    def next_due(self) -> float | None:
        """Monotonic time the next queued item is due (None: nothing queued)."""
        return min((p.due() for p in self._pending.values()), default=None)

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

    def done(self, item: Pending, *, retry_in: float | None = None) -> None:
        """The write of ``item`` ended; ``retry_in`` seconds: try it again after that.

        A newer status that arrived during the write replaces the retry.
        """
        self._processing.discard(item.key)
        if retry_in is None:
            self._written[item.key] = self._clock()
        newer = self._dirty.pop(item.key, None)
        if newer is not None and retry_in is None:
            newer = replace(newer, since=self._written[item.key])
        if newer is not None:
            if retry_in is not None:
                newer = _coalesce(replace(item, attempts=item.attempts + 1,
                                          not_before=self._clock() + retry_in), newer)
            self._add(newer)
        elif retry_in is not None:
            self._add(replace(item, attempts=item.attempts + 1,
                              not_before=self._clock() + retry_in))
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
