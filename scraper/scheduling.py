"""One APScheduler job per target, phases spread deterministically over the interval.

As Prometheus does, every target gets a fixed offset inside its interval from a
hash of its key, so N targets with the same interval do not all fire at once
and a restarted scraper scrapes each target at the same phase as before.

Unlike Prometheus, which spreads offsets to the millisecond, offsets fall on one
of :data:`PHASES` evenly spaced phases.  Every event-loop wakeup costs CPU of its
own (45-68 us on a 2-core VM, ``python -m benchmarks.breakdown``), so targets that
share a phase share one wakeup, one pass of APScheduler's job loop and one
``epoll`` round for their requests.  20 phases still spread N targets into
bursts of about N/20.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from scraper.targets import Target

log = logging.getLogger(__name__)

#: Distinct start phases per interval (see the module docstring for why not more).
PHASES = 20

ScrapeFunc = Callable[[str], Awaitable[None]]

#: Seconds between two "runs skipped" warnings (the counter counts every one).
SKIP_WARNING_PERIOD = 60.0


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


def _drop_skip_warnings(record: logging.LogRecord) -> bool:
    """Logging filter: False for APScheduler's per-run "skipped" warning."""
    return "maximum number of running instances reached" not in record.getMessage()


def _drop_cancelled_runs(record: logging.LogRecord) -> bool:
    """Logging filter: False for APScheduler's ERROR about a run that was cancelled.

    Shutdown cancels the scrapes in flight on purpose; APScheduler's executor would
    log each one as "raised an exception" with a CancelledError traceback.
    """
    return not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))


class _OnLoopScheduler(AsyncIOScheduler):  # type: ignore[misc]  # APScheduler 3 is untyped
    """APScheduler's asyncio scheduler, woken by its timer without a thread hop.

    The stock timer callback is ``wakeup()``, which goes through
    ``call_soon_threadsafe`` (a write to the loop's self-pipe, a read back and one
    more loop iteration) although the timer already runs on the loop.  Here the
    timer runs the same job pass directly; ``wakeup()`` from other code is unchanged.
    """

    def _start_timer(self, wait_seconds: float | None) -> None:
        self._stop_timer()
        if wait_seconds is not None:
            self._timeout = self._eventloop.call_later(wait_seconds, self._on_timer)

    def _on_timer(self) -> None:
        self._timeout = None
        self._start_timer(self._process_jobs())


class TargetScheduler:
    """Runs ``scrape(key)`` for every scheduled target on its interval.

    Jobs never overlap for one target (``max_instances=1``); runs missed while
    the loop was busy are coalesced into one (``coalesce=True``) and run late
    rather than dropped.
    """

    def __init__(self, scrape: ScrapeFunc,
                 on_skipped: Callable[[str], None] | None = None) -> None:
        """``on_skipped(key)`` is called for every run skipped because the scraper is
        behind its schedule: the target's previous run had not finished, or a run
        reported through :meth:`note_skipped`."""
        self._scrape = scrape
        self._on_skipped = on_skipped
        self._scheduler = _OnLoopScheduler(timezone=UTC)
        self._scheduler.add_listener(self._skipped, EVENT_JOB_MAX_INSTANCES)
        # APScheduler warns once per skipped run: a line per target per interval
        # when the scraper falls behind.  _skipped() counts them and warns per minute.
        logging.getLogger("apscheduler.scheduler").addFilter(_drop_skip_warnings)
        logging.getLogger("apscheduler.executors.default").addFilter(_drop_cancelled_runs)
        self._scheduled: dict[str, Target] = {}
        self._skips = 0
        self._last_warning = float("-inf")

    def _skipped(self, event: JobSubmissionEvent) -> None:
        self.note_skipped(event.job_id, "its previous scrape was still running")

    def note_skipped(self, key: str, why: str) -> None:
        """Count a run of ``key`` that did not scrape because the scraper is behind.

        Calls ``on_skipped(key)`` every time and logs a WARNING at most once a minute
        (``why`` says what held the run up).
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

    def scheduled_keys(self) -> set[str]:
        """Keys of the scheduled targets."""
        return set(self._scheduled)

    def schedule(self, target: Target) -> None:
        """Add the target's job, or replace it if its URL, pod or interval changed."""
        current = self._scheduled.get(target.key)
        if current == target:
            return
        self._scheduler.add_job(
            self._scrape,
            IntervalTrigger(seconds=target.interval,
                            start_date=first_run(target.key, target.interval), timezone=UTC),
            args=(target.key,),
            id=target.key,
            name=target.key,
            replace_existing=True,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
        )
        self._scheduled[target.key] = target
        log.debug("scheduled %s every %.1fs (%s)", target.key, target.interval, target.url)

    def pause(self, key: str) -> None:
        """Stop firing the target's job until :meth:`resume` (its waiting scrape is open:
        a run per interval would only find it open, at the cost of a wakeup and a job run)."""
        if key in self._scheduled:
            with contextlib.suppress(Exception):  # JobLookupError: already gone
                self._scheduler.pause_job(key)

    def resume(self, key: str) -> None:
        """Fire the target's job again at its phase (its waiting scrape ended)."""
        if key in self._scheduled:
            with contextlib.suppress(Exception):
                self._scheduler.resume_job(key)

    def unschedule(self, key: str) -> None:
        """Remove the target's job if there is one."""
        if self._scheduled.pop(key, None) is not None:
            # JobLookupError: the job already ran its course; nothing to remove.
            with contextlib.suppress(Exception):
                self._scheduler.remove_job(key)
            log.debug("unscheduled %s", key)
