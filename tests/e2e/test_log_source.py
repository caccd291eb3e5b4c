"""Zero-code progress from the training's own output, on the real stack.

A ClusterTrainingRuntime derived from the shipped ``torch-distributed`` carries the
pod annotation ``trainjob-progress.dev/source: logs``.  TrainJobs on it run the
trainings of ``tests/trainings`` (each imports nothing of this project: tqdm, Keras
with the torch backend, Lightning, the Transformers Trainer, Katib-style lines).
Trainer -> JobSet -> Job make the pod; the pod runner stores its output in CRI format;
the scraper (its own process, ``--log-source``) reads it through the API server's
pods/log, answered by kwok's kubelet endpoint, and writes ``trainerStatus``; after
the pod ended, the final status from the last lines.  What is not real: kwok and the
pod runner stand in for the kubelet and the container runtime.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TrainerStatus
from localdev.cluster import trainjobs
from localdev.cluster.runtimes import LOG_SOURCE, annotated_runtime
from localdev.cluster.stack import Cluster
from tests.helpers.stack import TrainJobRecorder, recording, scraper, scraper_metric

REPO = Path(__file__).resolve().parents[2]
RUNTIME = "torch-distributed-logs"
TIMEOUT_SECONDS = 300
FINAL_TIMEOUT_SECONDS = 60

#: script, environment, metric names the final status must hold, whether progress is read
#: while the training runs (a \n bar, or a \r bar past one 16 KiB entry).
CASES = {
    "tqdm": ("tqdm_loop.py", {"STEPS": "400", "SLEEP": "0.01", "MININTERVAL": "0"},
             {"loss", "lr"}, True),
    "tqdm_auto": ("tqdm_loop.py", {"STEPS": "60", "SLEEP": "0.01", "TQDM_AUTO": "1",
                                   "EVAL_EVERY": "20"}, {"loss", "lr"}, False),
    "keras_verbose2": ("keras_fit.py", {"VERBOSE": "2", "EPOCHS": "4", "STEPS": "4",
                                        "SLEEP": "0.4"}, {"loss", "accuracy"}, True),
    "keras_verbose1": ("keras_fit.py", {"VERBOSE": "1", "EPOCHS": "3", "STEPS": "6",
                                        "SLEEP": "0.3"}, {"loss", "accuracy"}, True),
    "transformers": ("transformers_trainer.py", {"STEPS": "16", "SLEEP": "0.2",
                                                 "EVAL_STEPS": "8"},
                     {"loss", "learning_rate", "eval_loss", "train_loss"}, True),
    "lightning": ("lightning_bar.py", {"EPOCHS": "2", "STEPS": "4"},
                  {"train_loss", "val_loss"}, False),
    "katib": ("katib_lines.py", {"EPOCHS": "4", "SLEEP": "1"}, {"loss", "accuracy"}, True),
}


def progress_in_every_version(recorder: TrainJobRecorder, uid: str) -> list[int]:
    """Checks every version of the TrainJob the watch saw: once one has progress, every
    later one has it too, never lower (a version without it, or with a lower one, is
    what issue 27 saw).  Returns the progress of each version that has it."""
    progress: list[int] = []
    for observation in list(recorder.seen):
        if observation.uid != uid or observation.event == "DELETED":
            continue
        status = observation.status
        value = None if status is None else status.progress_percentage
        if progress:
            assert value is not None, (f"version {observation.resource_version} has no "
                                       f"progress after {progress}: {status}")
            assert value >= progress[-1], (progress, value)
        if value is not None:
            progress.append(value)
    return progress


@pytest.fixture(scope="module")
def logs_runtime(kube_stack: Cluster) -> Iterator[str]:
    manifests = kube_stack.assets.manifests
    assert manifests is not None
    custom = client.CustomObjectsApi(kube_stack.api_client())
    custom.create_cluster_custom_object(API_GROUP, API_VERSION, "clustertrainingruntimes",
                                        annotated_runtime(manifests, RUNTIME, LOG_SOURCE))
    try:
        yield RUNTIME
    finally:
        custom.delete_cluster_custom_object(API_GROUP, API_VERSION, "clustertrainingruntimes",
                                            RUNTIME)


@pytest.mark.parametrize("case", sorted(CASES))
def test_unmodified_training_reports_from_its_log(
    kube_stack: Cluster, stack_api: client.ApiClient, stack_namespace: str,
    logs_runtime: str, tmp_path: Path, case: str,
) -> None:
    script, env, names, live = CASES[case]
    namespace, name = stack_namespace, case.replace("_", "-")
    command = [sys.executable, str(REPO / "tests" / "trainings" / script)]
    with scraper(kube_stack, namespace, tmp_path, ["--log-source"]) as child, \
            recording(stack_api, namespace, name) as recorder:
        created = trainjobs.create(stack_api, trainjobs.trainjob_body(
            namespace, name, runtime=logs_runtime, command=command,
            env={"PYTHONUNBUFFERED": "1", "KERAS_BACKEND": "torch",
                 "OUTPUT_DIR": str(tmp_path / "out"), **env}))
        finished = trainjobs.wait_finished(stack_api, namespace, name, TIMEOUT_SECONDS)
        assert trainjobs.condition(finished, "Complete"), finished.get("status")
        [pod] = trainjobs.pods(stack_api, namespace, name)
        [trainer] = pod.status.container_statuses
        assert not trainer.state.terminated.message  # no exporter, no termination message

        def done(status: TrainerStatus | None) -> bool:
            return status is not None and names <= set(status.metrics_dict()) and (
                case == "katib" or status.progress_percentage == 100)

        final = recorder.wait_for(lambda o: done(o.status), FINAL_TIMEOUT_SECONDS,
                                  f"{case}: the final status from the log").status
        assert final is not None
        seen = recorder.statuses(created["metadata"]["uid"])
        progress = progress_in_every_version(recorder, created["metadata"]["uid"])
        if live and case != "katib":
            assert any(p < 100 for p in progress), progress  # read while it ran
        if live and case == "katib":
            assert len({s.metrics_dict().get("loss") for s in seen}) >= 2, seen
        reads = scraper_metric(child, "trainjob_scraper_log_reads_total")
        assert 'result="ok"' in reads, reads
        assert "trainjob_scraper_log_parse_failures_total 0.0" in scraper_metric(
            child, "trainjob_scraper_log_parse_failures_total")


@pytest.mark.parametrize("source", ["logs", "auto"])
def test_trainjob_annotation_selects_the_log_for_its_pods(
    kube_stack: Cluster, stack_api: client.ApiClient, stack_namespace: str, tmp_path: Path,
    source: str,
) -> None:
    """The shipped runtime as is; the TrainJob itself carries the source annotation
    (``auto``: nothing listens on the exporter port, so the log is read)."""
    namespace, name = stack_namespace, f"annotated-{source}"
    body = trainjobs.trainjob_body(
        namespace, name, command=[sys.executable, str(REPO / "tests" / "trainings" /
                                                      "tqdm_loop.py")],
        env={"PYTHONUNBUFFERED": "1", "STEPS": "30", "SLEEP": "0.05"})
    body["metadata"]["annotations"] = {**LOG_SOURCE, "trainjob-progress.dev/source": source}
    with scraper(kube_stack, namespace, tmp_path, ["--log-source"]), \
            recording(stack_api, namespace, name) as recorder:
        trainjobs.create(stack_api, body)
        finished = trainjobs.wait_finished(stack_api, namespace, name, TIMEOUT_SECONDS)
        assert trainjobs.condition(finished, "Complete"), finished.get("status")
        [pod] = trainjobs.pods(stack_api, namespace, name)
        assert "trainjob-progress.dev/source" not in (pod.metadata.annotations or {})
        final = recorder.wait_for(
            lambda o: o.status is not None and o.status.progress_percentage == 100,
            FINAL_TIMEOUT_SECONDS, "the final status from the log").status
        assert final is not None and "loss" in final.metrics_dict()


def test_live_tqdm_bar_with_postfix_keeps_its_progress_in_every_version(
    kube_stack: Cluster, stack_api: client.ApiClient, stack_namespace: str,
    logs_runtime: str, tmp_path: Path,
) -> None:
    """Issue 27, point 2, as reported: ``tqdm(total=2000, desc="train", mininterval=0)``,
    then 2000 times ``sleep(0.01)``, ``update(1)`` and ``set_postfix(loss=...,
    refresh=False)``, read with ``--log-source --interval=1s``.  The bar redraws only
    with ``\r``: the runtime stores it in 16 KiB partial entries that the kubelet joins
    behind one timestamp, and the reads overlap.  Before, re-read redraws made the bar
    "start again" and versions carried metrics only.  Now every version the watch sees,
    from the first with progress on, has progress, never lower; it was read while the
    bar ran; the run ends at 100 with the last loss."""
    namespace, name = stack_namespace, "tqdm-postfix"
    command = [sys.executable, str(REPO / "tests" / "trainings" / "tqdm_loop.py")]
    with scraper(kube_stack, namespace, tmp_path, ["--log-source"]) as child, \
            recording(stack_api, namespace, name) as recorder:
        created = trainjobs.create(stack_api, trainjobs.trainjob_body(
            namespace, name, runtime=logs_runtime, command=command,
            env={"PYTHONUNBUFFERED": "1", "MANUAL": "1", "STEPS": "2000", "SLEEP": "0.01",
                 "MININTERVAL": "0"}))
        finished = trainjobs.wait_finished(stack_api, namespace, name, TIMEOUT_SECONDS)
        assert trainjobs.condition(finished, "Complete"), finished.get("status")
        final = recorder.wait_for(
            lambda o: o.status is not None and o.status.progress_percentage == 100,
            FINAL_TIMEOUT_SECONDS, "the final status from the log").status
        assert final is not None and final.metrics_dict()["loss"] == f"{1 / 2000:.4f}"
        uid = created["metadata"]["uid"]
        progress = progress_in_every_version(recorder, uid)
        print(f"progress of every version with it: {progress}")
        live = [p for p in progress if p < 100]
        assert len(set(live)) >= 3, progress  # read while the bar ran, many times
        assert "trainjob_scraper_log_parse_failures_total 0.0" in scraper_metric(
            child, "trainjob_scraper_log_parse_failures_total")
