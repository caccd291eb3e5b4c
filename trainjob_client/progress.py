"""A TrainJob's progress as the clients show it: state, trainer status and where it came from.

Pure functions over the TrainJob object as the API returns it (a ``dict``); nothing here
talks to the API.  The trainer status is read from ``status.trainerStatus`` (Trainer
v2.2.0 and later) or from the annotation :data:`~trainjob_client.annotation.
TRAINER_STATUS_ANNOTATION` (older releases, written by the scraper's annotation mode);
when both are present the one with the later ``lastUpdatedTime`` wins, so a cluster
upgraded in the middle of a run shows the newest report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from exporter_lib.status import StatusError, TrainerStatus
from trainjob_client.annotation import TRAINER_STATUS_ANNOTATION, decode_annotation

#: Where a trainer status was read from (:attr:`TrainJobProgress.source`).
SOURCE_STATUS = "status.trainerStatus"
SOURCE_ANNOTATION = f"metadata.annotations[{TRAINER_STATUS_ANNOTATION}]"
#: The annotation the scraper writes while a training is stalled: the time of its last
#: change (RFC 3339; docs/scraper.md, "Stall detection").
STALLED_SINCE_ANNOTATION = "trainjob-progress.dev/stalled-since"
#: TrainJob condition types that end a TrainJob (Trainer v1alpha1 API).
TERMINAL_CONDITIONS = ("Complete", "Failed")


@dataclass(frozen=True)
class TrainJobProgress:
    """What the plugin and the SDK helper show for one TrainJob.

    ``state`` is ``Complete`` or ``Failed`` when that condition is True, else the type of
    the last True condition (``Created``, ``Suspended``...), else ``""``.
    ``status`` is ``None`` when no trainer status was reported yet; ``problem`` then
    says why, when a value was present but invalid (an annotation is not validated by
    the API server).
    """

    namespace: str
    name: str
    state: str
    created: datetime | None
    status: TrainerStatus | None
    source: str | None
    problem: str | None = None
    #: The last change of a training the scraper finds stalled (None: not stalled).
    stalled_since: datetime | None = None

    def stalled_for(self, now: datetime) -> str | None:
        """``stalled for 14 min`` while the scraper finds the training stalled, else None."""
        if self.stalled_since is None or self.ended:
            return None
        minutes = max(0, int((now - self.stalled_since).total_seconds() // 60))
        return f"stalled for {minutes} min"

    @property
    def ended(self) -> bool:
        """The TrainJob has a True Complete or Failed condition."""
        return self.state in TERMINAL_CONDITIONS

    @property
    def at_full_progress(self) -> bool:
        """The trainer reported 100 percent."""
        return self.status is not None and self.status.progress_percentage == 100

    def to_dict(self) -> dict[str, Any]:
        """The JSON/YAML form of ``-o json|yaml`` (camelCase, like API objects)."""
        return {
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state,
            "source": self.source,
            "trainerStatus": None if self.status is None else self.status.to_api(),
            **({"problem": self.problem} if self.problem else {}),
            **({"stalledSince": self.stalled_since.isoformat()} if self.stalled_since else {}),
        }


def trainjob_state(trainjob: Mapping[str, Any]) -> str:
    """The state of a TrainJob object from its conditions (see :class:`TrainJobProgress`)."""
    conditions = (trainjob.get("status") or {}).get("conditions") or []
    true_types = [str(c.get("type", "")) for c in conditions if c.get("status") == "True"]
    for terminal in TERMINAL_CONDITIONS:
        if terminal in true_types:
            return terminal
    return true_types[-1] if true_types else ""


def trainjob_progress(trainjob: Mapping[str, Any]) -> TrainJobProgress:
    """Read the progress of one TrainJob object (``dict`` as returned by the API)."""
    meta = trainjob.get("metadata") or {}
    created = meta.get("creationTimestamp")
    from_status, from_annotation, problems = None, None, []
    raw_status = (trainjob.get("status") or {}).get("trainerStatus")
    if raw_status:
        try:
            from_status = TrainerStatus.from_api(raw_status)
        except StatusError as exc:
            problems.append(f"{SOURCE_STATUS}: {exc}")
    raw_annotation = (meta.get("annotations") or {}).get(TRAINER_STATUS_ANNOTATION)
    if raw_annotation:
        try:
            from_annotation = decode_annotation(raw_annotation)
        except StatusError as exc:
            problems.append(str(exc))
    status, source = from_status, SOURCE_STATUS if from_status else None
    if from_annotation is not None and (
            status is None or from_annotation.last_updated_time > status.last_updated_time):
        status, source = from_annotation, SOURCE_ANNOTATION
    return TrainJobProgress(
        stalled_since=_time((meta.get("annotations") or {}).get(STALLED_SINCE_ANNOTATION)),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        state=trainjob_state(trainjob),
        created=datetime.fromisoformat(created) if isinstance(created, str) else created,
        status=status,
        source=source,
        problem="; ".join(problems) if problems and status is None else None,
    )


def _time(raw: Any) -> datetime | None:
    """An RFC 3339 time; None when absent or unreadable (an annotation anyone may edit)."""
    if not isinstance(raw, str):
        return None
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


__all__ = [
    "SOURCE_ANNOTATION",
    "SOURCE_STATUS",
    "STALLED_SINCE_ANNOTATION",
    "TERMINAL_CONDITIONS",
    "TrainJobProgress",
    "trainjob_progress",
    "trainjob_state",
]
