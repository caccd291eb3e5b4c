"""The scrape-loop stage in-process: every rule it owns, with fakes for its neighbours.

The neighbours (the exporter scraper, the Event recorder, the scheduler) are in-process
fakes of their Protocols in :mod:`scraper.scrape.loop` and :mod:`scraper.scrape.manager`; the real
ones are exercised against real exporters and the real API server by the other tests of
this folder.  The status writer is the real :class:`~scraper.write.queue.WriteQueue`
behind a stand-in for the API server (:class:`QueueWriter`: what each TrainJob stores,
in memory), so a final waits in the queue as it does in production and leadership
changes clear it as ``ScraperApp`` does; tests of the loop's reaction to one writer
outcome script that outcome instead.  The clock is a fake too, so backoff and Event
dedupe are checked without sleeping.  No cluster needed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from exporter_lib.status import TrainerStatus
from scraper.discovery.pod_targets import PodTargets
from scraper.scrape.loop import (
    DETAIL_MAX,
    EVENT_REPEAT_SECONDS,
    REASON_FINAL_INVALID,
    REASON_INVALID,
    REASON_SCRAPE_FAILED,
    ScrapeLoop,
)
from scraper.scrape.manager import TargetManager
from scraper.scrape.target_state import TargetState
from scraper.shared.outcome import WriteOutcome
from scraper.shared.pod_check import PodCheck
from scraper.shared.scrapes import (
    Busy,
    Failure,
    FailureKind,
    Fresh,
    NothingYet,
    NotModified,
    ScrapeResult,
)
from scraper.shared.targets import Final, Target
from scraper.shared.trainjobs import TrainJobGone
from scraper.telemetry import JobView
from scraper.write.queue import Priority, WriteQueue

NS, TJ, POD = "ns", "tj", "tj-node-0-0"


def _status(progress: int) -> TrainerStatus:
    return TrainerStatus(progress_percentage=progress,
                         last_updated_time=datetime(2025, 1, 1, tzinfo=UTC))


def _target(url: str = "http://10.0.0.7:28080/metrics", interval: float = 10.0) -> Target:
    return Target(NS, TJ, POD, "uid-1", url, interval)


# ---------------------------------------------------------------- fakes


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeScraper:
    """Answers each scrape with the next queued result (the last one repeats)."""

    results: list[ScrapeResult] = field(default_factory=list)
    calls: list[tuple[str, str | None]] = field(default_factory=list)
    gate: asyncio.Event | None = None  # when set: a scrape waits for it
    waits: list[tuple[str | None, float]] = field(default_factory=list)  # waiting scrapes

    async def scrape(self, target: Target, etag: str | None = None) -> ScrapeResult:
        self.calls.append((target.url, etag))
        if self.gate is not None:
            await self.gate.wait()
        return self.results.pop(0) if len(self.results) > 1 else self.results[0]

    async def wait_for_change(self, target: Target, etag: str | None,
                              wait: float) -> ScrapeResult:
        self.waits.append((etag, wait))
        return await self.scrape(target, etag)


@dataclass
class QueueWriter:
    """The write side as the loop sees it, over the real write queue.

    ``apply`` decides as :meth:`scraper.write.writer.StatusWriter.apply` does against
    what the TrainJob stores (``held``, standing in for the API server, shared by the
    replicas of a test): the same content and nothing queued is UNCHANGED, anything
    else is queued (QUEUED).  :meth:`flush` plays the writer tasks: each due item is
    decided again and written (``writes``).  :meth:`stop_leading` clears the queue, as
    ``ScraperApp`` does when leadership ends.  ``outcomes``, when set, answer the
    applies instead, in order (the last repeats; an exception is raised): for the rules
    of the loop's reaction to one outcome.
    """

    held: dict[tuple[str, str], TrainerStatus] = field(default_factory=dict)
    queue: WriteQueue = field(default_factory=WriteQueue)
    outcomes: list[WriteOutcome | BaseException] = field(default_factory=list)
    applied: list[tuple[str, str, TrainerStatus]] = field(default_factory=list)
    writes: list[tuple[str, str, TrainerStatus, bool]] = field(default_factory=list)
    confirms: list[Target | None] = field(default_factory=list)

    async def apply(self, namespace: str, name: str, status: TrainerStatus, *,
                    final: bool = False, uid: str = "", seen: float | None = None,
                    finished_at: float | None = None,
                    confirm: Target | None = None) -> WriteOutcome:
        self.applied.append((namespace, name, status))
        self.confirms.append(confirm)
        if self.outcomes:
            outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        key = (namespace, name)
        if self.held.get(key) == status and self.queue.pending(key) is None:
            return WriteOutcome.UNCHANGED
        self.queue.put(key, status, Priority.FINAL if final else Priority.PROGRESS, uid=uid)
        return WriteOutcome.QUEUED

    def flush(self) -> int:
        """Write every due item (decided again against ``held``); returns the writes."""
        before = len(self.writes)
        while (item := self.queue.take()) is not None:
            if self.held.get(item.key) != item.status:
                self.held[item.key] = item.status
                self.writes.append((*item.key, item.status, item.priority is Priority.FINAL))
            self.queue.done(item)
        return len(self.writes) - before

    def stop_leading(self) -> None:
        self.queue.clear()


@dataclass
class FakeEvents:
    recorded: list[tuple[str, str, str, str]] = field(default_factory=list)

    async def event(self, namespace: str, name: str, reason: str, message: str) -> None:
        self.recorded.append((namespace, name, reason, message))


class Counted:
    """The scrape loop's counts kept in lists: the results, and the failed writes."""

    def __init__(self, results: list[str] | None = None,
                 failed: list[WriteOutcome] | None = None) -> None:
        self.results = results if results is not None else []
        self.failed = failed if failed is not None else []

    def scraped(self, result: str) -> None:
        self.results.append(result)

    def wrong_pod(self, reason: str) -> None:
        pass

    def written(self, outcome: WriteOutcome) -> None:
        self.failed.append(outcome)


