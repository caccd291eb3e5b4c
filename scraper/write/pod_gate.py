"""The pod read before a status of an answer that stated no pod is sent.

The writer tasks (:mod:`scraper.write.worker`) ask :meth:`PodGate.verdict` before each
try of a queued status that carries a ``confirm`` target: its pod is read once
(:mod:`scraper.discovery.pod_confirm`), and the try goes on only when the pod is still the
target's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from scraper.shared.outcome import WriteOutcome
from scraper.shared.pod_check import PodCheck
from scraper.shared.targets import Target

__all__ = ["PodGate"]


@dataclass(frozen=True)
class PodGate:
    """Reads a queued status's pod before it is sent.

    Attributes:
        confirm_pod: reads a target's pod, given when the status arrived (epoch seconds;
            None: unknown): :class:`scraper.discovery.pod_confirm.PodConfirmer`.
        on_pod_check: told ``(target, PodCheck)`` of each read, a failed one
            (``UNREAD``) too.
    """

    confirm_pod: Callable[[Target, float | None], Awaitable[PodCheck]]
    on_pod_check: Callable[[Target, PodCheck], object]

    async def verdict(self, target: Target | None, arrived: float,
                      retry_in: Callable[[], float]) -> tuple[WriteOutcome, float | None] | None:
        """None: send (no ``target`` to confirm, or its pod confirmed).  Otherwise the
        try's outcome and its retry delay: ``UNCONFIRMED`` (dropped, not retried) when
        the pod is not the target's any more, ``RETRIED`` after ``retry_in()`` seconds
        when the read failed (nothing learnt, as a failed write)."""
        if target is None:
            return None
        # 0: no arrival time known; an ended pod then confirms nothing.
        check = await self.confirm_pod(target, arrived if arrived > 0 else None)
        self.on_pod_check(target, check)
        if check is PodCheck.UNREAD:
            return WriteOutcome.RETRIED, retry_in()
        return None if check is PodCheck.CONFIRMED else (WriteOutcome.UNCONFIRMED, None)
