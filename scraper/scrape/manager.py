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
of the table, in :attr:`TargetManager.owed`) until it settles or its TrainJob is gone.
It makes no Kubernetes or HTTP call of its own.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Any, Protocol

from scraper.discovery.deletions import DeletionRequests
from scraper.discovery.identity import (
    Belongs,
    ChainWaits,
    Foreign,
    Link,
    NotYet,
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
from scraper.discovery.targets import SOURCES, Target
from scraper.scrape.loop import FinalDue, ScrapeLoop, TargetState
from scraper.scrape.target_table import AddressIndex, TargetTable
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


class Scheduler(Protocol):
    """When targets are scraped (:class:`scraper.scrape.scheduling.TargetScheduler`)."""

    def schedule(self, target: Target) -> None: ...

    def unschedule(self, key: str) -> None: ...

    def scheduled_keys(self) -> set[str]: ...


class TargetManager:
    """The table of targets and what changes it.

    Args:
        loop: runs the per-target rules.
        scheduler: fires :meth:`run` per scheduled key.
        spawn: starts a background coroutine (the final status writes) and tracks it.
        forget: called with ``(namespace, trainjob)`` when a TrainJob is gone.
        default_port, default_path, default_interval: for pods without annotations.
        leading: whether this replica scrapes now (set through :meth:`set_leading`).
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
        leading: bool,
        identify: Callable[[dict[str, Any]], Verdict] = lambda pod: Belongs(""),
        on_dropped: Callable[[Target], None] = lambda target: None,
        trainjob_source: Callable[[str, str], str | None] = lambda namespace, name: None,
    ) -> None:
        self._trainjob_source = trainjob_source
        self._loop = loop
        self._scheduler = scheduler
        self._spawn = spawn
        self._forget = forget
        self._default_port = default_port
        self._default_path = default_path
        self._default_interval = default_interval
        self.leading = leading
        #: Per-pod states by ``namespace/pod``, indexed by TrainJob: every pod event
        #: touches one TrainJob's states, never a scan of the table.
        self.states = TargetTable()
        #: Pods by exporter address: an answer without identity is refused while two
        #: share one (scraper/scrape/loop.py, SharedAddress).
        self.addresses = AddressIndex()
        #: Deleted pods whose final is still owed, by TrainJob and pod UID.
        self.owed: dict[tuple[str, str], dict[str, TargetState]] = {}
        # Pods logged once (misconfigured; failing the owner-chain check), by key -> UID:
        # dropped with the pod's deletion or a relist without it (bounded by live pods).
        self._warned_pods: dict[str, str] = {}
        self._identify = identify
        self._on_dropped = on_dropped
        self._ranks: dict[str, tuple[int, int, str, str]] = {}  # key -> rank of its pod
        # Pods whose chain did not verify (yet), by the links they wait on; deleted pods
        # with a final status under "deleted:<uid>" while the informers still list.
        self._unverified = ChainWaits()
        self._foreign: dict[str, str] = {}
        # The earliest deletion request of each pod being deleted: a kubelet's grace-0
        # confirmation rewrites the pod's own (scraper/discovery/deletions.py).
        self.deletions = DeletionRequests()
        self._chosen: dict[tuple[str, str], str] = {}  # TrainJob -> key of its target

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
                    if self._chosen.get(state.trainjob_key) == key:
                        self._scheduler.schedule(state.target)
                else:
                    self._start_final(state)
            for by_uid in list(self.owed.values()):
                for state in list(by_uid.values()):
                    self._start_final(state)
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
        self._forget_unlisted(item.scope, listed)
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

    def _forget_unlisted(self, scope: str | None, listed: set[str]) -> None:
        """Let go of the pods of ``scope`` a list no longer holds that are not in the
        table: one logged as misconfigured or foreign, or parked until its owner chain
        verifies (their DELETED event was missed while the watch was down)."""
        def gone(key: str) -> bool:
            return (key not in listed and not key.startswith("deleted:")
                    and (scope is None or key.split("/", 1)[0] == scope))

        for logged in (self._warned_pods, self._foreign):
            for key in [k for k in logged if gone(k)]:
                del logged[key]
        for key, _ in self._unverified.due(None):
            if gone(key):
                self._unverified.release(key)

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
            self._warned_pods.pop(key, None)
            self._foreign.pop(key, None)
            self.deletions.forget(uid)
            final = final_from_deleted(pod, requested)
            if final is not None and (state is None or state.ended is None):
                known = state.target.trainjob_uid if state and state.target else ""
                # Verified while it ran (its Job may be gone with it), else check now.
                verdict = Belongs(known) if known else self._verified(key, pod)
                self.drop(key)
                self._final_of_deleted(key, pod, verdict, state, requested)
                return
            self.drop(key)  # an owed final stays owed (kept in self.owed)
            if state is not None:
                self._start_final(state)
            return
        decision = classify(pod, default_port=self._default_port,
                            default_path=self._default_path,
                            default_interval=self._default_interval,
                            deletion_requested=requested)
        if isinstance(decision, Ignore | Wait):
            self._unverified.release(key)  # a watch event brings it back when it changes
            if state is not None:
                self.drop(key)
            if isinstance(decision, Ignore) and decision.misconfigured:
                if self._warned_pods.get(key) != uid:  # once per pod, not per watch event
                    self._warned_pods[key] = uid
                    log.warning("pod %s not scraped: %s", key, decision.reason)
            else:
                log.debug("pod %s not scraped: %s", key, decision.reason)
            return
        verdict = self._verified(key, pod)
        if not isinstance(verdict, Belongs):
            if state is not None:
                self.drop(key)
            # Foreign too: a chain can become valid (the TrainJob watch behind a re-creation).
            self._unverified.park(key, pod, verdict.links)
            return
        self._unverified.release(key)
        source = self._source(pod, decision)
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
            self._ranks[key] = rank(pod)
            self._choose(state.trainjob_key)
        elif isinstance(decision, Final):
            if state.target is not None:
                self._on_dropped(state.target)
            state.target = None
            self.addresses.place(key, None)
            state.stop_holding()
            state.end(decision)
            state.attempt = restart_attempt(pod)
            state.view.up = False
            self._ranks.pop(key, None)
            self._scheduler.unschedule(key)
            self._choose(state.trainjob_key)
            self._start_final(state)

    def _source(self, pod: dict[str, Any], decision: Scrape | Final) -> str:
        """The pod's own source annotation, else its TrainJob's (when valid), else the
        default."""
        current = decision.target.source if isinstance(decision, Scrape) else decision.source
        if ANNOTATION_SOURCE in ((pod.get("metadata") or {}).get("annotations") or {}):
            return current
        namespace = (pod.get("metadata") or {}).get("namespace", "")
        trainjob = decision.target.trainjob if isinstance(decision, Scrape) else \
            decision.trainjob
        inherited = self._trainjob_source(namespace, trainjob)
        return inherited if inherited in SOURCES else current


    def _verified(self, key: str, pod: dict[str, Any]) -> Verdict:
        verdict = self._identify(pod)
        uid = (pod.get("metadata") or {}).get("uid", "")
        if isinstance(verdict, Foreign):
            if key.startswith("deleted:"):  # checked once, then let go (recheck)
                log.warning("pod %s is not a target: %s", pod_key(pod), verdict.reason)
            elif self._foreign.get(key) != uid:  # one line per pod, not per watch event
                self._foreign[key] = uid
                log.warning("pod %s is not a target: %s", key, verdict.reason)
        elif isinstance(verdict, NotYet):
            log.debug("pod %s waits for its owner chain: %s", key, verdict.reason)
        return verdict

    def recheck(self, link: Link | None = None) -> None:
        """Check again the pods whose owner chain did not verify and that wait on ``link``
        (a Job, JobSet or TrainJob added, changed or deleted); every such pod for None
        (after a list or relist of any kind)."""
        for key, pod in self._unverified.due(link):
            if key.startswith("deleted:"):
                self._unverified.release(key)
                self._final_of_deleted(key, pod, self._verified(key, pod))
            else:
                self.on_pod(pod, deleted=False)

    def _final_of_deleted(self, key: str, pod: dict[str, Any], verdict: Verdict,
                          state: TargetState | None = None,
                          requested: float | None = None) -> None:
        """Owe the final status of a deleted pod (seen ended only now) once its chain
        verifies; ``state``: the pod's dropped state, if it had one; ``requested``: the
        earliest deletion request seen for it (:class:`DeletionRequests`).

        While the informers still list, the pod is kept (under ``deleted:<uid>``) and
        checked again after each list: a pod that ended and was deleted before a slow
        TrainJob list came must not lose its final status.  Once everything was listed,
        an unknown Job means the chain cannot be verified any more (it went with the
        pod): nothing is written to a TrainJob the pod may not belong to.
        """
        final = final_from_deleted(pod, requested)
        if final is None:
            return
        uid = (pod.get("metadata") or {}).get("uid", "")
        if isinstance(verdict, NotYet) and verdict.listing:
            self._unverified.park(f"deleted:{uid}", pod, ())
        elif isinstance(verdict, NotYet):
            log.info("final status of deleted pod %s not written: %s (its owner chain "
                     "cannot be verified)", pod_key(pod), verdict.reason)
        elif isinstance(verdict, Belongs):
            if state is None:
                state = TargetState(JobView(final.namespace, final.trainjob, final.pod_name),
                                    uid=uid, dropped=True)
            state.attempt = restart_attempt(pod)
            state.end(dataclasses.replace(final, trainjob_uid=verdict.trainjob_uid))
            self._owe(state)
            self._start_final(state)


    def _start_final(self, state: TargetState) -> None:
        """Apply ``state``'s final if it is owed, this replica leads and no finalize runs
        for it; a final a newer restart attempt supersedes is settled instead."""
        if not self.leading or not state.owes_final or state.ended is None:
            return
        if self._superseded_by_attempt(state):
            log.info("final status of pod %s/%s not applied: a newer restart attempt of "
                     "TrainJob %s/%s runs", state.view.namespace, state.view.pod,
                     *state.trainjob_key)
            self._settled(state)
            return
        if state.start_final():
            self._spawn(self._apply_final(state, state.ended))

    async def _apply_final(self, state: TargetState, final: Final) -> None:
        """One finalize run; the final stays owed unless it settled.  A run's apply is
        its last step, so a gain of leadership during its earlier steps (a log read)
        still has it queue in the new term."""
        settled = False
        try:
            settled = await self._loop.finalize(final, state)
        finally:
            if settled:
                self._settled(state)
            elif state.final is FinalDue.APPLYING:
                state.final = FinalDue.OWED

    def trainjob_seen(self, key: tuple[str, str] | None) -> None:
        """A watch event of TrainJob ``key`` (None: a list): the owed finals of its
        deleted pods are applied again, so one it now holds settles (and is let go)."""
        groups = list(self.owed.values()) if key is None else [self.owed.get(key, {})]
        for by_uid in groups:
            for state in list(by_uid.values()):
                self._start_final(state)

    def _settled(self, state: TargetState) -> None:
        state.final = FinalDue.SETTLED
        if state.dropped:
            self._unowe(state)

    def _owe(self, state: TargetState) -> None:
        """Keep a dropped state whose final is owed (its pod is gone from the table)."""
        self.owed.setdefault(state.trainjob_key, {})[state.uid] = state

    def _unowe(self, state: TargetState) -> None:
        by_uid = self.owed.get(state.trainjob_key)
        if by_uid is not None and by_uid.get(state.uid) is state:
            del by_uid[state.uid]
            if not by_uid:
                del self.owed[state.trainjob_key]

    def _choose(self, trainjob: tuple[str, str]) -> None:
        """Schedule only the best-ranked live target of ``trainjob`` (identity.rank)."""
        candidates = [k for k in self.states.of_trainjob(trainjob)
                      if self.states[k].target is not None and k in self._ranks]
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
            target = self.states[k].target
            if k == best and self.leading and target is not None:
                self._scheduler.schedule(target)
            elif k != best:
                self._scheduler.unschedule(k)
                self.states[k].stop_holding()  # a held scrape of a pod no longer chosen

    def _superseded_by_attempt(self, state: TargetState) -> bool:
        """True when another known live pod of the TrainJob runs a higher restart attempt."""
        key = f"{state.view.namespace}/{state.view.pod}"
        return any(self._ranks[k][1] > state.attempt
                   for k in self.states.of_trainjob(state.trainjob_key)
                   if k != key and k in self._ranks)


    def drop(self, key: str) -> None:
        """Forget one target (its state and its scheduled job); a final it still owes
        stays owed (:attr:`owed`)."""
        self._scheduler.unschedule(key)
        state = self.states.pop(key, None)
        self._ranks.pop(key, None)
        self._unverified.release(key)
        self.addresses.place(key, None)
        if state is not None:
            state.dropped = True
            state.stop_holding()
            if state.target is not None:
                self._on_dropped(state.target)
            self._choose(state.trainjob_key)  # another pod of the TrainJob may take over
            if state.owes_final:
                self._owe(state)

    def drop_trainjob(self, namespace: str, trainjob: str) -> None:
        """Forget every target of a TrainJob that is gone, and the finals it was owed."""
        for key in self.states.of_trainjob((namespace, trainjob)):
            self.drop(key)
        for state in list(self.owed.get((namespace, trainjob), {}).values()):
            state.final = FinalDue.SETTLED
            self._unowe(state)
        self._forget(namespace, trainjob)

    def target_of(self, namespace: str, trainjob: str) -> Target | None:
        """The live target chosen for a TrainJob (None: none runs)."""
        key = self._chosen.get((namespace, trainjob))
        state = self.states.get(key) if key is not None else None
        return state.target if state is not None else None
    def chosen(self) -> dict[tuple[str, str], TargetState]:
        """The scraped target's state of every TrainJob, by ``(namespace, trainjob)``."""
        return {tj: self.states[key] for tj, key in self._chosen.items() if key in self.states}

    def sizes(self) -> dict[str, int]:
        """Entries of each map kept per pod or TrainJob (issue 27, deliverable 6: each is
        bounded by the live objects)."""
        return {**self.states.sizes(), "owed": len(self.owed),
                "owed_pods": sum(len(v) for v in self.owed.values()),
                "warned_pods": len(self._warned_pods), "ranks": len(self._ranks),
                **{f"unverified.{k}": v for k, v in self._unverified.sizes().items()},
                "foreign": len(self._foreign), "chosen": len(self._chosen),
                "deletions": len(self.deletions)}

    def snapshot(self) -> list[TargetState]:
        """The states now, for a check that awaits (a dropped one is skipped after)."""
        return list(self.states.values())

    # ------------------------------------------------------------ telemetry

    def views(self) -> Iterable[JobView]:
        """One view per TrainJob; nothing on a standby (it would export stale zeros)."""
        if not self.leading:
            return []
        by_job: dict[tuple[str, str], JobView] = {}
        for state in self.states.values():
            key = state.trainjob_key
            # A live target wins over a terminated pod of the same TrainJob.
            if key not in by_job or state.target is not None:
                by_job[key] = state.view
        return list(by_job.values())
