"""The owner-chain check of each pod as discovery applies it: verdicts, the
pods parked until their chain verifies, and the warnings logged once per pod.

Every entry is bounded by the live pods: a pod's entries go with its deletion, or with
a relist that no longer holds it (its DELETED event was missed while the watch was
down).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from scraper.discovery.identity import ChainWaits, Foreign, Link, NotYet, Verdict
from scraper.discovery.pods import pod_key

log = logging.getLogger(__name__)


class PodChecks:
    """Owner-chain verdicts of pods, and what waits on them.

    Args:
        identify: the owner-chain check of a pod
            (:class:`scraper.discovery.identity.Identity`).
    """

    def __init__(self, identify: Callable[[dict[str, Any]], Verdict]) -> None:
        self._identify = identify
        # Pods whose chain did not verify (yet), by the links they wait on; deleted pods
        # with a final status under "deleted:<uid>" while the informers still list.
        self.waiting = ChainWaits()
        # Pods logged once (misconfigured; failing the owner-chain check), by key -> UID.
        self._misconfigured: dict[str, str] = {}
        self._foreign: dict[str, str] = {}

    def verified(self, key: str, pod: dict[str, Any]) -> Verdict:
        """The pod's verdict; a foreign pod is logged once per pod, not per watch event."""
        verdict = self._identify(pod)
        uid = (pod.get("metadata") or {}).get("uid", "")
        if isinstance(verdict, Foreign):
            if key.startswith("deleted:"):  # checked once, then let go (recheck)
                log.warning("pod %s is not a target: %s", pod_key(pod), verdict.reason)
            elif self._foreign.get(key) != uid:
                self._foreign[key] = uid
                log.warning("pod %s is not a target: %s", key, verdict.reason)
        elif isinstance(verdict, NotYet):
            log.debug("pod %s waits for its owner chain: %s", key, verdict.reason)
        return verdict

    def misconfigured(self, key: str, uid: str, reason: str) -> None:
        """Log once per pod (not per watch event) that it is not scraped, and why."""
        if self._misconfigured.get(key) != uid:
            self._misconfigured[key] = uid
            log.warning("pod %s not scraped: %s", key, reason)

    def deleted(self, key: str) -> None:
        """The pod is gone: its warnings go with it."""
        self._misconfigured.pop(key, None)
        self._foreign.pop(key, None)

    def forget_unlisted(self, scope: str | None, listed: set[str]) -> None:
        """Let go of the pods of ``scope`` a list no longer holds: one logged as
        misconfigured or foreign, or parked until its owner chain verifies."""
        def gone(key: str) -> bool:
            return (key not in listed and not key.startswith("deleted:")
                    and (scope is None or key.split("/", 1)[0] == scope))

        for logged in (self._misconfigured, self._foreign):
            for key in [k for k in logged if gone(k)]:
                del logged[key]
        for key, _ in self.waiting.due(None):
            if gone(key):
                self.waiting.release(key)

    def park(self, key: str, pod: dict[str, Any], links: Iterable[Link]) -> None:
        """Check ``pod`` again when one of ``links`` changes (or after a list)."""
        self.waiting.park(key, pod, tuple(links))

    def release(self, key: str) -> None:
        """Stop waiting on ``key``'s chain."""
        self.waiting.release(key)

    def sizes(self) -> dict[str, int]:
        """Entries kept per pod."""
        return {"warned_pods": len(self._misconfigured), "foreign": len(self._foreign),
                **{f"unverified.{k}": v for k, v in self.waiting.sizes().items()}}
