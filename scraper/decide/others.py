"""The rule for other writers, as a pure decision (no I/O): part of
:func:`scraper.decide.decision.decide`.

The whole rule, and why, is docs/scraper.md, "Other writers and time".  It holds for
every status source (exporter JSON, Prometheus text, termination messages, push-compat)
and is tested with hypothesis (``tests/scraper/test_writer_rules.py``).
:func:`decide` says whether a report is written where the TrainJob stores ``there``, last
written by ``writer`` (:class:`scraper.shared.trainjobs.Writer`: the API server's clock and
the store's monotonic clock order writes, never a writer's own ``lastUpdatedTime``).
The ``lastUpdatedTime`` written is settled when the write is sent
(:func:`scraper.write.notices.settle_time`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter_lib.status import TrainerStatus
from scraper.shared.policy import OTHER_WRITER_GRACE_SECONDS
from scraper.shared.writes import Report, WriteVerdict, same_content

if TYPE_CHECKING:  # no import at run time: this module stays free of Kubernetes
    from scraper.shared.trainjobs import Writer

__all__ = ["FINAL_DELIVERED_MARGIN_SECONDS", "OTHER_WRITER_GRACE_SECONDS", "Report",
           "WriteVerdict", "decide", "same_content"]

#: Rule 4: another writer's write counts as the delivery of a final only when it came
#: more than this after the container ended (seconds).  Both times have 1 s resolution
#: and come from two clocks (the API server's managedFields ``time``, the kubelet's
#: ``finishedAt``); a push the training made just before it exited lands in the same
#: second, and the termination message written at exit is newer than it.
FINAL_DELIVERED_MARGIN_SECONDS = 10.0


def decide(there: TrainerStatus | None, writer: Writer | None, report: Report, *,
           now: float, grace: float = OTHER_WRITER_GRACE_SECONDS) -> WriteVerdict:
    """Whether ``report`` is written where the TrainJob stores ``there``, written by
    ``writer`` (docs/scraper.md, "Other writers and time", rules 2 to 4).

    Args:
        now: monotonic seconds, the clock of ``writer.seen`` and ``report.seen``.
        grace: ``--other-writer-grace`` (seconds).
    """
    if same_content(there, report.status):
        return WriteVerdict.UNCHANGED
    if there is None or writer is None or writer.ours:
        return WriteVerdict.WRITE
    if report.final:
        if (report.finished_at is not None
                and writer.time > report.finished_at + FINAL_DELIVERED_MARGIN_SECONDS):
            return WriteVerdict.DELIVERED
        return WriteVerdict.WRITE
    if now - writer.seen < grace:
        return WriteVerdict.OTHER_WRITER
    return WriteVerdict.WRITE if report.seen > writer.seen else WriteVerdict.NOT_NEWS
