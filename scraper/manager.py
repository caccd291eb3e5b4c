"""The target manager: discovery's pods in, one scheduled scrape loop per target out.

Holds the table of :class:`~scraper.loop.TargetState` (one per trainer pod, keyed
``namespace/pod``), turns each pod watch item into a state change through
:func:`scraper.discovery.classify`, keeps the scheduler's jobs in step with the
table and with leadership, and starts each ended pod's final status write once.
It makes no Kubernetes or HTTP call of its own.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol

from scraper.discovery import (
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
from scraper.identity import (
    Belongs,
    ChainWaits,
    Foreign,
    Link,
    NotYet,
    Verdict,
    rank,
    restart_attempt,
)
from scraper.loop import ScrapeLoop, TargetState
from scraper.targets import SOURCES, Target
from scraper.telemetry import JobView

log = logging.getLogger(__name__)


class Scheduler(Protocol):
    """When targets are scraped (:class:`scraper.scheduling.TargetScheduler`)."""

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
        identify: the owner-chain check of a pod (:class:`scraper.identity.Identity`);
            a pod that fails it is not a target; one that is not verified (yet) is
            checked again by :meth:`recheck` when a link of its chain changes.
        on_dropped: called with a target no longer scraped (pod deleted or ended, URL
            changed), so the scraper lets go of what it keeps for it (its pooled
            connections: :meth:`scraper.scraping.ExporterScraper.forget`).
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
        self.states: dict[str, TargetState] = {}
        self._warned_pods: set[str] = set()  # uids of misconfigured pods already logged
        # --- identity and one target per TrainJob (scraper/identity.py)
        self._identify = identify
        self._on_dropped = on_dropped
        self._ranks: dict[str, tuple[int, int, str, str]] = {}  # key -> rank of its pod
        # Pods whose chain did not verify (yet), by the links they wait on; deleted pods
        # with a final status under "deleted:<uid>" while the informers still list.
        self._unverified = ChainWaits()
        self._foreign: set[str] = set()  # uids of pods logged as failing the check
        self._chosen: dict[tuple[str, str], str] = {}  # TrainJob -> key of its target
        # --- end identity

    async def run(self, key: str) -> None:
        """The scheduler's job for ``key``: one run of its scrape loop."""
        state = self.states.get(key)
        if state is not None and self.leading:
            await self._loop.run(state)

    # ------------------------------------------------------------ leadership

    def set_leading(self, leading: bool) -> None:
        """Start (True) or stop (False) scraping every known target."""
        self.leading = leading
        if leading:
            for key, state in self.states.items():
                if state.target is not None:
                    if self._chosen.get(state.trainjob_key) == key:
                        self._scheduler.schedule(state.target)
                elif state.ended is not None and state.claim_final():
                    self._spawn(self._loop.finalize(state.ended, state))
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
        """A full list of one scope: drop what it no longer holds, then apply every pod."""
        listed = {pod_key(p) for p in item.pods}
        for key in list(self.states):
            ns = key.split("/", 1)[0]
            if (item.scope is None or ns == item.scope) and key not in listed:
                self.drop(key)
        for pod in item.pods:
            self.on_pod(pod, deleted=False)

    def on_pod(self, pod: dict[str, Any], *, deleted: bool) -> None:
        """One pod added, changed or deleted."""
        key = pod_key(pod)
        uid = (pod.get("metadata") or {}).get("uid", "")
        state = self.states.get(key)
        if state is not None and state.uid != uid:
            self.drop(key)  # same name, new pod: start over
            state = None
        if deleted:
            self._warned_pods.discard(uid)
            self._foreign.discard(uid)
            final = final_from_deleted(pod)
            if final is not None and self.leading and (state is None or not state.final_claimed):
                known = state and (state.target.trainjob_uid if state.target else
                                   state.ended.trainjob_uid if state.ended else "")
                # Verified while it ran (its Job may be gone with it), else check now.
                verdict = Belongs(known) if known else self._verified(key, pod)
                self.drop(key)
                self._final_of_deleted(key, pod, verdict)
                return
            self.drop(key)
            return
        decision = classify(pod, default_port=self._default_port,
                            default_path=self._default_path,
                            default_interval=self._default_interval)
        if isinstance(decision, Ignore | Wait):
            self._unverified.release(key)  # a watch event brings it back when it changes
            if state is not None:
                self.drop(key)
            if isinstance(decision, Ignore) and decision.misconfigured:
                if uid not in self._warned_pods:  # once per pod, not once per watch event
                    self._warned_pods.add(uid)
                    log.warning("pod %s not scraped: %s", key, decision.reason)
            else:
                log.debug("pod %s not scraped: %s", key, decision.reason)
            return
        # --- identity: the owner chain must lead to the TrainJob object (its UID)
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
        # --- end identity
        if state is None:
            trainjob = decision.target.trainjob if isinstance(decision, Scrape) else \
                decision.trainjob
            namespace, name = key.split("/", 1)
            state = TargetState(JobView(namespace, trainjob, name), uid=uid)
            self.states[key] = state
        if isinstance(decision, Scrape):
            before = state.target
            state.retarget(decision.target)
            if before is not None and before.url != decision.target.url:
                self._on_dropped(before)
            self._ranks[key] = rank(pod)
            self._choose(state.trainjob_key)
        elif isinstance(decision, Final):
            if state.target is not None:
                self._on_dropped(state.target)
            state.target = None
            state.stop_holding()
            state.ended = decision
            state.view.up = False
            self._ranks.pop(key, None)
            self._scheduler.unschedule(key)
            self._choose(state.trainjob_key)
            if self._superseded(key, pod, decision.trainjob):
                log.info("final status of pod %s not applied: a newer restart attempt of "
                         "TrainJob %s/%s runs", key, decision.namespace, decision.trainjob)
            elif self.leading and state.claim_final():
                self._spawn(self._loop.finalize(decision, state))

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

    # --- identity and one target per TrainJob (scraper/identity.py)

    def _verified(self, key: str, pod: dict[str, Any]) -> Verdict:
        verdict = self._identify(pod)
        uid = (pod.get("metadata") or {}).get("uid", "")
        if isinstance(verdict, Foreign):
            if uid not in self._foreign:  # one line per pod, not one per watch event
                self._foreign.add(uid)
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

    def _final_of_deleted(self, key: str, pod: dict[str, Any], verdict: Verdict) -> None:
        """Write the final status of a deleted pod once its chain verifies.

        While the informers still list, the pod is kept (under ``deleted:<uid>``) and
        checked again after each list: a pod that ended and was deleted before a slow
        TrainJob list came must not lose its final status.  Once everything was listed,
        an unknown Job means the chain cannot be verified any more (it went with the
        pod): nothing is written to a TrainJob the pod may not belong to.
        """
        final = final_from_deleted(pod)
        if final is None or not self.leading:
            return
        uid = (pod.get("metadata") or {}).get("uid", "")
        if isinstance(verdict, NotYet) and verdict.listing:
            self._unverified.park(f"deleted:{uid}", pod, ())
        elif isinstance(verdict, NotYet):
            log.info("final status of deleted pod %s not written: %s (its owner chain "
                     "cannot be verified)", pod_key(pod), verdict.reason)
        elif isinstance(verdict, Belongs) and not self._superseded(pod_key(pod), pod,
                                                                   final.trainjob):
            self._spawn(self._loop.finalize(
                dataclasses.replace(final, trainjob_uid=verdict.trainjob_uid), None))

    def _choose(self, trainjob: tuple[str, str]) -> None:
        """Schedule only the best-ranked live target of ``trainjob`` (identity.rank)."""
        candidates = [k for k, st in self.states.items()
                      if st.trainjob_key == trainjob and st.target is not None
                      and k in self._ranks]
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

    def _superseded(self, key: str, pod: dict[str, Any], trainjob: str) -> bool:
        """True when another known pod of the TrainJob runs a higher restart attempt."""
        namespace = key.split("/", 1)[0]
        attempt = restart_attempt(pod)
        return any(r[1] > attempt for k, r in self._ranks.items()
                   if k != key and self.states.get(k) is not None
                   and self.states[k].trainjob_key == (namespace, trainjob))

    # --- end identity

    def drop(self, key: str) -> None:
        """Forget one target (its state and its scheduled job)."""
        self._scheduler.unschedule(key)
        state = self.states.pop(key, None)
        self._ranks.pop(key, None)
        self._unverified.release(key)
        if state is not None:
            state.dropped = True
            state.stop_holding()
            if state.target is not None:
                self._on_dropped(state.target)
            self._choose(state.trainjob_key)  # another pod of the TrainJob may take over

    def drop_trainjob(self, namespace: str, trainjob: str) -> None:
        """Forget every target of a TrainJob that is gone."""
        for key, state in list(self.states.items()):
            if state.trainjob_key == (namespace, trainjob):
                self.drop(key)
        self._forget(namespace, trainjob)

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
