"""The rule for other writers and time (docs/scraper.md, "Other writers and time"), in
process: named input -> verdict cases at each clause's boundary and hypothesis
properties (each rule's consequence on the inputs it speaks of, how a verdict moves when
an input moves) over the decisions of :mod:`scraper.decide.others`; the exporter's
sequence (:mod:`scraper.shared.sequence`); and whole runs of the real scrape loop
(:class:`scraper.scrape.loop.ScrapeLoop`) feeding a writer that decides with the real rule.

The exporter and the TrainJob are fakes here (orders of answers, sequences, clock
offsets and foreign writes are what is generated); the same rule against the real API
server, real exporters and a real second writer is ``test_writer_rules_api.py``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from exporter_lib.status import TrainerStatus
from scraper.decide.others import FINAL_DELIVERED_MARGIN_SECONDS as FINAL_MARGIN
from scraper.decide.others import Report, WriteVerdict, decide, same_content
from scraper.scrape.loop import ScrapeLoop
from scraper.scrape.target_state import TargetState
from scraper.shared.outcome import WriteOutcome
from scraper.shared.scrapes import Fresh, NotModified, ScrapeResult
from scraper.shared.sequence import Sequence, is_late, sequence_of
from scraper.shared.targets import Target
from scraper.shared.trainjobs import OUR_FIELD_MANAGER, Writer
from scraper.telemetry import JobView
from scraper.write.notices import FUTURE_LIMIT_SECONDS, Skew, settle_time

BASE = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
GRACE = 60.0

seconds = st.integers(min_value=-10 * 86400, max_value=10 * 86400)


def _status(progress: int, at: datetime = BASE) -> TrainerStatus:
    return TrainerStatus(progress_percentage=progress, last_updated_time=at)


# ---------------------------------------------------------------- time (rule 5)


@given(reported=seconds, stored=st.none() | seconds, arrival=seconds)
def test_time_never_moves_back_silently(reported: int, stored: int | None,
                                        arrival: int) -> None:
    rep = BASE + timedelta(seconds=reported)
    stored_at = None if stored is None else BASE + timedelta(seconds=stored)
    arr = BASE + timedelta(seconds=arrival, microseconds=250_000)
    written, skew = settle_time(rep, stored_at, arr)
    arrival_whole = arr.replace(microsecond=0)
    if skew is None:
        # The report's own time is written only when it neither moves the stored time back
        # nor runs more than a minute ahead of the scraper's clock.
        assert written == rep
        assert stored_at is None or written >= stored_at
        assert (written - arrival_whole).total_seconds() <= FUTURE_LIMIT_SECONDS
    else:
        assert written == arrival_whole
        if skew is Skew.FUTURE:
            assert (rep - arrival_whole).total_seconds() > FUTURE_LIMIT_SECONDS
        else:
            assert stored_at is not None and rep < stored_at
    # Whatever was written: never more than the limit ahead of the scraper's clock, and
    # below the stored time only when the stored time itself is ahead of the scraper's clock.
    assert (written - arrival_whole).total_seconds() <= FUTURE_LIMIT_SECONDS
    if stored_at is not None and written < stored_at:
        assert skew is not None and arrival_whole < stored_at


def test_time_named_cases_of_issue_21() -> None:
    arrival = BASE
    # One hour older than what the TrainJob stores: the arrival time, counted as "back".
    assert settle_time(BASE - timedelta(hours=1), BASE - timedelta(minutes=1), arrival) == (
        arrival, Skew.BACK)
    # The stored status came from 10 minutes in the future; the report is an hour old: the
    # arrival time (older than the stored one: it was in the future), still "back".
    assert settle_time(BASE - timedelta(hours=1), BASE + timedelta(minutes=10), arrival) == (
        arrival, Skew.BACK)
    assert settle_time(BASE + timedelta(minutes=2), None, arrival) == (arrival, Skew.FUTURE)
    assert settle_time(BASE + timedelta(seconds=59), None, arrival) == (
        BASE + timedelta(seconds=59), None)


# ---------------------------------------------------------------- decisions (rules 2-4)


def test_a_push_in_the_second_the_container_ended_does_not_stand_for_its_final() -> None:
    """A newcomer's run: the training pushed 90 % through the SDK just before it exited
    with its termination message at 100 %; the push's managedFields time and the
    container's finishedAt were the same whole second (23:16:33Z), and the final was
    deferred as "delivered" for good.  The termination message is the newer word."""
    ended = 1_800_000_000.0
    pushed_90 = Writer(manager="trainer-status", time=ended, seen=5.0)
    final = Report(_status(100), seen=6.0, final=True, finished_at=ended)
    assert decide(_status(90), pushed_90, final, now=6.0, grace=GRACE) is WriteVerdict.WRITE
    # A write of another writer well after the end (another process, an operator) is
    # that writer's final word.
    later = Writer(manager="kubectl-edit", time=ended + FINAL_MARGIN + 1, seen=5.0)
    assert decide(_status(90), later, final, now=6.0, grace=GRACE) is WriteVerdict.DELIVERED


# Concrete cases, one per clause of rules 2-4 and at each boundary: (stored progress or
# None, writer or None, report, now, the verdict).  ``PUSH`` changed the field at
# monotonic 100 (API server time ``ENDED``); the grace is 60 s.
ENDED = 1_800_000_000.0
PUSH = Writer(manager="trainer-status", time=ENDED, seen=100.0)
OURS = Writer(manager=OUR_FIELD_MANAGER, time=ENDED, seen=100.0)
DECISIONS = [
    ("nothing stored", None, None, Report(_status(10), 1.0), 200.0, WriteVerdict.WRITE),
    ("stored, its writer unknown", 5, None, Report(_status(10), 1.0), 101.0,
     WriteVerdict.WRITE),
    ("ours stored, another value", 5, OURS, Report(_status(10), 50.0), 101.0,
     WriteVerdict.WRITE),
    ("same content, ours", 10, OURS, Report(_status(10, BASE + timedelta(hours=1)), 150.0),
     101.0, WriteVerdict.UNCHANGED),
    ("same content, a live writer", 10, PUSH, Report(_status(10), 150.0), 101.0,
     WriteVerdict.UNCHANGED),
    ("same content, a final", 10, PUSH,
     Report(_status(10), 150.0, final=True, finished_at=ENDED - 3600), 101.0,
     WriteVerdict.UNCHANGED),
    ("rule 2: changed just now", 5, PUSH, Report(_status(10), 150.0), 100.0,
     WriteVerdict.OTHER_WRITER),
    ("rule 2: 59.9 s ago", 5, PUSH, Report(_status(10), 150.0), 159.9,
     WriteVerdict.OTHER_WRITER),
    ("rule 3: quiet at exactly the grace, news", 5, PUSH, Report(_status(10), 100.5), 160.0,
     WriteVerdict.WRITE),
    ("rule 3: quiet, content seen in the same instant", 5, PUSH, Report(_status(10), 100.0),
     160.0, WriteVerdict.NOT_NEWS),
    ("rule 3: quiet, content older than its write", 5, PUSH, Report(_status(10), 99.0),
     500.0, WriteVerdict.NOT_NEWS),
    ("rule 3: quiet, a first answer (seen unknown)", 5, PUSH,
     Report(_status(10), float("-inf")), 500.0, WriteVerdict.NOT_NEWS),
    ("rule 4: a final over a live writer", 5, PUSH,
     Report(_status(100), 0.0, final=True, finished_at=ENDED), 100.0, WriteVerdict.WRITE),
    ("rule 4: its write exactly the margin after the end", 5, PUSH,
     Report(_status(100), 0.0, final=True, finished_at=ENDED - FINAL_MARGIN), 100.0,
     WriteVerdict.WRITE),
    ("rule 4: its write past the margin", 5, PUSH,
     Report(_status(100), 0.0, final=True, finished_at=ENDED - FINAL_MARGIN - 1), 100.0,
     WriteVerdict.DELIVERED),
    ("rule 4: the end unknown", 5, PUSH, Report(_status(100), 0.0, final=True), 500.0,
     WriteVerdict.WRITE),
]


@pytest.mark.parametrize(("stored", "writer", "report", "now", "expected"),
                         [case[1:] for case in DECISIONS], ids=[case[0] for case in DECISIONS])
def test_decide_named_cases(stored: int | None, writer: Writer | None, report: Report,
                            now: float, expected: WriteVerdict) -> None:
    there = None if stored is None else _status(stored)
    assert decide(there, writer, report, now=now, grace=GRACE) is expected


def test_grace_zero_turns_rule_2_off() -> None:
    """``--other-writer-grace 0``: no writer is live, rule 3 still applies."""
    assert decide(_status(5), PUSH, Report(_status(10), 100.5), now=100.0,
                  grace=0.0) is WriteVerdict.WRITE
    assert decide(_status(5), PUSH, Report(_status(10), 99.0), now=100.0,
                  grace=0.0) is WriteVerdict.NOT_NEWS


# Properties over generated inputs: each rule's consequence on the inputs it speaks
# of, and how a verdict moves when one input moves (never the rule's steps restated).

progress = st.integers(0, 100)
moments = st.floats(-1e6, 1e6)
foreign_writers = st.builds(Writer, manager=st.sampled_from(["trainer-status",
                                                             "kubectl-edit"]),
                            time=st.floats(0, 2e9), seen=moments)
any_writer = st.none() | foreign_writers | st.builds(
    Writer, manager=st.just(OUR_FIELD_MANAGER), time=st.floats(0, 2e9), seen=moments)
finishes = st.none() | st.floats(0, 2e9)
reports = st.builds(Report, status=st.builds(_status, progress),
                    seen=moments | st.just(float("-inf")), final=st.booleans(),
                    finished_at=finishes)
graces = st.floats(0.0, 3600.0)


@given(stored=progress, writer=any_writer, report=reports, now=moments, grace=graces,
       stamp=seconds)
def test_same_content_is_unchanged_whoever_wrote_it(stored: int, writer: Writer | None,
                                                    report: Report, now: float,
                                                    grace: float, stamp: int) -> None:
    """The stored content again (its own ``lastUpdatedTime`` whatever) is never written."""
    there = _status(stored, BASE + timedelta(seconds=stamp))
    again = Report(_status(stored), report.seen, report.final, report.finished_at)
    assert decide(there, writer, again, now=now, grace=grace) is WriteVerdict.UNCHANGED


@given(stored=st.none() | progress, new=progress, writer=any_writer, report=reports,
       now=moments, grace=graces)
def test_nobody_elses_status_is_replaced_by_any_change(stored: int | None, new: int,
                                                       writer: Writer | None,
                                                       report: Report, now: float,
                                                       grace: float) -> None:
    """Nothing stored, no writer known, or our own write: a different report is written."""
    assume(stored != new)
    assume(stored is None or writer is None or writer.ours)
    there = None if stored is None else _status(stored)
    changed = Report(_status(new), report.seen, report.final, report.finished_at)
    assert decide(there, writer, changed, now=now, grace=grace) is WriteVerdict.WRITE


@given(stored=progress, new=progress, writer=foreign_writers,
       seen=moments | st.just(float("-inf")), age=st.floats(-1e6, 3600.0),
       grace=st.floats(0.001, 3600.0))
def test_rule_2_a_live_writer_keeps_the_field(stored: int, new: int, writer: Writer,
                                              seen: float, age: float,
                                              grace: float) -> None:
    """A non-final change while the other writer's change is younger than the grace
    (a negative age included: seen ahead of this clock) is not written, however new the
    report."""
    assume(stored != new and age < grace)
    verdict = decide(_status(stored), writer, Report(_status(new), seen),
                     now=writer.seen + age, grace=grace)
    assert verdict is WriteVerdict.OTHER_WRITER


@given(stored=progress, new=progress, writer=foreign_writers,
       seen=moments | st.just(float("-inf")), extra=st.floats(0.0, 1e6), grace=graces)
def test_rule_3_a_quiet_writers_status_is_replaced_only_by_news(
        stored: int, new: int, writer: Writer, seen: float, extra: float,
        grace: float) -> None:
    """Once the grace has passed: written exactly when the report's content was first
    seen after the other writer's write."""
    assume(stored != new)
    now = writer.seen + grace + extra
    assume(now - writer.seen >= grace)  # float rounding of the sum
    verdict = decide(_status(stored), writer, Report(_status(new), seen), now=now, grace=grace)
    assert verdict is (WriteVerdict.WRITE if seen > writer.seen else WriteVerdict.NOT_NEWS)


