"""Waiting scrapes on the exporter's event loop (wire contract 2 and 3).

A scrape that sends ``Prefer: wait=N`` with the ETag it holds is answered when the
status changes (contract 3: when it changes in a way the scraper states it will write,
:mod:`exporter_lib.hold_policy`), after ``N`` seconds, when its client leaves, or when
the server stops.  While a scrape waits, one task polls the renderer's version every
:data:`WAIT_POLL_SECONDS`; a report that changes the integer percentage (at most 101
per training) also wakes the waiting scrapes at once (:meth:`WaitingScrapes.poke`,
through :attr:`exporter_lib.state.State.on_progress`), so the change users look at
first is not held up to a poll, while every other report costs ``update()`` no
wake-up call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from exporter_lib.exposition import Rendered, Renderer, etag_matches
from exporter_lib.hold_policy import HoldPolicy

#: How often waiting scrapes look for a new status (seconds): the most a change waits.
WAIT_POLL_SECONDS = 0.1


def unchanged(rendered: Rendered | None, if_none_match: str | None) -> bool:
    """True when the answer would tell the client nothing new (304, or 204 again)."""
    if rendered is None:
        return True
    return etag_matches(if_none_match, rendered.etag)


class WaitingScrapes:
    """The scrapes waiting for news, and the one task that watches for it.  Loop thread
    only.

    Args:
        renderer: the status's renderer (its ``version()``, ``render()`` and ``status()``).
    """

    def __init__(self, renderer: Renderer) -> None:
        self._renderer = renderer
        #: Scrapes waiting now.
        self.waiting = 0
        self._changed = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False

    def due(self, rendered: Rendered | None, if_none_match: str | None,
            policy: HoldPolicy | None, waited: float) -> bool:
        """True when a scrape that has waited ``waited`` seconds is answered now: its
        answer would be news, and (with a stated write policy) news the scraper would
        write."""
        if unchanged(rendered, if_none_match):
            return False
        return policy is None or policy.answers(self._renderer.status(), waited)

    async def wait(self, gone: Callable[[], bool], accept: str | None,
                   if_none_match: str | None, seconds: int,
                   policy: HoldPolicy | None = None) -> Rendered | None:
        """Wait until the answer is :meth:`due`, ``seconds`` pass, the client is ``gone()``
        or the server stops (stopping answers at once: the training is ending, its last
        status is the final one); the answer rendered for ``accept``."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        end = start + seconds
        self.waiting += 1
        # From here a report wakes this scrape (poke) or the watcher sees it (from the
        # version read now); one that came since the caller's render is looked at here.
        if self._watcher is None:
            self._watcher = loop.create_task(self._watch(self._renderer.version()),
                                             name="trainjob-exporter-watch")
        try:
            rendered = self._renderer.render(accept)
            if self.due(rendered, if_none_match, policy, 0.0):
                return rendered
            while True:
                changed = self._changed
                now = loop.time()
                remaining = end - now
                if remaining <= 0 or self._stopping:
                    break
                if policy is not None and (due := policy.metrics_due_in(now - start)) > 0:
                    # Wake when the metrics fall due, changed or not; the margin keeps a
                    # timer that fires a hair early from spinning.
                    remaining = min(remaining, due + 0.001)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await changed.wait()
                if gone():
                    break
                rendered = self._renderer.render(accept)
                if self.due(rendered, if_none_match, policy, loop.time() - start):
                    return rendered
        finally:
            self.waiting -= 1
        return self._renderer.render(accept)

    async def _watch(self, seen: tuple[int, int]) -> None:
        """While scrapes wait, look for a new status every :data:`WAIT_POLL_SECONDS`,
        from the version ``seen`` when the first of them registered.

        Polling keeps ``update()`` free of any wake-up call but for a new percentage; the
        loop only wakes while somebody waits.
        """
        try:
            while self.waiting > 0 and not self._stopping:
                await asyncio.sleep(WAIT_POLL_SECONDS)
                version = self._renderer.version()
                if version != seen:
                    seen = version
                    self._wake()
        finally:
            self._watcher = None

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def poke(self) -> None:
        """A report changed the percentage: every waiting scrape looks at the status now,
        not at the next poll.  Loop thread only."""
        if self.waiting > 0:
            self._wake()

    def stop(self) -> None:
        """Answer every waiting scrape at once; none waits from now on."""
        self._stopping = True
        self._wake()

    def task(self) -> asyncio.Task[None] | None:
        """The watching task while one runs."""
        return self._watcher
