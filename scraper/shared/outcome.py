"""What a status write came to, shared by the queue side
(:class:`scraper.write.writer.StatusWriter`) and the writer tasks
(:class:`scraper.write.worker.WriteWorker`)."""

from __future__ import annotations

import enum
from typing import Protocol

from scraper.shared.trainjobs import OUR_FIELD_MANAGER

__all__ = ["FIELD_MANAGER", "NO_COUNTS", "NotLeader", "WriteCounts", "WriteOutcome"]

#: The field manager of every apply this scraper makes (``trainjob-scraper``).
FIELD_MANAGER = OUR_FIELD_MANAGER


class NotLeader(Exception):
    """The write fence closed: this replica may not write now."""


class WriteOutcome(enum.Enum):
    """Result of :meth:`scraper.write.writer.StatusWriter.apply` and of each write;
    ``value`` is the metrics label."""

    WRITTEN = "written"
    UNCHANGED = "unchanged"
    NOT_STORED = "not_stored"  # the CRD has no trainerStatus: nothing can be written
    FAILED = "failed"
    NOT_LEADER = "not_leader"
    DEFERRED = "deferred"  # another writer's status is kept (decide.others: deferred_total)
    QUEUED = "queued"  # apply(): news, queued for the writers (not counted as a write)
    RETRIED = "retried"  # a write failed and stays queued
    #: Not sent: the answer stated no pod, and the writer's read of its pod found it
    #: not the target's any more.
    UNCONFIRMED = "unconfirmed"


class WriteCounts(Protocol):
    """Where the write stage counts what it does (the scraper's telemetry,
    :class:`scraper.telemetry.Telemetry`)."""

    def written(self, outcome: WriteOutcome) -> None:
        """One try or submission of a status came to ``outcome``."""

    def request_took(self, seconds: float) -> None:
        """One apply request took ``seconds``."""

    def deferred(self, reason: str) -> None:
        """One report was kept out by another writer (``reason``: a
        :class:`~scraper.shared.writes.WriteVerdict` value)."""

    def skewed(self, direction: str) -> None:
        """One write carries the arrival time instead of the report's (``"back"`` or
        ``"future"``)."""


class _NoCounts:
    """Counts nothing (tools and tests that do not read the counts)."""

    def written(self, outcome: WriteOutcome) -> None:
        pass

    def request_took(self, seconds: float) -> None:
        pass

    def deferred(self, reason: str) -> None:
        pass

    def skewed(self, direction: str) -> None:
        pass


#: A :class:`WriteCounts` that counts nothing.
NO_COUNTS: WriteCounts = _NoCounts()
