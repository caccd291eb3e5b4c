"""The indexed write queue hands out the same items in the same order as the rules say.

``Model`` below is a plain reading of the rules in ``scraper/write/queue.py``'s module
doc: it keeps every record in a dict and, on each take, sorts all due records by the
stated rule with exact fractions.  Hypothesis drives both it and the real queue with the
same operations (puts of each class, holds, time passing, takes, successful and failed
writes, statuses arriving during a write, the progress floor's gap after a write,
forget, clear, the API coming back) and
compares every item handed out, ``next_due`` and the counts after each step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from fractions import Fraction

from hypothesis import example, given, settings
from hypothesis import strategies as st

from exporter_lib.status import TrainerStatus
from scraper.write.order import WriteOrder
from scraper.write.queue import Pending, Priority, WriteQueue

AGE = 10
POINT = 3  # seconds of waiting a percentage point behind is worth
MAX_LEAD = 20  # at most, in all
KEYS = [("ns", f"job-{i}") for i in range(6)]


def status(n: int) -> TrainerStatus:
    return TrainerStatus.from_api({"progressPercentage": n % 101, "metrics": [],
                                   "lastUpdatedTime": datetime(2026, 1, 1, tzinfo=UTC)})


@dataclass(frozen=True)
class Record:
    status: int
    cls: Priority
    queued: int
    not_before: int = 0
    hold: int = 0
    attempts: int = 0
    since: int = 0
    gap: int = 0
    behind: int = 0  # points between this status's progress and the one shown

    def due(self) -> int:
        """Backoff, the metrics hold, and the progress floor after the last write."""
        return max(self.not_before, self.hold, self.since + self.gap)


class Model:
    """The ordering rules, spelled out (not the queue's code)."""

    def __init__(self) -> None:
        self.now = 1000
        self.queued: dict[tuple[str, str], Record] = {}
        self.arrived_during_write: dict[tuple[str, str], Record] = {}
        self.writing: set[tuple[str, str]] = set()
        self.last_write: dict[tuple[str, str], int] = {}
        self.back_meanwhile: set[tuple[str, str]] = set()
        # Forgotten (TrainJob gone) while being written: that write leaves nothing behind.
        self.gone_meanwhile: set[tuple[str, str]] = set()

    @staticmethod
    def join(old: Record, new: Record) -> Record:
        """Coalescing: a final is never replaced by a non-final; a final joining a
        non-final is due at once with no failed tries; otherwise the newest status with
        the more urgent class, and the old place, backoff and tries; the hold and the
        gap only while the class has them."""
        if old.cls == Priority.FINAL:
            return old if new.cls != Priority.FINAL else replace(
                new, queued=old.queued, not_before=old.not_before, hold=0,
                attempts=old.attempts, since=old.since)
        if new.cls == Priority.FINAL:
            return replace(new, queued=old.queued, since=old.since)
        cls = Priority(min(old.cls, new.cls))
        return Record(new.status, cls, old.queued, old.not_before,
                      new.hold if cls == Priority.METRICS else 0, old.attempts, old.since,
                      new.gap if cls > Priority.FIRST else 0, new.behind)

    def put(self, key: tuple[str, str], n: int, cls: Priority, hold: int, gap: int,
            shown: int | None) -> None:
        """``shown``: the progress the TrainJob shows (None: none)."""
        record = Record(n, cls, self.now, hold=hold if cls == Priority.METRICS else 0,
                        since=self.last_write.get(key, self.now),
                        gap=gap if cls > Priority.FIRST else 0,
                        behind=0 if shown is None else abs(n % 101 - shown))
        self.enqueue(key, record)

    def enqueue(self, key: tuple[str, str], record: Record) -> None:
        slot = self.arrived_during_write if key in self.writing else self.queued
        slot[key] = record if key not in slot else self.join(slot[key], record)

    def order(self, key: tuple[str, str], r: Record) -> tuple[object, ...]:
        if r.cls == Priority.FINAL:
            return (0, r.queued, key)
        waited = Fraction(self.now - max(r.queued, r.hold), AGE)  # a hold is no waiting
        # Each point behind counts as POINT seconds of waiting since the last write, up to
        # MAX_LEAD in all.
        turn = r.since - min(r.behind * POINT, MAX_LEAD)
        return (1, max(Fraction(int(r.cls)) - waited, Fraction(1)), turn, r.queued, key)

    def take(self) -> tuple[tuple[str, str], Record] | None:
        due = [(k, r) for k, r in self.queued.items() if r.due() <= self.now]
        if not due:
            return None
        key, record = sorted(due, key=lambda kr: self.order(*kr))[0]
        del self.queued[key]
        self.writing.add(key)
        return key, record

    def done(self, key: tuple[str, str], record: Record, retry_in: int | None) -> None:
        self.writing.discard(key)
        back = key in self.back_meanwhile
        self.back_meanwhile.discard(key)
        gone = key in self.gone_meanwhile
        self.gone_meanwhile.discard(key)
        newer = self.arrived_during_write.pop(key, None)
        if gone:
            # Neither its end nor its retry is kept; a status put after the forget is.
            if newer is not None:
                self.enqueue(key, newer)
            return
        if retry_in is None:
            self.last_write[key] = self.now
        if newer is not None and retry_in is None:
            # The TrainJob now shows what was just written.
            newer = replace(newer, since=self.now,
                            behind=abs(newer.status % 101 - record.status % 101))
        if retry_in is None:
            if newer is not None:
                self.enqueue(key, newer)
            return
        retry = (replace(record, attempts=0, not_before=0) if back else
                 replace(record, attempts=record.attempts + 1,
                         not_before=self.now + retry_in))
        self.enqueue(key, retry if newer is None else self.join(retry, newer))

    def forget(self, key: tuple[str, str]) -> None:
        for table in (self.queued, self.arrived_during_write, self.last_write):
            table.pop(key, None)
        self.back_meanwhile.discard(key)
        if key in self.writing:
            self.gone_meanwhile.add(key)

    def clear(self) -> None:
        for table in (self.queued, self.arrived_during_write, self.last_write):
            table.clear()
        self.back_meanwhile.clear()

    def resume(self) -> None:
        self.back_meanwhile |= self.writing
        for table in (self.queued, self.arrived_during_write):
            for key, r in list(table.items()):
                if r.attempts or r.not_before > self.now:
                    table[key] = replace(r, attempts=0, not_before=0)

    def next_due(self) -> int | None:
        return min((r.due() for r in self.queued.values()), default=None)


class Clock:
    def __init__(self, model: Model) -> None:
        self.model = model

    def __call__(self) -> float:
        return float(self.model.now)


key_index = st.integers(0, len(KEYS) - 1)
operations = st.lists(st.one_of(
    st.tuples(st.just("put"), key_index, st.sampled_from(list(Priority)),
              st.sampled_from([0, 0, 4, 15, 30]),
              st.sampled_from([0, 0, 1, 5, 12]),
              st.one_of(st.none(), st.integers(0, 100))),
    st.tuples(st.just("tick"), st.integers(0, 12)),
    st.tuples(st.just("take"), st.integers(0, 2)),
    st.tuples(st.just("done"), st.integers(0, 5), st.one_of(st.none(), st.integers(0, 30))),
    st.tuples(st.just("forget"), key_index),
    st.tuples(st.just("clear")),
    st.tuples(st.just("resume")),
), min_size=1, max_size=120)


def same(item: Pending, key: tuple[str, str], record: Record) -> bool:
    return (item.key == key and item.status == status(record.status)
            and item.priority == record.cls and item.queued_at == record.queued
            and item.attempts == record.attempts and item.since == record.since
            and item.due() == record.due() and item.behind == record.behind)


@settings(max_examples=400, deadline=None)
@given(operations)
# A held metrics-only change ages from the end of its hold, not from when it was queued.
@example([("put", 0, Priority.METRICS, 20, 0, None), ("tick", 15),
          ("put", 1, Priority.PROGRESS, 0, 0, None), ("tick", 5), ("take", 1)])
# The TrainJob furthest behind goes first among equals; the lead is capped.
# A newer status joining a pending one brings its own distance behind, and the order's
# index follows it.
@example([("put", 0, Priority.PROGRESS, 0, 0, None), ("put", 1, Priority.PROGRESS, 0, 0, None),
          ("put", 1, Priority.PROGRESS, 0, 0, 0), ("take", 0)])
# A status that arrived during a write is measured against what that write put there.
@example([("put", 0, Priority.PROGRESS, 0, 0, None), ("put", 1, Priority.PROGRESS, 0, 0, None),
          ("take", 0), ("put", 0, Priority.PROGRESS, 0, 0, 100), ("tick", 15),
          ("done", 0, None), ("take", 0)])
@example([("put", 0, Priority.PROGRESS, 0, 0, 0), ("put", 1, Priority.PROGRESS, 0, 0, 60),
          ("put", 2, Priority.PROGRESS, 0, 0, None), ("tick", 30), ("take", 2)])
# A TrainJob forgotten while its write is out: the failed write is not retried, and a
# status put for a new TrainJob of that name meanwhile is queued (CI, 2026-12-03).
@example([("put", 4, Priority.FINAL, 0, 0, None), ("take", 0), ("forget", 4),
          ("put", 4, Priority.PROGRESS, 0, 0, None), ("done", 0, 0), ("take", 0)])
@example([("put", 4, Priority.FINAL, 0, 0, None), ("take", 0), ("forget", 4),
          ("done", 0, 0)])
def test_the_indexed_queue_follows_the_rules_step_by_step(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    model = Model()
    queue = WriteQueue(clock=Clock(model), age_seconds=AGE, point_seconds=POINT,
                       max_lead_seconds=MAX_LEAD)
    out: list[tuple[Pending, Record]] = []  # taken, not done yet (model and queue alike)
    for n, op in enumerate(ops):
        if op[0] == "put":
            _, k, cls, hold, gap, shown = op
            model.put(KEYS[k], n, cls, model.now + hold, gap, shown)
            queue.put(KEYS[k], status(n), cls, metrics_due=float(model.now + hold),
                      gap=float(gap), shown=None if shown is None else status(shown))
        elif op[0] == "tick":
            model.now += op[1]
        elif op[0] == "take":
            for _ in range(op[1] + 1):
                expected = model.take()
                item = queue.take()
                if expected is None:
                    assert item is None
                    continue
                assert item is not None and same(item, *expected), (item, expected)
                out.append((item, expected[1]))
        elif op[0] == "done" and out:
            item, record = out.pop(op[1] % len(out))
            retry = op[2]
            model.done(item.key, record, retry)
            queue.done(item, retry_in=None if retry is None else float(retry))
        elif op[0] == "forget":
            model.forget(KEYS[op[1]])
            queue.forget(KEYS[op[1]])
        elif op[0] == "clear":
            model.clear()
            queue.clear()
        elif op[0] == "resume":
            model.resume()
            queue.resume()
        assert queue.next_due() == model.next_due()
        assert len(queue) == len(model.queued) + len(model.arrived_during_write)
        assert queue.unapplied() == len(model.queued.keys() | model.writing)


@dataclass(frozen=True)
class Item:
    priority: Priority
    queued_at: float
    since: float
    at: float
    behind: int = 0

    def due(self) -> float:
        return self.at

    def ages_from(self) -> float:
        return self.queued_at


def test_changes_leave_a_bounded_number_of_stale_entries() -> None:
    """Every change of rank leaves stale heap entries behind; they are dropped before
    they outnumber the live items by more than a constant factor."""
    items: dict[tuple[str, str], Item] = {}
    order = WriteOrder(items, AGE)
    for i in range(1000):
        items[KEYS[0]] = Item(Priority.PROGRESS, 0.0, 0.0, float(i))
        order.add(KEYS[0], 0.0)
    assert len(order) == 1
    assert order.entries() <= 4 * len(order) + 64
    for i in range(50_000):
        key = ("ns", f"many-{i % 5000}")
        items[key] = Item(Priority(i % 4), float(i), 0.0, float(i % 7))
        order.add(key, 0.0)
    assert order.entries() <= 4 * len(order) + 64
    taken = []
    while (key := order.pop(1e9)) is not None:
        taken.append(key)
    assert len(taken) == len(items)
