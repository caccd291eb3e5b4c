"""The chart's stall alerts (templates/prometheusrule.yaml), evaluated by the real
promtool (Debian's prometheus package, as the other Prometheus tests): ``promtool check
rules`` on the rendered groups, and ``promtool test rules`` on series of a hung training,
a moving one, an uninstrumented one and one whose exporter went down.

The same rule loaded by a real Prometheus that scrapes the real scraper's ``/metrics``
while a real training hangs: ``tests/e2e/test_stall_stack.py``; the default
(``auto``) against a real API server with and without the kind:
``tests/chart/test_chart_apiserver.py``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.chart import FULLNAME, Helm

pytestmark = pytest.mark.timeout(120)

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
VALUES = {"prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus"}}}


def rule_groups(helm: Helm, values: dict[str, Any] | None = None) -> dict[str, Any]:
    """The rendered PrometheusRule's groups as a Prometheus rule file."""
    rule = helm.template(values or VALUES).one("PrometheusRule", FULLNAME)
    return {"groups": rule["spec"]["groups"]}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60,
                          check=False)


#: What `helm install` sees on a cluster with the Prometheus Operator's CRDs.
OPERATOR_API = ("--api-versions=monitoring.coreos.com/v1/PrometheusRule",)


def test_the_rule_ships_by_default_where_the_kind_is_served(helm: Helm) -> None:
    """prometheusRule.enabled=auto (the default): rendered when the cluster serves
    PrometheusRule, left out (no error) when it does not; true and false force it."""
    assert not helm.template().of_kind("PrometheusRule")
    rule = helm.template(extra=OPERATOR_API).one("PrometheusRule", FULLNAME)
    assert [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]] == [
        "TrainJobStalled", "TrainJobExporterDown"]
    assert not helm.template({"prometheusRule": {"enabled": False}},
                             extra=OPERATOR_API).of_kind("PrometheusRule")
    assert helm.template({"prometheusRule": {"enabled": True}}).of_kind("PrometheusRule")
    refused = helm.template_result({"prometheusRule": {"enabled": "yes"}})
    assert not refused.ok and "/prometheusRule/enabled" in refused.stderr, refused.stderr


def test_the_rule_ships_when_enabled_with_its_labels(helm: Helm) -> None:
    rule = helm.template(VALUES).one("PrometheusRule", FULLNAME)
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert alerts == ["TrainJobStalled", "TrainJobExporterDown"]


def test_promtool_checks_the_rendered_rules(helm: Helm, tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule_groups(helm)))
    result = _promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 2 rules found" in result.stdout, result.stdout


UNIT_TESTS = """
rule_files: [rules.yaml]
evaluation_interval: 30s
tests:
  - interval: 30s
    input_series:
      # hung: the scraper says stalled from minute 3 on.
      - series: 'trainjob_progress_stalled{namespace="a",trainjob="hung",instance="s1"}'
        values: '0x5 1x10'
      # moving: never stalled, its last change always recent.
      - series: 'trainjob_progress_stalled{namespace="a",trainjob="moving",instance="s1"}'
        values: '0x15'
      # a blip shorter than `for`.
      - series: 'trainjob_progress_stalled{namespace="a",trainjob="blip",instance="s1"}'
        values: '0 1 0x14'
      # down: answered before (a last update), then its exporter stops answering.
      - series: 'trainjob_scraper_target_up{namespace="a",trainjob="down",pod="p",instance="s1"}'
        values: '1 0x30'
      - series: 'trainjob_last_update_timestamp_seconds{namespace="a",trainjob="down"}'
        values: '100x30'
      # uninstrumented: never answered, no last update.
      - series: 'trainjob_scraper_target_up{namespace="a",trainjob="plain",pod="q",instance="s1"}'
        values: '0x30'
    alert_rule_test:
      - eval_time: 3m
        alertname: TrainJobStalled
        exp_alerts: []
      - eval_time: 4m
        alertname: TrainJobStalled
        exp_alerts:
          - exp_labels: {namespace: a, trainjob: hung, severity: warning}
            exp_annotations:
              summary: TrainJob a/hung stalled
              description: >-
                The training's status (progress, remaining time, metrics) has not changed
                for longer than its threshold while its pod runs and its exporter answers.
                See the TrainingStalled Event on the TrainJob and docs/operator-guide.md.
      - eval_time: 9m
        alertname: TrainJobExporterDown
        exp_alerts: []
      - eval_time: 11m
        alertname: TrainJobExporterDown
        exp_alerts:
          - exp_labels: {namespace: a, trainjob: down, severity: warning}
            exp_annotations:
              summary: TrainJob a/down exporter down
              description: >-
                The exporter of the TrainJob's target pod answered before and no longer
                answers while the pod runs: its progress is not tracked (not a stall).
"""


def test_promtool_test_rules_fires_for_a_hung_training_only(helm: Helm, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(helm)))
    (tmp_path / "tests.yaml").write_text(UNIT_TESTS)
    result = _promtool("test", "rules", str(tmp_path / "tests.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