@dataclass
class RecordingPacing:
    """The scrape loop's pacing kept in lists: busy runs and sooner runs asked."""

    busy_keys: list[str] = field(default_factory=list)
    retries: list[tuple[str, float]] = field(default_factory=list)

    def busy(self, key: str) -> None:
        self.busy_keys.append(key)

    def holding(self, key: str, held: bool) -> None:
        pass

    def run_within(self, key: str, seconds: float) -> None:
        self.retries.append((key, seconds))


@dataclass
class FakeScheduler:
    scheduled: dict[str, Target] = field(default_factory=dict)

    def schedule(self, target: Target) -> None:
        self.scheduled[target.key] = target

    def unschedule(self, key: str) -> None:
        self.scheduled.pop(key, None)

    def scheduled_keys(self) -> set[str]:
        return set(self.scheduled)


@dataclass
class Rig:
    """A loop and a manager wired to fakes, as ScraperApp wires the real parts."""

    scraper: FakeScraper
    writer: QueueWriter
    events: FakeEvents
    clock: Clock
    loop: ScrapeLoop
    manager: TargetManager
    scheduler: FakeScheduler
    spawned: list[asyncio.Task[Any]]
    gone: list[tuple[str, str]]
    busy: list[str]
    scrapes: list[str]
    failed_writes: list[WriteOutcome]
    retries: list[tuple[str, float]]
    pods: PodTargets

    async def settle(self) -> None:
        """Let every spawned final status run finish (their statuses are then queued)."""
        while pending := [t for t in self.spawned if not t.done()]:
            await asyncio.gather(*pending)

    def lose(self) -> None:
        """Leadership ends, as ``ScraperApp._on_leadership(False)`` handles it."""
        self.writer.stop_leading()
        self.manager.set_leading(False)

    def gain(self) -> None:
        self.manager.set_leading(True)

    def finals(self) -> list[int | None]:
        """Progress of every final written so far."""
        return [s.progress_percentage for _ns, _n, s, final in self.writer.writes if final]

    def state(self, target: Target | None = None) -> TargetState:
        target = target or _target()
        state = TargetState(JobView(NS, TJ, POD), target=target, uid=target.pod_uid)
        self.manager.states[target.key] = state
        return state


