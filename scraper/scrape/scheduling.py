"""One APScheduler job per target, phases spread deterministically over the interval.

As Prometheus does, every target gets a fixed offset inside its interval from a
hash of its key, so N targets with the same interval do not all fire at once
and a restarted scraper scrapes each target at the same phase as before.  A target
that appears while the scraper runs (a new training, or the lists at start-up and at a
Lease gain) is first scraped sooner than its phase: within a second
(:data:`SOON_SECONDS`), early first runs taking turns at most :data:`SOON_PER_SECOND` a
second, and never later than its phase.  Its first answer opens the waiting scrape that
brings each new percentage at once.

Unlike Prometheus, which spreads offsets to the millisecond, offsets fall on one
of :data:`PHASES` evenly spaced phases.  Every event-loop wakeup costs CPU of its
own (``python -m benchmarks.breakdown`` measures it), so targets that share a phase
share one wakeup, one pass of APScheduler's job loop and one ``epoll`` round for
their requests.  20 phases still spread N targets into bursts of about N/20.

APScheduler is used through its public API only (``add_job``, ``pause_job``,
``resume_job``, ``remove_job``, listeners).  Its asyncio scheduler wakes through
``call_soon_threadsafe`` even from its own timer: one extra loop iteration per
phase, that is at most :data:`PHASES` per interval whatever the number of targets
(20 per 30 s at the defaults), too few to justify overriding its private methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from scraper.shared.targets import Target

log = logging.getLogger(__name__)

#: Distinct start phases per interval (see the module docstring for why not more).
PHASES = 20

ScrapeFunc = Callable[[str], Awaitable[None]]

#: Seconds between two "runs skipped" warnings (the counter counts every one).
SKIP_WARNING_PERIOD = 60.0

#: A target that appears while the scraper runs (a new training's pod) is first scraped
#: within this many seconds (its phase within it) instead of at its phase within the
#: interval: a waiting scrape, and with it a new percentage at once, starts only after a
#: first answer, so a new training waited up to a whole interval (30 s by default).
SOON_SECONDS = 1.0
#: Early first runs per second at most.  Beyond that a surge (the lists at start-up and
#: at a Lease gain) takes turns: the k-th target over the rate runs about k / this
#: seconds later, or at its phase when that comes first (docs/decisions.md, "Early
#: first scrapes take turns").
SOON_PER_SECOND = 50.0


#: APScheduler instances of one target's job: the running scrape and a run that finds
#: it running and returns at once (:meth:`TargetScheduler._run`).
_INSTANCES = 2


def offset_seconds(key: str, interval: float) -> float:
    """The target's phase within its interval, in seconds: ``k * interval / PHASES``
    with ``k = hash(key) mod PHASES``.

    The hash is the first 8 bytes of SHA-256, so the offset is the same in every
    process and on every run (Python's ``hash()`` is salted per process).
    """
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return (digest % PHASES) * interval / PHASES


def first_run(key: str, interval: float, now: float | None = None) -> datetime:
    """The first time after ``now`` (epoch seconds) whose phase is the target's offset."""
    now = time.time() if now is None else now
    offset = offset_seconds(key, interval)
    base = now - (now % interval)
    at = base + offset
    if at <= now:
        at += interval
    return datetime.fromtimestamp(at, UTC)


def _drop_cancelled_runs(record: logging.LogRecord) -> bool:
    """Logging filter: False for APScheduler's ERROR about a run that was cancelled.

    Shutdown cancels the scrapes in flight on purpose; APScheduler's executor would
    log each one as "raised an exception" with a CancelledError traceback.
    """
    return not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))


