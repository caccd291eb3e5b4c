"""The target manager: discovery's target changes in, one scheduled scrape loop per target out.

Holds the table of :class:`~scraper.scrape.target_state.TargetState` (one per trainer pod, keyed
``namespace/pod``), applies the changes discovery hands over (it is discovery's
:class:`~scraper.shared.targets.TargetSink`, like Prometheus's scrape manager fed by
its discovery manager), keeps the scheduler's jobs in step with the table and with
leadership, and keeps every ended pod's final status owed until it needs no write
(:class:`~scraper.scrape.target_state.FinalDue`).

Leader changes (docs/scraper.md, "Leader changes"): a final is owed from the pod's end
until an apply finds it on the TrainJob (or superseded, not storable, the TrainJob
gone).  Whoever leads applies every owed final: at each gain of leadership, at each
event of the pod and at each relist, one finalize at a time per pod.  Nothing about
a final is remembered across terms but the pods themselves, so losing the write queue
with leadership loses no final; a deleted pod whose final is still owed is kept (out
of the table, in :attr:`TargetManager.owed`) until it settles or its TrainJob is gone
(:mod:`scraper.scrape.finals`); which pod of a TrainJob is scraped is
:mod:`scraper.scrape.choice`'s.  It makes no Kubernetes or HTTP call of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from scraper.scrape.choice import Scheduler, TargetChoice
from scraper.scrape.finals import OwedFinals
from scraper.scrape.loop import ScrapeLoop
from scraper.scrape.target_state import TargetState
from scraper.scrape.target_table import AddressIndex, TargetTable
from scraper.shared.leadership import Leadership
from scraper.shared.targets import Final, Known, Rank, Target
from scraper.telemetry import JobView

log = logging.getLogger(__name__)


class TargetManager:
    """The table of targets and what changes it.

    Args:
        loop: runs the per-target rules.
        scheduler: fires :meth:`run` per scheduled key.
        spawn: starts a background coroutine (the final status writes) and tracks it.
        forget: called with ``(namespace, trainjob)`` when a TrainJob is gone.
        leading: whether this replica scrapes now (set through :meth:`set_leading`): a
            shared :class:`~scraper.shared.leadership.Leadership`, or its value.
        addresses, states: the pods by exporter address and the per-pod states, shared
            with the scrape loop and the telemetry (None: new ones).
        on_dropped: called with a target no longer scraped (pod deleted or ended, URL
            changed), so the scraper lets go of what it keeps for it (its pooled
            connections: :meth:`scraper.scrape.exporter.ExporterScraper.forget`).
    """

    def __init__(
        self,
        loop: ScrapeLoop,
        scheduler: Scheduler,
        *,
        spawn: Callable[[Coroutine[Any, Any, None]], object],
        forget: Callable[[str, str], None] = lambda namespace, trainjob: None,
        leading: bool | Leadership,
        on_dropped: Callable[[Target], None] = lambda target: None,
        addresses: AddressIndex | None = None,
        states: TargetTable | None = None,
    ) -> None:
        self._loop = loop
        self._scheduler = scheduler
        self._forget = forget
        self.leadership = (leading if isinstance(leading, Leadership)
                           else Leadership(leading))
        #: Per-pod states by ``namespace/pod``, indexed by TrainJob: every pod event
        #: touches one TrainJob's states, never a scan of the table.
        self.states = states if states is not None else TargetTable()
        #: Pods by exporter address: an answer without identity is refused while two
        #: share one (scraper/scrape/loop.py, SharedAddress).
        self.addresses = addresses if addresses is not None else AddressIndex()
        self.choice = TargetChoice(self.states, scheduler, self.leadership)
        self.finals = OwedFinals(loop, spawn=spawn, leading=self.leadership,
                                 superseded=self.choice.superseded_by_attempt)
        self._on_dropped = on_dropped

    @property
    def leading(self) -> bool:
        """Whether this replica scrapes now (:attr:`leadership`)."""
        return self.leadership.leading

    @leading.setter
    def leading(self, leading: bool) -> None:
        self.leadership.leading = leading

    async def run(self, key: str) -> None:
        """The scheduler's job for ``key``: one run of its scrape loop."""
        state = self.states.get(key)
        if state is not None and self.leading:
            await self._loop.run(state)

    # ------------------------------------------------------------ leadership

    def set_leading(self, leading: bool) -> None:
        """Start (True) or stop (False) scraping every known target; on True, apply
        every owed final (module doc)."""
        self.leading = leading
        if leading:
            for key, state in list(self.states.items()):
                if state.target is not None:
                    if self.choice.is_chosen(key, state.trainjob_key):
                        self._scheduler.schedule(state.target)
                else:
                    self.finals.start(state)
            self.finals.start_every_deleted()
        else:
            for key in self._scheduler.scheduled_keys():
                self._scheduler.unschedule(key)
            self.stop_holding()

    def stop_holding(self) -> None:
        """Cancel every waiting scrape in flight (re-opened by the runs of a new term)."""
        for state in self.states.values():
            state.stop_holding()

    # ------------------------------------------------------------ discovery's changes

    def known(self, key: str) -> Known | None:
        """What is held for ``key`` (None: nothing)."""
        state = self.states.get(key)
        if state is None:
            return None
        return Known(state.uid, state.target.trainjob_uid if state.target else "",
                     state.ended is not None)

    def held_keys(self) -> list[str]:
        """Every key held."""
        return list(self.states)

    def _state(self, key: str, uid: str, trainjob: str) -> TargetState:
        state = self.states.get(key)
        if state is not None and state.uid != uid:
            self.drop(key)  # same name, new pod: start over
            state = None
        if state is None:
            namespace, name = key.split("/", 1)
            state = TargetState(JobView(namespace, trainjob, name), uid=uid)
            self.states[key] = state
        return state

    def scrape(self, key: str, uid: str, target: Target, rank: Rank) -> None:
        """Scrape ``target`` (a verified Running pod), new or retargeted."""
        state = self._state(key, uid, target.trainjob)
        before = state.target
        state.retarget(target)
        self.addresses.place(key, target.url)
        if before is not None and before.url != target.url:
            self._on_dropped(before)
        self.choice.ranked(key, rank)
        self.choice.choose(state.trainjob_key)

    def end(self, key: str, uid: str, final: Final, attempt: int) -> None:
        """The verified pod ended: no longer scraped, its final owed and applied."""
        state = self._state(key, uid, final.trainjob)
        if state.target is not None:
            self._on_dropped(state.target)
        state.stop_scraping(final, attempt)
        self.addresses.place(key, None)
        self.choice.ranked(key, None)
        self._scheduler.unschedule(key)
        self.choice.choose(state.trainjob_key)
        self.finals.start(state)

    def owe_final(self, final: Final, attempt: int, key: str | None = None) -> None:
        """A deleted pod's verified final (``final.trainjob_uid`` set) is owed; the state
        held under ``key``, if any, is dropped and carries it."""
        state = self.states.get(key) if key is not None else None
        if key is not None:
            self.drop(key)
        self.finals.owe_deleted(final, attempt, state)

    @property
    def owed(self) -> dict[tuple[str, str], dict[str, TargetState]]:
        """Deleted pods whose final is still owed, by TrainJob and pod UID."""
        return self.finals.owed

    def trainjob_seen(self, key: tuple[str, str] | None) -> None:
        """A watch event of TrainJob ``key`` (None: a list): the owed finals of its
        deleted pods are applied again, so one it now holds settles (and is let go)."""
        self.finals.start_every_deleted(key)

    def drop(self, key: str, *, deleted: bool = False) -> None:
        """Forget one target (its state and its scheduled job); a final it still owes
        stays owed (:attr:`owed`) and, when the pod was ``deleted``, is applied."""
        self._scheduler.unschedule(key)
        state = self.states.pop(key, None)
        self.choice.ranked(key, None)
        self.addresses.place(key, None)
        if state is not None:
            state.drop()
            if state.target is not None:
                self._on_dropped(state.target)
            self.choice.choose(state.trainjob_key)  # another pod may take over
            if state.owes_final:
                self.finals.keep(state)
            if deleted:
                self.finals.start(state)

    def drop_trainjob(self, namespace: str, trainjob: str) -> None:
        """Forget every target of a TrainJob that is gone, and the finals it was owed."""
        for key in self.states.of_trainjob((namespace, trainjob)):
            self.drop(key)
        self.finals.trainjob_gone((namespace, trainjob))
        self._forget(namespace, trainjob)

    def target_of(self, namespace: str, trainjob: str) -> Target | None:
        """The live target chosen for a TrainJob (None: none runs)."""
        return self.choice.target_of((namespace, trainjob))

    def chosen(self) -> dict[tuple[str, str], TargetState]:
        """The scraped target's state of every TrainJob, by ``(namespace, trainjob)``."""
        return self.choice.chosen()

    def sizes(self) -> dict[str, int]:
        """Entries of each map kept per pod or TrainJob (each is bounded by the live
        objects)."""
        return {**self.states.sizes(), **self.finals.sizes(), **self.choice.sizes()}

    def snapshot(self) -> list[TargetState]:
        """The states now, for a check that awaits (a dropped one is skipped after)."""
        return list(self.states.values())

    # ------------------------------------------------------------ telemetry

    def views(self) -> Iterable[JobView]:
        """One view per TrainJob (:meth:`TargetTable.views`); nothing on a standby (it
        would export stale zeros).  Safe from another thread."""
        return self.states.views() if self.leading else []
