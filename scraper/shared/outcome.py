"""What a status write came to, shared by the queue side
(:class:`scraper.write.writer.StatusWriter`) and the writer tasks
(:class:`scraper.write.worker.WriteWorker`)."""

from __future__ import annotations

import enum

from scraper.shared.trainjobs import OUR_FIELD_MANAGER

__all__ = ["FIELD_MANAGER", "NotLeader", "WriteOutcome"]

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
