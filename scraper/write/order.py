"""Which pending write is handed out next, in O(log n) per change and per take.

:class:`scraper.write.queue.WriteQueue` states the order (its module doc); this module
keeps indexes so that finding the next item never scans what is pending (a scan cost
milliseconds of CPU per write with 10,000 TrainJobs queued, on the loop that renews
the Lease).  The rule, restated in the terms the indexes use:

* an item is *due* from its ``due()`` (backoff, the metrics wait, the gap after its last write);
* a final ranks by ``(queued_at, key)`` and before every non-final;
* a non-final's class falls by one every ``age`` seconds of waiting from its
  ``ages_from()`` (queued, or the end of a metrics wait) and stops at
  :attr:`Priority.FIRST`, which it *reaches* at ``ages_from() + (priority - FIRST) * age``.
  At a given time every item that reached it ties, ordered by ``(since - lead,
  queued_at, key)`` (``lead``: what the item's ``behind`` is worth); one that has not
  is behind all of those, and among themselves such items rank by the time they reach
  it (the same order as their class now), then the same tie-break.

So each item sits in one of four min-heaps: *waiting* (not due yet, by due time),
*finals*, *climbing* (due, not at FIRST yet, by the time it gets there), *top* (due and
at FIRST); a fifth heap holds every item by due time for :meth:`WriteOrder.next_due`.
An item enters the heap it belongs in when added, and moves waiting -> finals, climbing
or top, and climbing -> top, as time passes (each move once, when a take looks).  A
change of its rank (coalescing, a retry, :meth:`resume
<scraper.write.queue.WriteQueue.resume>`) gives it fresh entries and leaves the old
ones behind, skipped when they reach the head (lazy deletion).  When stale entries
outnumber live ones four to one the heaps are rebuilt (O(n), paid for by as many
changes), so they stay within a constant factor of what is pending.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections.abc import Callable, Mapping
from typing import Protocol

TrainJobKey = tuple[str, str]


class Ranked(Protocol):
    """The fields of a pending item that the order reads."""

    @property
    def priority(self) -> enum.IntEnum: ...

    @property
    def queued_at(self) -> float: ...

    @property
    def since(self) -> float: ...

    def due(self) -> float: ...

    def ages_from(self) -> float: ...

    @property
    def behind(self) -> int: ...


#: Priorities below or at this rank as FINAL: never aged, first (``Priority.FINAL``).
FINAL = 0
#: The class every non-final item ages into (``Priority.FIRST``).
FIRST = 1

# Heap entries: the sort fields, then the key, then the entry's number (unique, so a
# stale entry and a live one of the same key never compare further).  Sort fields:
# due time (waiting, dues); queued_at (finals); since - lead, queued_at (top); the time
# it reaches FIRST, since - lead, queued_at (climbing).
_Entry = tuple[tuple[float, ...], TrainJobKey, int]


def _rank_fields(item: Ranked) -> tuple[int, float, float, float, float, int]:
    return (int(item.priority), item.due(), item.queued_at, item.since, item.ages_from(),
            item.behind)


class WriteOrder:
    """The indexes over the pending items of a write queue (module doc).

    Args:
        items: the queue's pending items by key (read, never changed here); every key
            in it must be :meth:`add` ed, and :meth:`remove` d when it leaves.
        age: seconds of waiting that move a non-final item up one class.
        lead: seconds of waiting that an item's ``behind`` (percentage points) is worth.
    """

    def __init__(self, items: Mapping[TrainJobKey, Ranked], age: float,
                 lead: Callable[[int], float] = lambda behind: 0.0) -> None:
        self._items = items
        self._age = age
        self._lead = lead
        self._numbers: Callable[[], int] = itertools.count().__next__
        # key -> number of its live entries, and the rank fields they were made from
        self._live: dict[TrainJobKey, int] = {}
        self._fields: dict[TrainJobKey, tuple[int, float, float, float, float, int]] = {}
        self._dues: list[_Entry] = []
        self._waiting: list[_Entry] = []
        self._finals: list[_Entry] = []
        self._climbing: list[_Entry] = []
        self._top: list[_Entry] = []

    def __len__(self) -> int:
        return len(self._live)

    def sizes(self) -> dict[str, int]:
        """Entries of each map kept: live keys, their ranks, heap entries (live and stale)."""
        return {"live": len(self._live), "fields": len(self._fields), "entries": self.entries()}

    def entries(self) -> int:
        """Heap entries kept, live and stale (bounded by a constant times ``len``)."""
        return (len(self._dues) + len(self._waiting) + len(self._finals)
                + len(self._climbing) + len(self._top))

    def add(self, key: TrainJobKey, now: float) -> None:
        """Index ``items[key]`` (new, or changed: its old entries go stale if its rank
        changed; a change of status alone keeps them) at monotonic time ``now``."""
        item = self._items[key]
        fields = _rank_fields(item)
        if self._fields.get(key) == fields:
            return
        number = self._numbers()
        self._live[key] = number
        self._fields[key] = fields
        heapq.heappush(self._dues, ((item.due(),), key, number))
        heapq.heappush(*self._place(item, key, number, now))
        self._compact(now)

    def _place(self, item: Ranked, key: TrainJobKey, number: int,
               now: float) -> tuple[list[_Entry], _Entry]:
        """The heap an item belongs in at ``now``, and its entry there."""
        if item.due() > now:
            return self._waiting, ((item.due(),), key, number)
        if item.priority <= FINAL:
            return self._finals, ((item.queued_at,), key, number)
        reaches = item.ages_from() + (int(item.priority) - FIRST) * self._age
        turn = item.since - self._lead(item.behind)
        if reaches <= now:
            return self._top, ((turn, item.queued_at), key, number)
        return self._climbing, ((reaches, turn, item.queued_at), key, number)

    def remove(self, key: TrainJobKey) -> None:
        """Stop indexing ``key`` (taken, forgotten); its entries go stale."""
        self._live.pop(key, None)
        self._fields.pop(key, None)

    def clear(self) -> None:
        """Forget everything."""
        self._live.clear()
        self._fields.clear()
        for heap in (self._dues, self._waiting, self._finals, self._climbing, self._top):
            heap.clear()

    def _is_live(self, key: TrainJobKey, number: int) -> bool:
        return self._live.get(key) == number

    def _promote(self, now: float) -> None:
        """Move what became due to its ready heap, and what reached FIRST to the top."""
        while self._waiting and self._waiting[0][0][0] <= now:
            _, key, number = heapq.heappop(self._waiting)
            if self._is_live(key, number):
                heapq.heappush(*self._place(self._items[key], key, number, now))
        while self._climbing and self._climbing[0][0][0] <= now:
            fields, key, number = heapq.heappop(self._climbing)
            if self._is_live(key, number):
                heapq.heappush(self._top, (fields[1:], key, number))

    def pop(self, now: float) -> TrainJobKey | None:
        """The key of the next due item at ``now`` (module doc), no longer indexed; None
        when nothing is due."""
        self._promote(now)
        key = (self._pop_live(self._finals) or self._pop_live(self._top)
               or self._pop_live(self._climbing))
        if key is not None:
            self.remove(key)
        return key

    def _pop_live(self, heap: list[_Entry]) -> TrainJobKey | None:
        """Pop stale entries, then the head if any; its key."""
        while heap:
            _, key, number = heapq.heappop(heap)
            if self._is_live(key, number):
                return key
        return None

    def next_due(self) -> float | None:
        """The earliest due time of the indexed items (None: none)."""
        while self._dues and not self._is_live(self._dues[0][1], self._dues[0][2]):
            heapq.heappop(self._dues)
        return self._dues[0][0][0] if self._dues else None

    def _compact(self, now: float) -> None:
        """Rebuild the heaps from the live items once stale entries dominate (O(n), paid
        for by as many changes as there are items: O(1) amortised)."""
        if self.entries() <= 4 * len(self._live) + 64:
            return
        keys = list(self._live)
        self.clear()
        for key in keys:
            item = self._items[key]
            number = self._numbers()
            self._live[key] = number
            self._fields[key] = _rank_fields(item)
            self._dues.append(((item.due(),), key, number))
            heap, entry = self._place(item, key, number, now)
            heap.append(entry)
        for heap in (self._dues, self._waiting, self._finals, self._climbing, self._top):
            heapq.heapify(heap)
