"""Reports another writer's status keeps out, counted and logged once per TrainJob.

:func:`scraper.decide.decision.decide` decides; :class:`Deferrals` is told each decision
for a TrainJob (with where the status is written, ``status.trainerStatus`` or the
annotation, :mod:`scraper.write.annotation_target`), counts each report kept out
(``status_writes_deferred_total{reason}``) and logs when deferring to another writer
starts and when it ends, once each per TrainJob.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from scraper.shared.policy import OTHER_WRITER_GRACE_SECONDS
from scraper.shared.trainjobs import TrainJobKey, Writer
from scraper.shared.writes import Decision, Skip, WriteVerdict
from scraper.write.annotation_target import Place

log = logging.getLogger(__name__)


class Deferrals:
    """Decisions kept out by another writer, with their count and log.

    Args:
        clock: monotonic seconds, the clock of the informer's store (``Writer.seen``).
        grace: ``--other-writer-grace`` (seconds, named in the log line).
        on_deferred: called with the reason (a :class:`~scraper.shared.writes.WriteVerdict`
            value) of each report not written because of another writer.
    """

    def __init__(self, clock: Callable[[], float], *,
                 grace: float = OTHER_WRITER_GRACE_SECONDS,
                 on_deferred: Callable[[str], None] = lambda reason: None) -> None:
        self._clock = clock
        self.grace = grace
        self._on_deferred = on_deferred
        self._deferring: set[TrainJobKey] = set()

    def sizes(self) -> dict[str, int]:
        """Entries of each map kept per TrainJob."""
        return {"deferring": len(self._deferring)}

    def told(self, key: TrainJobKey, decision: Decision, writer: Writer | None,
             place: Place) -> None:
        """Count a report kept out by another writer (``writer``, of ``place``) and log
        when deferring to it starts and when it ends."""
        reason = decision.reason if isinstance(decision, Skip) else WriteVerdict.WRITE
        if reason in (WriteVerdict.WRITE, WriteVerdict.UNCHANGED):
            if key in self._deferring:
                self._deferring.discard(key)
                log.info("TrainJob %s/%s: no longer deferring to another writer of %s: %s",
                         *key, place.value, "the status is written" if reason is
                         WriteVerdict.WRITE else "it stores the same content")
            return
        self._on_deferred(reason.value)
        if key not in self._deferring and writer is not None:
            self._deferring.add(key)
            why = {WriteVerdict.OTHER_WRITER: f"it changed it {self._clock() - writer.seen:.0f}s "
                                              f"ago (< --other-writer-grace "
                                              f"{self.grace:g}s)",
                   WriteVerdict.NOT_NEWS: "no report changed since it wrote",
                   WriteVerdict.DELIVERED: "it wrote after the container ended"}[reason]
            log.info("TrainJob %s/%s: deferring to another writer of %s (field manager %s): "
                     "%s", *key, place.value, writer.manager, why)

    def forget(self, key: TrainJobKey) -> None:
        """Drop what is kept for a TrainJob (it is gone)."""
        self._deferring.discard(key)