@pytest.fixture
def rig() -> Iterator[Rig]:
    yield _make_rig()


def _make_rig() -> Rig:
    scraper, writer, events, clock = FakeScraper(), QueueWriter(), FakeEvents(), Clock()
    scheduler = FakeScheduler()
    spawned: list[asyncio.Task[Any]] = []
    gone: list[tuple[str, str]] = []
    busy: list[str] = []
    scrapes: list[str] = []
    failed: list[WriteOutcome] = []
    retries: list[tuple[str, float]] = []
    holder: dict[str, TargetManager] = {}

    def on_gone(namespace: str, trainjob: str) -> None:
        gone.append((namespace, trainjob))
        holder["manager"].drop_trainjob(namespace, trainjob)

    loop = ScrapeLoop(scraper, writer, events, backoff_max=35.0,
                      leading=lambda: holder["manager"].leading, on_gone=on_gone,
                      pacing=RecordingPacing(busy, retries), counts=Counted(scrapes, failed),
                      clock=clock)
    manager = TargetManager(loop, scheduler,
                            spawn=lambda coro: spawned.append(asyncio.ensure_future(coro)),
                            leading=True)
    holder["manager"] = manager
    pods = PodTargets(manager, default_port=28080, default_path="/metrics",
                      default_interval=10.0)
    return Rig(scraper, writer, events, clock, loop, manager, scheduler, spawned, gone, busy,
              scrapes, failed, retries, pods)


def _replica(held: dict[tuple[str, str], TrainerStatus]) -> Rig:
    """A second rig (another replica) whose writer writes to the same ``held``."""
    replica = _make_rig()
    replica.writer.held = held
    return replica


def _pod(phase: str = "Running", *, uid: str = "uid-1", ip: str | None = "10.0.0.7",
         message: dict[str, Any] | str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "podIP": ip}
    if message is not None:
        text = message if isinstance(message, str) else json.dumps(message)
        status["containerStatuses"] = [
            {"name": "node", "state": {"terminated": {"exitCode": 0, "message": text}}}]
    return {"metadata": {"namespace": NS, "name": POD, "uid": uid,
                         "labels": {"jobset.sigs.k8s.io/jobset-name": TJ}},
            "status": status}


FINAL = {"progressPercentage": 100, "metrics": [], "lastUpdatedTime": "2025-01-01T00:00:00Z"}


# ---------------------------------------------------------------- ETag


@pytest.mark.parametrize("outcome", [WriteOutcome.WRITTEN, WriteOutcome.UNCHANGED,
                                     WriteOutcome.NOT_STORED])
async def test_etag_kept_when_the_status_is_where_it_belongs(rig: Rig,
                                                             outcome: WriteOutcome) -> None:
    state = rig.state()
    rig.scraper.results = [Fresh(_status(10), '"e1"'), NotModified()]
    rig.writer.outcomes = [outcome]
    await rig.loop.run(state)
    assert state.etag == '"e1"'
    await rig.loop.run(state)
    assert [etag for _url, etag in rig.scraper.calls] == [None, '"e1"']
    assert len(rig.writer.applied) == 1  # 304: nothing to write
    assert rig.scrapes == ["ok", "not_modified"]


async def test_an_answer_that_states_no_pod_goes_to_the_writer_with_its_target(
        rig: Rig) -> None:
    """The writer reads the pod of such an answer before sending it
    (scraper/discovery/pod_confirm.py); an answer that states its pod needs no read."""
    state = rig.state()
    rig.scraper.results = [Fresh(_status(10), '"e1"', identified=False),
                           Fresh(_status(11), '"e2"')]
    await rig.loop.run(state)
    await rig.loop.run(state)
    assert rig.writer.confirms == [_target(), None]


