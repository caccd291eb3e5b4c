"""The scrape-loop stage: per-target state and the rules of one run.

One run is scrape -> validate (done by the scraper) -> write decision.  The rules
this module owns, each tested in-process with fakes (``tests/scraper/test_loop.py``):

* ETag: kept only when the status is safely where it belongs (written, unchanged,
  or not storable); dropped on any failure, so the next scrape fetches the body
  again and the write is retried.
* Backoff: a target where nothing listens (refused, unreachable) is retried after
  ``interval * 2**(n-1)`` seconds, capped at ``backoff_max``; logged the first time
  only.  Any answer resets it.
* Events: another failure is recorded as a Warning Event on the TrainJob, the same
  message at most once per :data:`EVENT_REPEAT_SECONDS`.
* Final status: a terminated pod's termination message is applied once (the
  caller claims it through :meth:`TargetState.claim_final`); a scrape that returns
  after the pod ended writes nothing, so the final status wins.

The neighbours are :class:`Scraper`, :class:`StatusWriter` and
:class:`EventRecorder` (Protocols); their production implementations are
:class:`scraper.scraping.ExporterScraper`, :class:`scraper.status_writer.StatusWriter`
and :class:`scraper.kube.events.EventRecorder`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from exporter_lib.status import StatusError, TrainerStatus
from scraper.discovery import Final
from scraper.scraping import (
    Busy,
    Failure,
    FailureKind,
    Fresh,
    NothingYet,
    NotModified,
    ScrapeResult,
)
from scraper.status_writer import TrainJobGone, WriteOutcome
from scraper.targets import Target
from scraper.telemetry import JobView

log = logging.getLogger(__name__)

#: The same failure on the same target is recorded as an Event at most this often (seconds).
EVENT_REPEAT_SECONDS = 600.0

REASON_INVALID = "InvalidTrainerStatus"
REASON_SCRAPE_FAILED = "TrainerStatusScrapeFailed"
REASON_FINAL_INVALID = "InvalidFinalTrainerStatus"

#: Outcomes after which the ETag is kept: the status is where it belongs (or cannot be).
#: QUEUED: the write queue keeps it until applied (writes: scraper/status_writer.py).
_SETTLED = (WriteOutcome.WRITTEN, WriteOutcome.UNCHANGED, WriteOutcome.NOT_STORED,
            WriteOutcome.QUEUED)


class Scraper(Protocol):
    """Scrapes one target; raises nothing but cancellation."""

    async def scrape(self, target: Target, etag: str | None = None) -> ScrapeResult: ...


class StatusWriter(Protocol):
    """Applies (or queues) a status for a TrainJob; ``final`` for a final status.

    Raises :class:`~scraper.status_writer.TrainJobGone` when the TrainJob does not
    exist; any other exception counts as a failed write.
    """

    async def apply(self, namespace: str, name: str, status: TrainerStatus, *,
                    final: bool = False, uid: str = "") -> WriteOutcome: ...


class EventRecorder(Protocol):
    """Records a Warning Event on a TrainJob; best effort, raises nothing."""

    async def event(self, namespace: str, name: str, reason: str, message: str) -> None: ...


@dataclass(eq=False)
class TargetState:
    """Per-pod bookkeeping; ``view`` is what /metrics shows for its TrainJob.

    Attributes:
        target: what to scrape; None once the pod ended.
        uid: the pod's UID.
        etag: ETag of the last status that is safely written (sent as If-None-Match).
        refusals: consecutive failures meaning "no exporter here".
        retry_at: monotonic time before which scheduled runs do nothing (backoff).
        last_event: the last Event message and the monotonic time it was recorded.
        ended: the pod's end (termination messages), once it ended.
        final_claimed: the final status write has been started (it is started once).
        dropped: the state left the table (pod gone, TrainJob gone, replaced).
    """

    view: JobView
    target: Target | None = None
    uid: str = ""
    etag: str | None = None
    refusals: int = 0
    retry_at: float = 0.0
    last_event: tuple[str, float] = ("", 0.0)
    ended: Final | None = None
    final_claimed: bool = False
    dropped: bool = False

    @property
    def trainjob_key(self) -> tuple[str, str]:
        """``(namespace, trainjob)``: the object whose status this pod reports."""
        return (self.view.namespace, self.view.trainjob)

    def claim_final(self) -> bool:
        """True the first time it is called for a state whose pod ended; False after."""
        if self.ended is None or self.final_claimed:
            return False
        self.final_claimed = True
        return True

    def retarget(self, target: Target) -> None:
        """Set the target; a new URL starts over (no ETag, no backoff)."""
        if self.target is not None and self.target.url != target.url:
            self.etag, self.refusals, self.retry_at = None, 0, 0.0
        self.target = target


class ScrapeLoop:
    """Runs the per-target rules (see the module docstring).

    Args:
        scraper, writer, events: the neighbours (Protocols above).
        backoff_max: longest wait on a target that refuses connections (seconds).
        leading: the write fence of the caller: runs do nothing while it is False.
        on_gone: called with ``(namespace, trainjob)`` when a write finds the TrainJob gone.
        on_busy: called with the target key when no scrape slot came free.
        count_scrape: called with the scrape result label (``ok``, ``not_modified``,
            ``empty`` or a :class:`FailureKind` value).
        count_write: called with :attr:`WriteOutcome.FAILED` when a write raised.
        clock: monotonic seconds (injectable for tests).
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
        on_busy: Callable[[str], None] = lambda key: None,
        count_scrape: Callable[[str], None] = lambda result: None,
        count_write: Callable[[WriteOutcome], None] = lambda outcome: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._scraper = scraper
        self._writer = writer
        self._events = events
        self._backoff_max = backoff_max
        self._leading = leading
        self._on_gone = on_gone
        self._on_busy = on_busy
        self._count_scrape = count_scrape
        self._count_write = count_write
        self._clock = clock

    async def run(self, state: TargetState) -> None:
        """One scheduled run for one target (never overlaps itself for that target)."""
        target = state.target
        if target is None or state.dropped or not self._leading():
            return
        if self._clock() < state.retry_at:
            return
        result = await self._scraper.scrape(target, state.etag)
        if isinstance(result, Busy):
            self._on_busy(target.key)
            return
        if isinstance(result, Failure):
            self._count_scrape(result.kind.value)
            await self._on_failure(state, target, result)
            return
        if state.refusals:
            log.info("target %s answers again", target.key)
        state.refusals, state.retry_at, state.view.up = 0, 0.0, True
        if isinstance(result, NotModified):
            self._count_scrape("not_modified")
            return
        if isinstance(result, NothingYet):
            self._count_scrape("empty")
            return
        assert isinstance(result, Fresh)
        self._count_scrape("ok")
        state.view.status = result.status
        if state.dropped or state.target is None:
            return  # the pod ended meanwhile: its final status wins
        outcome = await self.write(target.namespace, target.trainjob, result.status,
                                   uid=target.trainjob_uid)
        state.etag = result.etag if outcome in _SETTLED else None

    async def _on_failure(self, state: TargetState, target: Target, failure: Failure) -> None:
        state.view.up = False
        state.etag = None
        if failure.kind.not_instrumented:
            state.refusals += 1
            delay = min(target.interval * 2 ** (state.refusals - 1), self._backoff_max)
            state.retry_at = self._clock() + delay
            if state.refusals == 1:
                log.info("target %s (%s): %s; treating it as not instrumented and backing "
                         "off (up to %gs)", target.key, target.url, failure.detail,
                         self._backoff_max)
            return
        reason = REASON_INVALID if failure.kind is FailureKind.INVALID else REASON_SCRAPE_FAILED
        message = f"scraping {target.url} (pod {target.pod_name}): {failure.detail}"
        last, at = state.last_event
        now = self._clock()
        if last == message and now - at < EVENT_REPEAT_SECONDS:
            return
        state.last_event = (message, now)
        log.warning("TrainJob %s/%s: %s", target.namespace, target.trainjob, message)
        await self._events.event(target.namespace, target.trainjob, reason,
                                 message + "; the previous status is kept")

    async def write(self, namespace: str, trainjob: str, status: TrainerStatus, *,
                    final: bool = False, uid: str = "") -> WriteOutcome | None:
        """Apply ``status`` to TrainJob ``uid`` (``""``: whichever exists); None when the
        TrainJob is gone (``on_gone`` was called)."""
        try:
            return await self._writer.apply(namespace, trainjob, status, final=final, uid=uid)
        except TrainJobGone:
            log.info("TrainJob %s/%s is gone: no longer scraping its pod", namespace, trainjob)
            self._on_gone(namespace, trainjob)
            return None
        except Exception as exc:
            log.warning("status write to TrainJob %s/%s failed: %s", namespace, trainjob, exc)
            self._count_write(WriteOutcome.FAILED)
            return WriteOutcome.FAILED

    async def finalize(self, final: Final, state: TargetState | None) -> None:
        """Apply the final status from a terminated pod's termination message.

        The first container message that is a valid trainerStatus is applied; when
        none is, one Warning Event names every problem.
        """
        problems = []
        for container, message in final.messages:
            try:
                status = TrainerStatus.from_json(message)
            except StatusError as exc:
                problems.append(f"container {container}: {exc}")
                continue
            if state is not None:
                state.view.status = status
            outcome = await self.write(final.namespace, final.trainjob, status, final=True,
                                       uid=final.trainjob_uid)
            log.info("final status of TrainJob %s/%s from pod %s (container %s): %s",
                     final.namespace, final.trainjob, final.pod_name, container,
                     outcome.value if outcome else "TrainJob gone")
            return
        if problems:
            await self._events.event(
                final.namespace, final.trainjob, REASON_FINAL_INVALID,
                f"termination message of pod {final.pod_name} is not a valid trainerStatus: "
                + "; ".join(problems) + "; the previous status is kept",
            )
