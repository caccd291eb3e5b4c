"""The scraper's settings grouped by the part that uses them.

:class:`scraper.config.ScraperSettings` reads every option flat, by the names of its
flags, environment variables, config-file keys and chart values (none of which change);
its groups (``settings.scrape``, ``settings.write``, ...) are these frozen models, built
from it after validation, so each part is handed only its own settings.  Durations are
seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from scraper.shared.policy import WritePolicy

__all__ = ["DiscoverySettings", "LeaseSettings", "LogSourceSettings", "ScrapeSettings",
           "StallSettings", "TelemetrySettings", "WriteSettings"]


class _Group(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DiscoverySettings(_Group):
    """Which pods are targets: ``--namespaces``, ``--selector``, the exporter endpoint
    and interval a pod without annotations gets, ``--resync-interval``, ``--kubeconfig``."""

    namespaces: tuple[str, ...]
    selector: str
    default_port: int
    default_path: str
    default_interval: float
    resync_interval: float
    kubeconfig: Path | None


class ScrapeSettings(_Group):
    """How targets are scraped: ``--scrape-timeout``, ``--max-body-bytes``,
    ``--concurrency``, ``--backoff-max``, ``--wait-scrapes``."""

    timeout: float
    max_body_bytes: int
    concurrency: int
    backoff_max: float
    wait_scrapes: bool


class WriteSettings(_Group):
    """How statuses are written: ``--write-qps``, ``--write-burst``, ``--status-target``,
    and the write policy (``--progress-floor``, ``--metrics-staleness``,
    ``--other-writer-grace``)."""

    qps: float
    burst: int
    status_target: Literal["status", "annotation", "auto"]
    policy: WritePolicy


class StallSettings(_Group):
    """Stall detection: ``--stall-after`` (None: auto, 0: off) and ``--stall-annotate``."""

    after: float | None
    annotate: bool


class LogSourceSettings(_Group):
    """Reading progress from the trainer's log: ``--log-source``, ``--log-qps``,
    ``--log-burst``, ``--log-limit-bytes``, ``--log-tail-lines``."""

    enabled: bool
    qps: float
    burst: int
    limit_bytes: int
    tail_lines: int


class LeaseSettings(_Group):
    """Leader election: ``--leader-election``, the Lease (``--lease-name``, its namespace
    resolved: the flag, else the pod's own, else ``default``), its timings and
    ``--identity``."""

    enabled: bool
    name: str
    namespace: str
    duration: float
    renew_deadline: float
    retry_period: float
    identity: str


class TelemetrySettings(_Group):
    """The scraper's own server: ``--listen-host``, ``--listen-port``, and who may read
    ``/metrics`` (``--metrics-auth``, its cache TTL and size)."""

    listen_host: str
    listen_port: int
    metrics_auth: bool
    metrics_auth_cache_ttl: float
    metrics_auth_cache_size: int
