"""The write queue after an API outage (issue 21, input 6), in-process with a fake clock:
a final never inherits a progress write's backoff, a recovery makes every retry due at
once, and what a writer took off the queue still counts as not applied."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from exporter_lib.status import TrainerStatus
from scraper.write.queue import Priority, WriteQueue
from scraper.write.worker import QUEUE_BACKOFF

KEY = ("ns", "job")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def status(progress: int) -> TrainerStatus:
    return TrainerStatus.from_api({"progressPercentage": progress, "metrics": [],
                                   "lastUpdatedTime": datetime(2026, 1, 1, tzinfo=UTC)})


def failed_times(queue: WriteQueue, clock: Clock, times: int) -> None:
    """Fail the write of KEY ``times`` times, each after its backoff."""
    for _ in range(times):
        clock.now = queue.next_due() or clock.now
        item = queue.take()
        assert item is not None
        queue.done(item, retry_in=QUEUE_BACKOFF.delay(item.attempts))


@given(failures=st.integers(1, 12), during=st.booleans())
def test_a_final_never_inherits_a_progress_writes_backoff(failures: int, during: bool) -> None:
    """A final joining a progress write that failed ``failures`` times is due at once with
    no failed tries, whether it joins the queued retry or arrives while a try is out."""
    clock = Clock()
    queue = WriteQueue(clock=clock)
    queue.put(KEY, status(40), Priority.PROGRESS)
    failed_times(queue, clock, failures)
    clock.now = queue.next_due() or clock.now
    if during:
        item = queue.take()
        assert item is not None
        queue.put(KEY, status(100), Priority.FINAL)
        queue.done(item, retry_in=QUEUE_BACKOFF.delay(item.attempts))
    else:
        queue.put(KEY, status(100), Priority.FINAL)
    final = queue.take()
    assert final is not None, "the final waits on the progress write's backoff"
    assert final.priority is Priority.FINAL and final.status.progress_percentage == 100
    assert final.attempts == 0


@given(keys=st.integers(1, 6), failures=st.integers(1, 12))
def test_resume_makes_every_retry_due_at_once_with_its_backoff_started_over(
        keys: int, failures: int) -> None:
    clock = Clock()
    queue = WriteQueue(clock=clock)
    names = [("ns", f"job-{i}") for i in range(keys)]
    for key in names:
        queue.put(key, status(1), Priority.PROGRESS)
    for _ in range(failures):
        clock.now += 60.0  # every retry due
        items = [queue.take() for _ in names]
        for item in items:
            assert item is not None
            queue.done(item, retry_in=QUEUE_BACKOFF.delay(item.attempts))
    assert queue.take() is None  # every one backing off
    assert queue.resume() == keys
    taken = [queue.take() for _ in names]
    assert all(t is not None and t.attempts == 0 for t in taken)


def test_a_write_out_when_the_api_comes_back_is_retried_at_once() -> None:
    """The try in flight at the recovery (the restarting API server held it, then its
    warming authorizer refused it) is retried at once, not after its grown backoff."""
    clock = Clock()
    queue = WriteQueue(clock=clock)
    queue.put(KEY, status(40), Priority.PROGRESS)
    failed_times(queue, clock, 8)
    clock.now = queue.next_due() or clock.now
    item = queue.take()
    assert item is not None and item.attempts == 8
    queue.resume()  # the API answers again while this try is out
    queue.done(item, retry_in=QUEUE_BACKOFF.delay(item.attempts))  # then 403
    again = queue.take()
    assert again is not None and again.attempts == 0
    queue.done(again, retry_in=QUEUE_BACKOFF.delay(again.attempts))  # 403 once more
    assert queue.take() is None  # from now on its own, short backoff
    assert queue.next_due() is not None and queue.next_due() - clock.now <= 0.3  # type: ignore[operator]


def test_unapplied_counts_what_a_writer_took_and_waits_on_the_budget_for() -> None:
    """The pending-writes gauge read 0 while three finals waited on the budget."""
    clock = Clock()
    queue = WriteQueue(clock=clock)
    for i in range(3):
        queue.put(("ns", f"job-{i}"), status(100), Priority.FINAL)
    taken = [queue.take() for _ in range(3)]  # three writers wait for a token
    assert len(queue) == 0 and queue.unapplied() == 3
    queue.put(("ns", "job-0"), status(100), Priority.FINAL)  # a newer one behind a try
    assert queue.unapplied() == 3
    for item in taken:
        assert item is not None
        queue.done(item)
    assert queue.unapplied() == 1  # the newer one of job-0
