"""The final statuses owed by ended pods, applied by whoever leads.

A final is owed from the pod's end until an apply finds it on the TrainJob (or it is
superseded, not storable, or the TrainJob is gone): docs/scraper.md, "Leader changes".
Whoever leads applies every owed final, one finalize at a time per pod; nothing about
a final is remembered across terms but the pods themselves, so losing the write queue
with leadership loses no final.  A deleted pod whose final is still owed is kept here
(out of the target table) until it settles or its TrainJob is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from exporter_lib.status import StatusError, TrainerStatus
from scraper.scrape.exporter import excerpt
from scraper.scrape.loop import DETAIL_MAX, FINAL_SETTLED, REASON_FINAL_INVALID, ScrapeLoop
from scraper.scrape.target_state import TargetState
from scraper.shared.targets import Final
from scraper.telemetry import JobView

log = logging.getLogger(__name__)

TrainJobKey = tuple[str, str]


class OwedFinals:
    """Starts the finalize runs of owed finals and keeps the deleted pods that owe one.

    Args:
        loop: writes a final (:func:`finalize`).
        spawn: starts a background coroutine and tracks it.
        leading: whether this replica writes now.
        superseded: whether a newer restart attempt of the pod's TrainJob runs.
    """

    def __init__(self, loop: ScrapeLoop, *,
                 spawn: Callable[[Coroutine[Any, Any, None]], object],
                 leading: Callable[[], bool],
                 superseded: Callable[[TargetState], bool]) -> None:
        self._loop = loop
        self._spawn = spawn
        self._leading = leading
        self._superseded = superseded
        #: Deleted pods whose final is still owed, by TrainJob and pod UID.
        self.owed: dict[TrainJobKey, dict[str, TargetState]] = {}

    def start(self, state: TargetState) -> None:
        """Apply ``state``'s final if it is owed, this replica leads and no finalize runs
        for it; a final a newer restart attempt supersedes is settled instead."""
        if not self._leading() or not state.owes_final or state.ended is None:
            return
        if self._superseded(state):
            log.info("final status of pod %s/%s not applied: a newer restart attempt of "
                     "TrainJob %s/%s runs", state.view.namespace, state.view.pod,
                     *state.trainjob_key)
            self._settled(state)
            return
        if state.start_final():
            self._spawn(self._apply(state, state.ended))

    async def _apply(self, state: TargetState, final: Final) -> None:
        """One finalize run; the final stays owed unless it settled.  A run's apply is
        its last step, so a gain of leadership during its earlier steps (a log read)
        still has it queue in the new term."""
        settled = False
        try:
            settled = await finalize(self._loop, final, state)
        finally:
            if settled:
                self._settled(state)
            else:
                state.final_still_owed()

    def owe_deleted(self, final: Final, attempt: int,
                    state: TargetState | None = None) -> None:
        """Owe the verified final status of a deleted pod (seen ended only now;
        ``final.trainjob_uid`` set by discovery); ``state``: the pod's dropped state, if
        it had one; ``attempt``: its restart attempt."""
        if state is None:
            state = TargetState(JobView(final.namespace, final.trainjob, final.pod_name),
                                uid=final.pod_uid, dropped=True)
        state.end(final, attempt)
        self.keep(state)
        self.start(state)

    def start_every_deleted(self, trainjob: TrainJobKey | None = None) -> None:
        """Start the owed finals of the deleted pods of ``trainjob`` (None: of all)."""
        groups = (list(self.owed.values()) if trainjob is None
                  else [self.owed.get(trainjob, {})])
        for by_uid in groups:
            for state in list(by_uid.values()):
                self.start(state)

    def _settled(self, state: TargetState) -> None:
        state.final_settled()
        if state.dropped:
            self._unowe(state)

    def keep(self, state: TargetState) -> None:
        """Keep a dropped state whose final is owed (its pod is gone from the table)."""
        self.owed.setdefault(state.trainjob_key, {})[state.uid] = state

    def _unowe(self, state: TargetState) -> None:
        by_uid = self.owed.get(state.trainjob_key)
        if by_uid is not None and by_uid.get(state.uid) is state:
            del by_uid[state.uid]
            if not by_uid:
                del self.owed[state.trainjob_key]

    def trainjob_gone(self, trainjob: TrainJobKey) -> None:
        """Let go of every final owed to a TrainJob that is gone."""
        for state in list(self.owed.get(trainjob, {}).values()):
            state.final_settled()
            self._unowe(state)

    def sizes(self) -> dict[str, int]:
        """TrainJobs and deleted pods with a final owed."""
        return {"owed": len(self.owed), "owed_pods": sum(len(v) for v in self.owed.values())}


async def finalize(loop: ScrapeLoop, final: Final, state: TargetState | None) -> bool:
    """Apply the final status from a terminated pod's termination message, through
    ``loop``'s write (and its log source, for a pod whose source is not the exporter).

    The first container message that is a valid trainerStatus is applied; when none is,
    one Warning Event names every problem.

    Returns:
        True when the final is settled (:class:`FinalDue`): the apply found nothing to
        write or wrote it, the TrainJob is gone, or there is no valid final (the Event
        was recorded).  False while it is owed: queued in this replica's write queue
        (lost if leadership ends before it lands), not leading, or the apply failed;
        applying it again later is safe (coalesced, or found unchanged).
    """
    problems = []
    for container, message in final.messages:
        try:
            status = TrainerStatus.from_json(message)
        except StatusError as exc:
            problems.append(f"container {excerpt(container)}: {excerpt(str(exc), DETAIL_MAX)}")
            continue
        if state is not None:
            state.show(status)
        outcome = await loop.write(final.namespace, final.trainjob, status, final=True,
                                   uid=final.trainjob_uid, finished_at=final.finished(container))
        log.info("final status of TrainJob %s/%s from pod %s (container %s): %s",
                 final.namespace, final.trainjob, final.pod_name, container,
                 outcome.value if outcome else "TrainJob gone")
        return outcome is None or outcome in FINAL_SETTLED
    if final.source != "exporter" and loop.final_from_log is not None:
        from_log = await loop.final_from_log(final, state is not None and state.exporter_answered)
        if from_log is not None:
            if state is not None:
                state.show(from_log)
            outcome = await loop.write(final.namespace, final.trainjob, from_log, final=True,
                                       uid=final.trainjob_uid)
            log.info("final status of TrainJob %s/%s from the log of pod %s (container %s): %s",
                     final.namespace, final.trainjob, final.pod_name, final.log_container,
                     outcome.value if outcome else "TrainJob gone")
            return outcome is None or outcome in FINAL_SETTLED
    if problems:
        await loop.events.event(
            final.namespace, final.trainjob, REASON_FINAL_INVALID,
            f"termination message of pod {final.pod_name} is not a valid trainerStatus: "
            + "; ".join(problems) + "; the previous status is kept")
    return True