@given(stored=progress, new=progress, writer=foreign_writers, report=reports,
       now=moments, later=st.floats(0.0, 1e6), grace=graces)
def test_a_live_writer_only_ever_goes_quiet(stored: int, new: int, writer: Writer,
                                           report: Report, now: float, later: float,
                                           grace: float) -> None:
    """Time passing never makes a writer live again: no OTHER_WRITER after a verdict
    that was not."""
    assume(stored != new)
    changed = Report(_status(new), report.seen, report.final, report.finished_at)
    first = decide(_status(stored), writer, changed, now=now, grace=grace)
    then = decide(_status(stored), writer, changed, now=now + later, grace=grace)
    assert first is WriteVerdict.OTHER_WRITER or then is not WriteVerdict.OTHER_WRITER


@given(stored=progress, new=progress, writer=foreign_writers, finished=finishes,
       now=moments, seen=moments | st.just(float("-inf")), grace=graces)
def test_rule_4_a_final_is_delivered_unless_the_other_writer_wrote_after_the_end(
        stored: int, new: int, writer: Writer, finished: float | None, now: float,
        seen: float, grace: float) -> None:
    """A final over another writer's different status: DELIVERED when that writer wrote
    more than the margin after the container ended, else written; never kept out by a
    live writer or for want of news."""
    assume(stored != new)
    final = Report(_status(new), seen, final=True, finished_at=finished)
    verdict = decide(_status(stored), writer, final, now=now, grace=grace)
    delivered = finished is not None and writer.time > finished + FINAL_MARGIN
    assert verdict is (WriteVerdict.DELIVERED if delivered else WriteVerdict.WRITE)


