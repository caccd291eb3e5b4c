"""The target manager: discovery's pods in, one scheduled scrape loop per target out.

Holds the table of :class:`~scraper.loop.TargetState` (one per trainer pod, keyed
``namespace/pod``), turns each pod watch item into a state change through
:func:`scraper.discovery.classify`, keeps the scheduler's jobs in step with the
table and with leadership, and starts each ended pod's final status write once.
It makes no Kubernetes or HTTP call of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol

from scraper.discovery import (
    Final,
    Ignore,
    Scrape,
    Synced,
    Wait,
    classify,
    final_from_deleted,
    pod_key,
)
from scraper.loop import ScrapeLoop, TargetState
from scraper.targets import Target
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
    ) -> None:
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
            for state in self.states.values():
                if state.target is not None:
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
            final = final_from_deleted(pod)
            if final is not None and self.leading and (state is None or not state.final_claimed):
                self._spawn(self._loop.finalize(final, None))
            self.drop(key)
            return
        decision = classify(pod, default_port=self._default_port,
                            default_path=self._default_path,
                            default_interval=self._default_interval)
        if isinstance(decision, Ignore | Wait):
            if state is not None:
                self.drop(key)
            if isinstance(decision, Ignore) and decision.misconfigured:
                if uid not in self._warned_pods:  # once per pod, not once per watch event
                    self._warned_pods.add(uid)
                    log.warning("pod %s not scraped: %s", key, decision.reason)
            else:
                log.debug("pod %s not scraped: %s", key, decision.reason)
            return
        if state is None:
            trainjob = decision.target.trainjob if isinstance(decision, Scrape) else \
                decision.trainjob
            namespace, name = key.split("/", 1)
            state = TargetState(JobView(namespace, trainjob, name), uid=uid)
            self.states[key] = state
        if isinstance(decision, Scrape):
            state.retarget(decision.target)
            if self.leading:
                self._scheduler.schedule(decision.target)
        elif isinstance(decision, Final):
            state.target = None
            state.stop_holding()
            state.ended = decision
            state.view.up = False
            self._scheduler.unschedule(key)
            if self.leading and state.claim_final():
                self._spawn(self._loop.finalize(decision, state))

    def drop(self, key: str) -> None:
        """Forget one target (its state and its scheduled job)."""
        self._scheduler.unschedule(key)
        state = self.states.pop(key, None)
        if state is not None:
            state.dropped = True
            state.stop_holding()

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
