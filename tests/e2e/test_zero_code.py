"""Zero-code progress on the real stack: the shipped runtime overlay, an unmodified training.

The overlay (``charts/runtime-overlays/zero-code``, a kustomize Component) is rendered
with the real ``kubectl kustomize`` onto Trainer v2.3.0's shipped ``torch-distributed``
runtime and created as its own ClusterTrainingRuntime.  A TrainJob on it runs
``localdev.demo.train_unmodified``: torch and Transformers only, ``report_to`` at its
default.  Trainer -> JobSet -> Job make the pod; the pod runner starts the exporter
sidecar (native: ``restartPolicy: Always`` init container), waits for its
startupProbe, starts the trainer; Transformers' own ``KubeflowCallback`` pushes to the
sidecar; the scraper (its own process) scrapes the sidecar and, after the pod ended,
applies the final status from the sidecar's termination message.

What is not real: kwok and the pod runner stand in for the kubelet and container
runtime (no images: the sidecar's ``python`` is this interpreter, set by a patch in
the test's own kustomization, as a user sets the image).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TrainerStatus
from localdev.cluster import trainjobs
from localdev.cluster.stack import Cluster
from tests.helpers.stack import python_command, recording, scraper

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "charts" / "runtime-overlays" / "zero-code"
RUNTIME = "torch-distributed-zero-code"
TRAINJOB = "zero-code"
SIDECAR = "trainjob-exporter"
TRAINING_TIMEOUT_SECONDS = 420
FINAL_TIMEOUT_SECONDS = 60
POD_TEMPLATE = "/spec/template/spec/replicatedJobs/0/template/spec/template/spec"


def render(cluster: Cluster, workdir: Path) -> dict[str, Any]:
    """The overlay on the shipped torch-distributed runtime, as a user's kustomization."""
    manifests = cluster.assets.manifests
    assert manifests is not None
    shutil.copy(manifests / "trainer" / "runtimes" / "torch_distributed.yaml", workdir)
    (workdir / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["torch_distributed.yaml"],
        # kustomize takes components by relative path only.
        "components": [os.path.relpath(OVERLAY, workdir)],
        "nameSuffix": "-zero-code",
        "images": [{"name": "trainjob-exporter", "newName": "localhost/trainjob-exporter",
                    "newTag": "dev"}],
        "patches": [{"target": {"kind": "ClusterTrainingRuntime"}, "patch": json.dumps([
            {"op": "replace", "path": f"{POD_TEMPLATE}/initContainers/0/command/0",
             "value": sys.executable}])}],
    }))
    [runtime] = [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(workdir)).stdout)
                 if d]
    return dict(runtime)


def _explain(cluster: Cluster, pod: client.V1Pod) -> str:
    """The pod's container statuses and the tails of its container logs (pod runner)."""
    meta = pod.metadata
    logs = sorted((cluster.workdir / "pods").glob(f"{meta.namespace}_{meta.name}_*.log"))
    logs.append(cluster.workdir / "pod-runner.log")
    tails = "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-15:])
                      for p in logs)
    return f"{pod.status.init_container_statuses}\n{pod.status.container_statuses}\n{tails}"


def _logged_losses(path: Path) -> list[str]:
    return [repr(e["loss"]) if isinstance(e["loss"], float) else str(e["loss"])
            for e in map(json.loads, path.read_text().splitlines()) if "loss" in e]


def test_unmodified_transformers_training_reports_through_the_sidecar(
    kube_stack: Cluster, stack_api: client.ApiClient, stack_namespace: str, tmp_path: Path,
) -> None:
    runtime = render(kube_stack, tmp_path)
    assert runtime["metadata"]["name"] == RUNTIME
    pod_spec = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"]
    [sidecar] = pod_spec["spec"]["initContainers"]
    assert (sidecar["name"], sidecar["restartPolicy"]) == (SIDECAR, "Always")
    assert sidecar["image"] == "localhost/trainjob-exporter:dev"
    assert pod_spec["metadata"]["annotations"] == {"trainjob-progress.dev/port": "28080"}

    custom = client.CustomObjectsApi(stack_api)
    custom.create_cluster_custom_object(API_GROUP, API_VERSION, "clustertrainingruntimes",
                                        runtime)
    namespace = stack_namespace
    log_file = tmp_path / "training-log.jsonl"
    command = python_command("localdev.demo.train_unmodified", "--epochs", "2",
                             "--samples", "256", "--log-file", str(log_file))
    try:
        with scraper(kube_stack, namespace, tmp_path) as _, \
                recording(stack_api, namespace, TRAINJOB) as recorder:
            created = trainjobs.create(stack_api, trainjobs.trainjob_body(
                namespace, TRAINJOB, runtime=RUNTIME, command=command,
                env={"PYTHONUNBUFFERED": "1"}))
            finished = trainjobs.wait_finished(stack_api, namespace, TRAINJOB,
                                               TRAINING_TIMEOUT_SECONDS)
            [pod] = trainjobs.pods(stack_api, namespace, TRAINJOB)
            [exporter] = pod.status.init_container_statuses
            [trainer] = pod.status.container_statuses
            assert trainjobs.condition(finished, "Complete"), (finished.get("status"), trainer)
            assert trainer.state.terminated is not None, _explain(kube_stack, pod)
            assert trainer.state.terminated.exit_code == 0, _explain(kube_stack, pod)
            # The training itself leaves no status: it has no exporter_lib in it.
            assert not trainer.state.terminated.message
            # The sidecar got SIGTERM after the trainer and left the last push.
            assert exporter.name == SIDECAR and exporter.restart_count == 0
            ended = exporter.state.terminated
            assert ended.finished_at >= trainer.state.terminated.finished_at
            final = TrainerStatus.from_json(ended.message)
            assert final.progress_percentage == 100

            seen = recorder.statuses_through(
                final, created["metadata"]["uid"], FINAL_TIMEOUT_SECONDS,
                "the sidecar's final status applied by the scraper")
            progress = [s.progress_percentage for s in seen if s.progress_percentage is not None]
            assert progress == sorted(progress), progress
            # Live: values below 100 came from scrapes while the training ran.
            assert len({p for p in progress if p < 100}) >= 1, progress
            assert len(seen) >= 2, seen

            logged = _logged_losses(log_file)
            assert logged, "training logged no loss"
            losses = [s.metrics_dict()["loss"] for s in seen if "loss" in s.metrics_dict()]
            assert losses and set(losses) <= set(logged), (losses, logged)
            # The callback's last push: 100, no time left, every metric it saw logged.
            assert final.estimated_remaining_seconds == 0
            assert final.metrics_dict()["loss"] == logged[-1]
            assert "train_loss" in final.metrics_dict()
    finally:
        custom.delete_cluster_custom_object(API_GROUP, API_VERSION, "clustertrainingruntimes",
                                            RUNTIME)
