"""A real Prometheus server on loopback, for tests and the demo.

:class:`PrometheusServer` runs the ``prometheus`` binary (Debian's package, or
``$PROMETHEUS_BIN``) on a free ``127.0.0.1`` port with a generated configuration
and a temporary TSDB directory, scraping the given targets at a short interval
(1 s by default), and offers the few HTTP API calls tests need::

    with PrometheusServer([ScrapeTarget("scraper", "127.0.0.1:8080")]) as prom:
        prom.wait_for_targets_up(timeout=30)
        result = prom.wait_for_data("trainjob_scraper_targets", timeout=30)

Every wait is bounded by its ``timeout``; a failure raises :class:`PrometheusError`
whose message includes what Prometheus said (its API error or the tail of its log).
Only the standard library is used, so the helper works in any test environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from localdev.cluster import processes

__all__ = [
    "PrometheusError",
    "PrometheusQueryError",
    "PrometheusServer",
    "ScrapeTarget",
    "find_prometheus",
]

DEFAULT_BINARY = "/usr/bin/prometheus"


class PrometheusError(RuntimeError):
    """Prometheus could not be started, did not answer, or a wait ran out."""


class PrometheusQueryError(PrometheusError):
    """The query API answered ``status: error`` (e.g. a PromQL parse error).

    ``error_type`` and ``error`` are Prometheus' own fields (``bad_data``, the parser's
    message); ``expr`` is the query that failed.
    """

    def __init__(self, expr: str, error_type: str, error: str) -> None:
        self.expr = expr
        self.error_type = error_type
        self.error = error
        super().__init__(f"query {expr!r} failed: {error_type}: {error}")


@dataclass(frozen=True)
class ScrapeTarget:
    """One ``host:port`` to scrape, as its own Prometheus job."""

    job: str
    address: str
    metrics_path: str = "/metrics"
    labels: Mapping[str, str] = field(default_factory=dict)
    #: File holding a bearer token sent on every scrape (Prometheus'
    #: ``authorization.credentials_file``, what the Operator's ``bearerTokenFile`` becomes).
    bearer_token_file: str | None = None


def _scrape_config(target: ScrapeTarget) -> dict[str, Any]:
    config: dict[str, Any] = {
        "job_name": target.job,
        "metrics_path": target.metrics_path,
        "static_configs": [{"targets": [target.address], "labels": dict(target.labels)}],
    }
    if target.bearer_token_file:
        config["authorization"] = {"type": "Bearer",
                                   "credentials_file": target.bearer_token_file}
    return config


def find_prometheus() -> str:
    """Return the path of the ``prometheus`` binary.

    ``$PROMETHEUS_BIN`` wins, then ``prometheus`` on ``PATH``, then ``/usr/bin/prometheus``.

    Raises:
        PrometheusError: none of them is an executable file.
    """
    candidates = [os.environ.get("PROMETHEUS_BIN"), shutil.which("prometheus"), DEFAULT_BINARY]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise PrometheusError(
        "no prometheus binary: set PROMETHEUS_BIN or install Debian's 'prometheus' package "
        "(scripts/bootstrap test does)"
    )


def _duration(seconds: float) -> str:
    """Prometheus duration for a number of seconds (whole milliseconds)."""
    return f"{max(1, round(seconds * 1000))}ms"


class PrometheusServer:
    """A ``prometheus`` process scraping ``targets``; use as a context manager.

    Args:
        targets: what to scrape; a plain ``"host:port"`` becomes job ``target<N>``.
        scrape_interval: seconds between scrapes (also the rule evaluation interval).
        binary: path of ``prometheus``; default :func:`find_prometheus`.
        workdir: where the configuration, TSDB and log go; default a temporary
            directory removed by :meth:`stop`.
        startup_timeout: seconds to wait for ``/-/ready``.
        rule_files: Prometheus rule files loaded (alerting and recording rules,
            evaluated every ``scrape_interval``).
    """

    def __init__(
        self,
        targets: Sequence[ScrapeTarget | str],
        *,
        scrape_interval: float = 1.0,
        binary: str | None = None,
        workdir: Path | None = None,
        startup_timeout: float = 30.0,
        rule_files: Sequence[Path] = (),
    ) -> None:
        self.rule_files = [str(p) for p in rule_files]
        self.targets = [
            t if isinstance(t, ScrapeTarget) else ScrapeTarget(f"target{i}", t)
            for i, t in enumerate(targets)
        ]
        jobs = [t.job for t in self.targets]
        if len(set(jobs)) != len(jobs):
            raise ValueError(f"job names must be unique, got {jobs}")
        self.scrape_interval = scrape_interval
        self.binary = binary
        self.startup_timeout = startup_timeout
        self._workdir_arg = workdir
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.workdir: Path | None = None
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle -----------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:40123``."""
        if self.port is None:
            raise PrometheusError("Prometheus is not running")
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        if self.workdir is None:
            raise PrometheusError("Prometheus was never started")
        return self.workdir / "prometheus.log"

    def config(self) -> dict[str, Any]:
        """The configuration written to ``prometheus.yml`` (YAML is a superset of JSON)."""
        interval = _duration(self.scrape_interval)
        return {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "scrape_configs": [_scrape_config(t) for t in self.targets],
            **({"rule_files": self.rule_files} if self.rule_files else {}),
        }

    def start(self) -> PrometheusServer:
        """Start Prometheus and wait until it is ready.

        Raises:
            PrometheusError: no binary, the process exited, or not ready in time.
        """
        if self._proc is not None:
            raise PrometheusError("already started")
        binary = self.binary or find_prometheus()
        if self._workdir_arg is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="prometheus-")
            self.workdir = Path(self._tmp.name)
        else:
            self.workdir = self._workdir_arg
            self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(json.dumps(self.config(), indent=2))

        last_error = ""
        for _attempt in range(3):  # a free port can be taken between probe and bind
            self.port = processes.free_port()
            # Own process group, killed with this process even when it dies abruptly.
            self._proc = processes.spawn(
                [
                    binary,
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1d",
                    "--log.level=info",
                ],
                self.log_path,
            )
            try:
                self._wait_ready()
                return self
            except PrometheusError as exc:
                last_error = str(exc)
                self._terminate()
                if "address already in use" not in last_error:
                    break
        self._cleanup()
        raise PrometheusError(last_error)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise PrometheusError(
                    f"prometheus exited with code {self._proc.returncode}:\n{self.log_tail()}"
                )
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp,
            ):
                if resp.status == 200:
                    return
            time.sleep(0.2)
        raise PrometheusError(
            f"prometheus not ready after {self.startup_timeout}s:\n{self.log_tail()}"
        )

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            processes.stop(proc, grace=10.0)

    def _cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def stop(self) -> None:
        """Stop Prometheus (SIGTERM, then SIGKILL after 10 s) and remove a temporary workdir."""
        self._terminate()
        self._cleanup()
        self.port = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of Prometheus' log (for failure messages)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, PrometheusError):
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- HTTP API ------------------------------------------------------------

    def api(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        """GET ``/api/v1/<path>`` and return the decoded body, whatever its ``status``.

        Prometheus answers errors such as a PromQL parse error with HTTP 400 and a JSON
        body ``{"status": "error", "errorType": ..., "error": ...}``; that body is
        returned, not raised.

        Raises:
            PrometheusError: no answer, or an answer that is not Prometheus' JSON.
        """
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()
        except OSError as exc:
            raise PrometheusError(f"GET {url}: {exc}") from exc
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise PrometheusError(f"GET {url}: not JSON: {body[:200]!r}") from exc
        if not isinstance(data, dict) or "status" not in data:
            raise PrometheusError(f"GET {url}: unexpected body {body[:200]!r}")
        return data

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """Instant query; returns ``data`` (``resultType`` and ``result``).

        Raises:
            PrometheusQueryError: Prometheus rejected the expression.
        """
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        body = self.api("query", params)
        if body["status"] != "success":
            raise PrometheusQueryError(
                expr, str(body.get("errorType", "")), str(body.get("error", ""))
            )
        data: dict[str, Any] = body["data"]
        return data

    def query_range(self, expr: str, start: float, end: float, step: float) -> dict[str, Any]:
        """Range query; returns ``data``.

        Raises:
            PrometheusQueryError: Prometheus rejected the expression.
        """
        body = self.api(
            "query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}"},
        )
        if body["status"] != "success":
            raise PrometheusQueryError(
                expr, str(body.get("errorType", "")), str(body.get("error", ""))
            )
        data: dict[str, Any] = body["data"]
        return data

    def active_targets(self) -> list[dict[str, Any]]:
        """``/api/v1/targets``' active targets (each has ``health``, ``lastError``, ``labels``)."""
        body = self.api("targets", {"state": "active"})
        targets: list[dict[str, Any]] = body.get("data", {}).get("activeTargets", [])
        return targets

    def wait_for_targets_up(self, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Wait until every configured target was scraped successfully.

        Raises:
            PrometheusError: some target is not ``up`` after ``timeout`` seconds; the
                message names each with its last error.
        """
        targets: list[dict[str, Any]] = []

        def all_up() -> bool:
            nonlocal targets
            targets = self.active_targets()
            return len(targets) == len(self.targets) and all(
                t.get("health") == "up" for t in targets
            )

        if not self._poll(all_up, timeout):
            detail = ", ".join(
                f"{t.get('scrapeUrl')}: {t.get('health')} {t.get('lastError', '')}".strip()
                for t in targets
            )
            raise PrometheusError(f"targets not up after {timeout}s: {detail or 'none'}")
        return targets

    def wait_for_data(
        self,
        expr: str,
        timeout: float = 30.0,
        predicate: Callable[[list[dict[str, Any]]], bool] = bool,
    ) -> list[dict[str, Any]]:
        """Poll an instant query until ``predicate(result)`` holds (default: non-empty).

        Raises:
            PrometheusQueryError: the expression does not parse.
            PrometheusError: the predicate did not hold within ``timeout`` seconds.
        """
        result: list[dict[str, Any]] = []

        def ready() -> bool:
            nonlocal result
            data = self.query(expr)
            result = data["result"] if isinstance(data["result"], list) else [data["result"]]
            return predicate(result)

        if not self._poll(ready, timeout):
            raise PrometheusError(f"{expr!r}: condition not met after {timeout}s, last {result}")
        return result

    def _poll(self, check: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if self._proc is None or self._proc.poll() is not None:
                raise PrometheusError(f"prometheus is not running:\n{self.log_tail()}")
            if check():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.25, self.scrape_interval))
