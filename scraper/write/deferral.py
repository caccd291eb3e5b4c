"""The rule for other writers applied to one TrainJob's report, counted and logged.

:func:`scraper.write.rules.decide` is the pure decision; :class:`Deferrals` applies it to
where the TrainJob's status is written (``status.trainerStatus`` or the annotation,
:mod:`scraper.write.annotation_target`) as the informer holds it, counts each report kept out
(``status_writes_deferred_total{reason}``) and logs when deferring to another writer
starts and when it ends, once each per TrainJob.  The queue side
(:class:`scraper.write.writer.StatusWriter`) decides when a report arrives and the
writer tasks (:class:`scraper.write.worker.WriteWorker`) again right before the request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from scraper.discovery.trainjobs import TrainJobKey, TrainJobRecord
from scraper.write.annotation_target import Place, status_in, writer_in
from scraper.write.rules import OTHER_WRITER_GRACE_SECONDS, Report, WriteVerdict, decide

log = logging.getLogger(__name__)


class Deferrals:
    """Verdicts of the rule for other writers, with their count and log.

    Args:
        clock: monotonic seconds, the clock of the informer's store (``Writer.seen``).
        grace: ``--other-writer-grace`` (seconds, :mod:`scraper.write.rules`).
        on_deferred: called with the reason (a :class:`~scraper.write.rules.WriteVerdict`
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

    def verdict(self, key: TrainJobKey, record: TrainJobRecord, place: Place,
                report: Report) -> WriteVerdict:
        """:func:`scraper.write.rules.decide` for ``report`` against what ``record`` has at
        ``place``; counts a report kept out and logs when deferring to another writer
        starts and when it ends."""
        writer = writer_in(record, place)
        verdict = decide(status_in(record, place), writer, report, now=self._clock(),
                         grace=self.grace)
        if verdict in (WriteVerdict.WRITE, WriteVerdict.UNCHANGED):
            if key in self._deferring:
                self._deferring.discard(key)
                log.info("TrainJob %s/%s: no longer deferring to another writer of %s: %s",
                         *key, place.value, "the status is written" if verdict is
                         WriteVerdict.WRITE else "it stores the same content")
            return verdict
        self._on_deferred(verdict.value)
        if key not in self._deferring and writer is not None:
            self._deferring.add(key)
            why = {WriteVerdict.OTHER_WRITER: f"it changed it {self._clock() - writer.seen:.0f}s "
                                              f"ago (< --other-writer-grace "
                                              f"{self.grace:g}s)",
                   WriteVerdict.NOT_NEWS: "no report changed since it wrote",
                   WriteVerdict.DELIVERED: "it wrote after the container ended"}[verdict]
            log.info("TrainJob %s/%s: deferring to another writer of %s (field manager %s): "
                     "%s", *key, place.value, writer.manager, why)
        return verdict

    def forget(self, key: TrainJobKey) -> None:
        """Drop what is kept for a TrainJob (it is gone)."""
        self._deferring.discard(key)