@pytest.mark.parametrize("check", [c for c in PodCheck if c is not PodCheck.CONFIRMED])
async def test_a_status_whose_pod_the_writer_did_not_confirm_drops_the_etag_and_warns_once(
        rig: Rig, check: PodCheck, caplog: pytest.LogCaptureFixture) -> None:
    state = rig.state()
    rig.scraper.results = [Fresh(_status(10), '"e1"', identified=False)]
    await rig.loop.run(state)
    assert state.etag == '"e1"'  # queued: kept until the writer says otherwise
    with caplog.at_level(logging.DEBUG, logger="scraper.scrape.loop"):
        for _ in range(3):
            rig.loop.pod_checked(state, _target(), check)
        assert state.etag is None  # the next scrape fetches the body and writes again
        rig.loop.pod_checked(state, _target(), PodCheck.CONFIRMED)  # the episode ends
        rig.loop.pod_checked(state, _target(), check)
    lines = [r for r in caplog.records if f"any more ({check.value})" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.DEBUG, logging.DEBUG,
                                          logging.WARNING]
    # The same pod at the same address with another interval is still this target.
    state.etag = '"e3"'
    assert rig.loop.pod_checked(state, _target(interval=30.0), check)
    assert state.etag is None
    # A check of another address or pod (the table moved on meanwhile) changes nothing.
    state.etag = '"e4"'
    assert not rig.loop.pod_checked(state, _target("http://10.0.0.8:28080/metrics"), check)
    assert not rig.loop.pod_checked(
        state, Target(NS, TJ, POD, "uid-2", _target().url, 10.0), check)
    assert not rig.loop.pod_checked(None, _target(), check)
    assert state.etag == '"e4"'


@pytest.mark.parametrize("outcome", [WriteOutcome.FAILED, WriteOutcome.NOT_LEADER,
                                     RuntimeError("API down")])
async def test_etag_dropped_when_the_write_did_not_land(rig: Rig,
                                                        outcome: WriteOutcome | Exception) -> None:
    state = rig.state()
    rig.scraper.results = [Fresh(_status(10), '"e1"')]
    rig.writer.outcomes = [outcome, WriteOutcome.WRITTEN]
    await rig.loop.run(state)
    assert state.etag is None
    await rig.loop.run(state)  # the body is fetched again and the write retried
    assert [etag for _url, etag in rig.scraper.calls] == [None, None]
    assert len(rig.writer.applied) == 2 and state.etag == '"e1"'
    assert rig.failed_writes == ([WriteOutcome.FAILED] if isinstance(outcome, Exception)
                                 else [])


async def test_etag_dropped_on_a_failed_scrape_and_on_a_new_url(rig: Rig) -> None:
    state = rig.state()
    rig.scraper.results = [Fresh(_status(10), '"e1"'),
                           Failure(FailureKind.HTTP_ERROR, "HTTP 500"),
                           Fresh(_status(10), '"e2"')]
    await rig.loop.run(state)
    await rig.loop.run(state)
    assert state.etag is None and state.view.up is False
    await rig.loop.run(state)
    assert state.etag == '"e2"' and state.view.up is True
    state.retarget(_target(url="http://10.0.0.8:28080/metrics"))
    assert state.etag is None
    state.etag = '"e3"'
    state.retarget(_target(url="http://10.0.0.8:28080/metrics"))  # same URL: kept
    assert state.etag == '"e3"'


async def test_trainjob_gone_drops_every_target_of_it(rig: Rig) -> None:
    rig.pods.on_pod(_pod(), deleted=False)
    assert set(rig.scheduler.scheduled) == {f"{NS}/{POD}"}
    rig.scraper.results = [Fresh(_status(10), '"e1"')]
    rig.writer.outcomes = [TrainJobGone(f"{NS}/{TJ}")]
    await rig.manager.run(f"{NS}/{POD}")
    assert rig.gone == [(NS, TJ)]
    assert rig.manager.states == {} and rig.scheduler.scheduled == {}


