"""The scrape-loop stage: per-target state and the rules of one run.

One run is scrape -> validate (done by the scraper) -> write decision.  The rules
this module owns, each tested in-process with fakes (``tests/scraper/test_loop.py``):

* ETag: kept only when the status is safely where it belongs (written, unchanged,
  or not storable); dropped on any failure, so the next scrape fetches the body
  again and the write is retried.
* Backoff: a target where nothing listens (refused, unreachable) is retried after
  ``interval * 2**(n-1)`` seconds, capped at ``backoff_max``; logged the first time
  only.  Any answer resets it.  A target that has never answered (a new training whose
  exporter is still starting) is retried sooner, after ``min(STARTING_RETRY_SECONDS *
  2**(n-1), interval * 2**(n-1))`` (1, 2, 4, ... s), through ``on_retry``: its first
  answer opens the waiting scrape that brings each new percentage at once.
* Events: another failure is recorded as a Warning Event on the TrainJob, at most
  once per :data:`EVENT_REPEAT_SECONDS` per target and reason, whatever the message
  says (an exporter answering a different page per request must not flood).  What
  the pod sent appears only as a short sanitised prefix (:func:`scraper.scrape.exporter.excerpt`).
* Waiting scrapes: an exporter whose answers carry ``Trainjob-Exporter-Contract: 2;
  max-wait=N`` gets one held request at a time (``Prefer: wait=N`` with the ETag),
  opened no sooner than one interval after its previous answer; any failure, or an
  answer without the header, goes back to polling.  Each held request states the
  TrainJob's write policy (:mod:`scraper.shared.policy`, header
  :data:`~exporter_lib.hold_policy.WRITE_POLICY_HEADER`); an exporter of contract 3
  then answers only for a change that will be written, so its next request is opened
  no sooner than the *progress floor* after its previous answer instead of the
  interval: a new percentage reaches the writer within about the floor.
* Which pod answers: an answer whose exporter states another pod than the target's
  (:class:`~scraper.scrape.exporter.WrongPod`: a reused pod IP) is never written; it drops
  the ETag, is logged once per target, counted by reason and recorded as a Warning
  Event (as other failures, at most once per :data:`EVENT_REPEAT_SECONDS`).  An
  answer that states no pod goes to the writer with its target, which reads the pod
  before sending the status (:mod:`scraper.discovery.pod_confirm`); a status not confirmed
  drops the ETag (:meth:`ScrapeLoop.pod_checked`).
* Final status: a terminated pod's final status is owed
  (:class:`~scraper.scrape.target_state.FinalDue`) until the writer finds it needs no
  write: the TrainJob stores it, another writer's newer status stands, the CRD cannot
  store it, or the TrainJob is gone
  (:func:`scraper.scrape.finals.finalize` says which).  The caller
  (:class:`scraper.scrape.finals.OwedFinals`) starts one finalize at a time per pod and
  starts it again while it is owed (leadership gained, a pod event, a relist); a
  repeated apply is coalesced by the write queue or found unchanged, so an owed final
  is written once.  A scrape that returns after the pod ended writes nothing, so the
  final status wins.
* Order and news (docs/scraper.md, "Other writers and time"): an answer whose
  exporter sequence (:data:`scraper.shared.sequence.SEQUENCE_HEADER`) is lower than the
  last one of the same exporter process is late and dropped (``scrapes_total{result=
  "late"}``); each status goes to the writer with when its content (values, time,
  sequence) was first seen, so an exporter answering the same content again is no
  news to another writer's status, whatever the wire format (ETag or not, JSON or text).

The neighbours are :class:`Scraper`, :class:`StatusWriter` and
:class:`EventRecorder` (Protocols); their production implementations are
:class:`scraper.scrape.exporter.ExporterScraper`, :class:`scraper.write.writer.StatusWriter`
and :class:`scraper.kube.events.EventRecorder`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from exporter_lib.hold_policy import format_policy
from exporter_lib.status import TrainerStatus
from scraper.scrape.exporter import excerpt
from scraper.scrape.target_state import TargetState
from scraper.shared.outcome import WriteOutcome
from scraper.shared.pod_check import PodCheck
from scraper.shared.policy import DEFAULT_POLICY, WritePolicy
from scraper.shared.scrapes import (
    NO_SCRAPE_COUNTS,
    Busy,
    Failure,
    FailureKind,
    Fresh,
    NothingYet,
    NotModified,
    ScrapeCounts,
    ScrapeResult,
    SharedAddress,
    WrongPod,
)
from scraper.shared.sequence import is_late
from scraper.shared.targets import Final, Target
from scraper.shared.trainjobs import TrainJobGone

log = logging.getLogger(__name__)

#: First retry of a target that never answered (seconds; doubled per refusal, at most
#: the interval's backoff): an exporter starts a few seconds after its pod.
STARTING_RETRY_SECONDS = 1.0

#: The same failure on the same target is recorded as an Event at most this often (seconds).
EVENT_REPEAT_SECONDS = 600.0

REASON_INVALID = "InvalidTrainerStatus"
REASON_SCRAPE_FAILED = "TrainerStatusScrapeFailed"
REASON_FINAL_INVALID = "InvalidFinalTrainerStatus"
REASON_WRONG_POD = "TrainerStatusFromOtherPod"
REASON_SHARED_ADDRESS = "TrainerStatusFromSharedAddress"

#: Longest excerpt of a failure's detail (characters) kept in an Event or log line: the
#: detail quotes what the pod sent, which namespace users can read in the Event.
DETAIL_MAX = 160


#: Outcomes after which the ETag is kept: the status is where it belongs (or cannot be).
#: QUEUED: the write queue keeps it until applied (writes: scraper/write/).
_SETTLED = (WriteOutcome.WRITTEN, WriteOutcome.UNCHANGED, WriteOutcome.NOT_STORED,
            WriteOutcome.QUEUED)


#: Outcomes of a final's apply after which it is owed no more: on the TrainJob (or found
#: there), another writer's newer status stands (decide.others), the CRD cannot store it.
FINAL_SETTLED = (WriteOutcome.WRITTEN, WriteOutcome.UNCHANGED, WriteOutcome.DEFERRED,
                  WriteOutcome.NOT_STORED)


class Scraper(Protocol):
    """Scrapes one target; raises nothing but cancellation."""

    async def scrape(self, target: Target, etag: str | None = None) -> ScrapeResult: ...

    async def wait_for_change(self, target: Target, etag: str | None,
                              wait: float, policy: str | None = None) -> ScrapeResult:
        """A waiting scrape (``Prefer: wait``), held up to ``wait`` seconds; ``policy``:
        the write policy stated to the exporter (exporter_lib.hold_policy)."""
        ...


class StatusWriter(Protocol):
    """Applies (or queues) a status for a TrainJob; ``final`` for a final status.

    Raises :class:`~scraper.shared.trainjobs.TrainJobGone` when the TrainJob does not
    exist; any other exception counts as a failed write.
    """

    async def apply(self, namespace: str, name: str, status: TrainerStatus, *,
                    final: bool = False, uid: str = "", seen: float | None = None,
                    finished_at: float | None = None,
                    confirm: Target | None = None) -> WriteOutcome:
        """``seen``: monotonic time the content was first seen (None: now; ``-inf``:
        unknown); ``finished_at``: a final's container end (epoch seconds); ``confirm``:
        the target of an answer that stated no pod, whose pod is read before the status
        is sent (None: no read)."""
        ...


class EventRecorder(Protocol):
    """Records a Warning Event on a TrainJob; best effort, raises nothing."""

    async def event(self, namespace: str, name: str, reason: str, message: str) -> None: ...


class Pacing(Protocol):
    """What a run tells its target's scheduling
    (:class:`scraper.scrape.scheduling.TargetScheduler`)."""

    def busy(self, key: str) -> None:
        """No scrape slot came free in time for the target's run."""

    def holding(self, key: str, held: bool) -> None:
        """The target's waiting scrapes start (True) or end: its runs wait meanwhile."""

    def run_within(self, key: str, seconds: float) -> None:
        """Run the target again within ``seconds`` (a target still starting)."""