@given(stored=progress, writer=any_writer, report=reports, now=moments, grace=graces)
def test_each_reason_to_keep_a_report_out_belongs_to_one_kind_of_report(
        stored: int, writer: Writer | None, report: Report, now: float,
        grace: float) -> None:
    """DELIVERED only for a final; OTHER_WRITER and NOT_NEWS only for a non-final; all
    three only over another writer's status."""
    verdict = decide(_status(stored), writer, report, now=now, grace=grace)
    if verdict is WriteVerdict.DELIVERED:
        assert report.final
    if verdict in (WriteVerdict.OTHER_WRITER, WriteVerdict.NOT_NEWS):
        assert not report.final
    if verdict not in (WriteVerdict.WRITE, WriteVerdict.UNCHANGED):
        assert writer is not None and not writer.ours


# ---------------------------------------------------------------- sequences


@given(start=st.sampled_from(["a1", "b2"]), n=st.integers(0, 2**40),
       other_start=st.sampled_from(["a1", "b2"]), m=st.integers(0, 2**40))
def test_sequence_orders_one_process_only(start: str, n: int, other_start: str,
                                          m: int) -> None:
    last = sequence_of(f"{n}; start={start}")
    new = sequence_of(f" {m} ;start={other_start}")
    assert last == Sequence(start, n) and new == Sequence(other_start, m)
    assert is_late(last, new) is (start == other_start and m < n)
    assert not is_late(None, new) and not is_late(last, None)