# ---------------------------------------------------------------- backoff


@pytest.mark.parametrize("kind", [FailureKind.REFUSED, FailureKind.UNREACHABLE])
async def test_not_instrumented_backs_off_exponentially_capped_and_logs_once(
    rig: Rig, kind: FailureKind, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="scraper.scrape.loop")
    state = rig.state(_target(interval=10.0))
    state.answered_ever = True  # an exporter that answered before (a starting one: below)
    rig.scraper.results = [Failure(kind, "connection refused")]
    waits = []
    for _ in range(4):
        await rig.loop.run(state)
        waits.append(state.retry_at - rig.clock.now)
        rig.clock.now = state.retry_at - 0.01
        await rig.loop.run(state)  # still backing off: no scrape
        rig.clock.now = state.retry_at
    assert waits == [10.0, 20.0, 35.0, 35.0]  # interval * 2**(n-1), capped at backoff_max
    assert rig.retries == []  # the schedule's own runs retry it
    assert len(rig.scraper.calls) == 4
    assert rig.events.recorded == []  # no exporter is no news for the TrainJob's owner
    assert state.view.up is False and state.etag is None
    assert sum("treating it as not instrumented" in r.message for r in caplog.records) == 1
    # Any answer resets the backoff.
    rig.scraper.results = [NothingYet()]
    await rig.loop.run(state)
    assert (state.refusals, state.retry_at, state.view.up) == (0, 0.0, True)
    assert "answers again" in caplog.text
    await rig.loop.run(state)
    assert len(rig.scraper.calls) == 6


async def test_a_target_that_never_answered_is_retried_soon_until_its_exporter_starts(
    rig: Rig,
) -> None:
    # A new training's exporter listens a few seconds after its pod runs: its first
    # answer opens the waiting scrape, so it is retried after 1, 2, 4 ... s (capped by
    # the interval's own backoff), each time asking the scheduler for that early run.
    state = rig.state(_target(interval=10.0))
    rig.scraper.results = [Failure(FailureKind.REFUSED, "connection refused")]
    waits = []
    for _ in range(5):
        await rig.loop.run(state)
        waits.append(state.retry_at - rig.clock.now)
        rig.clock.now = state.retry_at
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert rig.retries == [(f"{NS}/{POD}", w) for w in waits]
    rig.scraper.results = [NothingYet()]
    await rig.loop.run(state)
    assert state.answered_ever and state.refusals == 0
    # Once it has answered, a refusal waits for the interval again.
    rig.scraper.results = [Failure(FailureKind.REFUSED, "connection refused")]
    await rig.loop.run(state)
    assert state.retry_at - rig.clock.now == 10.0 and len(rig.retries) == 5


async def test_busy_is_neither_up_nor_down(rig: Rig) -> None:
    state = rig.state()
    rig.scraper.results = [Busy()]
    await rig.loop.run(state)
    assert rig.busy == [f"{NS}/{POD}"]
    assert (state.view.up, state.refusals, rig.scrapes) == (None, 0, [])


async def test_nothing_runs_while_not_leading(rig: Rig) -> None:
    state = rig.state()
    rig.scraper.results = [Fresh(_status(1), None)]
    rig.manager.set_leading(False)
    await rig.loop.run(state)
    await rig.manager.run(f"{NS}/{POD}")
    assert rig.scraper.calls == []
    assert list(rig.manager.views()) == []


# ---------------------------------------------------------------- Events


