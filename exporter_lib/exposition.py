"""The exporter's ``/metrics`` bodies: Prometheus text, OpenMetrics and JSON.

Series (documented in ``docs/metrics.md``; units in names per Prometheus
naming conventions):

* ``trainjob_progress_ratio`` - progressPercentage / 100 (0..1).
* ``trainjob_estimated_remaining_seconds`` - estimatedRemainingSeconds.
* ``trainjob_last_update_timestamp_seconds`` - lastUpdatedTime, unix seconds.
* ``trainjob_last_checkpoint_timestamp_seconds`` - lastCheckpointTime, unix seconds
  (only once the training reported a checkpoint).
* ``trainjob_metric{name}`` - a metric whose value text parses as a number.
* ``trainjob_metric_info{name,value} 1`` - a metric whose value is other text.
* ``trainjob_exporter_updates_total`` / ``trainjob_exporter_rejected_values_total{field}``.
* ``trainjob_exporter_http_refused_total{reason}`` - requests and connections the
  exporter's server refused, by the reason of its Kubernetes Status answer.

Bodies are rendered by prometheus-client from a private registry, at most once
per status generation and representation, and carry a strong ETag derived
from the body, so equal bodies have equal tags and a restarted process
cannot produce a stale match.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry

from exporter_lib.status import PROGRESS_MAX, TrainerStatus

JSON_CONTENT_TYPE = "application/json"

# Decimal numbers as Prometheus and Go's ParseFloat read them, plus NaN/Inf.
# Python's float() also takes "1_000" and surrounding blanks; such text stays info.
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:inf|infinity|nan)",
                     re.IGNORECASE)


class StatusSource(Protocol):
    """What the server reads: a generation counter and the status it stands for."""

    generation: int
    rejected: dict[str, int]

    def status(self) -> TrainerStatus | None:
        """The current status, or ``None`` before the first report."""
        ...


def numeric_value(text: str) -> float | None:
    """``float(text)`` when ``text`` is a plain decimal number, NaN or Inf, else ``None``."""
    return float(text) if _NUMBER.fullmatch(text) else None


_HELP = {
    "trainjob_exporter_updates_total": "Status changes accepted by the exporter.",
    "trainjob_exporter_rejected_values_total":
        "Reported values dropped or clamped for breaking a Trainer API limit.",
    "trainjob_exporter_http_refused_total":
        "Requests and connections the exporter's server refused, by reason.",
    "trainjob_progress_ratio": "Training progress (trainerStatus.progressPercentage / 100).",
    "trainjob_estimated_remaining_seconds":
        "Estimated time until training ends (trainerStatus.estimatedRemainingSeconds).",
    "trainjob_last_update_timestamp_seconds":
        "Unix time of the last status update (trainerStatus.lastUpdatedTime).",
    "trainjob_last_checkpoint_timestamp_seconds":
        "Unix time of the training's last saved checkpoint (lastCheckpointTime).",
    "trainjob_metric": "Training metric with a numeric value (trainerStatus.metrics).",
    "trainjob_metric_info":
        "Training metric with a non-numeric value, exact text in the value label; always 1.",
}


class StatusCollector(Collector):
    """prometheus-client collector translating the current status into series."""

    def __init__(self, source: StatusSource, refused: Mapping[str, int]) -> None:
        self._source = source
        self._refused = refused

    def collect(self) -> Iterator[Metric]:
        status = self._source.status()
        updates = CounterMetricFamily(
            "trainjob_exporter_updates", _HELP["trainjob_exporter_updates_total"],
            value=self._source.generation)
        rejected = CounterMetricFamily(
            "trainjob_exporter_rejected_values",
            _HELP["trainjob_exporter_rejected_values_total"],
            labels=["field"])
        counts = dict(self._source.rejected)
        fields = {"progressPercentage", "estimatedRemainingSeconds", "metrics", *counts}
        for field in sorted(fields):
            rejected.add_metric([field], counts.get(field, 0))
        yield updates
        yield rejected
        refused = CounterMetricFamily(
            "trainjob_exporter_http_refused", _HELP["trainjob_exporter_http_refused_total"],
            labels=["reason"])
        for reason, count in sorted(dict(self._refused).items()):
            refused.add_metric([reason], count)
        yield refused
        if status is None:
            return
        if status.progress_percentage is not None:
            yield GaugeMetricFamily(
                "trainjob_progress_ratio", _HELP["trainjob_progress_ratio"],
                value=status.progress_percentage / PROGRESS_MAX)
        if status.estimated_remaining_seconds is not None:
            yield GaugeMetricFamily(
                "trainjob_estimated_remaining_seconds",
                _HELP["trainjob_estimated_remaining_seconds"],
                value=status.estimated_remaining_seconds, unit="seconds")
        yield GaugeMetricFamily(
            "trainjob_last_update_timestamp_seconds",
            _HELP["trainjob_last_update_timestamp_seconds"],
            value=status.last_updated_time.timestamp(), unit="seconds")
        if status.last_checkpoint_time is not None:
            yield GaugeMetricFamily(
                "trainjob_last_checkpoint_timestamp_seconds",
                _HELP["trainjob_last_checkpoint_timestamp_seconds"],
                value=status.last_checkpoint_time.timestamp(), unit="seconds")
        numeric = GaugeMetricFamily(
            "trainjob_metric", _HELP["trainjob_metric"],
            labels=["name"])
        text = GaugeMetricFamily(
            "trainjob_metric_info", _HELP["trainjob_metric_info"],
            labels=["name", "value"])
        for metric in status.metrics:
            number = numeric_value(metric.value)
            if number is None:
                text.add_metric([metric.name, metric.value], 1)
            else:
                numeric.add_metric([metric.name], number)
        if numeric.samples:
            yield numeric
        if text.samples:
            yield text


@dataclass(frozen=True)
class Rendered:
    """One representation of one status: body bytes, Content-Type, strong ETag (quoted)."""

    body: bytes
    content_type: str
    etag: str


class Renderer:
    """Renders and caches ``/metrics`` bodies for a :class:`StatusSource`.

    ``render(accept)`` returns ``None`` for JSON before the first report (the
    server answers 204).  Thread-safe; at most one render per (generation,
    encoder) is kept.
    """

    def __init__(self, source: StatusSource, refused: Mapping[str, int] | None = None) -> None:
        self._source = source
        self._refused: Mapping[str, int] = {} if refused is None else refused
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(StatusCollector(source, self._refused))
        self._lock = threading.Lock()
        self._version: tuple[int, int] = (-1, -1)
        self._cache: dict[str, Rendered | None] = {}

    def status(self) -> TrainerStatus | None:
        """The status the bodies are rendered from (None before the first report)."""
        return self._source.status()

    def version(self) -> tuple[int, int]:
        """What the bodies depend on: (status generation, refusals counted); cheap.

        Equal versions give equal bodies; a file-backed source re-reads a changed file here.
        """
        self._source.status()
        return self._source.generation, sum(self._refused.values())

    def render(self, accept: str | None) -> Rendered | None:
        """The body for an ``Accept`` header (JSON when it names application/json)."""
        if wants_json(accept):
            return self._cached("json", self._render_json)
        encoder, content_type = choose_encoder(accept or "")
        return self._cached(content_type, lambda: self._render_prometheus(encoder, content_type))

    def _cached(self, key: str, make: Callable[[], Rendered | None]) -> Rendered | None:
        version = self.version()
        with self._lock:
            if version != self._version:
                self._cache = {}
                self._version = version
            elif key in self._cache:
                return self._cache[key]
        rendered = make()
        with self._lock:
            if version == self._version:
                self._cache[key] = rendered
        return rendered

    def _render_json(self) -> Rendered | None:
        status = self._source.status()
        if status is None:
            return None
        body = status.to_json()
        return Rendered(body, JSON_CONTENT_TYPE, _etag(body, "json"))

    def _render_prometheus(self, encoder: Callable[[Collector], bytes],
                           content_type: str) -> Rendered:
        return self._finish(encoder(self._registry), content_type)

    @staticmethod
    def _finish(body: bytes, content_type: str) -> Rendered:
        suffix = "om" if content_type.startswith("application/openmetrics-text") else "text"
        return Rendered(body, content_type, _etag(body, suffix))


def wants_json(accept: str | None) -> bool:
    """True when the ``Accept`` header lists ``application/json`` (any parameters, q > 0)."""
    if not accept:
        return False
    for item in accept.split(","):
        media, *params = (part.strip() for part in item.split(";"))
        if media.lower() == JSON_CONTENT_TYPE:
            return not any(p.replace(" ", "") in {"q=0", "q=0.0", "q=0.00", "q=0.000"}
                           for p in params)
    return False


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110 weak comparison of an ``If-None-Match`` header (``*`` or a list) with ``etag``."""
    if not if_none_match:
        return False
    bare = etag.removeprefix("W/")
    for candidate in if_none_match.split(","):
        tag = candidate.strip()
        if tag == "*" or tag.removeprefix("W/") == bare:
            return True
    return False


def _etag(body: bytes, representation: str) -> str:
    digest = hashlib.blake2b(body, digest_size=10).hexdigest()
    return f'"{digest}-{representation}"'
