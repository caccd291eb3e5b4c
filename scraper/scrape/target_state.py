"""A target's state: what the scraper keeps for one trainer pod, and its transitions.

One :class:`TargetState` per pod (keyed ``namespace/pod`` in
:class:`scraper.scrape.target_table.TargetTable`); the rules of a run that change it are
:class:`scraper.scrape.loop.ScrapeLoop`'s, its final status's are
:mod:`scraper.scrape.finals`'s, its place in the table the target manager's.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from exporter_lib.status import TrainerStatus
from scraper.shared.sequence import Sequence
from scraper.shared.targets import Final, Target
from scraper.telemetry import JobView

__all__ = ["FinalDue", "TargetState"]


class FinalDue(enum.Enum):
    """Where an ended pod's final status stands (docs/scraper.md, "Leader changes")."""

    #: Not known to be on the TrainJob: whoever leads applies it (again).  A final in
    #: this replica's write queue is owed too, until an apply finds it on the TrainJob.
    OWED = "owed"
    #: A finalize run is deciding and queueing it now (one at a time per pod).
    APPLYING = "applying"
    #: Nothing more to write: on the TrainJob, superseded, not storable, or no valid final.
    SETTLED = "settled"


@dataclass(eq=False)
class TargetState:
    """Per-pod bookkeeping; ``view`` is what /metrics shows for its TrainJob.

    Attributes:
        target: what to scrape; None once the pod ended.
        uid: the pod's UID.
        etag: ETag of the last status that is safely written (sent as If-None-Match).
        refusals: consecutive failures meaning "no exporter here".
        retry_at: monotonic time before which scheduled runs do nothing (backoff).
        event_at: per Event reason, the monotonic time it was last recorded.
        ended: the pod's end (termination messages), once it ended.
        final: where its final status stands once it ended (:class:`FinalDue`).
        attempt: the pod's restart attempt (a newer attempt's pod supersedes its final).
        exporter_answered: its exporter answered a scrape (``auto`` source: the final is
            then the exporter's, never the log's).
        dropped: the state left the table (pod gone, TrainJob gone, replaced).
        max_wait: the exporter's longest wait when its last answer offered waiting
            scrapes (contract 2), else None (the target is polled).
        answered_at: monotonic time of the target's last answer (the floor of the next).
        answered_ever: its exporter answered once (before, a refusal is retried soon).
        held: the task of the run holding this target's one waiting scrape open, if
            any (:meth:`ScrapeLoop.run`).
        wrong_pod_logged: an answer from another pod was logged for this target.
        unconfirmed_logged: the last pod check logged as a WARNING (one per result).
        sequence: the exporter sequence of the last answer in order (None: none had one).
        reported: the content (status, sequence) of the last answer in order.
        reported_seen: monotonic time ``reported`` was first seen (``-inf`` for the
            target's first answer: when its content changed is unknown).
        by_policy: the exporter's last answer said it holds by the write policy
            (contract 3): held requests are then paced by the progress floor.
        taken_at: monotonic time the last status of this target went to the writer
            (the metrics' age stated to the exporter counts from it).
    """

    view: JobView
    target: Target | None = None
    uid: str = ""
    etag: str | None = None
    refusals: int = 0
    retry_at: float = 0.0
    event_at: dict[str, float] = field(default_factory=dict)
    ended: Final | None = None
    final: FinalDue | None = None
    attempt: int = 0
    exporter_answered: bool = False
    dropped: bool = False
    max_wait: float | None = None
    answered_at: float = float("-inf")
    answered_ever: bool = False
    held: asyncio.Task[None] | None = None
    wrong_pod_logged: bool = False
    unconfirmed_logged: str | None = None
    #: The pods at this target's address when a :class:`SharedAddress` Event was last
    #: recorded: one Event per set of pods, not per scrape; () once an answer is used.
    shared_reported: tuple[str, ...] = ()
    sequence: Sequence | None = None
    reported: tuple[TrainerStatus, int | None] | None = None
    reported_seen: float = float("-inf")
    by_policy: bool = False
    taken_at: float = float("-inf")

    def show(self, status: TrainerStatus) -> None:
        """``status`` is what /metrics shows for its TrainJob now (a final's)."""
        self.view.status = status

    def stop_holding(self) -> None:
        """Cancel the waiting scrape in flight (leadership lost, pod gone, stop)."""
        if self.held is not None:
            self.held.cancel()
            self.held = None

    @property
    def trainjob_key(self) -> tuple[str, str]:
        """``(namespace, trainjob)``: the object whose status this pod reports."""
        return (self.view.namespace, self.view.trainjob)

    def end(self, final: Final, attempt: int | None = None) -> None:
        """The pod ended (or its end was seen again): its final is owed unless settled;
        ``attempt``: its restart attempt (None: unchanged)."""
        self.ended = final
        if attempt is not None:
            self.attempt = attempt
        if self.final is None:
            self.final = FinalDue.OWED

    def stop_scraping(self, final: Final, attempt: int) -> None:
        """The pod ended while it was a target: no target, no waiting scrape, down, and
        its final owed (:meth:`end`)."""
        self.target = None
        self.stop_holding()
        self.end(final, attempt)
        self.view.up = False

    def drop(self) -> None:
        """The state left the table (pod gone, TrainJob gone, replaced)."""
        self.dropped = True
        self.stop_holding()

    def exporter_did_answer(self) -> None:
        """Its exporter answered a scrape (an ``auto`` source's final is then the
        exporter's)."""
        self.exporter_answered = True

    def final_settled(self) -> None:
        """Its final needs no write (applied, superseded, or its TrainJob gone)."""
        self.final = FinalDue.SETTLED

    def final_still_owed(self) -> None:
        """A finalize ended without settling the final: owed again (no-op otherwise)."""
        if self.final is FinalDue.APPLYING:
            self.final = FinalDue.OWED

    @property
    def owes_final(self) -> bool:
        """True while the pod's final status is not known to need no write."""
        return self.ended is not None and self.final in (FinalDue.OWED, FinalDue.APPLYING)

    def start_final(self) -> bool:
        """True (and APPLYING) when its final is owed and no finalize runs for it."""
        if self.ended is None or self.final is not FinalDue.OWED:
            return False
        self.final = FinalDue.APPLYING
        return True

    def retarget(self, target: Target) -> None:
        """Set the target; a new URL starts over (no ETag, no backoff, polled first)."""
        if self.target is not None and self.target.url != target.url:
            self.etag, self.refusals, self.retry_at = None, 0, 0.0
            self.max_wait, self.answered_ever = None, False
            self.stop_holding()
        self.target = target
