"""One APScheduler job per target, phases spread deterministically over the interval.

As Prometheus does, every target gets a fixed offset inside its interval from a
hash of its key, so N targets with the same interval do not all fire at once
and a restarted scraper scrapes each target at the same phase as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from scraper.targets import Target

log = logging.getLogger(__name__)

ScrapeFunc = Callable[[str], Awaitable[None]]


def offset_seconds(key: str, interval: float) -> float:
    """The target's phase within its interval: ``hash(key) mod interval`` (seconds).

    The hash is the first 8 bytes of SHA-256, so the offset is the same in every
    process and on every run (Python's ``hash()`` is salted per process).
    """
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    interval_ms = max(1, round(interval * 1000))
    return (digest % interval_ms) / 1000.0


def first_run(key: str, interval: float, now: float | None = None) -> datetime:
    """The first time after ``now`` (epoch seconds) whose phase is the target's offset."""
    now = time.time() if now is None else now
    offset = offset_seconds(key, interval)
    base = now - (now % interval)
    at = base + offset
    if at <= now:
        at += interval
    return datetime.fromtimestamp(at, UTC)


class TargetScheduler:
    """Runs ``scrape(key)`` for every scheduled target on its interval.

    Jobs never overlap for one target (``max_instances=1``); runs missed while
    the loop was busy are coalesced into one (``coalesce=True``) and run late
    rather than dropped.
    """

    def __init__(self, scrape: ScrapeFunc) -> None:
        self._scrape = scrape
        self._scheduler = AsyncIOScheduler(timezone=UTC)
        self._scheduled: dict[str, Target] = {}

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

    def unschedule(self, key: str) -> None:
        """Remove the target's job if there is one."""
        if self._scheduled.pop(key, None) is not None:
            # JobLookupError: the job already ran its course; nothing to remove.
            with contextlib.suppress(Exception):
                self._scheduler.remove_job(key)
            log.debug("unscheduled %s", key)
