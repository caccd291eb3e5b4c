"""Helpers for the Helm chart tests: run the pinned helm, parse what it renders.

``helm`` is the binary built from ``tools/controlplane/helm`` by
``scripts/controlplane-assets`` (through :func:`localdev.cluster.ensure_assets`),
or ``$TRAINJOB_HELM``; a missing binary fails the test with the reason, it is never
skipped.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "trainjob-scraper"
MONITORING_CRDS = REPO / "tests" / "chart" / "monitoring-crds.yaml"
HELM_TIMEOUT_SECONDS = 120.0
RELEASE = "tjs"


def pinned_kubernetes_version() -> str:
    """The Kubernetes version the control plane is built from (tools/controlplane/kube)."""
    for line in (REPO / "tools" / "controlplane" / "kube" / "go.mod").read_text().splitlines():
        fields = line.split("//")[0].split()
        if fields[:1] == ["require"]:
            fields = fields[1:]
        if len(fields) == 2 and fields[0] == "k8s.io/kubernetes":
            return fields[1]
    raise AssertionError("tools/controlplane/kube/go.mod does not require k8s.io/kubernetes")


#: ``helm template`` and ``helm lint`` assume the Kubernetes version compiled into helm
#: (v1.20 unless its build stamps another); the chart's kubeVersion needs a newer one,
#: so both are told the version of the API server the other tests run.
KUBE_VERSION = pinned_kubernetes_version()
RELEASE_NAMESPACE = "trainjob-system"


@dataclass
class HelmResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


@dataclass
class Rendered:
    """The objects of one ``helm template`` run, with lookups by kind and name."""

    text: str
    objects: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
        return found[0]

    def kinds(self) -> list[str]:
        return sorted(o["kind"] for o in self.objects)


class Helm:
    """Runs the pinned helm on the chart with values given as a mapping."""

    def __init__(self, binary: Path, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir

    def env(self, **extra: str) -> dict[str, str]:
        """helm's environment: kept away from the user's config, cache and registries.

        HOME is set too: without it client-go's discovery cache lands in ``./.kube``.
        """
        return {
            "HOME": str(self.workdir),
            "HELM_CACHE_HOME": str(self.workdir / "cache"),
            "HELM_CONFIG_HOME": str(self.workdir / "config"),
            "HELM_DATA_HOME": str(self.workdir / "data"),
            "PATH": "/usr/bin:/bin",
            **extra,
        }

    def run(self, *args: str, values: Mapping[str, Any] | None = None) -> HelmResult:
        cmd = [str(self.binary), *args]
        if values is not None:
            with tempfile.NamedTemporaryFile(
                "w", suffix=".yaml", dir=self.workdir, delete=False
            ) as handle:
                yaml.safe_dump(dict(values), handle)
            cmd.append(f"--values={handle.name}")
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=HELM_TIMEOUT_SECONDS, env=self.env(),
            check=False,
        )
        return HelmResult(proc.returncode, proc.stdout, proc.stderr)

    def template(
        self,
        values: Mapping[str, Any] | None = None,
        *,
        release: str = RELEASE,
        namespace: str = RELEASE_NAMESPACE,
        extra: tuple[str, ...] = (),
    ) -> Rendered:
        """Render the chart; fail the test with helm's message if it does not render."""
        result = self.template_result(values, release=release, namespace=namespace, extra=extra)
        assert result.ok, f"helm template failed:\n{result.stderr}"
        objects = [d for d in yaml.safe_load_all(result.stdout) if d]
        return Rendered(result.stdout, objects)

    def template_result(
        self,
        values: Mapping[str, Any] | None = None,
        *,
        release: str = RELEASE,
        namespace: str = RELEASE_NAMESPACE,
        extra: tuple[str, ...] = (),
    ) -> HelmResult:
        return self.run(
            "template", release, str(CHART), f"--namespace={namespace}",
            f"--kube-version={KUBE_VERSION}", *extra, values=values,
        )

    def lint(self, values: Mapping[str, Any] | None = None) -> HelmResult:
        return self.run(
            "lint", "--strict", f"--kube-version={KUBE_VERSION}", str(CHART), values=values
        )


FULLNAME = f"{RELEASE}-trainjob-scraper"

