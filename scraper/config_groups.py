"""The scraper's settings grouped by the part that uses them.

:class:`scraper.config.ScraperSettings` reads every option flat, by the names of its
flags, environment variables, config-file keys and chart values (none of which change);
its groups (``settings.scrape``, ``settings.write``, ...) are these frozen models, built
from it after validation, so each part is handed only its own settings.  Durations are
seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from exporter_lib.pod import service_account_namespace
from scraper.shared.policy import WritePolicy

__all__ = ["BoostSettings", "DiscoverySettings", "LeaseSettings", "LogSourceSettings",
           "ScrapeSettings", "StallSettings", "TelemetrySettings", "WriteSettings"]


class _Group(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# Each group's ``of(settings)`` builds it from a validated ScraperSettings (typed Any:
# scraper/config.py imports this module, not the other way).


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

    @classmethod
    def of(cls, s: Any) -> DiscoverySettings:
        return cls(namespaces=tuple(s.namespaces), selector=s.selector,
                   default_port=s.default_port, default_path=s.default_path,
                   default_interval=s.interval, resync_interval=s.resync_interval,
                   kubeconfig=s.kubeconfig)


class ScrapeSettings(_Group):
    """How targets are scraped: ``--scrape-timeout``, ``--max-body-bytes``,
    ``--concurrency``, ``--backoff-max``, ``--wait-scrapes``."""

    timeout: float
    max_body_bytes: int
    concurrency: int
    backoff_max: float
    wait_scrapes: bool

    @classmethod
    def of(cls, s: Any) -> ScrapeSettings:
        return cls(timeout=s.scrape_timeout, max_body_bytes=s.max_body_bytes,
                   concurrency=s.concurrency, backoff_max=s.backoff_max,
                   wait_scrapes=s.wait_scrapes)


class WriteSettings(_Group):
    """How statuses are written: ``--write-qps`` (the start and floor of the adaptive
    rate), ``--write-qps-max`` (its ceiling, at least ``qps``; equal: a fixed rate),
    ``--write-burst``, ``--status-target``, and the write policy (``--progress-floor``,
    ``--metrics-staleness``, ``--other-writer-grace``)."""

    qps: float
    qps_max: float
    burst: int
    status_target: Literal["status", "annotation", "auto"]
    policy: WritePolicy

    @classmethod
    def of(cls, s: Any) -> WriteSettings:
        return cls(qps=s.write_qps, qps_max=max(s.write_qps, s.write_qps_max), burst=s.write_burst,
                   status_target=s.status_target, policy=s.write_policy())


class StallSettings(_Group):
    """Stall detection: ``--stall-after`` (None: auto, 0: off) and ``--stall-annotate``."""

    after: float | None
    annotate: bool

    @classmethod
    def of(cls, s: Any) -> StallSettings:
        return cls(after=s.stall_after, annotate=s.stall_annotate)


class BoostSettings(_Group):
    """Checkpoint-aware preemption: ``--priority-boost-max`` (0: off), the largest
    ``kueue.x-k8s.io/priority-boost`` the scraper writes on a TrainJob's Workload."""

    max_boost: int

    @classmethod
    def of(cls, s: Any) -> BoostSettings:
        return cls(max_boost=s.priority_boost_max)


class LogSourceSettings(_Group):
    """Reading progress from the trainer's log: ``--log-source``, ``--log-qps``,
    ``--log-burst``, ``--log-limit-bytes``, ``--log-tail-lines``."""

    enabled: bool
    qps: float
    burst: int
    limit_bytes: int
    tail_lines: int

    @classmethod
    def of(cls, s: Any) -> LogSourceSettings:
        return cls(enabled=s.log_source, qps=s.log_qps, burst=s.log_burst,
                   limit_bytes=s.log_limit_bytes, tail_lines=s.log_tail_lines)


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

    @classmethod
    def of(cls, s: Any) -> LeaseSettings:
        return cls(enabled=s.leader_election, name=s.lease_name,
                   namespace=(s.lease_namespace or service_account_namespace()
                              or "default"), duration=s.lease_duration,
                   renew_deadline=s.renew_deadline, retry_period=s.retry_period,
                   identity=s.identity)


class TelemetrySettings(_Group):
    """The scraper's own server: ``--listen-host``, ``--listen-port``, and who may read
    ``/metrics`` (``--metrics-auth``, its cache TTL and size)."""

    listen_host: str
    listen_port: int
    metrics_auth: bool
    metrics_auth_cache_ttl: float
    metrics_auth_cache_size: int

    @classmethod
    def of(cls, s: Any) -> TelemetrySettings:
        return cls(listen_host=s.listen_host, listen_port=s.listen_port,
                   metrics_auth=s.metrics_auth,
                   metrics_auth_cache_ttl=s.metrics_auth_cache_ttl,
                   metrics_auth_cache_size=s.metrics_auth_cache_size)
