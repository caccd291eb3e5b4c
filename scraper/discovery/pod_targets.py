"""Pods in, target changes out: what each pod watch item means for the scrape stage.

Each pod is classified (:func:`scraper.discovery.pods.classify`), its owner chain
checked (:class:`scraper.discovery.pod_checks.PodChecks`), its deletion request
remembered (:class:`scraper.discovery.deletions.DeletionRequests`); what holds is
handed to a :class:`~scraper.shared.targets.TargetSink` (the scrape stage's target
manager) as a target to scrape, an end, a final owed by a deleted pod, or a drop.  Like
Prometheus's discovery manager feeding its scrape manager, nothing here schedules or
scrapes, and the sink never reads a pod.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

from scraper.discovery.deletions import DeletionRequests
from scraper.discovery.identity import Belongs, Link, NotYet, Verdict, rank, restart_attempt
from scraper.discovery.pod_checks import PodChecks
from scraper.discovery.pods import (
    ANNOTATION_SOURCE,
    Ignore,
    Scrape,
    Synced,
    Wait,
    classify,
    final_from_deleted,
    pod_key,
)
from scraper.shared.targets import SOURCES, Final, Known, TargetSink

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


class PodTargets:
    """Applies pod watch items, handing verified pods to ``sink``.

    Args:
        sink: the scrape stage's target manager.
        default_port, default_path, default_interval: for pods without annotations.
        identify: the owner-chain check of a pod (:class:`scraper.discovery.identity.Identity`);
            a pod that fails it is not a target; one that is not verified (yet) is
            checked again by :meth:`recheck` when a link of its chain changes.
        trainjob_source: a TrainJob's source annotation by ``(namespace, name)``.
    """

    def __init__(
        self,
        sink: TargetSink,
        *,
        default_port: int,
        default_path: str,
        default_interval: float,
        identify: Callable[[dict[str, Any]], Verdict] = lambda pod: Belongs(""),
        trainjob_source: Callable[[str, str], str | None] = lambda namespace, name: None,
    ) -> None:
        self._sink = sink
        self._default_port = default_port
        self._default_path = default_path
        self._default_interval = default_interval
        self._trainjob_source = trainjob_source
        self.checks = PodChecks(identify)
        # The earliest deletion request of each pod being deleted: a kubelet's grace-0
        # confirmation rewrites the pod's own (scraper/discovery/deletions.py).
        self.deletions = DeletionRequests()

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
        for key in self._sink.held_keys():
            ns = key.split("/", 1)[0]
            if (item.scope is None or ns == item.scope) and key not in listed:
                self._sink.drop(key)
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
        known = self._sink.known(key)
        if known is not None and known.uid != uid:
            self._sink.drop(key)  # same name, new pod: start over
            known = None
        requested = self.deletions.seen(pod)
        if deleted:
            self._deleted(key, uid, pod, known, requested)
            return
        decision = classify(pod, default_port=self._default_port,
                            default_path=self._default_path,
                            default_interval=self._default_interval,
                            deletion_requested=requested)
        if isinstance(decision, Ignore | Wait):
            self.checks.release(key)  # a watch event brings it back when it changes
            if known is not None:
                self._sink.drop(key)
            if isinstance(decision, Ignore) and decision.misconfigured:
                self.checks.misconfigured(key, uid, decision.reason)
            else:
                log.debug("pod %s not scraped: %s", key, decision.reason)
            return
        verdict = self.checks.verified(key, pod)
        if not isinstance(verdict, Belongs):
            if known is not None:
                self._sink.drop(key)
            # Foreign too: a chain can become valid (the TrainJob watch behind a re-creation).
            self.checks.park(key, pod, verdict.links)
            return
        self.checks.release(key)
        source = _source_of(pod, decision, self._trainjob_source)
        if isinstance(decision, Scrape):
            target = dataclasses.replace(decision.target, source=source,
                                         trainjob_uid=verdict.trainjob_uid)
            self._sink.scrape(key, uid, target, rank(pod))
        else:
            self._sink.end(key, uid, dataclasses.replace(
                decision, trainjob_uid=verdict.trainjob_uid, source=source),
                restart_attempt(pod))

    def _deleted(self, key: str, uid: str, pod: dict[str, Any], known: Known | None,
                 requested: float | None) -> None:
        """A pod deleted; ``known``: what the sink holds of it."""
        self.checks.deleted(key)
        self.deletions.forget(uid)
        final = final_from_deleted(pod, requested)
        if final is not None and (known is None or not known.ended):
            trainjob_uid = known.trainjob_uid if known is not None else ""
            # Verified while it ran (its Job may be gone with it), else check now.
            verdict = (Belongs(trainjob_uid) if trainjob_uid
                       else self.checks.verified(key, pod))
            self._owe(pod, final, verdict, key)
            return
        self._sink.drop(key, deleted=True)  # an owed final stays owed

    def _owe(self, pod: dict[str, Any], final: Final, verdict: Verdict,
             key: str | None) -> None:
        """Owe the final status of a deleted pod (seen ended only now) once its chain
        verifies; ``key``: the pod's key while the sink may hold it.

        While the informers still list, the pod is parked (under ``deleted:<uid>``) and
        checked again after each list: a pod that ended and was deleted before a slow
        TrainJob list came must not lose its final status.  Once everything was listed,
        an unknown Job means the chain cannot be verified any more (it went with the
        pod): nothing is written to a TrainJob the pod may not belong to.
        """
        if isinstance(verdict, Belongs):
            self._sink.owe_final(dataclasses.replace(final, trainjob_uid=verdict.trainjob_uid),
                                 restart_attempt(pod), key)
            return
        if key is not None:
            self._sink.drop(key)
        uid = (pod.get("metadata") or {}).get("uid", "")
        if isinstance(verdict, NotYet) and verdict.listing:
            self.checks.park(f"deleted:{uid}", pod, ())
        elif isinstance(verdict, NotYet):
            log.info("final status of deleted pod %s not written: %s (its owner chain "
                     "cannot be verified)", pod_key(pod), verdict.reason)

    def recheck(self, link: Link | None = None) -> None:
        """Check again the pods whose owner chain did not verify and that wait on ``link``
        (a Job, JobSet or TrainJob added, changed or deleted); every such pod for None
        (after a list or relist of any kind)."""
        for key, pod in self.checks.waiting.due(link):
            if key.startswith("deleted:"):
                self.checks.release(key)
                final = final_from_deleted(pod)
                if final is not None:
                    self._owe(pod, final, self.checks.verified(key, pod), None)
            else:
                self.on_pod(pod, deleted=False)

    def sizes(self) -> dict[str, int]:
        """Entries of each map kept per pod."""
        return {**self.checks.sizes(), "deletions": len(self.deletions)}