async def test_event_dedupe_same_message_once_per_period(rig: Rig) -> None:
    state = rig.state()
    bad = Failure(FailureKind.INVALID, "progressPercentage: must be <= 100")
    rig.scraper.results = [bad]
    await rig.loop.run(state)
    await rig.loop.run(state)
    rig.clock.now += EVENT_REPEAT_SECONDS - 1
    await rig.loop.run(state)
    assert len(rig.events.recorded) == 1
    ns, name, reason, message = rig.events.recorded[0]
    assert (ns, name, reason) == (NS, TJ, REASON_INVALID)
    assert message == (f"scraping {state.target.url} (pod {POD}): "  # type: ignore[union-attr]
                       "progressPercentage: must be <= 100; the previous status is kept")
    rig.clock.now += 1
    await rig.loop.run(state)
    assert len(rig.events.recorded) == 2
    # Another failure is another message: recorded at once.
    rig.scraper.results = [Failure(FailureKind.TIMEOUT, "no complete answer within 9s")]
    await rig.loop.run(state)
    assert [r[2] for r in rig.events.recorded] == [REASON_INVALID, REASON_INVALID,
                                                   REASON_SCRAPE_FAILED]
    assert rig.scrapes == ["invalid"] * 4 + ["timeout"]


async def test_event_dedupe_is_per_reason_not_per_message(rig: Rig) -> None:
    # Issue 13 input 7: an HTML page differing per request (a request id in it) must
    # not make an Event per scrape; one per target and reason per window.
    state = rig.state()
    for i in range(20):
        rig.scraper.results = [Failure(FailureKind.INVALID, f"not Prometheus text: <!-- {i} -->")]
        await rig.loop.run(state)
        rig.clock.now += 1
    assert [r[2] for r in rig.events.recorded] == [REASON_INVALID]
    rig.clock.now += EVENT_REPEAT_SECONDS
    await rig.loop.run(state)
    assert [r[2] for r in rig.events.recorded] == [REASON_INVALID, REASON_INVALID]
    # Another target is another key.
    other = rig.state(_target(url="http://10.0.0.8:28080/metrics"))
    await rig.loop.run(other)
    assert len(rig.events.recorded) == 3


async def test_event_message_carries_only_a_short_printable_prefix(rig: Rig) -> None:
    # Issue 13 input 9: what the pod sent reaches an object namespace users read.
    state = rig.state()
    foreign = "secret\x00\u2603\x1b[31m" + "A" * 5000
    rig.scraper.results = [Failure(FailureKind.INVALID, foreign)]
    await rig.loop.run(state)
    [(_, _, _, message)] = rig.events.recorded
    assert all(" " <= c <= "~" for c in message), message
    assert "A" * (DETAIL_MAX + 1) not in message
    assert len(message) < DETAIL_MAX + 200  # the URL, the pod name and the suffix
    assert "secret???[31m" in message


async def test_invalid_termination_message_event_is_sanitised(rig: Rig) -> None:
    rig.pods.on_pod(_pod("Succeeded", message="\u2603" * 3000), deleted=False)
    await rig.settle()
    [(_, _, reason, message)] = rig.events.recorded
    assert reason == REASON_FINAL_INVALID
    assert all(" " <= c <= "~" for c in message), message
    assert len(message) < 600


# ---------------------------------------------------------------- final status


async def test_final_status_applied_once(rig: Rig) -> None:
    rig.pods.on_pod(_pod(), deleted=False)
    ended = _pod("Succeeded", message=FINAL)
    rig.pods.on_pod(ended, deleted=False)
    rig.pods.on_pod(ended, deleted=False)  # a repeated MODIFIED event
    await rig.settle()
    assert rig.writer.flush() == 1
    rig.manager.set_leading(False)
    rig.manager.set_leading(True)  # leadership comes back: the TrainJob stores it
    rig.pods.on_pod(ended, deleted=True)  # deleted after its final status was written
    await rig.settle()
    rig.writer.flush()
    assert rig.finals() == [100]
    assert rig.scheduler.scheduled == {}
    assert rig.manager.states == {} and rig.manager.owed == {}