class _NoPacing:
    def busy(self, key: str) -> None: ...

    def holding(self, key: str, held: bool) -> None: ...

    def run_within(self, key: str, seconds: float) -> None: ...


class ScrapeLoop:
    """Runs the per-target rules (see the module docstring).

    Args:
        scraper, writer, events: the neighbours (Protocols above).
        backoff_max: longest wait on a target that refuses connections (seconds).
        leading: the write fence of the caller: runs do nothing while it is False.
        on_gone: called with ``(namespace, trainjob)`` when a write finds the TrainJob gone.
        pacing: told when a run found no slot, when waiting scrapes start and end, and
            when a target still starting is to run again sooner (:class:`Pacing`).
        counts: the scrape results, answers of another pod, failed writes
            (:class:`~scraper.shared.scrapes.ScrapeCounts`).
        clock: monotonic seconds (injectable for tests).
        waiting: use waiting scrapes where the exporter offers them (``--wait-scrapes``).
        final_from_log: reads the final status from a terminated pod's log, for pods
            whose source is the log (scraper/scrape/sources.py), given whether its exporter
            ever answered (``auto``: then the exporter's last status stands); None: never.
        policy_of: the write policy of a TrainJob by ``(namespace, name)``
            (:class:`scraper.shared.policy.PolicyResolver`), stated in held requests.
        pods_at: keys of the live pods known at a target URL's ``host:port``
            (:meth:`scraper.scrape.target_table.AddressIndex.pods_at`); an answer that states
            no pod is refused (:class:`SharedAddress`) while there is more than one, and
            otherwise goes to the writer with its target, whose pod the writer reads
            before sending it (:mod:`scraper.discovery.pod_confirm`, :meth:`pod_checked`).
    """

    def __init__(
        self,
        scraper: Scraper,
        writer: StatusWriter,
        events: EventRecorder,
        *,
        backoff_max: float,
        leading: Callable[[], bool] = lambda: True,
        on_gone: Callable[[str, str], None] = lambda namespace, trainjob: None,
        pacing: Pacing | None = None,
        counts: ScrapeCounts = NO_SCRAPE_COUNTS,
        clock: Callable[[], float] = time.monotonic,
        waiting: bool = True,
        final_from_log: Callable[[Final, bool], Awaitable[TrainerStatus | None]] | None = None,
        policy_of: Callable[[str, str], WritePolicy] = lambda namespace, name: DEFAULT_POLICY,
        pods_at: Callable[[str], tuple[str, ...]] = lambda url: (),
    ) -> None:
        self._pods_at = pods_at
        self._policy_of = policy_of
        self._pacing: Pacing = pacing if pacing is not None else _NoPacing()
        self._counts = counts
        self.final_from_log = final_from_log
        self._waiting = waiting
        self._scraper = scraper
        self._writer = writer
        self.events = events
        self._backoff_max = backoff_max
        self._leading = leading
        self._on_gone = on_gone
        self._clock = clock

    async def run(self, state: TargetState) -> None:
        """One scheduled run for one target (never overlaps itself for that target).

        A target polled: one scrape.  A target whose exporter offers waiting scrapes
        (learnt by a poll, possibly this run's): the run holds the target's one request
        open, one after another, until waiting ends (:meth:`_hold`); its scheduled runs
        are paused meanwhile (:meth:`Pacing.holding`), so the run is the target's only
        scheduling path, polled or held.
        """
        target = state.target
        if target is None or state.dropped or not self._leading():
            return
        if self._clock() < state.retry_at:
            return
        if state.held is not None and not state.held.done():
            return  # another run holds this target (only a caller without a scheduler)
        if state.max_wait is None:
            result = await self._scraper.scrape(target, state.etag)
            if isinstance(result, Busy):
                self._pacing.busy(target.key)
                return
            state.answered_at = self._clock()
            await self._handle(state, target, result)
            if (state.max_wait is None or state.dropped or state.target != target
                    or not self._leading()):
                return
            # The poll learnt that the exporter offers waiting scrapes: hold from now on,
            # not from the next scheduled run (an interval later); _hold keeps the pace.
        await self._hold(state, target)

    async def _hold(self, state: TargetState, target: Target) -> None:
        """Keep one waiting scrape open for ``target`` while its exporter offers them.

        A request is sent no sooner than the *pace* after the previous answer: the
        TrainJob's progress floor when the exporter holds by the stated write policy
        (contract 3: it answers only for a change that will be written), else the
        interval (contract 2 answers every change: a target answers at most once per
        interval, as polling would).  Ends (back to polling by the scheduled runs) on a
        failure, an answer without the contract header, a new target, the end of
        leadership or the state's drop; :meth:`TargetState.stop_holding` cancels it
        (the run's task is ``state.held`` meanwhile).
        """
        state.held = asyncio.current_task()
        self._pacing.holding(target.key, True)
        try:
            while True:
                policy = self._policy_of(target.namespace, target.trainjob)
                pace = policy.progress_floor if state.by_policy else target.interval
                delay = state.answered_at + pace - self._clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                if (state.dropped or state.target != target or not self._leading()
                        or state.max_wait is None or self._clock() < state.retry_at):
                    return
                result = await self._scraper.wait_for_change(
                    target, state.etag, state.max_wait, self._stated(state, policy))
                state.answered_at = self._clock()
                if state.dropped or not self._leading():
                    return
                await self._handle(state, target, result)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug must not end waiting silently; polling takes over
            log.exception("waiting scrape of %s failed; polling it", target.key)
            state.max_wait = None
        finally:
            if state.held is asyncio.current_task():
                state.held = None
            self._pacing.holding(target.key, False)

    def _stated(self, state: TargetState, policy: WritePolicy) -> str:
        """The write policy as stated to the exporter: the percentage of the last status
        taken from it, the staleness, and how long ago that status was taken."""
        progress = state.reported[0].progress_percentage if state.reported else None
        return format_policy(progress, policy.metrics_staleness,
                             self._clock() - state.taken_at)

    async def _handle(self, state: TargetState, target: Target, result: ScrapeResult) -> None:
        """The rules for one answer (or failure) of ``target``."""
        if isinstance(result, Busy):
            self._pacing.busy(target.key)
            return
        if isinstance(result, Failure):
            state.max_wait = None
            self._counts.scraped(result.kind.value)
            await self._on_failure(state, target, result)
            return
        if isinstance(result, Fresh) and not result.identified:
            pods = self._pods_at(target.url)
            if len(pods) > 1:
                result = SharedAddress(pods)
        if isinstance(result, WrongPod):
            await self._on_wrong_pod(state, target, result)
            return
        if isinstance(result, SharedAddress):
            await self._on_shared_address(state, target, result)
            return
        state.max_wait = result.max_wait if self._waiting else None
        state.by_policy = result.by_policy
        if state.refusals:
            log.info("target %s answers again", target.key)
        state.refusals, state.retry_at, state.view.up = 0, 0.0, True
        state.answered_ever = True
        state.shared_reported = ()  # a later conflict, even of the same pods, is evented
        if isinstance(result, NotModified):
            self._counts.scraped("not_modified")
            return
        if isinstance(result, NothingYet):
            self._counts.scraped("empty")
            return
        assert isinstance(result, Fresh)
        if is_late(state.sequence, result.sequence):
            self._counts.scraped("late")
            log.debug("target %s: answer of sequence %s is older than %s; dropped",
                      target.key, result.sequence, state.sequence)
            return
        content = (result.status, None if result.sequence is None else result.sequence.n)
        self._counts.scraped("ok")
        if result.sequence is not None:
            state.sequence = result.sequence
        if content != state.reported:
            state.reported_seen = float("-inf") if state.reported is None else self._clock()
            state.reported = content
        state.view.status = result.status
        if state.dropped or state.target is None:
            return  # the pod ended meanwhile: its final status wins
        state.taken_at = self._clock()
        outcome = await self.write(target.namespace, target.trainjob, result.status,
                                   uid=target.trainjob_uid, seen=state.reported_seen,
                                   confirm=None if result.identified else target)
        state.etag = result.etag if outcome in _SETTLED else None

    def pod_checked(self, state: TargetState | None, target: Target, check: PodCheck) -> bool:
        """The writer read ``target``'s pod before sending a status of an answer that
        stated no pod (:mod:`scraper.discovery.pod_confirm`).  Unless ``CONFIRMED`` the status
        was not sent: the target's ETag goes (the next scrape brings the status again)
        and a WARNING is logged once per result (repeats at DEBUG); a confirmed read
        ends the episode, so a later one warns again.  ``state``: the target's, None
        when it left the table.

        Returns:
            Whether the read was of the pod and address ``state`` still scrapes (False:
            the table moved on since, nothing is done).
        """
        now = state.target if state is not None else None
        if (state is None or now is None or state.uid != target.pod_uid
                or now.url != target.url):
            return False
        if check is PodCheck.CONFIRMED:
            state.unconfirmed_logged = None
            return True
        state.etag = None
        warned, state.unconfirmed_logged = state.unconfirmed_logged, check.value
        log.log(logging.DEBUG if warned == check.value else logging.WARNING,
                "target %s (%s): an answer that states no pod, and the pod is not the "
                "target's any more (%s); not written, the pod watch relists",
                target.key, target.url, check.value)
        return True

    async def _on_failure(self, state: TargetState, target: Target, failure: Failure) -> None:
        state.view.up = False
        state.etag = None
        if failure.kind.not_instrumented:
            state.refusals += 1
            delay = min(target.interval * 2 ** (state.refusals - 1), self._backoff_max)
            if not state.answered_ever:  # still starting
                delay = min(delay, STARTING_RETRY_SECONDS * 2 ** (state.refusals - 1))
                self._pacing.run_within(target.key, delay)
            state.retry_at = self._clock() + delay
            if state.refusals == 1:
                log.info("target %s (%s): %s; treating it as not instrumented and backing "
                         "off (up to %gs)", target.key, target.url, failure.detail,
                         self._backoff_max)
            return
        reason = REASON_INVALID if failure.kind is FailureKind.INVALID else REASON_SCRAPE_FAILED
        now = self._clock()
        at = state.event_at.get(reason)
        if at is not None and now - at < EVENT_REPEAT_SECONDS:
            return
        state.event_at[reason] = now
        detail = excerpt(failure.detail, DETAIL_MAX)
        message = f"scraping {target.url} (pod {target.pod_name}): {detail}"
        log.warning("TrainJob %s/%s: %s", target.namespace, target.trainjob, message)
        await self.events.event(target.namespace, target.trainjob, reason,
                                 message + "; the previous status is kept")

    async def _on_wrong_pod(self, state: TargetState, target: Target, wrong: WrongPod) -> None:
        state.max_wait, state.etag, state.view.up = None, None, False
        self._counts.scraped("wrong_pod")
        self._counts.wrong_pod(wrong.reason)
        # Not cut to DETAIL_MAX: ours, and what the pod stated is already an excerpt.
        message = f"pod {target.pod_name}: {wrong.detail}"
        if not state.wrong_pod_logged:
            state.wrong_pod_logged = True
            log.warning("TrainJob %s/%s: %s; not written", target.namespace, target.trainjob,
                        message)
        now = self._clock()
        at = state.event_at.get(REASON_WRONG_POD)
        if at is not None and now - at < EVENT_REPEAT_SECONDS:
            return
        state.event_at[REASON_WRONG_POD] = now
        await self.events.event(target.namespace, target.trainjob, REASON_WRONG_POD,
                                 message + "; not written, the previous status is kept")

    async def _on_shared_address(self, state: TargetState, target: Target,
                                 shared: SharedAddress) -> None:
        state.max_wait, state.etag, state.view.up = None, None, False
        self._counts.scraped("shared_address")
        if shared.pods == state.shared_reported:
            return
        state.shared_reported = shared.pods
        message = (f"the answer at {target.url} (pod {target.pod_name}) states no pod, and "
                   f"{len(shared.pods)} live pods are known at that address "
                   f"({excerpt(', '.join(shared.pods), DETAIL_MAX)}): it may be another "
                   "pod's")
        log.warning("TrainJob %s/%s: %s; not written", target.namespace, target.trainjob,
                    message)
        await self.events.event(target.namespace, target.trainjob, REASON_SHARED_ADDRESS,
                                 message + "; not written, the previous status is kept")

    async def write(self, namespace: str, trainjob: str, status: TrainerStatus, *,
                    final: bool = False, uid: str = "", seen: float | None = None,
                    finished_at: float | None = None,
                    confirm: Target | None = None) -> WriteOutcome | None:
        """Apply ``status`` to TrainJob ``uid`` (``""``: whichever exists); None when the
        TrainJob is gone (``on_gone`` was called).  ``seen``, ``finished_at`` and
        ``confirm``: as :meth:`StatusWriter.apply` takes them."""
        try:
            return await self._writer.apply(namespace, trainjob, status, final=final, uid=uid,
                                            seen=seen, finished_at=finished_at,
                                            confirm=confirm)
        except TrainJobGone:
            log.info("TrainJob %s/%s is gone: no longer scraping its pod", namespace, trainjob)
            self._on_gone(namespace, trainjob)
            return None
        except Exception as exc:
            log.warning("status write to TrainJob %s/%s failed: %s", namespace, trainjob, exc)
            self._counts.written(WriteOutcome.FAILED)
            return WriteOutcome.FAILED
