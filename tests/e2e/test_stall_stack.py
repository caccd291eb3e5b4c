"""Stall detection on the real stack (issue 29): real trainings through the real chain
(Trainer -> JobSet -> Job -> pods, scheduler, kwok, pod runner), the real scraper, the
real API server's Events and TrainJob annotations, the real kubectl running the plugin
(``kubectl trainjob progress``: the row a user sees), and a real Prometheus (Debian's)
that scrapes the scraper's real ``/metrics`` with the chart's rendered alert rule
loaded: ``TrainJobStalled`` fires for the hung training and never for a moving one.

The training (``stall_trainer.py``) pauses with its process and exporter alive: a pause
shorter than the threshold is an evaluation phase and raises nothing; a longer one is a
hung rank and raises ``TrainingStalled`` within its threshold (set short by the
TrainJob's ``trainjob-progress.dev/stall-after`` annotation), then ``TrainingResumed``
when it moves again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from localdev.cluster import trainjobs
from localdev.cluster.assets import ensure_assets
from localdev.cluster.prometheus import PrometheusServer, ScrapeTarget
from localdev.cluster.stack import Cluster
from scraper.stall.rule import STALL_AFTER_ANNOTATION, STALLED_SINCE_ANNOTATION
from scraper.stall.watch import CHECK_SECONDS, REASON_RESUMED, REASON_STALLED
from tests.helpers.chart import FULLNAME, Helm
from tests.helpers.stack import scraper, scraper_metric
from trainjob_client.progress import trainjob_progress

TRAINER = str(Path(__file__).with_name("stall_trainer.py"))
TIMEOUT = 120.0
THRESHOLD = 12.0


def _events(api: client.ApiClient, ns: str, name: str) -> list[Any]:
    items = client.CoreV1Api(api).list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name}").items
    return [e for e in items if e.reason in (REASON_STALLED, REASON_RESUMED)]


def _annotation(api: client.ApiClient, ns: str, name: str) -> str | None:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        API_GROUP, API_VERSION, ns, TRAINJOB_PLURAL, name)
    return (obj["metadata"].get("annotations") or {}).get(STALLED_SINCE_ANNOTATION)


def _rule_file(tmp_path: Path) -> Path:
    """The chart's PrometheusRule groups, rendered by the pinned helm, as a rule file."""
    assets = ensure_assets()
    assert assets.helm is not None, "no helm binary in the control plane assets"
    (tmp_path / "helm").mkdir()
    rendered = Helm(assets.helm, tmp_path / "helm").template(
        {"prometheusRule": {"enabled": True, "stalledFor": "1s"}})
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rendered.one("PrometheusRule", FULLNAME)[
        "spec"]["groups"]}))
    return path