class TargetScheduler:
    """Runs ``scrape(key)`` for every scheduled target on its interval.

    Scrapes never overlap for one target: a run that finds the target's previous
    scrape still running returns at once and is counted as skipped (:meth:`_run`;
    APScheduler allows the job :data:`_INSTANCES` instances, so it never skips or warns
    itself); runs missed while the loop was busy are coalesced into one
    (``coalesce=True``) and run late rather than dropped.
    """

    def __init__(self, scrape: ScrapeFunc,
                 on_skipped: Callable[[str], None] | None = None,
                 busy_reason: str = "no scrape slot came free in time") -> None:
        """``on_skipped(key)`` is called for every run skipped because the scraper is
        behind its schedule: the target's previous run had not finished, or a run
        reported through :meth:`note_skipped` or :meth:`busy` (``busy_reason`` says why
        in the warning)."""
        self._scrape = scrape
        self._busy_reason = busy_reason
        self._on_skipped = on_skipped
        self._scheduler = AsyncIOScheduler(timezone=UTC)
        self._scheduler.add_listener(self._skipped, EVENT_JOB_MAX_INSTANCES)
        logging.getLogger("apscheduler.executors.default").addFilter(_drop_cancelled_runs)
        self._scheduled: dict[str, Target] = {}
        self._running: set[str] = set()  # keys whose scrape is in flight
        self._paused: set[str] = set()  # keys whose run holds a waiting scrape
        self._soon_tokens = SOON_PER_SECOND
        self._soon_refilled = time.monotonic()
        self._skips = 0
        self._last_warning = float("-inf")

    async def _run(self, key: str) -> None:
        """The job of ``key``: its scrape, unless its previous one is still running
        (then a skipped run, counted; APScheduler's own skip would warn on every run)."""
        if key in self._running:
            self.note_skipped(key, "its previous scrape was still running")
            return
        self._running.add(key)
        try:
            await self._scrape(key)
        finally:
            self._running.discard(key)

    def _skipped(self, event: JobSubmissionEvent) -> None:
        self.note_skipped(event.job_id, "its previous scrape was still running")

    def note_skipped(self, key: str, why: str) -> None:
        """Count a run of ``key`` that did not scrape because the scraper is behind.

        Calls ``on_skipped(key)`` every time and logs a WARNING at most once a minute
        (``why`` says what delayed the run).
        """
        if self._on_skipped is not None:
            self._on_skipped(key)
        self._skips += 1
        now = time.monotonic()
        if now - self._last_warning >= SKIP_WARNING_PERIOD:
            log.warning("scheduled scrape of %s skipped: %s (%d skipped since start; counted "
                        "in trainjob_scraper_skipped_runs_total, warned at most once a "
                        "minute); if exporters time out they hold the slots: raise "
                        "--concurrency above hung exporters x timeout / interval; otherwise "
                        "give the scraper more CPU or a longer interval",
                        key, why, self._skips)
            self._last_warning = now

    def start(self) -> None:
        """Start the scheduler on the running event loop."""
        self._scheduler.start()

    def shutdown(self) -> None:
        """Stop firing jobs (in-flight runs are not awaited here)."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        self._scheduled.clear()
        self._paused.clear()

    def __len__(self) -> int:
        """How many targets are scheduled (no copy: read on every pod event)."""
        return len(self._scheduled)

    def sizes(self) -> dict[str, int]:
        """Entries kept per target: scheduled targets and APScheduler's jobs."""
        return {"scheduled": len(self._scheduled), "jobs": len(self._scheduler.get_jobs())}

    def scheduled_keys(self) -> set[str]:
        """Keys of the scheduled targets."""
        return set(self._scheduled)

    def _soon_wait(self) -> float:
        """Seconds until the next early first run is free in a bucket of
        :data:`SOON_PER_SECOND` per second (0: one is free now); not taken."""
        now = time.monotonic()
        self._soon_tokens = min(SOON_PER_SECOND, self._soon_tokens
                                + (now - self._soon_refilled) * SOON_PER_SECOND)
        self._soon_refilled = now
        return max(0.0, (1.0 - self._soon_tokens) / SOON_PER_SECOND)

    def _early_run(self, target: Target) -> datetime | None:
        """When a target new to this scheduler first runs if before its phase (taking
        its turn of the early runs), else None (it runs at its phase)."""
        wait = self._soon_wait()
        now = time.time()
        at = now + wait + offset_seconds(target.key, min(SOON_SECONDS, target.interval))
        if at >= first_run(target.key, target.interval, now).timestamp():
            return None
        self._soon_tokens -= 1.0  # below 0 while a surge takes turns
        return datetime.fromtimestamp(at, UTC)

    def schedule(self, target: Target) -> None:
        """Add the target's job, or replace it if its URL, pod or interval changed.

        A target new to this scheduler runs first within :data:`SOON_SECONDS` of its
        turn among the early first runs (:data:`SOON_PER_SECOND` per second), or at its
        phase (:func:`first_run`) when that comes first; APScheduler then counts its
        interval from that run.
        """
        current = self._scheduled.get(target.key)
        if current == target:
            return
        extra = {}
        if current is None and self._scheduler.running:
            early = self._early_run(target)
            if early is not None:
                extra["next_run_time"] = early
        self._scheduler.add_job(
            self._run,
            IntervalTrigger(seconds=target.interval,
                            start_date=first_run(target.key, target.interval), timezone=UTC),
            args=(target.key,),
            id=target.key,
            name=target.key,
            replace_existing=True,
            max_instances=_INSTANCES,
            coalesce=True,
            misfire_grace_time=None,
            **extra,
        )
        self._scheduled[target.key] = target
        if target.key in self._paused:
            # The replaced job is new and unpaused, while the run holding this target's
            # waiting scrape goes on: its firings would only find it running.
            with contextlib.suppress(JobLookupError):
                self._scheduler.pause_job(target.key)
        log.debug("scheduled %s every %.1fs (%s)", target.key, target.interval, target.url)

    # The scrape loop's Pacing (scraper.scrape.loop.Pacing).

    def busy(self, key: str) -> None:
        """A run of ``key`` found no scrape slot in time: a skipped run (:meth:`note_skipped`)."""
        self.note_skipped(key, self._busy_reason)

    def holding(self, key: str, held: bool) -> None:
        """The target's waiting scrapes start (:meth:`pause`) or end (:meth:`resume`)."""
        if held:
            self.pause(key)
        else:
            self.resume(key)

    def run_within(self, key: str, seconds: float) -> None:
        """Run the target's job once within ``seconds`` when its next run is later
        (a retry sooner than the interval); APScheduler counts the interval from that run."""
        if key not in self._scheduled:
            return
        job = self._scheduler.get_job(key)
        at = datetime.now(UTC) + timedelta(seconds=seconds)
        if job is not None and job.next_run_time is not None and job.next_run_time > at:
            with contextlib.suppress(JobLookupError):
                self._scheduler.modify_job(key, next_run_time=at)

    def pause(self, key: str) -> None:
        """Stop firing the target's job until :meth:`resume` (its waiting scrape is open:
        a run per interval would only find it open, at the cost of a wakeup and a job run;
        it stays paused when :meth:`schedule` replaces the job meanwhile)."""
        if key in self._scheduled:
            self._paused.add(key)
            with contextlib.suppress(JobLookupError):  # the job already ran its course
                self._scheduler.pause_job(key)

    def resume(self, key: str) -> None:
        """Fire the target's job again at its phase (its waiting scrape ended)."""
        self._paused.discard(key)
        if key in self._scheduled:
            with contextlib.suppress(JobLookupError):
                self._scheduler.resume_job(key)

    def unschedule(self, key: str) -> None:
        """Remove the target's job if there is one (its holding run is the caller's to
        cancel: :meth:`scraper.scrape.target_state.TargetState.stop_holding`)."""
        self._paused.discard(key)
        if self._scheduled.pop(key, None) is not None:
            # The job already ran its course: nothing to remove.
            with contextlib.suppress(JobLookupError):
                self._scheduler.remove_job(key)
            log.debug("unscheduled %s", key)
