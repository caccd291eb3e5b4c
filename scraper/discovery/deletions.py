"""When each pod's deletion was first requested, as the pod watch showed it.

A pod's ``deletionTimestamp`` minus its ``deletionGracePeriodSeconds`` is when its
deletion was requested, but only until the grace period is shortened: the kubelet
confirms a finished pod's deletion with grace period 0, and while a finalizer holds the
pod (a Job's ``batch.kubernetes.io/job-tracking``) the API server then moves
``deletionTimestamp`` to that moment and the grace period to 0 ("a shorter grace period
may be given"; Kubernetes ``rest.BeforeDelete``).  A pod killed by a preemption then
reads as if it had ended before anyone deleted it, and its termination message would be
taken for the training's end.  So the earliest request seen for each pod is kept and
used instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any


def requested_at(pod: Mapping[str, Any]) -> float | None:
    """Epoch seconds of the deletion request the pod shows (None: not being deleted).

    ``deletionTimestamp`` minus ``deletionGracePeriodSeconds`` (both 1 s resolution).
    """
    meta = pod.get("metadata") or {}
    stamp = meta.get("deletionTimestamp")
    if not isinstance(stamp, str):
        return None
    try:
        deleted = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return deleted - float(meta.get("deletionGracePeriodSeconds") or 0)


class DeletionRequests:
    """The earliest deletion request seen per pod UID; bounded by the pods being deleted
    (an entry goes when its pod's DELETED event comes or a list no longer holds it)."""

    def __init__(self) -> None:
        self._earliest: dict[str, tuple[str, float]] = {}  # uid -> (namespace, epoch s)

    def __len__(self) -> int:
        return len(self._earliest)

    def seen(self, pod: Mapping[str, Any]) -> float | None:
        """Record the request this version of the pod shows; the earliest seen for its
        UID (None: no deletion seen)."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        now = requested_at(pod)
        known = self._earliest.get(uid)
        if now is None:
            return known[1] if known else None
        if known is None or now < known[1]:
            self._earliest[uid] = (str(meta.get("namespace", "")), now)
            return now
        return known[1]

    def forget(self, uid: str) -> None:
        """The pod is gone."""
        self._earliest.pop(uid, None)

    def keep_only(self, scope: str | None, uids: Iterable[str]) -> None:
        """After a full list of ``scope`` (None: every namespace): forget the pods of that
        scope it does not hold."""
        listed = set(uids)
        for uid, (namespace, _) in list(self._earliest.items()):
            if (scope is None or namespace == scope) and uid not in listed:
                del self._earliest[uid]
