"""The whole path with clients nobody on this team wrote, on the real stack.

A TrainJob on the shipped ``torch-distributed`` ClusterTrainingRuntime runs a
real Transformers ``Trainer`` (tiny GPT-2 from a config, CPU, synthetic data) as
its trainer command.  The Trainer, JobSet and Job controllers make the JobSet,
Job and pod, the scheduler binds it to the runner node, the pod runner runs
the command at the pod's IP and reports its end.  The training reports in one
of three ways; the scraper (``trainjob-scraper run`` as its own process)
discovers the rank-0 pod, scrapes the exporter and writes
``status.trainerStatus``; kubectl, the Kubeflow SDK and a real Prometheus
(scraping the scraper) read the result back.

Ways of reporting:

* ``callback``: our ``exporter_lib.callbacks.transformers.ExporterCallback``;
* ``sdk``: the Kubeflow SDK's ``update_trainjob_status`` (push client) posting
  into the exporter's push-compatible endpoint;
* ``builtin``: Transformers' own Kubeflow integration (``report_to="kubeflow"``,
  present in the installed Transformers since its 5.x releases; the test fails,
  rather than skips, where it is missing).

What is not real: kwok plays the kubelet's node and pod bookkeeping and the pod
runner the container runtime (no images, no kubelet can run here).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL, TrainerStatus
from localdev.cluster import trainjobs
from localdev.cluster.prometheus import PrometheusServer, ScrapeTarget
from localdev.cluster.stack import Cluster
from tests.helpers.stack import python_command, recording, scraper

TRAINJOB = "e2e-train"
TRAINING_TIMEOUT_SECONDS = 420
FINAL_TIMEOUT_SECONDS = 60


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
    report: str, kube_stack: Cluster, stack_api: client.ApiClient, stack_namespace: str,
    tmp_path: Path,
) -> None:
    if report == "builtin":
        from transformers.integrations import integration_utils

        assert "kubeflow" in integration_utils.INTEGRATION_TO_CALLBACK, (
            f"transformers {transformers.__version__} has no built-in Kubeflow integration")
    namespace = stack_namespace
    metrics_log = tmp_path / "training-log.jsonl"
    command = python_command("localdev.demo.train_transformers", "--report", report,
                             "--epochs", "2", "--samples", "2048", "--log-file", str(metrics_log))

    with scraper(kube_stack, namespace, tmp_path) as scraper_child, \
            recording(stack_api, namespace, TRAINJOB) as recorder, \
            PrometheusServer([ScrapeTarget("trainjob-scraper",
                                           scraper_child.extra["base_url"].removeprefix("http://"))],
                             scrape_interval=1.0) as prometheus:
        created = trainjobs.create(stack_api, trainjobs.trainjob_body(
            namespace, TRAINJOB, command=command, env={"PYTHONUNBUFFERED": "1"}))
        finished = trainjobs.wait_finished(stack_api, namespace, TRAINJOB,
                                           TRAINING_TIMEOUT_SECONDS)
        [pod] = trainjobs.pods(stack_api, namespace, TRAINJOB)
        terminated = pod.status.container_statuses[0].state.terminated
        assert trainjobs.condition(finished, "Complete"), (finished.get("status"), terminated)
        assert terminated.exit_code == 0, terminated

        # The pod runner reported the exporter's final status as the termination message.
        message = terminated.message
        assert 0 < len(message.encode()) <= 4096
        final = TrainerStatus.from_json(message)
        seen = recorder.statuses_through(final, created["metadata"]["uid"],
                                         FINAL_TIMEOUT_SECONDS,
                                         "the final status applied by the scraper")

        # Progress only goes forward and ends at the final reported value, 100.
        progress = [s.progress_percentage for s in seen if s.progress_percentage is not None]
        assert progress == sorted(progress), progress
        assert progress[-1] == final.progress_percentage == 100
        assert len(set(progress)) >= 2, f"only saw {progress}: no live progress"
        # lastUpdatedTime moves.
        times = [s.last_updated_time for s in seen]
        assert times == sorted(times) and len(set(times)) >= 2, times

        # The loss in the TrainJob is a loss the training logged, exactly as logged.
        logged_losses = _logged(metrics_log, "loss")
        assert logged_losses, "training logged no loss"
        status_losses = [s.metrics_dict()["loss"] for s in seen if "loss" in s.metrics_dict()]
        assert status_losses, f"no loss reached the TrainJob: {seen[-1]}"
        assert set(status_losses) <= set(logged_losses), (status_losses, logged_losses)
        assert final.metrics_dict()["loss"] == logged_losses[-1]

        # kubectl shows the shipped printer columns (upstream has no progress column).
        table = kube_stack.kubectl("get", "trainjob", TRAINJOB, "-n", namespace).stdout
        assert table.split()[:3] == ["NAME", "STATE", "AGE"], table

        # The Kubeflow SDK reads the same trainer status.  kubeflow 0.5's TrainerClient
        # .get_job() returns a TrainJob type without trainerStatus (and needs a
        # ClusterTrainingRuntime), so the status is read with the SDK's own backend
        # client and parsed with its generated API model.
        from kubeflow.common.types import KubernetesBackendConfig
        from kubeflow.trainer import TrainerClient
        from kubeflow_trainer_api import models

        sdk = TrainerClient(backend_config=KubernetesBackendConfig(
            namespace=namespace, config_file=str(kube_stack.kubeconfig_path)))
        # Read back live through the SDK's own client: Trainer v2.3.0's Complete write
        # (a merge patch of its own fields) leaves the final trainerStatus in place.
        sdk_api = sdk.backend.custom_api  # type: ignore[attr-defined]
        raw = sdk_api.get_namespaced_custom_object(
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
