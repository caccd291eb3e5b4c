"""Who wrote a TrainJob's ``status.trainerStatus``: read from ``metadata.managedFields``.

Server-side apply records, per field manager, the fields it owns (``fieldsV1``)
and when it last changed them (``time``, set by the API server, 1 s resolution).
The *owners* of trainerStatus are the managers owning any field under
``f:status`` -> ``f:trainerStatus`` (two managers that applied the same value
share it).  The versions come from a watch (e.g. ``tests.helpers.stack.TrainJobRecorder``),
so no change between two polls is missed (tests, benchmarks/push_coexistence.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: Field manager of Kubeflow Trainer v2.2+'s push status server (``pkg/statusserver``).
PUSH_MANAGER = "trainer-status"
#: Field manager of this project's scraper.
SCRAPER_MANAGER = "trainjob-scraper"


def trainer_status_entries(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The managedFields entries of ``obj`` that own a field of ``status.trainerStatus``."""
    result = []
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        status = (entry.get("fieldsV1") or {}).get("f:status") or {}
        if status.get("f:trainerStatus"):
            result.append(entry)
    return result


def owners(obj: Mapping[str, Any]) -> frozenset[str]:
    """Field managers owning a field of ``status.trainerStatus`` (empty: nobody)."""
    return frozenset(e["manager"] for e in trainer_status_entries(obj))


def last_writer(obj: Mapping[str, Any]) -> str | None:
    """The owner of trainerStatus whose entry changed last (ties: by name), or None."""
    entries = trainer_status_entries(obj)
    if not entries:
        return None
    return str(max(entries, key=lambda e: (e.get("time") or "", e["manager"]))["manager"])


@dataclass(frozen=True)
class Write:
    """One change of trainerStatus seen by the watch."""

    at: datetime
    writer: str | None
    owners: frozenset[str]
    status: dict[str, Any] | None


def _entries_by_manager(obj: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["manager"]: e for e in trainer_status_entries(obj)}


def writer_of_change(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> str | None:
    """The field manager whose write turned ``before`` into ``after`` (two versions of one
    TrainJob), from their managedFields: the owner whose entry's ``time`` changed
    (the API server sets it for the manager that made the change); if none did
    (both in the same second), the owner whose fields changed; else :func:`last_writer`.
    """
    old = _entries_by_manager(before) if before is not None else {}
    new = _entries_by_manager(after)
    timed = [m for m, e in new.items() if (old.get(m) or {}).get("time") != e.get("time")]
    if len(timed) == 1:
        return timed[0]
    changed = [m for m, e in new.items()
               if (old.get(m) or {}).get("fieldsV1") != e.get("fieldsV1")]
    if len(changed) == 1:
        return changed[0]
    return last_writer(after)


def writes(versions: Iterable[Mapping[str, Any]],
           seen_at: Sequence[datetime] | None = None) -> list[Write]:
    """The versions whose trainerStatus differs from the version before, in order,
    each with its writer (:func:`writer_of_change`).

    ``seen_at`` (same length as ``versions``) is when the watch delivered each;
    without it each write is timed by its writer's managedFields ``time``.
    """
    result: list[Write] = []
    previous: object = None
    before: Mapping[str, Any] | None = None
    for index, obj in enumerate(versions):
        status = (obj.get("status") or {}).get("trainerStatus")
        if status == previous:
            before = obj
            continue
        previous = status
        writer = writer_of_change(before, obj)
        before = obj
        if seen_at is not None:
            at = seen_at[index]
        else:
            times = {e["manager"]: e.get("time") for e in trainer_status_entries(obj)}
            at = datetime.fromisoformat((times.get(writer or "") or "1970-01-01T00:00:00Z")
                                        .replace("Z", "+00:00"))
        result.append(Write(at, writer, owners(obj), status))
    return result


def owner_changes(history: Sequence[Write]) -> list[Write]:
    """The writes after which the owners of trainerStatus differ from before them
    (the first write with owners included): the flapping a user would see."""
    result: list[Write] = []
    current: frozenset[str] = frozenset()
    for write in history:
        if write.owners and write.owners != current:
            result.append(write)
            current = write.owners
    return result


def writes_per_minute(history: Sequence[Write]) -> dict[str, float]:
    """Changes of trainerStatus per minute by writer over the span of ``history``."""
    timed = [w for w in history if w.writer is not None]
    if len(timed) < 2:
        return {w.writer: float("nan") for w in timed if w.writer}
    span = (timed[-1].at - timed[0].at).total_seconds() / 60.0 or float("nan")
    counts = Counter(w.writer for w in timed if w.writer is not None)
    return {writer: count / span for writer, count in counts.items()}