def _plugin_row(cluster: Cluster, tmp_path: Path, ns: str, name: str) -> dict[str, str]:
    """``kubectl trainjob progress NAME -n NS`` by the stack's real kubectl, the plugin as
    the console script pip writes (this interpreter, ``trainjob_client.cli:main``), as
    {column: cell} of its one row."""
    bin_dir = tmp_path / "plugin-bin"
    script = bin_dir / "kubectl-trainjob"
    if not script.exists():
        bin_dir.mkdir()
        script.write_text(f"#!{sys.executable}\nimport sys\n"
                          "from trainjob_client.cli import main\nsys.exit(main())\n")
        script.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "KUBECONFIG": str(cluster.kubeconfig_path)}
    result = subprocess.run([str(cluster.kubectl_path), "trainjob", "progress", name,
                             "-n", ns], capture_output=True, text=True, env=env,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()
    titles = header.split()
    starts = [header.index(f"{t} " if i < len(titles) - 1 else t)
              for i, t in enumerate(titles)]
    return {t: row[s:e].strip() for t, s, e in zip(titles, starts, [*starts[1:], None],
                                                   strict=True)}


def _firing(prometheus: PrometheusServer) -> set[str]:
    result = prometheus.query('ALERTS{alertname="TrainJobStalled",alertstate="firing"}')
    return {r["metric"]["trainjob"] for r in result["result"]}


def test_an_evaluation_phase_raises_nothing_a_hang_raises_stalled_then_resumed(
        kube_stack: Cluster, stack_api: client.ApiClient, stack_namespace: str,
        tmp_path: Path) -> None:
    ns, name = stack_namespace, "hung"
    eval_pause, hang = THRESHOLD * 0.6, THRESHOLD * 2.5
    body = trainjobs.trainjob_body(ns, name, command=[
        sys.executable, TRAINER, "--steps", "40", "--step-seconds", "0.3",
        "--pause", f"10:{eval_pause}", "--pause", f"20:{hang}"])
    body["metadata"].setdefault("annotations", {})[STALL_AFTER_ANNOTATION] = f"{THRESHOLD:g}s"
    moving = trainjobs.trainjob_body(ns, "moving", command=[
        sys.executable, TRAINER, "--steps", "200", "--step-seconds", "0.3"])
    moving["metadata"].setdefault("annotations", {})[STALL_AFTER_ANNOTATION] = \
        f"{THRESHOLD:g}s"
    rules = _rule_file(tmp_path)
    with scraper(kube_stack, ns, tmp_path) as child, PrometheusServer(
            [ScrapeTarget("trainjob-scraper", child.extra["base_url"].removeprefix("http://"))],
            scrape_interval=1.0, rule_files=[rules]) as prometheus:
        trainjobs.create(stack_api, moving)
        trainjobs.create(stack_api, body)
        pod_log = None
        # Until the hang begins (step 20), nothing: the evaluation pause is shorter.
        deadline = time.monotonic() + TIMEOUT
        hang_seen_at = None
        while time.monotonic() < deadline:
            assert _events(stack_api, ns, name) == [], "an Event before the hang"
            assert _firing(prometheus) == set(), "an alert before the hang"
            lines = scraper_metric(child, "trainjob_metric{").splitlines()
            if any(f'trainjob="{name}"' in line and 'name="step"' in line
                   and line.endswith("} 20.0") for line in lines):
                hang_seen_at = time.monotonic()
                break
            time.sleep(0.5)
        assert hang_seen_at is not None, f"step 20 not reached: {pod_log}"
        # The hang: TrainingStalled within the threshold (+ one check, one scrape, slack).
        limit = hang_seen_at + THRESHOLD + CHECK_SECONDS + 1.0 + 5.0
        stalled = []
        while time.monotonic() < limit and not stalled:
            stalled = [e for e in _events(stack_api, ns, name) if e.reason == REASON_STALLED]
            time.sleep(0.5)
        raised_after = time.monotonic() - hang_seen_at
        assert stalled, f"no {REASON_STALLED} within {limit - hang_seen_at:.0f}s of the hang"
        assert raised_after > THRESHOLD - 2.0, f"raised too early: {raised_after:.1f}s"
        [event] = stalled
        assert event.type == "Warning"
        assert "last progress 50 %" in event.message, event.message
        assert f"threshold {THRESHOLD:g}s (from annotation)" in event.message, event.message
        since = _annotation(stack_api, ns, name)
        assert since is not None and since in event.message, (since, event.message)
        age = (datetime.now(UTC) - datetime.fromisoformat(since.replace("Z", "+00:00")))
        assert THRESHOLD - 2 < age.total_seconds() < THRESHOLD + 20
        assert 'trainjob="hung"} 1.0' in scraper_metric(child, "trainjob_progress_stalled{")
        # The plugin and the SDK read it from the TrainJob they already read.
        obj = client.CustomObjectsApi(stack_api).get_namespaced_custom_object(
            API_GROUP, API_VERSION, ns, TRAINJOB_PLURAL, name)
        shown = trainjob_progress(obj).stalled_for(datetime.now(UTC))
        assert shown is not None and shown.startswith("stalled for "), shown
        # What the user sees: the STATE cell of `kubectl trainjob progress` (a running
        # TrainJob of Trainer v2.3.0 has no True condition: its state is <none>).
        row = _plugin_row(kube_stack, tmp_path, ns, name)
        print(f"kubectl trainjob progress {name}: {row}")
        assert row["STATE"] in ("<none> (stalled for 0 min)", "<none> (stalled for 1 min)"), row
        assert row["PROGRESS"].endswith(" 50%"), row
        # The real Prometheus fires the chart's alert for the hung training only.
        limit = time.monotonic() + 15
        while time.monotonic() < limit and _firing(prometheus) != {name}:
            time.sleep(0.5)
        assert _firing(prometheus) == {name}, prometheus.log_tail()
        # It moves again: TrainingResumed, the annotation goes, and it ends at 100 %.
        resumed = []
        limit = time.monotonic() + hang + 20
        while time.monotonic() < limit and not resumed:
            resumed = [e for e in _events(stack_api, ns, name) if e.reason == REASON_RESUMED]
            time.sleep(0.5)
        assert resumed, f"no {REASON_RESUMED}"
        assert resumed[0].type == "Normal"
        limit = time.monotonic() + 20
        while _annotation(stack_api, ns, name) is not None and time.monotonic() < limit:
            time.sleep(0.5)
        assert _annotation(stack_api, ns, name) is None
        assert "stalled" not in _plugin_row(kube_stack, tmp_path, ns, name)["STATE"]
        trainjobs.wait_finished(stack_api, ns, name, TIMEOUT)
        time.sleep(CHECK_SECONDS * 2)
        # Listed by name (a hash), not by time: one of each.
        assert sorted(e.reason for e in _events(stack_api, ns, name)) == [REASON_RESUMED,
                                                                          REASON_STALLED]
        assert _events(stack_api, ns, "moving") == []
        assert "moving" not in _firing(prometheus)