@given(st.text(max_size=40))
def test_malformed_sequence_header_is_no_order(header: str) -> None:
    parsed = sequence_of(header)
    if parsed is not None:
        assert f"{parsed.n}" in header and parsed.start in header


# ---------------------------------------------------------------- whole runs of the loop


@dataclass
class ScriptedExporter:
    """Answers with whatever the step sets; 304 for a matching ETag when it sends ETags."""

    status: TrainerStatus
    sequence: Sequence | None
    etags: bool
    late: list[Fresh] = field(default_factory=list)  # answers delivered out of order

    async def scrape(self, target: Target, etag: str | None = None) -> ScrapeResult:
        if self.late:
            return self.late.pop(0)
        tag = f'"{hash((self.status, self.sequence))}"' if self.etags else None
        if tag is not None and etag == tag:
            return NotModified()
        return Fresh(self.status, tag, sequence=self.sequence)

    async def wait_for_change(self, target: Target, etag: str | None,
                              wait: float) -> ScrapeResult:
        return await self.scrape(target, etag)


@dataclass
class RuleWriter:
    """A TrainJob and a writer that decides with the real rule (no queue, no API)."""

    clock: list[float]
    stored: TrainerStatus | None = None
    writer: Writer | None = None
    written: list[tuple[float, TrainerStatus, float]] = field(default_factory=list)

    async def apply(self, namespace: str, name: str, status: TrainerStatus, *,
                    final: bool = False, uid: str = "", seen: float | None = None,
                    finished_at: float | None = None,
                    confirm: Target | None = None) -> WriteOutcome:
        now = self.clock[0]
        report = Report(status, now if seen is None else seen, final, finished_at)
        verdict = decide(self.stored, self.writer, report, now=now, grace=GRACE)
        if verdict is WriteVerdict.UNCHANGED:
            return WriteOutcome.UNCHANGED
        if verdict is not WriteVerdict.WRITE:
            return WriteOutcome.DEFERRED
        self.written.append((now, status, report.seen))
        self.stored, self.writer = status, Writer(OUR_FIELD_MANAGER, now, now)
        return WriteOutcome.WRITTEN

    def foreign(self, status: TrainerStatus) -> None:
        now = self.clock[0]
        self.stored, self.writer = status, Writer("trainer-status", now, now)


