"""The rule for other writers, time and stale writes, as pure decisions (no I/O).

The whole rule, and why, is docs/scraper.md, "Other writers and time"; this module is
its decision part, used by :class:`scraper.write.writer.StatusWriter` and
:class:`scraper.write.worker.WriteWorker` for every status
source (exporter JSON, Prometheus text, termination messages, push-compat) and tested
with hypothesis (``tests/scraper/test_writer_rules.py``):

* :func:`decide`: whether a report is written where the TrainJob stores ``there``,
  last written by ``writer`` (:class:`scraper.discovery.trainjobs.Writer`: the API server's
  clock and the store's monotonic clock order writes, never a writer's own
  ``lastUpdatedTime``);
* :func:`settle_time`: the ``lastUpdatedTime`` that is written (time never moves
  backwards silently).

The exporter's own sequence, which orders the answers of one target before any of this,
is :mod:`scraper.scrape.sequence`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from exporter_lib.status import TrainerStatus

if TYPE_CHECKING:  # no import at run time: this module stays free of Kubernetes
    from scraper.discovery.trainjobs import Writer

#: Default of ``--other-writer-grace``: another writer whose last change is younger
#: than this keeps the field (seconds).
OTHER_WRITER_GRACE_SECONDS = 60.0
#: A report's ``lastUpdatedTime`` more than this ahead of the scraper's clock is not
#: written as is (seconds).
FUTURE_LIMIT_SECONDS = 60.0
#: Rule 4: another writer's write counts as the delivery of a final only when it came
#: more than this after the container ended (seconds).  Both times have 1 s resolution
#: and come from two clocks (the API server's managedFields ``time``, the kubelet's
#: ``finishedAt``); a push the training made just before it exited lands in the same
#: second, and the termination message written at exit is newer than it.
FINAL_DELIVERED_MARGIN_SECONDS = 10.0


class WriteVerdict(enum.Enum):
    """What :func:`decide` says of a report; ``value`` is a metrics label where one is
    counted (``status_writes_deferred_total{reason}``)."""

    WRITE = "write"
    UNCHANGED = "unchanged"  # the TrainJob stores the same content
    OTHER_WRITER = "other_writer"  # another writer is live: no progress write
    NOT_NEWS = "not_news"  # a quiet writer's status; the report did not change since
    DELIVERED = "delivered"  # a final another writer wrote well after the container ended


@dataclass(frozen=True)
class Report:
    """One status as a source reported it, with what the rule needs to know of it.

    Attributes:
        status: the status as reported (its ``lastUpdatedTime`` unchanged).
        seen: monotonic seconds (the store's clock) when this content was first seen;
            ``-inf`` when unknown (a target's first answer: it may be old).
        final: a final status (termination message).
        finished_at: epoch seconds of the container's ``state.terminated.finishedAt``
            (finals; None when unknown).
    """

    status: TrainerStatus
    seen: float = float("-inf")
    final: bool = False
    finished_at: float | None = None


def same_content(stored: TrainerStatus | None, new: TrainerStatus) -> bool:
    """True when applying ``new`` would not change what the TrainJob stores.

    ``lastUpdatedTime`` is ignored (a repeat of the same values is no news).  A field
    ``new`` leaves unset is ignored as well: the apply would not send it, so a value
    another manager set there stays either way.
    """
    if stored is None:
        return False
    return (
        new.metrics == stored.metrics
        and new.progress_percentage in (None, stored.progress_percentage)
        and new.estimated_remaining_seconds in (None, stored.estimated_remaining_seconds)
    )


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
