"""The target manager: discovery's pods in, one scheduled scrape loop per target out.

Holds the table of :class:`~scraper.scrape.loop.TargetState` (one per trainer pod, keyed
``namespace/pod``), turns each pod watch item into a state change through
:func:`scraper.discovery.pods.classify`, keeps the scheduler's jobs in step with the
table and with leadership, and keeps every ended pod's final status owed until it
needs no write (:class:`~scraper.scrape.loop.FinalDue`).

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

import dataclasses
import logging
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Any

from scraper.discovery.deletions import DeletionRequests
from scraper.discovery.identity import (
    Belongs,
    Link,
    Verdict,
    rank,
    restart_attempt,
)
from scraper.discovery.pods import (
    ANNOTATION_SOURCE,
    Final,
    Ignore,
    Scrape,
    Synced,
    Wait,
    classify,
    final_from_deleted,
    pod_key,
)
from scraper.scrape.choice import Scheduler, TargetChoice
from scraper.scrape.finals import OwedFinals
from scraper.scrape.loop import ScrapeLoop, TargetState
from scraper.scrape.pod_checks import PodChecks
from scraper.scrape.target_table import AddressIndex, TargetTable
from scraper.shared.leadership import Leadership
from scraper.shared.targets import SOURCES, Target
from scraper.telemetry import JobView

log = logging.getLogger(__name__)

#: Pods of a list applied between two returns to the event loop: about 20 ms of CPU at
#: the per-pod cost of benchmarks/reports/event-cost-2026-12-03.md, a small share of the
#: renew deadline however long the list.
LIST_SLICE = 1000


class PodsNotApplied(Exception):
    """Applying some pods of a list raised (the others were applied).

    Attributes:
        failed: ``(namespace/pod, exception)`` of each; the first is the cause.
    """

    def __init__(self, failed: list[tuple[str, Exception]]) -> None:
        self.failed = failed
        key, first = failed[0]
        super().__init__(f"{len(failed)} pod(s) not applied, first {key}: "
                         f"{type(first).__name__}: {first}")
        self.__cause__ = first


def _source_of(pod: dict[str, Any], decision: Scrape | Final,
               trainjob_source: Callable[[str, str], str | None]) -> str:
    """The pod's own source annotation, else its TrainJob's (when valid), else the
    default."""
    current = decision.target.source if isinstance(decision, Scrape) else decision.source
    if ANNOTATION_SOURCE in ((pod.get("metadata") or {}).get("annotations") or {}):
        return current
    namespace = (pod.get("metadata") or {}).get("namespace", "")
    trainjob = decision.target.trainjob if isinstance(decision, Scrape) else \
        decision.trainjob
    inherited = trainjob_source(namespace, trainjob)
    return inherited if inherited in SOURCES else current


class TargetManager:
    """The table of targets and what changes it.

    Args:
        loop: runs the per-target rules.
        scheduler: fires :meth:`run` per scheduled key.
        spawn: starts a background coroutine (the final status writes) and tracks it.
        forget: called with ``(namespace, trainjob)`` when a TrainJob is gone.
        default_port, default_path, default_interval: for pods without annotations.
        leading: whether this replica scrapes now (set through :meth:`set_leading`): a
            shared :class:`~scraper.shared.leadership.Leadership`, or its value.
        addresses, states: the pods by exporter address and the per-pod states, shared
            with the scrape loop and the telemetry (None: new ones).
        identify: the owner-chain check of a pod (:class:`scraper.discovery.identity.Identity`);
            a pod that fails it is not a target; one that is not verified (yet) is
            checked again by :meth:`recheck` when a link of its chain changes.
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
        default_port: int,
        default_path: str,
        default_interval: float,
        leading: bool | Leadership,
        identify: Callable[[dict[str, Any]], Verdict] = lambda pod: Belongs(""),
        on_dropped: Callable[[Target], None] = lambda target: None,
        trainjob_source: Callable[[str, str], str | None] = lambda namespace, name: None,
        addresses: AddressIndex | None = None,
        states: TargetTable | None = None,
    ) -> None:
        self._trainjob_source = trainjob_source
        self._loop = loop
        self._scheduler = scheduler
        self._forget = forget
        self._default_port = default_port
        self._default_path = default_path
        self._default_interval = default_interval
        self.leadership = (leading if isinstance(leading, Leadership)
                           else Leadership(leading))
        #: Per-pod states by ``namespace/pod``, indexed by TrainJob: every pod event
        #: touches one TrainJob's states, never a scan of the table.
        self.states = states if states is not None else TargetTable()
        #: Pods by exporter address: an answer without identity is refused while two
        #: share one (scraper/scrape/loop.py, SharedAddress).
        self.addresses = addresses if addresses is not None else AddressIndex()
        self.choice = TargetChoice(self.states, scheduler, self.leadership)
        self.checks = PodChecks(identify)
        self.finals = OwedFinals(loop, spawn=spawn, leading=self.leadership,
                                 superseded=self.choice.superseded_by_attempt,
                                 park=self.checks.park)
        self._on_dropped = on_dropped
        # The earliest deletion request of each pod being deleted: a kubelet's grace-0
        # confirmation rewrites the pod's own (scraper/discovery/deletions.py).
        self.deletions = DeletionRequests()

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

    # ------------------------------------------------------------ discovery

    def on_synced(self, item: Synced) -> None:
        """A full list of one scope, applied in one call (:meth:`synced_steps`).

        Raises:
            PodsNotApplied: applying some pods raised; every other pod was applied.
        """
        for _ in self.synced_steps(item):
            pass

    def synced_steps(self, item: Synced, slice_size: int = LIST_SLICE) -> Iterator[int]:
        """Apply a full list of one scope: drop what it no longer holds, then apply every
        pod, yielding after each ``slice_size`` objects (the number done so far).

        The event loop's owner resumes it between yields, so a list of 50,000 pods never
        holds the loop (and the Lease renewal on it) for the whole list.

        Raises:
            PodsNotApplied: applying some pods raised; every other pod was applied.
        """
        listed = {pod_key(p) for p in item.pods}
        self.deletions.keep_only(item.scope, ((p.get("metadata") or {}).get("uid", "")
                                              for p in item.pods))
        done = 0
        for key in list(self.states):
            ns = key.split("/", 1)[0]
            if (item.scope is None or ns == item.scope) and key not in listed:
                self.drop(key)
                done += 1
                if done % slice_size == 0:
                    yield done
        self.checks.forget_unlisted(item.scope, listed)
        failed: list[tuple[str, Exception]] = []
        for pod in item.pods:
            try:
                self.on_pod(pod, deleted=False)
            except Exception as exc:  # one pod must not cost the pods after it
                failed.append((pod_key(pod), exc))
            done += 1
            if done % slice_size == 0:
                yield done
        if failed:
            raise PodsNotApplied(failed)

    def on_pod(self, pod: dict[str, Any], *, deleted: bool) -> None:
        """One pod added, changed or deleted."""
        key = pod_key(pod)
        uid = (pod.get("metadata") or {}).get("uid", "")
        state = self.states.get(key)
        if state is not None and state.uid != uid:
            self.drop(key)  # same name, new pod: start over
            state = None
        requested = self.deletions.seen(pod)
        if deleted:
            self.checks.deleted(key)
            self.deletions.forget(uid)
            final = final_from_deleted(pod, requested)
            if final is not None and (state is None or state.ended is None):
                known = state.target.trainjob_uid if state and state.target else ""
                # Verified while it ran (its Job may be gone with it), else check now.
                verdict = Belongs(known) if known else self.checks.verified(key, pod)
                self.drop(key)
                self.finals.owe_deleted(pod, verdict, state, requested)
                return
            self.drop(key)  # an owed final stays owed (kept in self.owed)
            if state is not None:
                self.finals.start(state)
            return
        decision = classify(pod, default_port=self._default_port,
                            default_path=self._default_path,
                            default_interval=self._default_interval,
                            deletion_requested=requested)
        if isinstance(decision, Ignore | Wait):
            self.checks.release(key)  # a watch event brings it back when it changes
            if state is not None:
                self.drop(key)
            if isinstance(decision, Ignore) and decision.misconfigured:
                self.checks.misconfigured(key, uid, decision.reason)
            else:
                log.debug("pod %s not scraped: %s", key, decision.reason)
            return
        verdict = self.checks.verified(key, pod)
        if not isinstance(verdict, Belongs):
            if state is not None:
                self.drop(key)
            # Foreign too: a chain can become valid (the TrainJob watch behind a re-creation).
            self.checks.park(key, pod, verdict.links)
            return
        self.checks.release(key)
        source = _source_of(pod, decision, self._trainjob_source)
        if isinstance(decision, Scrape):
            decision = Scrape(dataclasses.replace(decision.target, source=source,
                                                  trainjob_uid=verdict.trainjob_uid))
        else:
            decision = dataclasses.replace(decision, trainjob_uid=verdict.trainjob_uid,
                                           source=source)
        if state is None:
            trainjob = decision.target.trainjob if isinstance(decision, Scrape) else \
                decision.trainjob
            namespace, name = key.split("/", 1)
            state = TargetState(JobView(namespace, trainjob, name), uid=uid)
            self.states[key] = state
        if isinstance(decision, Scrape):
            before = state.target
            state.retarget(decision.target)
            self.addresses.place(key, decision.target.url)
            if before is not None and before.url != decision.target.url:
                self._on_dropped(before)
            self.choice.ranked(key, rank(pod))
            self.choice.choose(state.trainjob_key)
        elif isinstance(decision, Final):
            if state.target is not None:
                self._on_dropped(state.target)
            state.stop_scraping(decision, restart_attempt(pod))
            self.addresses.place(key, None)
            self.choice.ranked(key, None)
            self._scheduler.unschedule(key)
            self.choice.choose(state.trainjob_key)
            self.finals.start(state)

    def recheck(self, link: Link | None = None) -> None:
        """Check again the pods whose owner chain did not verify and that wait on ``link``
        (a Job, JobSet or TrainJob added, changed or deleted); every such pod for None
        (after a list or relist of any kind)."""
        for key, pod in self.checks.waiting.due(link):
            if key.startswith("deleted:"):
                self.checks.release(key)
                self.finals.owe_deleted(pod, self.checks.verified(key, pod))
            else:
                self.on_pod(pod, deleted=False)

    @property
    def owed(self) -> dict[tuple[str, str], dict[str, TargetState]]:
        """Deleted pods whose final is still owed, by TrainJob and pod UID."""
        return self.finals.owed

    def trainjob_seen(self, key: tuple[str, str] | None) -> None:
        """A watch event of TrainJob ``key`` (None: a list): the owed finals of its
        deleted pods are applied again, so one it now holds settles (and is let go)."""
        self.finals.start_every_deleted(key)

    def drop(self, key: str) -> None:
        """Forget one target (its state and its scheduled job); a final it still owes
        stays owed (:attr:`owed`)."""
        self._scheduler.unschedule(key)
        state = self.states.pop(key, None)
        self.choice.ranked(key, None)
        self.checks.release(key)
        self.addresses.place(key, None)
        if state is not None:
            state.drop()
            if state.target is not None:
                self._on_dropped(state.target)
            self.choice.choose(state.trainjob_key)  # another pod may take over
            if state.owes_final:
                self.finals.keep(state)

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
        return {**self.states.sizes(), **self.finals.sizes(), **self.choice.sizes(),
                **self.checks.sizes(),
                "deletions": len(self.deletions)}

    def snapshot(self) -> list[TargetState]:
        """The states now, for a check that awaits (a dropped one is skipped after)."""
        return list(self.states.values())

    # ------------------------------------------------------------ telemetry

    def views(self) -> Iterable[JobView]:
        """One view per TrainJob (:meth:`TargetTable.views`); nothing on a standby (it
        would export stale zeros).  Safe from another thread."""
        return self.states.views() if self.leading else []
