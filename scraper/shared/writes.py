"""What passes from scrape to decide to write: a report, the status it meets, and the
decision.

* :class:`Report`: one status as a source reported it;
* :class:`Stored`: what the TrainJob holds where the scraper writes, and what this
  scraper last wrote there;
* :data:`Decision`: :class:`Write`, :class:`Wait` or :class:`Skip`, the answer of
  :func:`scraper.decide.decision.decide`; :class:`Priority` is the write class the
  queue orders by.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from exporter_lib.status import TrainerStatus

if TYPE_CHECKING:
    from scraper.shared.policy import WritePolicy
    from scraper.shared.trainjobs import Writer

__all__ = ["Decide", "Decision", "Priority", "Report", "Skip", "Stored", "Wait", "Write",
           "WriteVerdict", "same_content"]


class Priority(enum.IntEnum):
    """Write classes, most urgent first; ``name.lower()`` is the metrics label."""

    FINAL = 0
    FIRST = 1
    PROGRESS = 2
    METRICS = 3


class WriteVerdict(enum.Enum):
    """What the rule for other writers says of a report
    (:func:`scraper.decide.others.decide`); ``value`` is a metrics label where one is
    counted (``status_writes_deferred_total{reason}``)."""

    WRITE = "write"
    UNCHANGED = "unchanged"  # the TrainJob stores the same content
    OTHER_WRITER = "other_writer"  # another writer is live: no progress write
    NOT_NEWS = "not_news"  # a quiet writer's status; the report did not change since
    DELIVERED = "delivered"  # a final another writer wrote well after the container ended


@dataclass(frozen=True)
class Report:
    """One status as a source reported it, with what the decision needs to know of it.

    Attributes:
        status: the status as reported (its ``lastUpdatedTime`` unchanged).
        seen: monotonic seconds (the TrainJob store's clock) when this content was first
            seen; ``-inf`` when unknown (a target's first answer: it may be old).
        final: a final status (termination message).
        finished_at: epoch seconds of the container's ``state.terminated.finishedAt``
            (finals; None when unknown).
    """

    status: TrainerStatus
    seen: float = float("-inf")
    final: bool = False
    finished_at: float | None = None


@dataclass(frozen=True)
class Stored:
    """What a TrainJob holds where the scraper writes, as the informer last saw it.

    Attributes:
        status: its trainerStatus there (None: none).
        writer: who wrote it last (None: nobody owns it).
        ours_taken_at: monotonic seconds when the status of this scraper's last write to
            it was taken (queued); None when this scraper has not written to it (since
            it started or leads).
        queued: a status of this scraper's is already queued for it (a newer report
            then replaces it even when the TrainJob stores the same content).
    """

    status: TrainerStatus | None
    writer: Writer | None = None
    ours_taken_at: float | None = None
    queued: bool = False


@dataclass(frozen=True)
class Write:
    """Send the report as soon as the budget allows.

    Attributes:
        priority: its write class.
        floor: seconds after the TrainJob's last write ends before it is sent (the
            progress floor; 0 for finals and first statuses).  The queue knows when a
            write ends, so it applies this.
    """

    priority: Priority
    floor: float = 0.0


@dataclass(frozen=True)
class Wait:
    """Send the report no sooner than ``until`` (monotonic seconds): a metrics-only change,
    due the staleness bound after the status of the scraper's last write was taken.
    ``until`` may have passed (then it is due now, and its turn in the queue counts from
    ``until``).  A significant change joining it ends the wait."""

    until: float
    floor: float = 0.0
    priority: Priority = Priority.METRICS


@dataclass(frozen=True)
class Skip:
    """Do not send the report; ``reason`` says why (never :attr:`WriteVerdict.WRITE`)."""

    reason: WriteVerdict


Decision = Write | Wait | Skip


class Decide(Protocol):
    """The decision function (:func:`scraper.decide.decision.decide`), as the write
    stage receives it from whoever wires it."""

    def __call__(self, stored: Stored, report: Report, policy: WritePolicy,
                 now: float) -> Decision: ...


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
