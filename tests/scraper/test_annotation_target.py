"""``--status-target annotation|auto`` against the real API server with the TrainJob CRD of
Trainer before v2.2 (no ``status.trainerStatus``): the status lands in the annotation
``trainjob-progress.dev/trainer-status`` by server-side apply on the main resource."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from exporter_lib.api import Exporter
from exporter_lib.state import State
from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL, TrainerStatus
from exporter_lib.status_annotation import TRAINER_STATUS_ANNOTATION, decode_annotation
from localdev.cluster import objects
from localdev.cluster.crds import install_trainjob_crds
from scraper.kube.apply_request import APPLY_CONTENT_TYPE, encode_apply_body
from scraper.shared.outcome import FIELD_MANAGER, WriteOutcome
from scraper.shared.trainjobs import TrainJobRecord
from scraper.write.annotation_target import (
    Place,
    StatusTarget,
    apply_request,
    place_for,
    uid_precondition_failed,
)
from tests.helpers.scraper import (
    ANNOTATION_RULES,
    ScraperProcess,
    events,
    resource_version,
    scraper_service_account,
    trainer_status,
    wait_for,
)
from tests.helpers.writer import running_writer


def _status(progress: int, loss: str = "0.5") -> TrainerStatus:
    return TrainerStatus.from_api({
        "progressPercentage": progress, "metrics": [{"name": "loss", "value": loss}],
        "lastUpdatedTime": datetime(2025, 1, 1, tzinfo=UTC)})


def _trainjob(kube_api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, name)
    return obj


def annotated(kube_api: client.ApiClient, namespace: str, name: str) -> TrainerStatus | None:
    value = (_trainjob(kube_api, namespace, name)["metadata"].get("annotations") or {}).get(
        TRAINER_STATUS_ANNOTATION)
    return None if value is None else decode_annotation(value)


def _merge_annotation(kube_api: client.ApiClient, namespace: str, name: str,
                      value: str | None) -> None:
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, name,
        {"metadata": {"annotations": {TRAINER_STATUS_ANNOTATION: value}}})


@pytest.mark.parametrize(("target", "supported", "place"), [
    (StatusTarget.STATUS, None, Place.STATUS), (StatusTarget.STATUS, False, Place.STATUS),
    (StatusTarget.STATUS, True, Place.STATUS),
    (StatusTarget.ANNOTATION, None, Place.ANNOTATION),
    (StatusTarget.ANNOTATION, False, Place.ANNOTATION),
    (StatusTarget.ANNOTATION, True, Place.ANNOTATION),
    # auto: the annotation only once the CRD is known to lack the field.
    (StatusTarget.AUTO, None, Place.STATUS), (StatusTarget.AUTO, False, Place.ANNOTATION),
    (StatusTarget.AUTO, True, Place.STATUS),
])
def test_where_each_target_writes(target: StatusTarget, supported: bool | None,
                                  place: Place) -> None:
    assert place_for(target, supported) is place


def test_the_annotation_body_holds_only_identity_and_the_one_annotation() -> None:
    path, params, body = apply_request(Place.ANNOTATION, "ns", "tj", _status(7), "u-1")
    assert path.format(**params) == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/tj"
    assert body == {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                    "metadata": {"name": "tj", "namespace": "ns", "uid": "u-1", "annotations": {
                        TRAINER_STATUS_ANNOTATION: _status(7).to_json().decode()}}}
    path, params, body = apply_request(Place.STATUS, "ns", "tj", _status(7), "u-1")
    assert path.format(**params).endswith("/trainjobs/tj/status")
    assert body["metadata"] == {"name": "tj", "namespace": "ns"}
    assert body["status"] == {"trainerStatus": _status(7).to_api()}


async def test_annotation_written_only_on_change_owned_by_the_field_manager(
        kube_api: client.ApiClient, namespace: str, legacy_trainjob_crd: None) -> None:
    objects.create_trainjob(kube_api, namespace, "old")
    spec = _trainjob(kube_api, namespace, "old")["spec"]
    async with running_writer(kube_api, namespace, target=StatusTarget.ANNOTATION) as (w, _):
        assert await w.crd.check() is False  # the legacy CRD: irrelevant to this mode
        assert await w.apply_and_wait(namespace, "old", _status(30)) is WriteOutcome.WRITTEN
        assert annotated(kube_api, namespace, "old") == _status(30)
        rv = resource_version(kube_api, namespace, "old")
        # Same values, a later lastUpdatedTime: no news, no request.
        later = TrainerStatus.from_api({**_status(30).to_api(),
                                        "lastUpdatedTime": "2025-01-01T00:05:00Z"})
        assert await w.apply_and_wait(namespace, "old", later) is WriteOutcome.UNCHANGED
        assert resource_version(kube_api, namespace, "old") == rv
        final = _status(100, loss="0.1")
        assert await w.apply_and_wait(namespace, "old", final, final=True) is \
            WriteOutcome.WRITTEN
    obj = _trainjob(kube_api, namespace, "old")
    assert decode_annotation(obj["metadata"]["annotations"][TRAINER_STATUS_ANNOTATION]) == final
    assert obj["spec"] == spec and "trainerStatus" not in (obj.get("status") or {})
    ours = [m for m in obj["metadata"]["managedFields"] if m["manager"] == FIELD_MANAGER]
    assert [(m["operation"], m.get("subresource")) for m in ours] == [("Apply", None)]
    assert ours[0]["fieldsV1"] == {"f:metadata": {"f:annotations": {
        f"f:{TRAINER_STATUS_ANNOTATION}": {}}}}
    # Nothing to warn about: the status is stored, only elsewhere.
    assert [e.reason for e in events(kube_api, namespace, "old")] == []


async def _until(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll in a thread: the writer under test runs on this event loop."""
    await asyncio.to_thread(wait_for, predicate, seconds, what)


