"""The rendered chart against a real kube-apiserver: server-side dry-run, install, upgrade.

ServiceMonitor and PodMonitor are validated with minimal monitoring.coreos.com/v1
CRDs (tests/chart/monitoring-crds.yaml, spec kept as given): the API server checks
their kind, metadata and namespace, not the Prometheus Operator's own schema.
"""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from localdev.cluster.controlplane import ControlPlane
from tests.helpers.chart import (
    CHART,
    CUSTOM,
    EXPORTER_POLICY,
    MONITORING,
    MONITORING_CRDS,
    RELEASE,
    Helm,
)

HELM_TIMEOUT_SECONDS = 180.0
PROMETHEUS_RULE_CRD = Path(__file__).with_name("prometheusrule-crd.yaml")


@pytest.fixture(scope="module")
def monitoring_crds(control_plane: ControlPlane) -> None:
    control_plane.kubectl("apply", "--server-side", f"--filename={MONITORING_CRDS}")
    for name in ("servicemonitors.monitoring.coreos.com", "podmonitors.monitoring.coreos.com"):
        control_plane.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                              f"crd/{name}")


def _create_namespace(control_plane: ControlPlane, prefix: str) -> str:
    name = f"{prefix}-{secrets.token_hex(3)}"
    control_plane.kubectl("create", "namespace", name)
    return name


def _dry_run(
    control_plane: ControlPlane, manifest: str, path: Path
) -> subprocess.CompletedProcess[str]:
    path.write_text(manifest)
    return control_plane.kubectl("apply", "--dry-run=server", f"--filename={path}",
                                 check=False)


@pytest.mark.parametrize("variant", ["default", "namespaced", "monitoring", "custom",
                                     "exporter-policy"])
def test_every_rendered_object_passes_server_side_dry_run(
    control_plane: ControlPlane, monitoring_crds: None, helm: Helm, tmp_path: Path,
    variant: str,
) -> None:
    release_ns = _create_namespace(control_plane, "chart")
    values: dict[str, Any] = {"default": {}, "monitoring": MONITORING, "custom": CUSTOM}.get(
        variant, {})
    if variant in ("namespaced", "exporter-policy"):
        watched = [_create_namespace(control_plane, "team") for _ in range(2)]
        values = {"config": {"namespaces": watched}}
    if variant == "exporter-policy":
        values = {**EXPORTER_POLICY, **values}
    if variant == "monitoring":
        # the dashboard goes to a namespace of its own in this variant
        dash_ns = _create_namespace(control_plane, "monitoring")
        values = {**MONITORING, "dashboard": {**MONITORING["dashboard"], "namespace": dash_ns}}
    rendered = helm.template(values, namespace=release_ns)
    result = _dry_run(control_plane, rendered.text, tmp_path / "manifest.yaml")
    assert result.returncode == 0, f"server-side dry-run failed:\n{result.stderr}"

    # kubectl reports one line per object; every object must have been validated.
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == len(rendered.objects), result.stdout
    assert all(line.endswith("(server dry run)") for line in lines), result.stdout
    for obj in rendered.objects:
        kind = obj["kind"].lower()
        name = obj["metadata"]["name"]
        assert any(line.split("/")[0].split(".")[0] == kind and f"/{name} " in line
                   for line in lines), f"{kind}/{name} not in:\n{result.stdout}"


def test_dry_run_catches_what_the_schema_lets_through(
    control_plane: ControlPlane, helm: Helm, tmp_path: Path
) -> None:
    """Proof that the dry-run validates: a bad quantity passes the chart but not the API."""
    release_ns = _create_namespace(control_plane, "chart")
    rendered = helm.template({"resources": {"requests": {"cpu": "lots"}}}, namespace=release_ns)
    result = _dry_run(control_plane, rendered.text, tmp_path / "manifest.yaml")
    assert result.returncode != 0
    assert "quantities must match the regular expression" in result.stderr, result.stderr


def _helm_cluster(
    helm: Helm, control_plane: ControlPlane, *args: str
) -> subprocess.CompletedProcess[str]:
    env = helm.env(KUBECONFIG=str(control_plane.kubeconfig_path))
    return subprocess.run([str(helm.binary), *args], capture_output=True, text=True,
                          timeout=HELM_TIMEOUT_SECONDS, env=env, check=False)