async def test_final_status_waits_for_leadership_then_is_applied_once(rig: Rig) -> None:
    rig.manager.set_leading(False)
    rig.pods.on_pod(_pod("Failed", message=FINAL), deleted=False)
    await rig.settle()
    assert rig.writer.applied == []
    rig.manager.set_leading(True)
    rig.manager.set_leading(True)
    await rig.settle()
    assert len(rig.writer.applied) == 1
    rig.writer.flush()
    assert rig.finals() == [100]
    view = next(iter(rig.manager.views()))
    assert view.status is not None and view.status.progress_percentage == 100


# ---------------------------------------------------------------- finals and leader changes
# (issue 27 point 1: the same replica losing and winning back the Lease lost every final
# still queued; docs/scraper.md, "Leader changes")


async def test_final_queued_when_leadership_is_lost_is_written_once_when_it_comes_back(
        rig: Rig) -> None:
    rig.pods.on_pod(_pod(), deleted=False)
    ended = _pod("Succeeded", message=FINAL)
    rig.pods.on_pod(ended, deleted=False)  # ends while leading: queued, not written
    await rig.settle()
    assert len(rig.writer.queue) == 1
    rig.lose()  # the queue goes with the term
    assert len(rig.writer.queue) == 0
    rig.pods.on_pod(ended, deleted=False)  # delivered again while standing by
    await rig.settle()
    assert rig.writer.queue.pending((NS, TJ)) is None
    rig.gain()
    await rig.settle()
    rig.pods.on_pod(ended, deleted=False)  # and again (a relist): coalesced
    await rig.settle()
    assert rig.writer.flush() == 1
    assert rig.finals() == [100]
    rig.pods.on_pod(ended, deleted=False)  # the TrainJob stores it: settled, no write
    await rig.settle()
    rig.lose()
    rig.gain()
    await rig.settle()
    assert rig.writer.flush() == 0 and rig.finals() == [100]


async def test_flapping_leadership_writes_every_final_once(rig: Rig) -> None:
    pods = [dict(_pod("Succeeded", uid=f"uid-{i}", message={**FINAL, "progressPercentage": i}),
                 metadata={"namespace": NS, "name": f"{TJ}{i}-node-0-0", "uid": f"uid-{i}",
                           "labels": {"jobset.sigs.k8s.io/jobset-name": f"{TJ}{i}"}})
            for i in range(20)]
    for pod in pods[:10]:
        rig.pods.on_pod(pod, deleted=False)
    await rig.settle()
    out = rig.writer.queue.take()  # one write is out when the term ends: it lands later
    assert out is not None
    rig.lose()
    for pod in pods[10:]:  # ten more end while standing by
        rig.pods.on_pod(pod, deleted=False)
    rig.gain()
    await rig.settle()
    rig.lose()
    rig.gain()
    await rig.settle()
    rig.writer.held[out.key] = out.status  # the write that was out lands now
    rig.writer.writes.append((*out.key, out.status, True))
    rig.writer.queue.done(out)
    written = 1 + rig.writer.flush()
    rig.lose()
    rig.gain()
    await rig.settle()
    written += rig.writer.flush()
    assert written == 20
    assert sorted(rig.finals()) == list(range(20))


async def test_the_standby_writes_what_the_leader_lost_and_nothing_twice(rig: Rig) -> None:
    standby = _replica(rig.writer.held)  # the same TrainJobs (one API server)
    standby.manager.set_leading(False)
    ended = _pod("Succeeded", message=FINAL)
    for replica in (rig, standby):  # both watch the pod
        replica.pods.on_pod(_pod(), deleted=False)
        replica.pods.on_pod(ended, deleted=False)
    await rig.settle()
    rig.lose()  # the queued final is gone with the leader's term
    standby.gain()
    await standby.settle()
    assert standby.writer.flush() == 1
    rig.gain()  # the old leader wins back later: the TrainJob stores the final
    await rig.settle()
    assert rig.writer.flush() == 0
    assert [s.progress_percentage for *_k, s, final in standby.writer.writes if final] == [100]


