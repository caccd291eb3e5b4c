"""Which live pod of each TrainJob is its target: the best-ranked one, and only that one
is scheduled.

The rank is :func:`scraper.discovery.identity.rank` of each live pod (the restart attempt
first); a pod that ended or went leaves the choice, and another pod of the TrainJob
may take over.  Every change touches one TrainJob's pods through the table's index,
never a scan of every target.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from scraper.scrape.target_state import TargetState
from scraper.scrape.target_table import TargetTable
from scraper.shared.targets import Target

log = logging.getLogger(__name__)

TrainJobKey = tuple[str, str]
Rank = tuple[int, int, str, str]


class Scheduler(Protocol):
    """What the target manager needs of :class:`scraper.scrape.scheduling.TargetScheduler`."""

    def schedule(self, target: Target) -> None: ...

    def unschedule(self, key: str) -> None: ...

    def scheduled_keys(self) -> set[str]: ...


class TargetChoice:
    """The chosen target of every TrainJob, kept in step with the scheduler.

    Args:
        states: the manager's table of per-pod states (read here, never changed).
        scheduler: its jobs follow the choice.
        leading: whether this replica schedules scrapes now.
    """

    def __init__(self, states: TargetTable, scheduler: Scheduler,
                 leading: Callable[[], bool]) -> None:
        self._states = states
        self._scheduler = scheduler
        self._leading = leading
        self._ranks: dict[str, Rank] = {}  # pod key -> rank of its live pod
        self._chosen: dict[TrainJobKey, str] = {}  # TrainJob -> key of its target

    def ranked(self, key: str, rank: Rank | None) -> None:
        """Pod ``key`` runs with ``rank`` (None: it ended or went)."""
        if rank is None:
            self._ranks.pop(key, None)
        else:
            self._ranks[key] = rank

    def choose(self, trainjob: TrainJobKey) -> None:
        """Schedule only the best-ranked live target of ``trainjob``."""
        states = self._states
        candidates = [k for k in states.of_trainjob(trainjob)
                      if states[k].target is not None and k in self._ranks]
        best = max(candidates, key=lambda k: self._ranks[k], default=None)
        before = self._chosen.get(trainjob)
        if best is None:
            self._chosen.pop(trainjob, None)
        else:
            self._chosen[trainjob] = best
        if before is not None and before != best and best is not None:
            log.info("TrainJob %s/%s: target is now pod %s (was %s)", *trainjob,
                     best.split("/", 1)[1], before.split("/", 1)[1])
        for k in candidates:
            target = states[k].target
            if k == best and self._leading() and target is not None:
                self._scheduler.schedule(target)
            elif k != best:
                self._scheduler.unschedule(k)
                states[k].stop_holding()  # a held scrape of a pod no longer chosen

    def is_chosen(self, key: str, trainjob: TrainJobKey) -> bool:
        """True when pod ``key`` is the target of ``trainjob``."""
        return self._chosen.get(trainjob) == key

    def superseded_by_attempt(self, state: TargetState) -> bool:
        """True when another known live pod of the TrainJob runs a higher restart attempt."""
        key = f"{state.view.namespace}/{state.view.pod}"
        return any(self._ranks[k][1] > state.attempt
                   for k in self._states.of_trainjob(state.trainjob_key)
                   if k != key and k in self._ranks)

    def target_of(self, trainjob: TrainJobKey) -> Target | None:
        """The live target chosen for a TrainJob (None: none runs)."""
        key = self._chosen.get(trainjob)
        state = self._states.get(key) if key is not None else None
        return state.target if state is not None else None

    def chosen(self) -> dict[TrainJobKey, TargetState]:
        """The scraped target's state of every TrainJob, by ``(namespace, trainjob)``."""
        return {tj: self._states[key] for tj, key in self._chosen.items()
                if key in self._states}

    def sizes(self) -> dict[str, int]:
        """Entries kept per pod and per TrainJob."""
        return {"ranks": len(self._ranks), "chosen": len(self._chosen)}
