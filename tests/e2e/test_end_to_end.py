"""The whole path with clients nobody on this team wrote.

A real Transformers ``Trainer`` (tiny GPT-2 from a config, CPU, synthetic data)
reports in one of three ways; the scraper (``trainjob-scraper run`` as its own
process) discovers the rank-0 trainer pod in the real kube-apiserver, scrapes
the exporter and writes ``status.trainerStatus``; kubectl, the Kubeflow SDK and a
real Prometheus (scraping the scraper) read the result back.

Ways of reporting:

* ``callback``: our ``exporter_lib.callbacks.transformers.ExporterCallback``;
* ``sdk``: the Kubeflow SDK's ``update_trainjob_status`` (push client) posting
  into the exporter's push-compatible endpoint;
* ``builtin``: Transformers' own Kubeflow integration (``report_to="kubeflow"``,
  present in the installed Transformers since its 5.x releases; the test fails,
  rather than skips, where it is missing).

Only the kubelet is simulated (none can run here): the Pod's Running status and
IP, and the copy of the termination message, are written through the Pod's status
subresource, as a kubelet would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import transformers
from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL, TrainerStatus
from localdev.cluster.controlplane import ControlPlane
from localdev.cluster.objects import create_trainer_pod, create_trainjob, terminate_pod
from localdev.cluster.processes import free_port
from localdev.cluster.prometheus import PrometheusServer, ScrapeTarget
from localdev.demo.processes import Child, start_scraper, start_training, wait_http_ok

TRAINJOB = "e2e-train"
TRAINING_TIMEOUT_SECONDS = 300
FINAL_TIMEOUT_SECONDS = 60


@pytest.fixture
def scraper_process(control_plane: ControlPlane, namespace: str, trainjob_crd: None,
                    tmp_path: Path) -> Iterator[Child]:
    child = start_scraper(tmp_path, kubeconfig=control_plane.kubeconfig_path, port=free_port(),
                          options=["--interval", "1s", "--namespaces", namespace])
    try:
        wait_http_ok(child.extra["base_url"] + "/readyz", child)
        yield child
    finally:
        child.stop()


def _trainjob(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    result: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, TRAINJOB)
    return result


def _status(obj: dict[str, Any]) -> TrainerStatus | None:
    raw = (obj.get("status") or {}).get("trainerStatus")
    return TrainerStatus.from_api(raw) if raw else None


def _logged(path: Path, key: str) -> list[str]:
    """Values of ``key`` the training logged, as the API strings them (``repr`` of floats)."""
    values = []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if key in entry:
            values.append(repr(entry[key]) if isinstance(entry[key], float) else str(entry[key]))
    return values


@pytest.mark.parametrize("report", ["callback", "sdk", "builtin"])
def test_training_progress_reaches_the_trainjob(
    report: str, control_plane: ControlPlane, kube_api: client.ApiClient, namespace: str,
    scraper_process: Child, tmp_path: Path,
) -> None:
    if report == "builtin":
        from transformers.integrations import integration_utils

        assert "kubeflow" in integration_utils.INTEGRATION_TO_CALLBACK, (
            f"transformers {transformers.__version__} has no built-in Kubeflow integration")

    port = free_port()
    create_trainjob(kube_api, namespace, TRAINJOB)
    pod = create_trainer_pod(kube_api, namespace, TRAINJOB, port=port)
    scraper_url = scraper_process.extra["base_url"]
    prom_address = scraper_url.removeprefix("http://")

    with PrometheusServer([ScrapeTarget("trainjob-scraper", prom_address)],
                          scrape_interval=1.0) as prometheus:
        training = start_training(tmp_path, port=port, framework="transformers",
                                  args=["--report", report, "--epochs", "2", "--samples", "2048"])
        seen: list[TrainerStatus] = []
        try:
            deadline = time.monotonic() + TRAINING_TIMEOUT_SECONDS
            while training.running() and time.monotonic() < deadline:
                status = _status(_trainjob(kube_api, namespace))
                if status is not None and (not seen or status != seen[-1]):
                    seen.append(status)
                time.sleep(0.2)
            assert training.wait(timeout=30) == 0, training.log_tail()
        finally:
            training.stop()

        # The pod ends; the kubelet copies the exporter's final status into the pod status.
        message = Path(training.extra["termination_log"]).read_text()
        assert 0 < len(message.encode()) <= 4096
        final = TrainerStatus.from_json(message)
        terminate_pod(kube_api, namespace, pod.metadata.name, message)
        deadline = time.monotonic() + FINAL_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            status = _status(_trainjob(kube_api, namespace))
            if status == final:
                break
            time.sleep(0.3)
        assert status == final, f"final status never landed: {status} != {final}"
        if seen[-1] != final:
            seen.append(final)

        # Progress only goes forward and ends at the final reported value, 100.
        progress = [s.progress_percentage for s in seen if s.progress_percentage is not None]
        assert progress == sorted(progress), progress
        assert progress[-1] == final.progress_percentage == 100
        assert len(set(progress)) >= 2, f"only saw {progress}: no live progress"
        # lastUpdatedTime moves.
        times = [s.last_updated_time for s in seen]
        assert times == sorted(times) and len(set(times)) >= 2, times

        # The loss in the TrainJob is a loss the training logged, exactly as logged.
        logged_losses = _logged(Path(training.extra["metrics_log"]), "loss")
        assert logged_losses, "training logged no loss"
        status_losses = [s.metrics_dict()["loss"] for s in seen if "loss" in s.metrics_dict()]
        assert status_losses, f"no loss reached the TrainJob: {seen[-1]}"
        assert set(status_losses) <= set(logged_losses), (status_losses, logged_losses)
        assert final.metrics_dict()["loss"] == logged_losses[-1]

        # kubectl: the printer column shows the progress.
        table = control_plane.kubectl("get", "trainjob", TRAINJOB, "-n", namespace).stdout
        header, row = table.splitlines()[:2]
        column = header.index("PROGRESS")  # columns are aligned; an empty STATE has no word
        assert row[column:].split()[0] == "100", table
        jsonpath = control_plane.kubectl(
            "get", "trainjob", TRAINJOB, "-n", namespace, "-o",
            "jsonpath={.status.trainerStatus}").stdout
        assert TrainerStatus.from_json(jsonpath) == final

        # The Kubeflow SDK reads the same trainer status.  kubeflow 0.5's TrainerClient
        # .get_job() returns a TrainJob type without trainerStatus (and needs a
        # ClusterTrainingRuntime), so the status is read with the SDK's own backend
        # client and parsed with its generated API model.
        from kubeflow.common.types import KubernetesBackendConfig
        from kubeflow.trainer import TrainerClient
        from kubeflow_trainer_api import models

        sdk = TrainerClient(backend_config=KubernetesBackendConfig(
            namespace=namespace, config_file=str(control_plane.kubeconfig_path)))
        raw = sdk.backend.custom_api.get_namespaced_custom_object(  # type: ignore[attr-defined]
            API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, TRAINJOB)
        sdk_status = models.TrainerV1alpha1TrainJob.from_dict(raw).status.trainer_status
        assert sdk_status.progress_percentage == 100
        assert {m.name: m.value for m in sdk_status.metrics or []} == final.metrics_dict()

        # Prometheus, scraping the scraper, returns this TrainJob's progress.
        selector = f'namespace="{namespace}",trainjob="{TRAINJOB}"'
        result = prometheus.wait_for_data(
            f"max_over_time(trainjob_progress_ratio{{{selector}}}[10m])",
            timeout=30, predicate=lambda r: bool(r) and float(r[0]["value"][1]) == 1.0)
        assert float(result[0]["value"][1]) == 1.0
