"""What the status writer tells people, once per TrainJob: a Warning Event when the
TrainJob CRD cannot store ``status.trainerStatus``, and a ``ClockSkew`` Event (with a log
line and ``clock_skew_total``) when the ``lastUpdatedTime`` written is not the report's
own.

That time is settled right before a write is sent, against what the TrainJob stores
then (:func:`settle_time`, pure): time never moves backwards silently (docs/scraper.md,
"Other writers and time")."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from exporter_lib.status import TrainerStatus, format_time
from scraper.kube.crd import CRD_NAME, REASON_UNSUPPORTED
from scraper.kube.events import EventRecorder
from scraper.shared.trainjobs import TrainJobKey
from scraper.write.annotation_target import Place
from scraper.write.queue import Pending

log = logging.getLogger(__name__)

#: A report's ``lastUpdatedTime`` more than this ahead of the scraper's clock is not
#: written as is (seconds).
FUTURE_LIMIT_SECONDS = 60.0


class Skew(enum.Enum):
    """Why :func:`settle_time` wrote the arrival time; ``value`` is the metrics label."""

    BACK = "back"  # the report's time is older than the stored one's
    FUTURE = "future"  # the report's time is too far ahead of the scraper's clock


def settle_time(reported: datetime, stored: datetime | None, arrival: datetime,
                *, future_limit: float = FUTURE_LIMIT_SECONDS) -> tuple[datetime, Skew | None]:
    """The ``lastUpdatedTime`` to write and why it is not the report's own (None: it is).

    The report's own time, unless it is older than ``stored`` (it would move back) or more
    than ``future_limit`` seconds ahead of ``arrival`` (the scraper's wall clock when the
    report arrived); then ``arrival`` (whole seconds).  ``arrival`` older than ``stored``
    means the stored time was in the future: still ``arrival``, with :attr:`Skew.BACK`.
    """
    arrival = arrival.astimezone(UTC).replace(microsecond=0)
    if (reported - arrival).total_seconds() > future_limit:
        return arrival, Skew.FUTURE
    if stored is not None and reported < stored:
        return arrival, Skew.BACK
    return reported, None


#: The Event recorded when the written ``lastUpdatedTime`` is not the report's own.
REASON_CLOCK_SKEW = "ClockSkew"


class Notices:
    """Events and log lines of the status writer, each told once per TrainJob.

    Args:
        events: where the Events go (TrainJob Events, their own token bucket).
        on_skew: called with ``"back"`` or ``"future"`` for each write whose
            ``lastUpdatedTime`` is the arrival time instead of the report's own.
        wall: epoch seconds (the arrival time of a report that carries none).
    """

    def __init__(self, events: EventRecorder, *,
                 on_skew: Callable[[str], None] = lambda direction: None,
                 wall: Callable[[], float] = time.time) -> None:
        self.events = events
        self._on_skew = on_skew
        self._wall = wall
        self._unsupported_told: set[TrainJobKey] = set()
        # (TrainJob, "back" | "future" | "stored in the future"): logged and evented once.
        self._skew_told: set[tuple[TrainJobKey, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # ClockSkew Events being recorded

    async def unsupported(self, namespace: str, name: str, uid: str) -> None:
        """A Warning Event on the TrainJob: its CRD has no ``status.trainerStatus`` (once
        per TrainJob until :meth:`supported_again`)."""
        if (namespace, name) in self._unsupported_told:
            return
        self._unsupported_told.add((namespace, name))
        await self.events.event(
            namespace, name, REASON_UNSUPPORTED,
            f"The TrainJob CRD ({CRD_NAME}) has no status.trainerStatus, so progress "
            "cannot be stored; upgrade the Kubeflow Trainer CRDs, or run trainjob-scraper "
            f"with --status-target auto (it then writes {Place.ANNOTATION.value}).",
            uid=uid,
        )

    def sizes(self) -> dict[str, int]:
        """Entries of each map kept per TrainJob."""
        return {"unsupported_told": len(self._unsupported_told), "skew_told": len(self._skew_told)}

    def supported_again(self) -> None:
        """The CRD stores trainerStatus again: announce a later loss anew."""
        self._unsupported_told.clear()

    def settled(self, item: Pending, there: TrainerStatus | None,
                uid: str) -> TrainerStatus:
        """``item.status`` with the ``lastUpdatedTime`` to write
        (:func:`settle_time`); a skew is logged once per TrainJob and
        direction (a stored time in the future is its own case), counted each time and
        recorded as a ``ClockSkew`` Event."""
        arrived = datetime.fromtimestamp(item.arrived or self._wall(), UTC)
        reported = item.status.last_updated_time
        stored_time = there.last_updated_time if there is not None else None
        settled, skew = settle_time(reported, stored_time, arrived)
        if skew is None:
            return item.status
        self._on_skew(skew.value)
        namespace, name = item.key
        kind = skew.value
        if skew is Skew.FUTURE:
            why = (f"lastUpdatedTime {format_time(reported)} is more than "
                   f"{FUTURE_LIMIT_SECONDS:g}s ahead of the scraper's clock")
        elif stored_time is not None and settled < stored_time:
            kind = "stored in the future"
            why = (f"the stored lastUpdatedTime {format_time(stored_time)} is in the future "
                   f"(the report says {format_time(reported)})")
        else:
            assert stored_time is not None
            why = (f"lastUpdatedTime {format_time(reported)} is older than the stored "
                   f"{format_time(stored_time)}")
        message = (f"{why}; wrote the scraper's arrival time {format_time(settled)} "
                   "instead (the reported values are kept)")
        if (item.key, kind) not in self._skew_told:
            self._skew_told.add((item.key, kind))
            log.warning("TrainJob %s/%s: clock skew (%s): %s", namespace, name, skew.value,
                        message)
            task = asyncio.create_task(self.events.event(
                namespace, name, REASON_CLOCK_SKEW, message, uid=uid),
                name=f"clock-skew-event {namespace}/{name}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return item.status.model_copy(update={"last_updated_time": settled})

    def forget(self, key: TrainJobKey) -> None:
        """Drop what was told of a TrainJob (it is gone)."""
        self._unsupported_told.discard(key)
        self._skew_told = {told for told in self._skew_told if told[0] != key}

    def cancel(self) -> None:
        """Cancel the ClockSkew Events still being recorded."""
        for task in list(self._tasks):
            task.cancel()
