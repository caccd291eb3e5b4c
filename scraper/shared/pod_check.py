"""What a read of a target's pod found, and the verdict for an answer that stated no pod.

The read itself is :class:`scraper.discovery.pod_confirm.PodConfirmer` (the rule and its
reasons are in that module's docstring); the writer asks it before sending
(:mod:`scraper.write.pod_gate`) and the scrape loop is told the verdict.
"""

from __future__ import annotations

import enum
import ipaddress
import math
from urllib.parse import urlsplit

from scraper.shared.targets import Target

__all__ = ["TERMINAL_PHASES", "PodCheck", "check_pod"]


#: Phases after which a pod's IP may be another pod's.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class PodCheck(enum.Enum):
    """What the read of a target's pod found."""

    CONFIRMED = "confirmed"
    GONE = "gone"  #: 404
    REPLACED = "replaced"  #: another UID under the name
    MOVED = "moved"  #: another (or no) pod IP
    ENDED = "ended"  #: a terminal phase
    UNREAD = "unread"  #: the read failed


def _same_host(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return False
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a == b


def check_pod(target: Target, uid: str | None, pod_ip: str | None, phase: str | None,
              *, ended_at: float | None = None, answered_at: float | None = None) -> PodCheck:
    """The verdict for a pod read with ``uid``, ``pod_ip`` and ``phase`` (module doc);
    ``ended_at``: the latest ``finishedAt`` of its containers (epoch seconds, None: none
    ended), ``answered_at``: when the answer arrived (epoch seconds, None: unknown)."""
    if uid != target.pod_uid:
        return PodCheck.REPLACED
    if not _same_host(pod_ip, urlsplit(target.url).hostname):
        return PodCheck.MOVED
    if phase in TERMINAL_PHASES:
        if (ended_at is not None and answered_at is not None
                and ended_at >= math.floor(answered_at)):
            return PodCheck.CONFIRMED  # it still held the address when it answered
        return PodCheck.ENDED
    return PodCheck.CONFIRMED
