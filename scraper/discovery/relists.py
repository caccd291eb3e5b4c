"""Relists of the pod watches that the writer asks for, spaced out per watch.

A write whose read of a target's pod finds it not the one the pod watch says
(:mod:`scraper.discovery.pod_confirm`) asks for a relist of that pod's watch; a list of all
pods in a scope is big, so one watch lists at most once per ``spacing`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from scraper.discovery.pods import PodWatcher

__all__ = ["RELIST_SPACING", "Relists"]

#: Seconds between two relists of one pod watch asked for by unconfirmed pods.
RELIST_SPACING = 10.0


class Relists:
    """The pod watches by scope (``None``: all namespaces) and when each last relisted."""

    def __init__(self, spacing: float = RELIST_SPACING,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._spacing = spacing
        self._clock = clock
        self._watchers: dict[str | None, PodWatcher] = {}
        self._last: dict[str | None, float] = {}

    def watch(self, watchers: Mapping[str | None, PodWatcher]) -> None:
        """The running pod watches, by the scope each lists."""
        self._watchers = dict(watchers)

    def relist_for(self, namespace: str) -> bool:
        """Relist the watch that sees ``namespace`` now, unless it relisted less than the
        spacing ago or there is none yet; whether it relists."""
        scope: str | None = namespace if namespace in self._watchers else None
        watcher = self._watchers.get(scope)
        now = self._clock()
        if watcher is None or now - self._last.get(scope, float("-inf")) < self._spacing:
            return False
        self._last[scope] = now
        watcher.relist()
        return True
