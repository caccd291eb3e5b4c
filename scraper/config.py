"""Scraper configuration: one typed model fed by flags, environment and a file.

Precedence, highest first: command-line flags, environment variables
(``TRAINJOB_SCRAPER_<FIELD>``, e.g. ``TRAINJOB_SCRAPER_INTERVAL=15s``), the
optional YAML/JSON file given by ``--config`` (keys are the field names, with
``_`` or ``-``), then the defaults below.  Everything is validated once, at
start: :func:`load_settings` raises :class:`ConfigError` whose message names each
bad option with its value.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

import annotated_types
from pydantic import (
    Field,
    FilePath,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from scraper.config_file import REMOVED_OPTIONS as REMOVED_OPTIONS
from scraper.config_file import FileSource, file_keys_given
from scraper.config_file import removed_option as removed_option
from scraper.config_groups import (
    BoostSettings,
    DiscoverySettings,
    LeaseSettings,
    LogSourceSettings,
    ScrapeSettings,
    StallSettings,
    TelemetrySettings,
    WriteSettings,
)
from scraper.shared.boost_range import MAX_BOOST_LIMIT
from scraper.shared.errors import ConfigError as ConfigError
from scraper.shared.policy import (
    METRICS_STALENESS_SECONDS,
    PROGRESS_FLOOR_SECONDS,
    WritePolicy,
    check_metrics_staleness,
    check_progress_floor,
)
from scraper.shared.stall_setting import StallSettingError, parse_stall_after
from scraper.syntax import (
    check_interval,
    parse_duration,
)

ENV_PREFIX = "TRAINJOB_SCRAPER_"

#: Options given as durations (``30s``, ``2m``, ``1h``, or seconds); seconds once parsed.
DURATION_FIELDS = (
    "interval",
    "scrape_timeout",
    "backoff_max",
    "resync_interval",
    "progress_floor",
    "metrics_staleness",
    "other_writer_grace",
    "lease_duration",
    "renew_deadline",
    "retry_period",
    "shutdown_timeout",
    "metrics_auth_cache_ttl",
)

#: The range check of each bounded duration option: a value that is not a duration at
#: all is told the same limit, in the same words, as one out of range.
_DURATION_RANGES: dict[str, Callable[[float], float]] = {
    "interval": check_interval,
    "progress_floor": check_progress_floor,
    "metrics_staleness": check_metrics_staleness,
}


#: Duration options that must be more than zero (the others may be 0).
POSITIVE_DURATIONS = ("scrape_timeout", "retry_period", "lease_duration", "renew_deadline",
                      "metrics_auth_cache_ttl")


def _limit_of(check: Callable[[float], float]) -> str:
    """The limit text a range check states (it refuses any negative number)."""
    try:
        check(-1.0)
    except ValueError as exc:
        return str(exc)
    return ""

#: Rank-0 trainer pod of a Kubeflow Trainer v2 TrainJob (the launcher for MPI).
DEFAULT_SELECTOR = (
    "jobset.sigs.k8s.io/jobset-name,"
    "jobset.sigs.k8s.io/replicatedjob-name in (node,launcher),"
    "jobset.sigs.k8s.io/job-index=0,"
    "batch.kubernetes.io/job-completion-index=0"
)


# ---------------------------------------------------------------- settings model

_config_file: ContextVar[Path | None] = ContextVar("trainjob_scraper_config_file", default=None)
class ScraperSettings(BaseSettings):
    """Every option of ``trainjob-scraper run``, flat by the names of its flags,
    variables and file keys; grouped by the part that uses them as ``discovery``,
    ``scrape``, ``write``, ``stall``, ``logs``, ``lease`` and ``telemetry``
    (:mod:`scraper.config_groups`).  Durations are seconds (floats)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", frozen=True, validate_default=True
    )

    kubeconfig: FilePath | None = Field(
        default=None,
        description="kubeconfig file; unset: in-cluster service account, then "
        "$KUBECONFIG / ~/.kube/config",
    )
    # NoDecode: the environment's value reaches _split_namespaces as the string it is
    # (a,b), not parsed as JSON first (pydantic-settings' rule for list fields), which
    # failed with a traceback on the documented comma form.
    namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="namespaces to watch (comma-separated); empty: all namespaces",
    )
    selector: str = Field(
        default=DEFAULT_SELECTOR,
        description="label selector of the pods to scrape (the rank-0 trainer pod of "
        "each TrainJob by default)",
    )
    interval: float = Field(
        default=30.0,
        description="default scrape interval (1s..1h); a pod's "
        "trainjob-progress.dev/interval annotation overrides it",
    )
    scrape_timeout: float = Field(
        default=10.0,
        description="timeout of one scrape; capped at 90% of the target's interval",
    )
    max_body_bytes: int = Field(
        default=1 << 20, ge=1024, le=64 << 20, description="largest exporter response read"
    )
    concurrency: int = Field(default=32, ge=1, le=1024, description="scrapes in flight at most")
    default_port: int = Field(
        default=28080, ge=1, le=65535, description="exporter port when a pod has no annotation"
    )
    default_path: str = Field(
        default="/metrics", description="exporter path when a pod has no annotation"
    )
    backoff_max: float = Field(
        default=300.0,
        description="longest wait between attempts on a target that refuses connections",
    )
    write_qps: float = Field(
        # 0.01 at least: the token bucket's period is burst / qps, and a qps that rounds
        # to 0 there (5e-324) made it divide by zero after the first burst.
        default=20.0, ge=0.01, le=1000, allow_inf_nan=False,
        description="status writes per second (sustained; 0.01..1000; "
        "kube-controller-manager's client default; Events have a budget of their own)",
    )
    write_burst: int = Field(default=30, ge=1, le=10000,
                             description="status writes in a burst")
    write_qps_max: float = Field(
        default=200.0, ge=0.01, le=10000, allow_inf_nan=False,
        description="highest status writes per second (0.01..10000): the rate starts at "
        "--write-qps and rises while writes succeed quickly, and falls on 429, timeouts "
        "and rising latency; below --write-qps it is --write-qps (equal: a fixed rate)",
    )
    status_target: Literal["status", "annotation", "auto"] = Field(
        default="status",
        description="where the trainer status is written: 'status' (status.trainerStatus, "
        "Trainer v2.2+), 'annotation' (the TrainJob annotation "
        "trainjob-progress.dev/trainer-status, any Trainer release; needs patch on "
        "trainjobs), 'auto' (the annotation while the CRD has no status.trainerStatus, "
        "else the status; re-checked every minute)",
    )
    progress_floor: float = Field(
        default=PROGRESS_FLOOR_SECONDS,
        description="a change of the integer progressPercentage is written at once, but "
        "no sooner than this after the TrainJob's previous write (0.1s..60s); with "
        "waiting scrapes (exporter contract 3) also the least time between two answers "
        "of one exporter; annotation trainjob-progress.dev/progress-floor overrides it",
    )
    metrics_staleness: float = Field(
        default=METRICS_STALENESS_SECONDS,
        description="a change of metrics or the remaining time alone is written within "
        "this (or with the next progress write; 0s..1h, 0: at once); annotation "
        "trainjob-progress.dev/metrics-staleness overrides it",
    )
    other_writer_grace: float = Field(
        default=60.0, ge=0,
        description="another writer of trainerStatus (e.g. upstream's push status server) "
        "keeps the field while its last change is younger than this: no progress write "
        "meanwhile (finals are still delivered; docs/scraper.md, Other writers and time)",
    )
    resync_interval: float = Field(
        default=0.0,
        description="how often the TrainJob informer relists besides its watch (a safety "
        "net; the watch sees every change; 0: never)",
    )
    listen_host: str = Field(default="0.0.0.0", description="address of /metrics, /healthz")
    listen_port: int = Field(
        default=8080, ge=0, le=65535, description="port of /metrics, /healthz, /readyz (0: any)"
    )
    metrics_auth: bool = Field(
        default=True,
        description="require a bearer token on /metrics, checked by TokenReview and "
        "SubjectAccessReview (get on the non-resource URL /metrics); false: /metrics is "
        "open to anyone who reaches the port (/healthz and /readyz are always open)",
    )
    metrics_auth_cache_ttl: float = Field(
        default=120.0,
        description="how long a /metrics authentication and authorization decision is "
        "reused (> 0)",
    )
    metrics_auth_cache_size: int = Field(
        default=1024, ge=1, le=1 << 20, description="/metrics decisions cached at most"
    )
    wait_scrapes: bool = Field(
        default=True,
        description="hold one scrape per target open at exporters that offer it "
        "(Trainjob-Exporter-Contract 2, Prefer: wait): changes arrive at once, an "
        "unchanged exporter costs one request per max-wait; false: poll every target",
    )
    stall_after: float | None = Field(
        default=None,
        description="when a training that runs and answers is stalled: 'auto' (3x the "
        "longest gap between its changes seen so far, at least 5m), a duration "
        "(5s..720h, 30 days; units ms, s, m, h), "
        "or 0 (off); a TrainJob's trainjob-progress.dev/stall-after annotation overrides it",
    )
    stall_annotate: bool = Field(
        default=True,
        description="write the TrainJob annotation trainjob-progress.dev/stalled-since "
        "while a training is stalled, read by the kubectl plugin and the SDK (needs patch "
        "on trainjobs); false: Events and /metrics only",
    )
    priority_boost_max: int = Field(
        default=0, ge=0, le=MAX_BOOST_LIMIT,
        description="checkpoint-aware preemption: the largest kueue.x-k8s.io/priority-boost "
        "written on a TrainJob's Kueue Workload, one step per doubling of the work a "
        "preemption would throw away (from one accelerator- or CPU-minute); keep it below "
        "the gap between priority classes; 0: off.  Needs Kueue's PriorityBoost feature "
        "gate, and list and patch on workloads.kueue.x-k8s.io",
    )
    leader_election: bool = Field(
        default=False, description="elect one leader through a coordination.k8s.io Lease"
    )
    lease_name: str = Field(default="trainjob-scraper", description="Lease name")
    lease_namespace: str | None = Field(
        default=None,
        description="Lease namespace; unset: the pod's own namespace, else 'default'",
    )
    lease_duration: float = Field(
        default=15.0, description="how long a standby waits before taking over the lease"
    )
    renew_deadline: float = Field(
        default=10.0, description="the leader stops leading if it cannot renew for this long"
    )
    retry_period: float = Field(default=2.0, description="lease poll/renew period")
    identity: str = Field(
        default_factory=lambda: f"{socket.gethostname()}_{os.getpid()}",
        description="this replica's identity in the Lease (default: hostname_pid)",
    )
    shutdown_timeout: float = Field(
        default=10.0, description="on SIGTERM, how long in-flight writes may take"
    )
    log_source: bool = Field(
        default=False, description="read progress from the trainer container's log for pods "
        "annotated trainjob-progress.dev/source: logs or auto (needs get on pods/log)")
    log_qps: float = Field(default=10.0, ge=0.01, le=10000, allow_inf_nan=False,
                           description="log reads per second at most (own token bucket; "
                           "0.01..10000)")
    log_burst: int = Field(default=20, ge=1, le=10000, description="log reads in a burst")
    log_limit_bytes: int = Field(
        default=64 * 1024, ge=17 * 1024, le=16 * 1024 * 1024,
        description="bytes one log read returns at most (limitBytes; >= one 16 KiB entry)")
    log_tail_lines: int = Field(default=200, ge=1, le=100000,
                                description="log entries one read returns at most (tailLines)")
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR")

    @field_validator("*", mode="before")
    @classmethod
    def _no_flag_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # A config file's true/false would otherwise count as 1/0 for a number (a
        # feature off by default, such as the priority boost, turned on by `true`).
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and field.annotation in (int, float):
            raise ValueError("a number, not true or false")
        return value

    @field_validator("namespaces", mode="before")
    @classmethod
    def _split_namespaces(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("namespaces")
    @classmethod
    def _check_namespaces(cls, value: list[str]) -> list[str]:
        for ns in value:
            if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", ns):
                raise ValueError(f"{ns!r} is not a namespace name")
        return sorted(set(value))

    @field_validator("selector")
    @classmethod
    def _check_selector(cls, value: str) -> str:
        # The grammar is the API server's: it is asked at start (discovery.probe_selector).
        # An empty selector is valid there, but would select every pod in the cluster.
        if not value.strip():
            raise ValueError("empty selector (it would select every pod)")
        return value.strip()

    @field_validator(*DURATION_FIELDS, mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration(value)

    @field_validator("stall_after", mode="before")
    @classmethod
    def _stall_after(cls, value: Any) -> float | None:
        try:
            return parse_stall_after(value, "stall-after")
        except StallSettingError as exc:  # the message names the option already
            raise ValueError(str(exc).split(": ", 1)[1]) from None

    @field_validator("interval")
    @classmethod
    def _interval_range(cls, value: float) -> float:
        return check_interval(value)

    @field_validator("progress_floor")
    @classmethod
    def _floor_range(cls, value: float) -> float:
        return check_progress_floor(value)

    @field_validator("metrics_staleness")
    @classmethod
    def _staleness_range(cls, value: float) -> float:
        return check_metrics_staleness(value)

    @field_validator(*POSITIVE_DURATIONS)
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be > 0")
        return value

    @field_validator("default_path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        if value.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            raise ValueError("must be DEBUG, INFO, WARNING or ERROR")
        return value.upper()

    @model_validator(mode="after")
    def _lease_timings(self) -> ScraperSettings:
        if self.leader_election and not (
            self.retry_period < self.renew_deadline < self.lease_duration
        ):
            raise ValueError(
                f"lease timings must satisfy retry-period ({self.retry_period:g}s) < "
                f"renew-deadline ({self.renew_deadline:g}s) < lease-duration "
                f"({self.lease_duration:g}s)"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, FileSource(settings_cls, _config_file.get()))

    def write_policy(self) -> WritePolicy:
        """The default write policy (``--progress-floor``, ``--metrics-staleness``,
        ``--other-writer-grace``)."""
        return WritePolicy(self.progress_floor, self.metrics_staleness,
                           self.other_writer_grace)

    # The options by the part that uses them (scraper/config_groups.py).
    discovery = property(DiscoverySettings.of)
    scrape = property(ScrapeSettings.of)
    write = property(WriteSettings.of)
    stall = property(StallSettings.of)
    boost = property(BoostSettings.of)
    logs = property(LogSourceSettings.of)
    lease = property(LeaseSettings.of)
    telemetry = property(TelemetrySettings.of)


def load_settings(
    flags: Mapping[str, Any] | None = None, config_file: Path | str | None = None
) -> ScraperSettings:
    """Build the settings from flags (unset ones omitted), the environment and a file.

    Raises:
        ConfigError: one ``option=value: reason`` line per invalid option.
    """
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    # Any case, as pydantic-settings reads the current options' variables.
    given_env = {key.upper(): key for key in os.environ}
    gone = [f"{given_env[ENV_PREFIX + name.upper()]}: option was removed: {hint}"
            for name, hint in REMOVED_OPTIONS.items() if ENV_PREFIX + name.upper() in given_env]
    if gone:
        raise ConfigError(gone)
    # The variable that set each option not given as a flag, to name it in an error.
    from_env = {upper[len(ENV_PREFIX):].lower(): key for upper, key in given_env.items()
                if upper.startswith(ENV_PREFIX) and upper[len(ENV_PREFIX):].lower() not in given}
    token = _config_file.set(Path(config_file) if config_file else None)
    file_keys: dict[str, str] = {}
    keys_token = file_keys_given.set(file_keys)
    try:
        return ScraperSettings(**given)
    except ValidationError as exc:
        # Named where the value was read: the variable, else the config file's key.
        where = {name: f"config={str(config_file)!r}: {key}"
                 for name, key in file_keys.items() if name not in from_env and name not in given}
        raise ConfigError(_describe(exc, {**where, **from_env})) from None
    finally:
        file_keys_given.reset(keys_token)
        _config_file.reset(token)


#: The variables Kubernetes sets for a Service in the pod's namespace (service links, on
#: by default) whose name starts with ``trainjob-scraper`` (the chart's, or a release's
#: such as ``trainjob-scraper-prod``): not options, never warned about.
_SERVICE_LINK = re.compile(
    rf"{ENV_PREFIX}(\w+_)?(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT(_\d+_\w+)?)")


def unknown_environment() -> list[str]:
    """``TRAINJOB_SCRAPER_*`` variables (any case) that name no option: misspelled ones,
    which pydantic-settings ignores.  Each entry: ``"VARIABLE: ..."`` naming the option
    it would be; service-link variables (:data:`_SERVICE_LINK`) are left out."""
    out = []
    for key in os.environ:
        upper = key.upper()
        name = upper[len(ENV_PREFIX):].lower()
        if (upper.startswith(ENV_PREFIX) and name not in ScraperSettings.model_fields
                and name not in REMOVED_OPTIONS and not _SERVICE_LINK.fullmatch(upper)):
            out.append(f"{key}: no option {name.replace('_', '-')!r}; the variable is "
                       "ignored (every option: trainjob-scraper run --help)")
    return out


def _describe(exc: ValidationError, from_env: Mapping[str, str]) -> list[str]:
    problems = []
    for err in exc.errors(include_url=False):
        # Named as on the command line and in the file (--listen-port, listen-port):
        # the spelling a user typed, not the Python field name; and the variable too
        # when the value came from the environment.
        option = ".".join(str(p).replace("_", "-") for p in err["loc"]) or "settings"
        if err["loc"] and str(err["loc"][0]) in from_env:
            option = from_env[str(err["loc"][0])]
        value = err.get("input")
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            problems.append(f"{option}: unknown option")
        elif not err["loc"]:
            problems.append(msg)
        elif msg.startswith("not a duration") and err["loc"][0] in _DURATION_RANGES:
            limit = _limit_of(_DURATION_RANGES[str(err["loc"][0])])
            # A negative duration is a duration out of range: one limit, the range's.
            why = limit if "(must be >= 0)" in msg else f"{msg}; {limit}"
            problems.append(f"{option}={value!r}: {why}")
        elif msg.endswith("(must be >= 0)") and err["loc"][0] in POSITIVE_DURATIONS:
            # Negative, for an option that 0 does not satisfy either: its one limit.
            problems.append(f"{option}={value!r}: must be > 0")
        elif msg.endswith("(must be >= 0)"):
            # A negative duration is a duration, below its limit.
            problems.append(f"{option}={value!r}: must be >= 0")
        else:
            bounds = _bounds_of(str(err["loc"][0]))
            # A value that is not a number at all is told the limits too.
            if bounds and err["type"] in _NOT_A_NUMBER:
                msg = f"{msg}; {bounds}"
            problems.append(f"{option}={value!r}: {msg}")
    return problems


#: pydantic error types of a value that is no number at all (its own message has no limit).
_NOT_A_NUMBER = frozenset({"float_parsing", "float_type", "int_parsing", "int_type",
                           "int_from_float", "finite_number"})


def _number(value: object) -> str:
    """A bound as written in the code: 67108864, not 6.71089e+07."""
    number = float(str(value))
    return str(int(number)) if number.is_integer() else f"{number:g}"


def _bounds_of(name: str) -> str:
    """``"must be between 0.01 and 1000"`` (or one side) from the field's ``ge``/``le``
    (``gt``/``lt``); empty when the field has none or does not exist."""
    info = ScraperSettings.model_fields.get(name)
    if info is None:
        return ""
    ge = next((m.ge for m in info.metadata if isinstance(m, annotated_types.Ge)), None)
    gt = next((m.gt for m in info.metadata if isinstance(m, annotated_types.Gt)), None)
    le = next((m.le for m in info.metadata if isinstance(m, annotated_types.Le)), None)
    if ge is not None and le is not None:
        return f"must be between {_number(ge)} and {_number(le)}"
    parts = [f"{sign} {_number(bound)}" for sign, bound in
             ((">=", ge), (">", gt), ("<=", le)) if bound is not None]
    return f"must be {' and '.join(parts)}" if parts else ""