#: Non-default values used across the tests (each key is checked by the schema).
NAMESPACED = {"config": {"namespaces": ["team-a", "team-b"]}}
MONITORING = {
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}},
    "networkPolicy": {
        "enabled": True,
        "egress": {
            "enabled": True,
            "apiServer": {"cidrs": ["10.0.0.1/32", "192.168.10.0/24"], "ports": [6443]},
            "exporters": {"ports": [28080, 9400]},
        },
        "metricsIngress": {"from": [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "monitoring"}}}]},
    },
    "metrics": {"auth": {"readers": [
        {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}]}},
    "validatingAdmissionPolicy": {"enabled": True},
    "dashboard": {"folder": "Training", "namespace": "monitoring"},
    "flowControl": {"enabled": True},
}
CUSTOM = {
    "replicaCount": 1,
    "image": {"repository": "registry.example/ml/trainjob-scraper",
              "digest": "sha256:" + "ab" * 32},
    "config": {
        "interval": "15s", "scrapeTimeout": "3s", "concurrency": 64, "defaultPort": 9400,
        "selector": "app=trainer", "logLevel": "DEBUG", "maxBodyBytes": 4194304,
        "writeQps": 2.5, "extraArgs": ["--resync-interval=1m"],
    },
    "leaderElection": {"enabled": False},
    "podMonitor": {"enabled": True, "authorization": {
        "type": "Bearer", "credentials": {"name": "prometheus-token", "key": "token"}}},
    "podDisruptionBudget": {"minAvailable": 1},
    "metrics": {"port": 9090, "service": {"port": 80}},
    "serviceAccount": {"create": False, "name": "preexisting"},
}
#: The exporter port opened to the scraper only, in the watched namespaces.
EXPORTER_POLICY = {**NAMESPACED, "exporterNetworkPolicy": {
    "enabled": True, "ports": [9400, 28080],
    "extraFrom": [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]}}
VARIANTS = {
    "default": {},
    "namespaced": NAMESPACED,
    "monitoring": MONITORING,
    "custom": CUSTOM,
    "exporter-policy": EXPORTER_POLICY,
}


# ---------------------------------------------------------------- the Grafana dashboard

DASHBOARD = CHART / "dashboards" / "trainjob-progress.json"

#: Panels that must show data once one TrainJob has been scraped.
CORE_PANELS = ("Progress", "Progress over time", "Targets up", "Target up")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def dashboard_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    out: list[dict[str, Any]] = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def variable_query(variable: dict[str, Any]) -> str:
    """The query text of a ``query`` template variable: its ``query`` field, a string or
    Grafana's ``{"query": ...}`` object."""
    query = variable["query"]
    return str(query["query"] if isinstance(query, dict) else query)


def dashboard_expressions(board: dict[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every query, plus ``("variable <name>", selector)``
    for each ``label_values(...)`` template variable (the series selector it lists)."""
    out = [
        (panel["title"], target["expr"])
        for panel in dashboard_panels(board)
        for target in panel.get("targets", [])
    ]
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+), *[a-z_]+\)", variable_query(variable))
        assert match, f"variable {variable['name']}: not a label_values query"
        out.append((f"variable {variable['name']}", match.group(1)))
    return out


def grafana_to_promql(expr: str, *, rate_interval: str = "30s", **variables: str) -> str:
    """Substitute the Grafana variables of a dashboard expression.

    ``$__rate_interval`` / ``$__interval`` / ``$__range`` become ``rate_interval``;
    ``$name`` and ``${name}`` become ``variables[name]`` (``.*`` when not given, the
    dashboard's "All" value).
    """
    for builtin in ("$__rate_interval", "$__interval", "$__range"):
        expr = expr.replace(builtin, rate_interval)

    def value(match: re.Match[str]) -> str:
        return variables.get(match.group(1) or match.group(2), ".*")

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def scraper_series() -> set[str]:
    """Names of every series the scraper's /metrics can expose (from scraper.telemetry)."""
    from datetime import UTC, datetime

    from exporter_lib.status import TrainerStatus
    from scraper.telemetry import JobView, Telemetry

    status = TrainerStatus.from_api({
        "progressPercentage": 50, "estimatedRemainingSeconds": 10,
        "metrics": [{"name": "loss", "value": "0.5"}],
        "lastUpdatedTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    })
    telemetry = Telemetry(lambda: [JobView("ns", "job", "pod", status=status, up=True)])
    # The stall gauges come from their own collector (registered by scraper.app).
    from scraper.stall.rule import StallClock
    from scraper.stall.watch import StallCollector, _Watched

    class _Clocks:
        clocks = {("ns", "job"): _Watched("uid", StallClock.start(status, 0.0, 0.0))}

    _Clocks.clocks[("ns", "job")].clock.threshold = 300.0
    telemetry.registry.register(StallCollector(_Clocks(), clock=lambda: 1.0))  # type: ignore[arg-type]
    names: set[str] = set()
    for family in telemetry.registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{s}" for s in ("_bucket", "_sum", "_count"))
            names.add(family.name)
        else:
            names.add(family.name)
    return names