class NoEvents:
    async def event(self, namespace: str, name: str, reason: str, message: str) -> None:
        return None


steps = st.lists(st.one_of(
    st.tuples(st.just("report"), st.integers(0, 3)),  # the exporter's content changes
    st.tuples(st.just("same"), st.integers(0, 0)),  # it answers again, unchanged
    st.tuples(st.just("late"), st.integers(1, 3)),  # an older answer arrives late
    st.tuples(st.just("foreign"), st.integers(50, 53)),  # the other writer writes
    st.tuples(st.just("tick"), st.integers(1, 90)),  # seconds pass
), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(script=steps, etags=st.booleans(), sequenced=st.booleans())
def test_loop_and_rule_over_any_order(script: list[tuple[str, int]], etags: bool,
                                      sequenced: bool) -> None:
    """Whatever the order of answers, late answers and foreign writes, and whatever the
    wire format (ETag or not, sequence or not): no progress write while the other writer
    is live, after its write only content that changed after it (and that content once
    the writer is quiet), never a late answer's status."""
    clock = [1000.0]
    writer = RuleWriter(clock)
    n = 0
    history: list[Fresh] = []

    def answer(progress: int) -> tuple[TrainerStatus, Sequence | None]:
        return _status(progress, BASE + timedelta(seconds=n)), (
            Sequence("p1", n) if sequenced else None)

    status, seq = answer(0)
    exporter = ScriptedExporter(status, seq, etags)
    loop = ScrapeLoop(exporter, writer, NoEvents(), backoff_max=60.0,
                      clock=lambda: clock[0], waiting=False)
    state = TargetState(JobView("ns", "tj", "pod"))
    state.target = Target("ns", "tj", "pod", "uid", "http://127.0.0.1:1/metrics", 10.0)

    async def run() -> None:
        nonlocal n
        foreign_at: float | None = None
        late_statuses: set[TrainerStatus] = set()
        model_content: TrainerStatus | None = None
        model_seen = float("-inf")
        for kind, value in script:
            if kind == "report":
                n += 1
                exporter.status, exporter.sequence = answer(value)
                history.append(Fresh(exporter.status, None, sequence=exporter.sequence))
            elif kind == "late" and sequenced and len(history) > value:
                old = history[-1 - value]
                if old.status != exporter.status:
                    exporter.late.append(old)
                    late_statuses.add(old.status)
            elif kind == "foreign":
                writer.foreign(_status(value, BASE + timedelta(hours=1)))
                foreign_at = clock[0]
            elif kind == "tick":
                clock[0] += value
            before = len(writer.written)
            late_answer = bool(exporter.late)
            await loop.run(state)
            if not late_answer and exporter.status != model_content:
                # The model's own account of when the loop first got this content.
                model_seen = clock[0] if model_content is not None else float("-inf")
                model_content = exporter.status
            if (foreign_at is not None and not late_answer
                    and clock[0] - foreign_at >= GRACE and model_seen > foreign_at):
                # And the other side of rule 3: news after a quiet writer is written.
                assert same_content(writer.stored, exporter.status), (writer.stored, foreign_at)
            for at, written, seen in writer.written[before:]:
                if foreign_at is not None:
                    # Rule 2: nothing while the other writer is live.
                    assert at - foreign_at >= GRACE, (at, foreign_at)
                    # Rule 3: only content first seen after the other writer's write.
                    assert seen > foreign_at, (seen, foreign_at)
                # A late answer (lower sequence of the same process) is never written.
                assert written not in late_statuses
                foreign_at = None  # ours again: the next foreign write starts over

    asyncio.run(run())
