"""The one write decision: whether, and when, a report is written to its TrainJob.

:func:`decide` is a pure function (no clock, no I/O) of what the TrainJob holds
(:class:`~scraper.shared.writes.Stored`), the report, the TrainJob's write policy and
the time.  Its rules, in order:

1. **Other writers and time** (:func:`scraper.decide.others.decide`, docs/scraper.md,
   "Other writers and time"): a report whose content the TrainJob already holds is
   :attr:`~scraper.shared.writes.WriteVerdict.UNCHANGED` (still queued when a status of
   ours is queued: the newest report replaces it); one another writer's status keeps
   out is skipped with that rule's reason.
2. **Class**: a final first, then a first status (the TrainJob holds none, or none of
   this scraper's since it started or leads), then a change of the integer percentage
   (significant, :func:`exporter_lib.write_rule.significant`), then a change of metrics
   or the remaining time alone.
3. **Writing by significance** (docs/scraper.md, "Writing by significance"): finals and
   first statuses are written at once; a significant change no sooner than the
   progress floor after the TrainJob's last write; a metrics-only change waits until
   the metrics staleness after the status of this scraper's last write was taken
   (:func:`exporter_lib.write_rule.metrics_due`, the rule the exporter holds a
   waiting scrape by through ``metrics_wait``: a :class:`~scraper.shared.writes.Wait`
   whose ``until`` has passed is due now).

The write stage calls it when a report arrives and again right before the request,
against the informer's newest (a TrainJob can change while a write waits).
"""

from __future__ import annotations

from exporter_lib.status import TrainerStatus
from exporter_lib.write_rule import metrics_due, significant
from scraper.decide.others import decide as other_writers
from scraper.shared.policy import WritePolicy
from scraper.shared.writes import (
    Decision,
    Priority,
    Report,
    Skip,
    Stored,
    Wait,
    Write,
    WriteVerdict,
)

__all__ = ["decide", "priority_of"]


def priority_of(current: TrainerStatus | None, new: TrainerStatus, *,
                final: bool) -> Priority:
    """The write class of ``new`` against the status the TrainJob holds (rule 2; None:
    it holds none)."""
    if final:
        return Priority.FINAL
    if current is None:
        return Priority.FIRST
    if significant(current.progress_percentage, new.progress_percentage):
        return Priority.PROGRESS
    return Priority.METRICS


def decide(stored: Stored, report: Report, policy: WritePolicy, now: float) -> Decision:
    """Write, wait until a time, or skip ``report`` (module doc).

    Args:
        stored: what the TrainJob holds where the scraper writes.
        report: the report to write.
        policy: the TrainJob's write policy (progress floor, metrics staleness, other
            writers' grace; seconds).
        now: monotonic seconds, the clock of ``stored.writer.seen``, ``report.seen`` and
            ``stored.ours_taken_at``.

    Returns:
        :class:`~scraper.shared.writes.Write` (with the floor the queue keeps after the
        TrainJob's last write), :class:`~scraper.shared.writes.Wait` (a metrics-only
        change, until a monotonic time) or :class:`~scraper.shared.writes.Skip` (with
        its reason).
    """
    verdict = other_writers(stored.status, stored.writer, report, now=now,
                            grace=policy.other_writer_grace)
    if verdict is WriteVerdict.UNCHANGED and not stored.queued:
        return Skip(verdict)
    if verdict not in (WriteVerdict.WRITE, WriteVerdict.UNCHANGED):
        return Skip(verdict)
    priority = priority_of(stored.status, report.status, final=report.final)
    if priority > Priority.FIRST and stored.ours_taken_at is None:
        priority = Priority.FIRST  # nothing of ours there yet (e.g. after a restart)
    if priority <= Priority.FIRST:
        return Write(priority)
    floor = policy.progress_floor
    taken = stored.ours_taken_at
    if priority is Priority.METRICS and taken is not None:
        # Until may have passed: the write is due now, and its waiting for a turn in
        # the queue counts from then, so a change that fell due does not rank with
        # fresh progress changes (scraper/write/queue.py, order rule 3).
        return Wait(metrics_due(taken, policy.metrics_staleness), floor)
    return Write(priority, floor)