def test_install_upgrade_uninstall_against_the_api_server(
    control_plane: ControlPlane, helm: Helm
) -> None:
    release_ns = _create_namespace(control_plane, "chart")
    fullname = f"{RELEASE}-trainjob-scraper"

    installed = _helm_cluster(helm, control_plane, "install", RELEASE, str(CHART),
                              f"--namespace={release_ns}")
    assert installed.returncode == 0, installed.stderr
    # NOTES.txt is rendered on install
    assert f"Lease {release_ns}/{fullname}" in installed.stdout, installed.stdout
    assert "status.trainerStatus" in installed.stdout
    # ... and says how to read the guarded /metrics, and that nobody may yet
    assert f"ClusterRole {fullname}-metrics-reader" in installed.stdout, installed.stdout
    assert "or Prometheus gets 403" in installed.stdout, installed.stdout

    def deployment() -> dict[str, Any]:
        out = control_plane.kubectl("get", "deployment", fullname, f"--namespace={release_ns}",
                                    "--output=yaml").stdout
        loaded: dict[str, Any] = yaml.safe_load(out)
        return loaded

    def config() -> dict[str, Any]:
        out = control_plane.kubectl("get", "configmap", fullname, f"--namespace={release_ns}",
                                    "--output=jsonpath={.data.config\\.yaml}").stdout
        loaded: dict[str, Any] = yaml.safe_load(out)
        return loaded

    before = deployment()["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert config()["interval"] == "30s"

    upgraded = _helm_cluster(helm, control_plane, "upgrade", RELEASE, str(CHART),
                             f"--namespace={release_ns}", "--reuse-values",
                             "--set=config.interval=10s")
    assert upgraded.returncode == 0, upgraded.stderr
    assert config()["interval"] == "10s"
    after = deployment()["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert after != before  # the pods roll on a configuration change

    rejected = _helm_cluster(helm, control_plane, "upgrade", RELEASE, str(CHART),
                             f"--namespace={release_ns}", "--reuse-values",
                             "--set=config.interval=soon")
    assert rejected.returncode != 0
    assert "values don't meet the specifications of the schema" in rejected.stderr

    removed = _helm_cluster(helm, control_plane, "uninstall", RELEASE,
                            f"--namespace={release_ns}", "--wait", "--timeout=60s")
    assert removed.returncode == 0, removed.stderr
    left = control_plane.kubectl("get", "clusterrole", fullname, check=False)
    assert left.returncode != 0 and "NotFound" in left.stderr


def test_the_stall_alerts_ship_by_default_where_the_prometheus_rule_kind_exists(
    control_plane: ControlPlane, helm: Helm
) -> None:
    """prometheusRule.enabled=auto (the default): a cluster without the Prometheus
    Operator's PrometheusRule kind installs without it (and without an error); once the
    kind is served, the same values create it; false removes it."""
    crd = "crd/prometheusrules.monitoring.coreos.com"
    absent = control_plane.kubectl("get", crd, check=False)
    assert absent.returncode != 0 and "NotFound" in absent.stderr, absent.stdout
    release_ns = _create_namespace(control_plane, "chart")
    release = "stall-alerts"  # its own cluster-scoped names: no clash with another test
    fullname = f"{release}-trainjob-scraper"

    def rules() -> list[str]:
        out = control_plane.kubectl("get", "prometheusrules", f"--namespace={release_ns}",
                                    "--output=jsonpath={.items[*].metadata.name}").stdout
        return out.split()

    installed = _helm_cluster(helm, control_plane, "install", release, str(CHART),
                              f"--namespace={release_ns}")
    assert installed.returncode == 0, installed.stderr
    assert "No PrometheusRule: the cluster does not serve" in installed.stdout, \
        installed.stdout
    assert "stalled for N min" in installed.stdout, installed.stdout
    try:
        control_plane.kubectl("apply", "--server-side", f"--filename={PROMETHEUS_RULE_CRD}")
        control_plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", crd)
        upgraded = _helm_cluster(helm, control_plane, "upgrade", release, str(CHART),
                                 f"--namespace={release_ns}")
        assert upgraded.returncode == 0, upgraded.stderr
        assert f"PrometheusRule {release_ns}/{fullname} (TrainJobStalled" in \
            upgraded.stdout, upgraded.stdout
        assert rules() == [fullname]
        out = control_plane.kubectl("get", "prometheusrule", fullname,
                                    f"--namespace={release_ns}", "--output=yaml").stdout
        alerts = [r["alert"] for g in yaml.safe_load(out)["spec"]["groups"]
                  for r in g["rules"]]
        assert alerts == ["TrainJobStalled", "TrainJobExporterDown"]
        off = _helm_cluster(helm, control_plane, "upgrade", release, str(CHART),
                            f"--namespace={release_ns}", "--set=prometheusRule.enabled=false")
        assert off.returncode == 0, off.stderr
        assert rules() == []
    finally:
        _helm_cluster(helm, control_plane, "uninstall", release, f"--namespace={release_ns}",
                      "--wait", "--timeout=60s")
        control_plane.kubectl("delete", "--ignore-not-found", f"--filename={PROMETHEUS_RULE_CRD}",
                              check=False)
