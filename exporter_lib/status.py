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

One field belongs to the exporter's contract only, not to the Trainer API:

* ``lastCheckpointTime``: RFC 3339 timestamp of the training's last saved checkpoint,
  optional.  Exporters and status files carry it (:meth:`TrainerStatus.to_json`); it is
  never written to a TrainJob (:meth:`TrainerStatus.to_api` leaves it out).  A scraper
  that does not know it ignores it (unknown fields are ignored), and a status without
  it is read as "no checkpoint reported".
"""

from __future__ import annotations

import json
import sys
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
#: Largest status JSON accepted at any boundary (push body, status file, served body):
#: 256 metrics of 64+64 characters, each escaped as ``\\uXXXX\\uXXXX`` (12 bytes) in the
#: worst case, plus framing, is under 400 KiB.
MAX_STATUS_JSON_BYTES = 512 * 1024

#: Why text with a lone surrogate (U+D800..U+DFFF) is refused: Python strings may hold one,
#: Unicode text may not.  UTF-8 cannot encode it, and the API server's JSON decoder
#: (Go's encoding/json rules, sigs.k8s.io/json) turns a ``\\ud800`` escape into U+FFFD, so
#: such text would never read back as written.
NOT_UNICODE = ("is not Unicode text: it holds a lone surrogate (U+D800..U+DFFF), which "
               "neither UTF-8 nor the Kubernetes API can carry")

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


#: Fields of the exporter contract the Trainer API does not store.
_NOT_IN_API: set[str] = {"last_checkpoint_time"}


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
    last_checkpoint_time: datetime | None = Field(default=None, alias="lastCheckpointTime")

    @field_validator("last_updated_time", "last_checkpoint_time")
    @classmethod
    def _whole_seconds_utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("must carry a time zone (RFC 3339)")
        return value.astimezone(UTC).replace(microsecond=0)

    @field_serializer("last_updated_time", "last_checkpoint_time")
    def _rfc3339(self, value: datetime | None) -> str | None:
        return None if value is None else format_time(value)

    def to_api(self) -> dict[str, Any]:
        """Return the camelCase dict the Trainer API stores, without unset fields
        (and without ``lastCheckpointTime``, which the Trainer API has no field for)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json",
                               exclude=_NOT_IN_API)

    def to_wire(self) -> dict[str, Any]:
        """Return the exporter contract's camelCase dict: :meth:`to_api` plus
        ``lastCheckpointTime`` when set."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    def to_api_json(self) -> bytes:
        """Return :meth:`to_api` as compact UTF-8 JSON bytes (what a TrainJob stores)."""
        return json.dumps(self.to_api(), separators=(",", ":"), ensure_ascii=False).encode()

    def to_json(self) -> bytes:
        """Return :meth:`to_wire` as compact UTF-8 JSON bytes (the exporter's JSON body,
        status files, termination messages)."""
        return json.dumps(self.to_wire(), separators=(",", ":"), ensure_ascii=False).encode()

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
        """Parse and validate exporter JSON (the served body, a status file, a termination message).

        Bytes are parsed and validated in one pass (pydantic's ``model_validate_json``,
        no intermediate dict) when :func:`_one_pass_ok` allows it; anything that pass
        refuses goes through :func:`parse_json_object` and :meth:`from_api`, so the
        result and every refusal's text are those of the two-step path
        (tests/exporter/test_status_one_pass.py compares both on generated bodies).

        Raises:
            StatusError: not a JSON object by :func:`parse_json_object`'s rules, or a
                field breaks a limit.
        """
        if isinstance(body, bytes) and _one_pass_ok(body):
            try:
                return cls.model_validate_json(body)
            except ValidationError:
                pass  # the two-step path names what is wrong, as it always did
        return cls.from_api(parse_json_object(body))


def _one_pass_ok(body: bytes) -> bool:
    """Whether ``model_validate_json`` may take ``body``: what it accepts, the two-step
    path accepts with the same result, except the ``NaN`` and ``Infinity`` literals
    (pydantic's JSON parser takes them, :func:`parse_json_object` refuses them; bodies
    with those letters anywhere take the two-step path) and bodies over the size limit.
    """
    return (len(body) <= MAX_STATUS_JSON_BYTES and b"NaN" not in body
            and b"Infinity" not in body)


def parse_json_object(body: bytes | str, what: str = "body",
                      limit: int = MAX_STATUS_JSON_BYTES) -> dict[str, Any]:
    """Parse one JSON object the way the Kubernetes API server would accept it.

    Rules (each refusal names ``what``, the offending value and the limit):

    * at most ``limit`` bytes (default :data:`MAX_STATUS_JSON_BYTES`);
    * UTF-8 (RFC 8259 section 8.1), without a byte order mark;
    * JSON only: ``NaN``/``Infinity`` (which Python's parser would take) are refused;
    * nesting deeper than Python's recursion limit is refused as not JSON, instead
      of the ``RecursionError`` the parser raises;
    * the top level is an object.

    Raises:
        StatusError: one of the rules above is broken.
    """
    size = len(body.encode("utf-8", "surrogatepass")) if isinstance(body, str) else len(body)
    if size > limit:
        raise StatusError([f"{what}: {size} bytes exceeds the limit of {limit} bytes"])
    if isinstance(body, str):
        text = body
    else:
        if body.startswith(b"\xef\xbb\xbf"):
            raise StatusError([f"{what}: starts with a UTF-8 byte order mark; JSON text "
                               "must not (RFC 8259 section 8.1)"])
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StatusError([f"{what}: not UTF-8: byte {exc.start} "
                               f"({body[exc.start:exc.start + 1]!r}) {exc.reason} "
                               "(JSON text must be UTF-8, RFC 8259 section 8.1)"]) from None
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise StatusError([f"{what}: not valid JSON (nested deeper than "
                           f"{sys.getrecursionlimit()} levels)"]) from None
    except ValueError as exc:
        raise StatusError([f"{what}: not valid JSON ({exc})"]) from None
    if not isinstance(data, dict):
        raise StatusError([f"{what}: expected a JSON object, got {type(data).__name__}"])
    return data


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259 has no such literal)")


def is_unicode_text(text: str) -> bool:
    """True when ``text`` has no lone surrogate: it encodes to UTF-8 (see :data:`NOT_UNICODE`)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC with whole seconds, as ``metav1.Time`` serialises (``...Z``)."""
    # Not strftime("%Y"): glibc prints year 1 as "1", which is not RFC 3339.
    return value.astimezone(UTC).replace(tzinfo=None, microsecond=0).isoformat() + "Z"


def now() -> datetime:
    """The current time in UTC, truncated to whole seconds."""
    return datetime.now(UTC).replace(microsecond=0)


_FIELD_NAMES = {
    "progress_percentage": "progressPercentage",
    "estimated_remaining_seconds": "estimatedRemainingSeconds",
    "last_updated_time": "lastUpdatedTime",
    "last_checkpoint_time": "lastCheckpointTime",
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
    elif err["type"] == "string_unicode":
        msg = NOT_UNICODE
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
