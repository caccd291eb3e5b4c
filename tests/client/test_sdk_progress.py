"""The notebook helpers with the real Kubeflow SDK (``kubeflow`` 0.5) against the API server.

``TrainerClient.wait_for_job_status`` runs unchanged and calls our callback on every
poll; the trainer status is written by server-side apply while it waits, as the
scraper writes it.  The SDK resolves the TrainJob's runtime on every ``get_job``, so a
ClusterTrainingRuntime exists (fixture ``cluster_training_runtime``).
"""

from __future__ import annotations

import io
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubeflow.common.types import KubernetesBackendConfig
from kubeflow.trainer import TrainerClient
from kubeflow_trainer_api.models import TrainerV1alpha1Metric, TrainerV1alpha1TrainerStatus
from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL, TrainerStatus, now
from localdev.cluster.controlplane import ControlPlane
from tests.helpers.client import apply_status, condition
from trainjob_client import ProgressCallback, get_trainer_status
from trainjob_client.annotation import TRAINER_STATUS_ANNOTATION, encode_annotation
from trainjob_client.kube import TrainJobForbidden, TrainJobNotFound
from trainjob_client.progress import STALLED_SINCE_ANNOTATION


def _status(percent: int, eta: int, **metrics: str) -> dict[str, object]:
    return {"progressPercentage": percent, "estimatedRemainingSeconds": eta,
            "lastUpdatedTime": now().isoformat(),
            "metrics": [{"name": k, "value": v} for k, v in metrics.items()]}


def test_get_trainer_status_returns_the_trainer_api_model(
        sdk: TrainerClient, kube_api: client.ApiClient, namespace: str, trainjob: str) -> None:
    assert get_trainer_status(trainjob, sdk) is None, "no status reported yet"
    written = _status(42, 310, loss="0.173", accuracy="0.91")
    apply_status(kube_api, namespace, trainjob, trainerStatus=written)

    got = get_trainer_status(trainjob, sdk)
    assert isinstance(got, TrainerV1alpha1TrainerStatus)
    assert (got.progress_percentage, got.estimated_remaining_seconds) == (42, 310)
    assert got.metrics == [TrainerV1alpha1Metric(name="loss", value="0.173"),
                           TrainerV1alpha1Metric(name="accuracy", value="0.91")]
    assert got.last_updated_time == TrainerStatus.from_api(written).last_updated_time

    with pytest.raises(TrainJobNotFound, match=f'"nope" not found in namespace "{namespace}"'):
        get_trainer_status("nope", sdk)


def test_get_trainer_status_reads_the_annotation_on_a_trainer_before_v2_2(
        sdk: TrainerClient, kube_api: client.ApiClient, legacy_trainjob_crd: None,
        namespace: str) -> None:
    from localdev.cluster import objects

    objects.create_trainjob(kube_api, namespace, "old")
    reported = TrainerStatus.from_api(_status(70, 20, loss="0.25"))
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, "old",
        {"metadata": {"annotations": {TRAINER_STATUS_ANNOTATION: encode_annotation(reported)}}})
    got = get_trainer_status("old", sdk)
    assert got is not None and got.progress_percentage == 70
    assert got.to_dict() == TrainerV1alpha1TrainerStatus.from_dict(reported.to_api()).to_dict()


def test_get_trainer_status_forbidden_names_the_identity(
        control_plane: ControlPlane, cluster_training_runtime: str, namespace: str,
        trainjob: str, tmp_path: Path) -> None:
    token = control_plane.service_account_token(namespace, "notebook", expiration_seconds=600)
    kubeconfig = control_plane.kubeconfig_for_token(token, tmp_path / "notebook.kubeconfig")
    restricted = TrainerClient(backend_config=KubernetesBackendConfig(
        namespace=namespace, config_file=str(kubeconfig)))
    with pytest.raises(TrainJobForbidden,
                       match=f"system:serviceaccount:{namespace}:notebook"):
        get_trainer_status(trainjob, restricted)