async def test_annotation_drift_is_restored_like_status(
        kube_api: client.ApiClient, namespace: str, legacy_trainjob_crd: None) -> None:
    """A removed annotation is restored; one another writer replaced is that writer's
    (docs/scraper.md, "Other writers and time": its ``lastUpdatedTime`` is data, not an
    order), until a report that changed after it, once that writer is quiet."""
    objects.create_trainjob(kube_api, namespace, "drift")
    async with running_writer(kube_api, namespace, target=StatusTarget.ANNOTATION,
                              other_writer_grace=1.0) as (w, _):
        assert await w.apply_and_wait(namespace, "drift", _status(40)) is WriteOutcome.WRITTEN
        _merge_annotation(kube_api, namespace, "drift", None)  # someone removes it
        await _until(lambda: annotated(kube_api, namespace, "drift") == _status(40), 10,
                     "the removed annotation restored")
        older = TrainerStatus.from_api({**_status(5).to_api(),
                                        "lastUpdatedTime": "2024-01-01T00:00:00Z"})
        _merge_annotation(kube_api, namespace, "drift", older.to_json().decode())
        await _until(lambda: (w.store.get(namespace, "drift") or TrainJobRecord("", None)).annotated
                     == older, 10, "the other writer's annotation in the informer")
        await asyncio.sleep(1.5)
        assert annotated(kube_api, namespace, "drift") == older  # kept: not restored
        seen_before = w.store.clock() - 100.0  # content older than the other writer's write
        assert await w.apply(namespace, "drift", _status(40),
                             seen=seen_before) is WriteOutcome.DEFERRED
        assert await w.apply_and_wait(namespace, "drift", _status(41)) is WriteOutcome.WRITTEN
        assert annotated(kube_api, namespace, "drift") == _status(41)


async def test_auto_uses_the_annotation_until_the_crd_has_trainer_status(
        kube_api: client.ApiClient, namespace: str, legacy_trainjob_crd: None) -> None:
    objects.create_trainjob(kube_api, namespace, "auto")
    async with running_writer(kube_api, namespace, target=StatusTarget.AUTO) as (w, _):
        # CRD not read (as without permission): the first apply to the status is refused
        # as undeclared, and the same status goes to the annotation at once.
        assert w.crd.supported is None and w.place() is Place.STATUS
        assert await w.apply_and_wait(namespace, "auto", _status(10)) is WriteOutcome.WRITTEN
        assert w.crd.supported is False and w.place() is Place.ANNOTATION
        assert annotated(kube_api, namespace, "auto") == _status(10)
        assert trainer_status(kube_api, namespace, "auto") is None
        assert [e.reason for e in events(kube_api, namespace, "auto")] == []

        install_trainjob_crds(kube_api, legacy=False)  # Trainer upgraded to v2.2+
        assert await w.crd.check() is True and w.place() is Place.STATUS
        assert await w.apply_and_wait(namespace, "auto", _status(20)) is WriteOutcome.WRITTEN
        assert trainer_status(kube_api, namespace, "auto") == _status(20).to_api()
        # The annotation keeps the last value it got (readers take the later one).
        assert annotated(kube_api, namespace, "auto") == _status(10)


async def test_status_target_on_a_legacy_crd_still_stores_nothing(
        kube_api: client.ApiClient, namespace: str, legacy_trainjob_crd: None) -> None:
    objects.create_trainjob(kube_api, namespace, "plain")
    async with running_writer(kube_api, namespace) as (w, _):
        assert await w.apply_and_wait(namespace, "plain", _status(10)) is \
            WriteOutcome.NOT_STORED
    assert annotated(kube_api, namespace, "plain") is None
    (event,) = events(kube_api, namespace, "plain")
    assert event.reason == "TrainerStatusUnsupported"
    assert "--status-target auto" in event.message


