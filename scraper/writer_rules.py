"""The rule for other writers, time and stale writes, as pure decisions (no I/O).

The whole rule, and why, is docs/scraper.md, "Other writers and time"; this module is
its decision part, used by :class:`scraper.status_writer.StatusWriter` for every status
source (exporter JSON, Prometheus text, termination messages, push-compat) and tested
with hypothesis (``tests/scraper/test_writer_rules.py``):

* :func:`decide`: whether a report is written where the TrainJob holds ``there``,
  last written by ``writer`` (:class:`scraper.trainjobs.Writer`: the API server's
  clock and the store's monotonic clock order writes, never a writer's own
  ``lastUpdatedTime``);
* :func:`settle_time`: the ``lastUpdatedTime`` that is written (time never moves
  backwards silently);
* :func:`is_late`: the exporter's own sequence orders the answers of one target.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from exporter_lib.server import SEQUENCE_HEADER as EXPORTER_SEQUENCE_HEADER
from exporter_lib.status import TrainerStatus

if TYPE_CHECKING:  # no import at run time: scraping.py uses this module without Kubernetes
    from scraper.trainjobs import Writer

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

#: The exporter's sequence header, ``<n>; start=<id>`` (defined with the exporter).
SEQUENCE_HEADER = EXPORTER_SEQUENCE_HEADER
_SEQUENCE = re.compile(r"^\s*(\d{1,19})\s*;\s*start\s*=\s*([0-9A-Za-z_-]{1,64})\s*$")


class Verdict(enum.Enum):
    """What :func:`decide` says of a report; ``value`` is a metrics label where one is
    counted (``status_writes_deferred_total{reason}``)."""

    WRITE = "write"
    UNCHANGED = "unchanged"  # the TrainJob holds the same content
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


def same_content(held: TrainerStatus | None, new: TrainerStatus) -> bool:
    """True when applying ``new`` would not change what the TrainJob holds.

    ``lastUpdatedTime`` is ignored (a repeat of the same values is no news).  A field
    ``new`` leaves unset is ignored as well: the apply would not send it, so a value
    another manager set there stays either way.
    """
    if held is None:
        return False
    return (
        new.metrics == held.metrics
        and new.progress_percentage in (None, held.progress_percentage)
        and new.estimated_remaining_seconds in (None, held.estimated_remaining_seconds)
    )


def other_writer_live(writer: Writer | None, now: float, grace: float) -> bool:
    """True while another writer's last change (``writer.seen``) is younger than
    ``grace`` seconds at monotonic ``now``."""
    return writer is not None and not writer.ours and now - writer.seen < grace


def decide(there: TrainerStatus | None, writer: Writer | None, report: Report, *,
           now: float, grace: float = OTHER_WRITER_GRACE_SECONDS) -> Verdict:
    """Whether ``report`` is written where the TrainJob holds ``there``, written by
    ``writer`` (docs/scraper.md, "Other writers and time", rules 2 to 4).

    Args:
        now: monotonic seconds, the clock of ``writer.seen`` and ``report.seen``.
        grace: ``--other-writer-grace`` (seconds).
    """
    if same_content(there, report.status):
        return Verdict.UNCHANGED
    if there is None or writer is None or writer.ours:
        return Verdict.WRITE
    if report.final:
        if (report.finished_at is not None
                and writer.time > report.finished_at + FINAL_DELIVERED_MARGIN_SECONDS):
            return Verdict.DELIVERED
        return Verdict.WRITE
    if now - writer.seen < grace:
        return Verdict.OTHER_WRITER
    return Verdict.WRITE if report.seen > writer.seen else Verdict.NOT_NEWS


class Skew(enum.Enum):
    """Why :func:`settle_time` wrote the arrival time; ``value`` is the metrics label."""

    BACK = "back"  # the report's time is older than the held one's
    FUTURE = "future"  # the report's time is too far ahead of the scraper's clock


def settle_time(reported: datetime, held: datetime | None, arrival: datetime,
                *, future_limit: float = FUTURE_LIMIT_SECONDS) -> tuple[datetime, Skew | None]:
    """The ``lastUpdatedTime`` to write and why it is not the report's own (None: it is).

    The report's own time, unless it is older than ``held`` (it would move back) or more
    than ``future_limit`` seconds ahead of ``arrival`` (the scraper's wall clock when the
    report arrived); then ``arrival`` (whole seconds).  ``arrival`` older than ``held``
    means the held time was in the future: still ``arrival``, with :attr:`Skew.BACK`.
    """
    arrival = arrival.astimezone(UTC).replace(microsecond=0)
    if (reported - arrival).total_seconds() > future_limit:
        return arrival, Skew.FUTURE
    if held is not None and reported < held:
        return arrival, Skew.BACK
    return reported, None


@dataclass(frozen=True)
class Sequence:
    """An exporter answer's place in its process's order: ``start`` names the process
    start, ``n`` counts its status changes."""

    start: str
    n: int


def sequence_of(header: str | None) -> Sequence | None:
    """The :data:`SEQUENCE_HEADER` value ``<n>; start=<id>``; None when absent or
    malformed (the answer is then not ordered by sequence)."""
    match = _SEQUENCE.match(header or "")
    if match is None:
        return None
    return Sequence(match.group(2), int(match.group(1)))


def is_late(last: Sequence | None, new: Sequence | None) -> bool:
    """True when ``new`` is an answer of the same exporter process older than ``last``
    (a late answer must not replace a newer one, whatever the clocks say)."""
    return (last is not None and new is not None and new.start == last.start
            and new.n < last.n)
