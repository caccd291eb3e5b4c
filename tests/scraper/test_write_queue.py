"""The write queue's rules (scraper/write/queue.py), in-process with a fake clock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter_lib.status import TrainerStatus
from scraper.decide.decision import priority_of
from scraper.shared.targets import Target
from scraper.write.queue import AGE_SECONDS, Priority, WriteQueue


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def status(progress: int, **metrics: str) -> TrainerStatus:
    return TrainerStatus.from_api({
        "progressPercentage": progress,
        "metrics": [{"name": k, "value": v} for k, v in metrics.items()],
        "lastUpdatedTime": datetime(2026, 1, 1, tzinfo=UTC)})


def drain(q: WriteQueue) -> list[tuple[str, str]]:
    out = []
    while (item := q.take()) is not None:
        out.append(item.key)
        q.done(item)
    return out


def test_priority_order_finals_first_then_first_progress_metrics() -> None:
    clock = Clock()
    q = WriteQueue(clock=clock)
    q.put(("ns", "metrics"), status(1), Priority.METRICS)
    q.put(("ns", "progress"), status(1), Priority.PROGRESS)
    q.put(("ns", "first"), status(1), Priority.FIRST)
    q.put(("ns", "final-b"), status(1), Priority.FINAL)
    clock.now += 1
    q.put(("ns", "final-a"), status(1), Priority.FINAL)
    assert [k[1] for k in drain(q)] == ["final-b", "final-a", "first", "progress", "metrics"]


def test_ties_are_broken_by_queue_time_then_key() -> None:
    q = WriteQueue(clock=Clock())
    for name in ("c", "a", "b"):
        q.put(("ns", name), status(1), Priority.PROGRESS)
    assert [k[1] for k in drain(q)] == ["a", "b", "c"]  # same time: by key


def test_coalescing_keeps_one_item_with_the_newest_status_and_its_place() -> None:
    clock = Clock()
    q = WriteQueue(clock=clock)
    q.put(("ns", "x"), status(1), Priority.METRICS)
    clock.now += 1
    q.put(("ns", "y"), status(5), Priority.PROGRESS)
    clock.now += 1
    q.put(("ns", "x"), status(2), Priority.PROGRESS)  # newer, and now a progress change
    assert len(q) == 2
    first = q.take()
    assert first is not None and first.key == ("ns", "x")  # kept its earlier place
    assert first.status == status(2) and first.priority is Priority.PROGRESS


A = Target("ns", "x", "x-node-0-0", "uid-a", "http://10.0.0.7:28080/metrics", 30.0)
B = Target("ns", "x", "x-node-0-1", "uid-b", "http://10.0.0.8:28080/metrics", 30.0)


def test_a_coalesced_status_carries_the_pod_to_confirm_of_its_newest_report() -> None:
    """The writer reads the pod of the status it sends (scraper/discovery/pod_confirm.py): the
    newest report's, never an older one's, also across a write in progress and a retry."""
    q = WriteQueue(clock=Clock())
    q.put(("ns", "x"), status(1), Priority.PROGRESS, confirm=A)
    q.put(("ns", "x"), status(2), Priority.PROGRESS)  # stated its pod: no read
    q.put(("ns", "x"), status(3), Priority.PROGRESS, confirm=B)
    item = q.take()
    assert item is not None and item.status == status(3) and item.confirm == B
    q.put(("ns", "x"), status(4), Priority.PROGRESS)  # while B's is being written
    q.done(item, retry_in=0.0)  # B's failed: the newer report supersedes it
    nxt = q.take()
    assert nxt is not None and nxt.status == status(4) and nxt.confirm is None
    q.done(nxt, retry_in=0.0)  # a retry keeps its own
    again = q.take()
    assert again is not None and again.status == status(4) and again.confirm is None
    q.done(again)
    q.put(("ns", "x"), status(100), Priority.FINAL)  # from the pod object: no read
    q.put(("ns", "x"), status(5), Priority.PROGRESS, confirm=A)
    final = q.take()
    assert final is not None and final.status == status(100) and final.confirm is None


def test_a_final_status_is_never_replaced_by_a_later_scrape() -> None:
    q = WriteQueue(clock=Clock())
    q.put(("ns", "x"), status(100), Priority.FINAL)
    q.put(("ns", "x"), status(40), Priority.PROGRESS)
    item = q.take()
    assert item is not None and item.status == status(100) and item.priority is Priority.FINAL


def test_a_key_being_written_is_not_handed_out_twice_and_the_newest_follows() -> None:
    q = WriteQueue(clock=Clock())
    q.put(("ns", "x"), status(1), Priority.PROGRESS)
    item = q.take()
    assert item is not None
    q.put(("ns", "x"), status(2), Priority.PROGRESS)
    q.put(("ns", "x"), status(3), Priority.PROGRESS)
    assert q.take() is None  # in progress: the newer status waits
    q.done(item)
    nxt = q.take()
    assert nxt is not None and nxt.status == status(3)


def test_failed_write_is_retried_after_its_backoff_unless_superseded() -> None:
    clock = Clock()
    q = WriteQueue(clock=clock)
    q.put(("ns", "x"), status(100), Priority.FINAL)
    item = q.take()
    assert item is not None
    q.done(item, retry_in=5.0)
    assert q.take() is None
    clock.now += 5.0
    again = q.take()
    assert again is not None and again.attempts == 1 and again.status == status(100)


def test_metrics_only_change_is_held_until_its_interval_ends() -> None:
    clock = Clock()
    q = WriteQueue(clock=clock)
    q.put(("ns", "x"), status(1, loss="0.5"), Priority.METRICS, metrics_due=clock.now + 30)
    assert q.take() is None
    clock.now += 30
    assert q.take() is not None
    # A progress change joining a held metrics-only item ends the hold.
    q.put(("ns", "y"), status(1, loss="0.5"), Priority.METRICS, metrics_due=clock.now + 30)
    q.put(("ns", "y"), status(2, loss="0.4"), Priority.PROGRESS)
    item = q.take()
    assert item is not None and item.key == ("ns", "y")


def test_aging_lets_an_old_metrics_change_pass_fresh_progress_changes() -> None:
    clock = Clock()
    q = WriteQueue(clock=clock)
    q.put(("ns", "old-metrics"), status(1), Priority.METRICS)
    clock.now += 2 * AGE_SECONDS
    q.put(("ns", "fresh-progress"), status(1), Priority.PROGRESS)
    assert drain(q)[0] == ("ns", "old-metrics")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30),
                          st.sampled_from([Priority.FIRST, Priority.PROGRESS, Priority.METRICS])),
                min_size=1, max_size=300))
def test_under_a_saturated_budget_no_trainjob_starves(puts: list[tuple[int, Priority]]) -> None:
    """Each tick one write and one new change (31 TrainJobs).  Strict priority would let a
    stream of progress changes starve a metrics-only one; with aging every key is written
    within (classes apart * AGE_SECONDS + keys) ticks, however long the run."""
    clock = Clock()
    q = WriteQueue(clock=clock)
    waiting: dict[tuple[str, str], float] = {}
    longest = 0.0
    for tick, (job, priority) in enumerate(puts):
        key = ("ns", f"job-{job}")
        q.put(key, status(tick % 101), priority)
        waiting.setdefault(key, clock.now)
        clock.now += 1
        item = q.take()
        if item is not None:
            longest = max(longest, clock.now - waiting.pop(item.key))
            q.done(item)
    bound = (Priority.METRICS - Priority.FIRST) * AGE_SECONDS + 31 + 1
    while (item := q.take()) is not None:
        clock.now += 1
        longest = max(longest, clock.now - waiting.pop(item.key))
        q.done(item)
    assert not waiting
    assert longest <= bound


def test_priority_of_classifies_against_what_the_trainjob_holds() -> None:
    assert priority_of(None, status(1), final=False) is Priority.FIRST
    assert priority_of(status(1), status(2), final=False) is Priority.PROGRESS
    assert priority_of(status(1, a="1"), status(1, a="2"), final=False) is Priority.METRICS
    assert priority_of(status(1), status(1), final=True) is Priority.FINAL


async def test_get_waits_for_a_due_item_and_wait_idle_sees_the_end() -> None:
    q = WriteQueue()
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0.01)
    assert not getter.done()
    q.put(("ns", "x"), status(1), Priority.PROGRESS)
    item = await asyncio.wait_for(getter, 1)
    assert not await q.wait_idle(0.01)
    q.done(item)
    assert await q.wait_idle(0.01)


@pytest.mark.parametrize("forget", ["forget", "clear"])
def test_forgotten_keys_are_not_written(forget: str) -> None:
    q = WriteQueue(clock=Clock())
    q.put(("ns", "x"), status(100), Priority.FINAL)
    if forget == "forget":
        q.forget(("ns", "x"))
    else:
        q.clear()
    assert q.take() is None and len(q) == 0


def test_a_stream_of_progress_changes_does_not_starve_a_metrics_only_change() -> None:
    """The adversarial case: the budget writes one item per second and a new progress
    change arrives every second; strict priority would never reach the metrics change."""
    clock = Clock()
    q = WriteQueue(clock=clock)
    q.put(("ns", "metrics-only"), status(1, loss="0.5"), Priority.METRICS)
    written_at = None
    for tick in range(200):
        q.put(("ns", f"busy-{tick}"), status(tick % 101), Priority.PROGRESS)
        clock.now += 1
        item = q.take()
        assert item is not None
        q.done(item)
        if item.key == ("ns", "metrics-only"):
            written_at = tick
            break
    assert written_at is not None and written_at <= 2 * AGE_SECONDS + 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=200, max_size=400))
def test_a_saturated_queue_is_round_robin_by_last_write(delays: list[int]) -> None:
    """20 TrainJobs changing all the time, one write per tick: each change is found by a
    scrape 0-5 ticks after the TrainJob's last write (``delays``).  Ordered by queue time
    the gap between two writes of one TrainJob drifts up to 20 + 5 ticks; ordered by the
    last write it stays 20 (issue 14: longest gap <= N / QPS)."""
    clock = Clock()
    q = WriteQueue(clock=clock)
    keys = [("ns", f"job-{i:02d}") for i in range(20)]
    for key in keys:
        q.put(key, status(0), Priority.PROGRESS)
    requeue: list[tuple[float, tuple[str, str]]] = []
    last: dict[tuple[str, str], float] = {}
    longest = 0.0
    for tick, delay in enumerate(delays):
        clock.now += 1
        for at, key in [r for r in requeue if r[0] <= clock.now]:
            requeue.remove((at, key))
            q.put(key, status(tick % 101), Priority.PROGRESS)
        item = q.take()
        assert item is not None, f"tick {tick}: nothing queued"
        if item.key in last:
            longest = max(longest, clock.now - last[item.key])
        last[item.key] = clock.now
        q.done(item)
        requeue.append((clock.now + delay, item.key))
    assert longest == 20


def test_writers_scale_with_the_budget() -> None:
    """Enough writers that the budget caps the rate while a request takes 0.5 s, within
    bounds (a benchmark's budget of 10**6/s once started 500000 writer tasks)."""
    from scraper.write.worker import WRITERS, WRITERS_MAX, writers_for

    assert writers_for(1) == WRITERS
    assert writers_for(20) == 10
    assert writers_for(20.5) == 11
    assert writers_for(1e6) == WRITERS_MAX
    for qps in (0.1, 5, 20, 64, 100, 1000):
        assert WRITERS <= writers_for(qps) <= WRITERS_MAX
        assert writers_for(qps) >= min(WRITERS_MAX, qps * 0.5)


async def test_each_put_wakes_one_waiting_getter_and_every_item_is_taken() -> None:
    q = WriteQueue()
    getters = [asyncio.create_task(q.get()) for _ in range(10)]
    await asyncio.sleep(0.01)
    for i in range(3):
        q.put(("ns", f"a{i}"), status(i), Priority.PROGRESS)
    await asyncio.sleep(0.01)
    assert sum(g.done() for g in getters) == 3
    for i in range(7):
        q.put(("ns", f"b{i}"), status(i), Priority.PROGRESS)
    items = await asyncio.wait_for(asyncio.gather(*getters), 1)
    assert sorted(item.key[1] for item in items) == sorted(
        [f"a{i}" for i in range(3)] + [f"b{i}" for i in range(7)])


async def test_a_woken_getter_cancelled_before_it_runs_passes_the_wake_on() -> None:
    """The writer's stop() may cancel the very task a put just woke: the item must still
    reach another waiting getter, not sit queued while it sleeps."""
    q = WriteQueue()
    first = asyncio.create_task(q.get())
    await asyncio.sleep(0.01)
    second = asyncio.create_task(q.get())
    await asyncio.sleep(0.01)
    q.put(("ns", "x"), status(1), Priority.PROGRESS)  # wakes the first waiter
    first.cancel()
    item = await asyncio.wait_for(second, 1)
    assert item.key == ("ns", "x")
    with pytest.raises(asyncio.CancelledError):
        await first


@pytest.mark.parametrize("shown", [True, False])
def test_a_status_that_waited_for_a_write_is_measured_against_what_the_trainjob_shows(
        shown: bool) -> None:
    """A write that put its status there (written, or already stored) is what the
    TrainJob shows; one that ended without it (deferred, not leading, not stored, failed
    for good) leaves the newer status as far behind as before."""
    q = WriteQueue(clock=Clock())
    q.put(("ns", "x"), status(50), Priority.PROGRESS, shown=status(10))
    item = q.take()
    assert item is not None and item.behind == 40
    q.put(("ns", "x"), status(51), Priority.PROGRESS, shown=status(10))
    q.done(item, shown=shown)
    nxt = q.take()
    assert nxt is not None and nxt.status == status(51)
    assert nxt.behind == (1 if shown else 41)