@pytest.mark.usefixtures("legacy_trainjob_crd")
def test_the_annotation_apply_carries_a_uid_precondition(
        kube_api: client.ApiClient, namespace: str) -> None:
    """Measured: on the main resource ``metadata.uid`` is checked (unlike on /status)."""
    objects.create_trainjob(kube_api, namespace, "uid")

    def apply(name: str, uid: str) -> client.ApiException | None:
        path, params, body = apply_request(Place.ANNOTATION, namespace, name, _status(1), uid)
        try:
            kube_api.call_api(path, "PATCH", params,
                              [("fieldManager", FIELD_MANAGER), ("force", "true")],
                              {"Content-Type": APPLY_CONTENT_TYPE},
                              body=encode_apply_body(body), auth_settings=["BearerToken"],
                              _preload_content=False)
        except client.ApiException as exc:
            return exc
        return None

    recreated = apply("uid", "00000000-0000-0000-0000-000000000000")
    assert recreated is not None and recreated.status == 422, recreated
    assert uid_precondition_failed(recreated)
    deleted = apply("gone", _trainjob(kube_api, namespace, "uid")["metadata"]["uid"])
    assert deleted is not None and deleted.status == 409, deleted
    assert uid_precondition_failed(deleted)
    assert annotated(kube_api, namespace, "uid") is None
    names = [o["metadata"]["name"] for o in client.CustomObjectsApi(kube_api)
             .list_namespaced_custom_object(API_GROUP, API_VERSION, namespace,
                                            TRAINJOB_PLURAL)["items"]]
    assert names == ["uid"], "an apply must never create a TrainJob"


def test_scraper_process_with_least_privilege_writes_progress_and_final_to_the_annotation(
        kube_api: client.ApiClient, namespace: str, control_plane: Any,
        legacy_trainjob_crd: None, tmp_path: Path,
        scraper_factory: Callable[..., ScraperProcess]) -> None:
    state = State()
    termination = tmp_path / "termination-log"
    exp = Exporter(state, state, host="127.0.0.1", port=0, status_file=None,
                   termination_message_path=str(termination), serve=True)
    try:
        assert exp.port is not None
        objects.create_trainjob(kube_api, namespace, "job-a")
        pod = objects.create_trainer_pod(kube_api, namespace, "job-a", port=exp.port)
        state.update(progress_percentage=25, estimated_remaining_seconds=300,
                     metrics={"loss": 0.75})
        with scraper_service_account(kube_api, control_plane, namespace,
                                     extra_rules=ANNOTATION_RULES) as token:
            kubeconfig = control_plane.kubeconfig_for_token(token, tmp_path / "sa.kubeconfig")
            scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}",
                                      "--no-wait-scrapes", "--status-target=annotation",
                                      kubeconfig=kubeconfig)

            def progress() -> int | None:
                held = annotated(kube_api, namespace, "job-a")
                return None if held is None else held.progress_percentage

            wait_for(lambda: progress() == 25, 20, "progress 25 in the annotation")
            assert annotated(kube_api, namespace, "job-a") is not None
            rv = resource_version(kube_api, namespace, "job-a")
            time.sleep(4)  # several scrapes of an unchanged exporter
            assert resource_version(kube_api, namespace, "job-a") == rv
            assert scraper.value("trainjob_scraper_status_writes_total",
                                 result="written") == 1
            state.update(progress_percentage=60, metrics={"loss": 0.5})
            wait_for(lambda: progress() == 60, 20, "progress 60 in the annotation")

            state.update(progress_percentage=100, estimated_remaining_seconds=0,
                         metrics={"loss": 0.1})
            exp.write_final_status()
            exp.stop()
            objects.terminate_pod(kube_api, namespace, pod.metadata.name,
                                  termination.read_text())
            wait_for(lambda: progress() == 100, 20, "final status in the annotation")
            final = annotated(kube_api, namespace, "job-a")
            assert final is not None and final.estimated_remaining_seconds == 0
            assert final.metrics_dict() == {"loss": "0.1"}
            assert trainer_status(kube_api, namespace, "job-a") is None
            assert scraper.value("trainjob_scraper_status_writes_total",
                                 result="failed") == 0
            log = scraper.log()
            assert "status target annotation" in log
            assert " ERROR " not in log, log[-3000:]
            assert scraper.terminate() == 0
    finally:
        exp.stop()
    raw = _trainjob(kube_api, namespace, "job-a")["metadata"]["annotations"][
        TRAINER_STATUS_ANNOTATION]
    assert json.loads(raw) == final.to_api()  # compact JSON as the API stores the status