async def test_a_deleted_pods_owed_final_survives_a_leader_change(rig: Rig) -> None:
    rig.pods.on_pod(_pod(), deleted=False)
    ended = _pod("Succeeded", message=FINAL)
    rig.pods.on_pod(ended, deleted=False)
    rig.pods.on_pod(ended, deleted=True)
    await rig.settle()
    rig.lose()
    assert rig.manager.states == {} and list(rig.manager.owed) == [(NS, TJ)]
    rig.gain()
    await rig.settle()
    assert rig.writer.flush() == 1
    rig.manager.trainjob_seen((NS, TJ))  # the watch shows it on the TrainJob: let go
    await rig.settle()
    assert rig.manager.owed == {} and rig.finals() == [100]


async def test_a_pod_deleted_while_standing_by_is_owed_to_the_next_leader(rig: Rig) -> None:
    rig.manager.set_leading(False)
    rig.pods.on_pod(_pod(), deleted=False)
    rig.pods.on_pod(_pod("Succeeded", message=FINAL), deleted=True)
    await rig.settle()
    assert rig.writer.applied == []
    rig.gain()
    await rig.settle()
    assert rig.writer.flush() == 1


async def test_owed_finals_of_a_trainjob_that_is_gone_are_let_go(rig: Rig) -> None:
    rig.manager.set_leading(False)
    rig.pods.on_pod(_pod("Succeeded", message=FINAL), deleted=False)
    rig.pods.on_pod(_pod("Succeeded", message=FINAL), deleted=True)
    assert rig.manager.owed
    rig.manager.drop_trainjob(NS, TJ)
    assert rig.manager.owed == {}
    rig.gain()
    await rig.settle()
    assert rig.writer.applied == []


async def test_deleted_pod_with_a_message_delivers_its_final_status(rig: Rig) -> None:
    rig.pods.on_pod(_pod(), deleted=False)
    rig.pods.on_pod(_pod("Succeeded", message=FINAL), deleted=True)
    await rig.settle()
    assert rig.writer.flush() == 1 and rig.manager.states == {}


async def test_a_scrape_that_returns_after_the_pod_ended_does_not_write(rig: Rig) -> None:
    rig.pods.on_pod(_pod(), deleted=False)
    rig.scraper.gate = asyncio.Event()
    rig.scraper.results = [Fresh(_status(40), '"e"')]
    run = asyncio.ensure_future(rig.manager.run(f"{NS}/{POD}"))
    await asyncio.sleep(0)
    rig.pods.on_pod(_pod("Succeeded", message=FINAL), deleted=False)
    await rig.settle()
    rig.scraper.gate.set()
    await run
    assert [s.progress_percentage for _ns, _n, s in rig.writer.applied] == [100]


async def test_invalid_termination_messages_make_one_event(rig: Rig) -> None:
    rig.pods.on_pod(_pod("Succeeded", message="{not json"), deleted=False)
    await rig.settle()
    assert rig.writer.applied == []
    [(ns, name, reason, message)] = rig.events.recorded
    assert (ns, name, reason) == (NS, TJ, REASON_FINAL_INVALID)
    assert message.startswith(f"termination message of pod {POD} is not a valid "
                              "trainerStatus: container node: ")
    assert message.endswith("; the previous status is kept")


async def test_final_of_a_recreated_pod_is_its_own(rig: Rig) -> None:
    rig.pods.on_pod(_pod("Succeeded", message=FINAL), deleted=False)
    rig.pods.on_pod(_pod("Succeeded", uid="uid-2", message=FINAL), deleted=False)
    await rig.settle()
    assert len(rig.writer.applied) == 2  # same name, new pod: a new final status


def test_final_dataclass_is_the_discovery_decision() -> None:
    # The loop consumes discovery's Final as is (no copy of its fields).
    final = Final(NS, TJ, POD, "uid-1", (("node", json.dumps(FINAL)),))
    state = TargetState(JobView(NS, TJ, POD))
    state.end(final)
    assert state.owes_final and state.start_final() and not state.start_final()
    assert state.trainjob_key == (NS, TJ)