def test_progress_callback_draws_the_bar_during_wait_for_job_status(
        sdk: TrainerClient, kube_api: client.ApiClient, namespace: str, trainjob: str) -> None:
    # The statuses a training reports while the SDK waits, then the Complete condition.
    # Each is written once the bar has shown the previous one, so no poll is missed
    # however slow the shared machine is.
    steps = [_status(25, 90, loss="2.0"), _status(60, 40, loss="1.1"),
             _status(100, 0, loss="0.4")]
    polls: list[int] = []
    shown = threading.Condition()
    stop = threading.Event()

    def record(job: object) -> None:
        with shown:
            polls.append(int(callback.bars[job.name].n))  # type: ignore[attr-defined]
            shown.notify_all()

    def train() -> None:
        for body in steps:
            with shown:
                shown.wait_for(lambda: bool(polls) or stop.is_set(), timeout=30)
            if stop.is_set():
                return
            apply_status(kube_api, namespace, trainjob, trainerStatus=body)
            percent = int(str(body["progressPercentage"]))
            with shown:
                shown.wait_for(lambda p=percent: (bool(polls) and polls[-1] == p)
                               or stop.is_set(), timeout=30)
        if not stop.is_set():
            apply_status(kube_api, namespace, trainjob, trainerStatus=steps[-1],
                         conditions=[condition("Complete")])

    out = io.StringIO()
    callback = ProgressCallback(sdk, metrics=["loss"], file=out, mininterval=0)
    writer = threading.Thread(target=train, daemon=True)
    writer.start()
    try:
        job = sdk.wait_for_job_status(trainjob, timeout=120, polling_interval=1,
                                      callbacks=[callback, record])
    finally:
        stop.set()
        with shown:
            shown.notify_all()
        writer.join(timeout=30)
    assert job.status == "Complete"
    bar = callback.bars[trainjob]
    assert bar.closed and bar.n == 100
    assert polls == sorted(polls) and set(polls) == {0, 25, 60, 100}, polls
    drawn = out.getvalue()
    # tqdm's text bar (no notebook here): the trainer's ETA and the loss as reported.
    assert f"{trainjob}: 100%|" in drawn and "Complete" in drawn, drawn
    assert "ETA 01:30" in drawn and "loss=2.0" in drawn and "loss=0.4" in drawn, drawn


def test_progress_callback_shows_a_missing_status_without_stopping_the_wait(
        sdk: TrainerClient, kube_api: client.ApiClient, namespace: str, trainjob: str) -> None:
    out = io.StringIO()
    callback = ProgressCallback(sdk, file=out, mininterval=0)
    with pytest.raises(TimeoutError):
        sdk.wait_for_job_status(trainjob, timeout=3, polling_interval=1, callbacks=[callback])
    callback.close()
    assert callback.bars[trainjob].n == 0
    assert "no trainer status yet" in out.getvalue(), out.getvalue()


def test_progress_callback_says_a_running_training_is_stalled(
        sdk: TrainerClient, kube_api: client.ApiClient, namespace: str, trainjob: str) -> None:
    """A running TrainJob has no True condition (the SDK's own state is shown) and the
    scraper's stalled-since annotation: the bar says "stalled for N min" after the state
    (the annotation written as the scraper writes it, a merge patch of that key; the
    scraper's own write on the real stack: tests/e2e/test_stall_stack.py)."""
    apply_status(kube_api, namespace, trainjob, trainerStatus=_status(42, 310, loss="0.2"))
    since = (datetime.now(UTC) - timedelta(minutes=14, seconds=20)).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob,
        {"metadata": {"annotations": {STALLED_SINCE_ANNOTATION: since}}})
    out = io.StringIO()
    callback = ProgressCallback(sdk, metrics=["loss"], file=out, mininterval=0)
    job = sdk.get_job(trainjob)
    callback(job)
    callback.close()
    drawn = out.getvalue()
    assert f"{job.status}, stalled for 14 min, ETA 05:10, loss=0.2" in drawn, drawn
