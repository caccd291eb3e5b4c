"""The pod watches' items fed to the target manager, a failure answered with a relist.

A failed item is never a silent gap: an exception while applying a list (the other
pods of it are applied) or an event is logged, counted
(``trainjob_scraper_pod_apply_failures_total``) and answered with a relist of every pod
watch, at most once per :data:`RELIST_BACKOFF` step while they keep failing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from scraper.discovery.pods import PodEvent, PodWatcher, Synced, WatchItem
from scraper.kube.calls import Backoff
from scraper.kube.informer import ScopesListed

log = logging.getLogger(__name__)

#: Between a failed pod watch item and the relist it asks for: 0.5 s doubling to 30 s
#: while items keep failing (a pod that always fails must not relist in a loop).
RELIST_BACKOFF = Backoff(initial=0.5, cap=30.0)


class PodSink(Protocol):
    """What the feed needs of :class:`scraper.discovery.pod_targets.PodTargets`."""

    def synced_steps(self, item: Synced) -> Iterator[int]: ...

    def on_pod(self, pod: dict[str, Any], *, deleted: bool) -> None: ...


class PodFeed:
    """Applies pod watch items in order (a root task: :meth:`run`).

    Args:
        sink: the pods' targets (:class:`scraper.discovery.pod_targets.PodTargets`).
        listed: the scopes whose first list was applied; :attr:`ScopesListed.event` is
            set once every scope's was.
        on_ready: called after a list once every scope was listed (readiness).
        on_failure: called with ``"list"`` or ``"event"`` per item that raised (a metric).
        on_applied: called after every item (the targets gauge).
    """

    def __init__(self, sink: PodSink, listed: ScopesListed, *,
                 on_ready: Callable[[], None], on_failure: Callable[[str], None],
                 on_applied: Callable[[], None]) -> None:
        self._sink = sink
        self.listed = listed
        self._on_ready = on_ready
        self._on_failure = on_failure
        self._on_applied = on_applied

    async def run(self, queue: asyncio.Queue[WatchItem],
                  watchers: Sequence[PodWatcher] = ()) -> None:
        """Feed every item of ``queue``; relist ``watchers`` after a failure (module doc)."""
        failures = 0  # in a row: a list applied whole starts the backoff over
        relist_at = 0.0
        loop = asyncio.get_running_loop()
        while True:
            item = await queue.get()
            kind = "list" if isinstance(item, Synced) else "event"
            try:
                if isinstance(item, Synced):
                    try:
                        for _ in self._sink.synced_steps(item):
                            await asyncio.sleep(0)  # the Lease renewal and scrapes run
                    finally:  # the list was applied, up to the pods that failed
                        self.listed.listed(item.scope)
                        if self.listed.event.is_set():
                            self._on_ready()
                    failures = 0
                elif isinstance(item, PodEvent):
                    self._sink.on_pod(item.pod, deleted=item.kind == "DELETED")
            except Exception:
                self._on_failure(kind)
                delay = RELIST_BACKOFF.delay(failures)
                failures += 1
                log.exception("applying a pod watch %s failed; relisting pods in %.1fs",
                              kind, delay)
                if loop.time() >= relist_at:  # one relist pending at a time
                    relist_at = loop.time() + delay
                    loop.call_later(delay, _relist, watchers)
            self._on_applied()


def _relist(watchers: Sequence[PodWatcher]) -> None:
    for watcher in watchers:
        watcher.relist()
