"""Named, guarded tasks: a failure is logged at once, and a root task's failure stops
the process (as kopf guards its root tasks, ``kopf/_core/reactor/running.py``).

Root tasks run for the whole life of the process (the pod watch consumer, leader
election, periodic checks).  One that raises, or returns, is a bug or a broken
dependency: :class:`Supervisor` logs it with its name and traceback when it
happens, and sets :attr:`Supervisor.failed`, on which the service shuts down and
exits non-zero.  Background tasks (one-off work such as a final status write) are
logged the same way but do not stop the process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class RootTaskFailed(Exception):
    """A root task raised or ended; ``name`` names it, ``__cause__`` is its exception."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"root task {name!r} failed")


class Supervisor:
    """Starts named tasks and watches them (create inside a running loop)."""

    def __init__(self) -> None:
        self._roots: dict[str, asyncio.Task[Any]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self.failed = asyncio.Event()
        self.failure: RootTaskFailed | None = None

    def root(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Start root task ``name``; it must run until cancelled."""
        if name in self._roots:
            raise ValueError(f"root task {name!r} is already running")
        task = asyncio.create_task(coro, name=name)
        self._roots[name] = task
        task.add_done_callback(self._root_done)
        return task

    def background(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Start a one-off task; cancelled by :meth:`cancel_background`."""
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background_done)
        return task

    def background_count(self) -> int:
        """One-off tasks still running (e.g. final status writes)."""
        return len(self._background)

    def _root_done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or self._stopping:
            return
        name = task.get_name()
        exc = task.exception()
        if exc is not None:
            log.error("root task %s failed; stopping", name, exc_info=exc)
        else:
            log.error("root task %s ended although it runs until stopped; stopping", name)
        if self.failure is None:
            self.failure = RootTaskFailed(name)
            self.failure.__cause__ = exc
        self.failed.set()

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())

    async def cancel_background(self) -> None:
        """Cancel the one-off tasks still running and wait for them."""
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def cancel(self, *names: str) -> None:
        """Cancel the named root tasks (every one when none is named), in that order.

        A task that raises while it is cancelled is logged (never swallowed).
        """
        self._stopping = True
        for name in names or tuple(self._roots):
            task = self._roots.pop(name, None)
            if task is None or task.done():
                continue  # a task that ended was reported when it did
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if task.cancelled():
                    continue
                raise  # the caller itself was cancelled
            except Exception:
                log.exception("root task %s failed while stopping", name)


async def first_set(*events: asyncio.Event) -> None:
    """Wait until the first of ``events`` is set."""
    waits = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
