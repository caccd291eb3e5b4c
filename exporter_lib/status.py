"""The one definition of a TrainJob's ``status.trainerStatus`` and its limits.

Both halves of the project use this module: the exporter validates what the
training loop reports, the scraper validates what it read from an exporter
before it writes anything to the Kubernetes API.

Every limit below is a fact of the Kubeflow Trainer ``trainer.kubeflow.org/v1alpha1``
API (``TrainJobStatus.trainerStatus``):

* ``progressPercentage``: integer, 0..100 (percent), optional.
* ``estimatedRemainingSeconds``: integer >= 0 stored as int32 (seconds), optional.
* ``metrics``: atomic list of ``{name, value}``, both strings of 1..64 characters,
  at most 256 items.  Values are strings on the API even when numeric.
* ``lastUpdatedTime``: RFC 3339 timestamp, required whenever ``trainerStatus`` is
  present (the CRD enforces it with a CEL rule).  ``metav1.Time`` keeps whole
  seconds, so this model keeps whole seconds too: a value read back from the
  API server compares equal to the one written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_serializer,
    field_validator,
)

#: Limits from the Trainer v1alpha1 API.
PROGRESS_MIN = 0
PROGRESS_MAX = 100
REMAINING_SECONDS_MAX = 2**31 - 1  # int32
METRIC_NAME_MAX_LENGTH = 64
METRIC_VALUE_MAX_LENGTH = 64
METRICS_MAX_ITEMS = 256

API_GROUP = "trainer.kubeflow.org"
API_VERSION = "v1alpha1"
TRAINJOB_PLURAL = "trainjobs"


class StatusError(ValueError):
    """A status that breaks a limit of the Trainer API.

    ``str(error)`` names each offending field, its value and the limit, e.g.
    ``progressPercentage=101: must be <= 100 (Trainer v1alpha1 API limit)``.
    ``problems`` holds one such line per offence.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


class Metric(BaseModel):
    """One training metric as the Trainer API stores it: two strings of 1..64 characters."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: StrictStr = Field(min_length=1, max_length=METRIC_NAME_MAX_LENGTH)
    value: StrictStr = Field(min_length=1, max_length=METRIC_VALUE_MAX_LENGTH)


class TrainerStatus(BaseModel):
    """``TrainJob.status.trainerStatus``.

    Python names are snake_case; the wire and API names (camelCase) are the
    aliases, and :meth:`to_api` / :meth:`from_api` convert.  Instances are
    immutable and compare by value.  Unknown fields are ignored, so a newer
    exporter does not break an older scraper.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    progress_percentage: StrictInt | None = Field(
        default=None, ge=PROGRESS_MIN, le=PROGRESS_MAX, alias="progressPercentage"
    )
    estimated_remaining_seconds: StrictInt | None = Field(
        default=None, ge=0, le=REMAINING_SECONDS_MAX, alias="estimatedRemainingSeconds"
    )
    metrics: tuple[Metric, ...] = Field(default=(), max_length=METRICS_MAX_ITEMS)
    last_updated_time: datetime = Field(alias="lastUpdatedTime")

    @field_validator("last_updated_time")
    @classmethod
    def _whole_seconds_utc(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("must carry a time zone (RFC 3339)")
        return value.astimezone(UTC).replace(microsecond=0)

    @field_serializer("last_updated_time")
    def _rfc3339(self, value: datetime) -> str:
        return format_time(value)

    def to_api(self) -> dict[str, Any]:
        """Return the camelCase dict the Trainer API stores, without unset fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    def to_json(self) -> bytes:
        """Return :meth:`to_api` as compact UTF-8 JSON bytes."""
        return json.dumps(self.to_api(), separators=(",", ":"), ensure_ascii=False).encode()

    def metrics_dict(self) -> dict[str, str]:
        """Return the metrics as ``{name: value}`` (the last wins on a repeated name)."""
        return {m.name: m.value for m in self.metrics}

    def same_report(self, other: TrainerStatus | None) -> bool:
        """True when ``other`` carries the same values, ignoring ``lastUpdatedTime``."""
        return other is not None and (
            self.progress_percentage,
            self.estimated_remaining_seconds,
            self.metrics,
        ) == (other.progress_percentage, other.estimated_remaining_seconds, other.metrics)

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> TrainerStatus:
        """Validate a camelCase mapping (API object or exporter JSON).

        Raises:
            StatusError: a field breaks a limit; the message names field, value, limit.
        """
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise StatusError(describe_validation_error(exc)) from None

    @classmethod
    def from_json(cls, body: bytes | str) -> TrainerStatus:
        """Parse and validate exporter JSON.

        Raises:
            StatusError: not JSON, not an object, or a field breaks a limit.
        """
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise StatusError([f"body: not valid JSON ({exc})"]) from None
        if not isinstance(data, dict):
            raise StatusError([f"body: expected a JSON object, got {type(data).__name__}"])
        return cls.from_api(data)


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC with whole seconds, as ``metav1.Time`` serialises (``...Z``)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now() -> datetime:
    """The current time in UTC, truncated to whole seconds."""
    return datetime.now(UTC).replace(microsecond=0)


_FIELD_NAMES = {
    "progress_percentage": "progressPercentage",
    "estimated_remaining_seconds": "estimatedRemainingSeconds",
    "last_updated_time": "lastUpdatedTime",
}


def describe_validation_error(exc: ValidationError) -> list[str]:
    """Turn a pydantic error into lines of ``field=value: reason (limit)``.

    The field is the API's camelCase path (``metrics[3].name``), the value is
    shown as received (long values cut to 80 characters), the reason is
    pydantic's, which states the limit (``at most 64 characters``).
    """
    problems = []
    for err in exc.errors(include_url=False):
        path = ""
        for part in err["loc"]:
            if isinstance(part, int):
                path += f"[{part}]"
            else:
                name = _FIELD_NAMES.get(str(part), str(part))
                path += f".{name}" if path else name
        value = "<missing>" if err["type"] == "missing" else _short_repr(err.get("input"))
        problems.append(f"{path or 'trainerStatus'}={value}: {_reason(err)}")
    return problems


def _reason(err: Any) -> str:
    msg = str(err["msg"])
    ctx = err.get("ctx") or {}
    if err["type"] == "too_long" and "max_length" in ctx:
        msg = f"{msg} (limit {ctx['max_length']}, Trainer v1alpha1 API)"
    elif err["type"] in {"less_than_equal", "greater_than_equal", "string_too_long",
                         "string_too_short"}:
        msg = f"{msg} (Trainer v1alpha1 API limit)"
    elif err["type"] == "missing":
        msg = "required whenever trainerStatus is set (Trainer v1alpha1 API CEL rule)"
    return msg


def _short_repr(value: Any) -> str:
    if isinstance(value, list | tuple) and len(value) > 3:
        return f"<{len(value)} items>"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def metrics_from_mapping(metrics: Mapping[str, object] | Iterable[tuple[str, object]]) -> list[
    dict[str, str]
]:
    """Render ``{name: value}`` as the API's list of ``{name, value}`` strings.

    Numbers become their shortest round-tripping text (``repr`` of a float),
    booleans ``true``/``false``, everything else ``str()``.  No limit is checked
    here: validation happens in :class:`TrainerStatus`.
    """
    items = metrics.items() if isinstance(metrics, Mapping) else metrics
    return [{"name": str(name), "value": metric_value_text(value)} for name, value in items]


def metric_value_text(value: object) -> str:
    """The API string for one metric value (see :func:`metrics_from_mapping`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)
