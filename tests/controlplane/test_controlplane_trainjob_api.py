"""The control plane enforces the real TrainJob API: schema, CEL rule, pruning, columns."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from localdev.cluster import objects
from localdev.cluster.controlplane import ControlPlane

FIELD_MANAGER = "trainjob-progress-test"


def apply_status(api: client.ApiClient, namespace: str, name: str,
                 trainer_status: dict[str, Any]) -> dict[str, Any]:
    return objects.apply_trainjob_status(api, namespace, name, {"trainerStatus": trainer_status},
                                         field_manager=FIELD_MANAGER)


def read_trainjob(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, name)
    return result


VALID = {
    "progressPercentage": 42,
    "estimatedRemainingSeconds": 310,
    "metrics": [{"name": "loss", "value": "0.125"}, {"name": "step", "value": "420"}],
    "lastUpdatedTime": "2026-01-02T03:04:05Z",
}


@pytest.mark.usefixtures("trainjob_crd")
def test_status_apply_accepts_valid_trainer_status(kube_api: client.ApiClient,
                                                   namespace: str) -> None:
    objects.create_trainjob(kube_api, namespace, "valid")

    apply_status(kube_api, namespace, "valid", VALID)

    stored = read_trainjob(kube_api, namespace, "valid")
    assert stored["status"]["trainerStatus"] == VALID
    managers = {m["manager"]: m for m in stored["metadata"]["managedFields"]}
    assert managers[FIELD_MANAGER]["subresource"] == "status"
    assert managers[FIELD_MANAGER]["operation"] == "Apply"


@pytest.mark.usefixtures("trainjob_crd")
def test_progress_over_100_is_rejected_with_422_naming_the_field(
        kube_api: client.ApiClient, namespace: str) -> None:
    objects.create_trainjob(kube_api, namespace, "over")

    with pytest.raises(client.ApiException) as caught:
        apply_status(kube_api, namespace, "over", {**VALID, "progressPercentage": 101})

    assert caught.value.status == 422
    causes = json.loads(caught.value.body)["details"]["causes"]
    assert any(c["field"] == "status.trainerStatus.progressPercentage" for c in causes), causes
    assert "status" not in read_trainjob(kube_api, namespace, "over")


@pytest.mark.usefixtures("trainjob_crd")
@pytest.mark.parametrize(("field", "value"), [
    ("estimatedRemainingSeconds", -1),
    ("metrics", [{"name": "x" * 65, "value": "1"}]),
    ("metrics", [{"name": "loss", "value": ""}]),
    ("metrics", [{"name": f"m{i}", "value": "1"} for i in range(257)]),
])
def test_other_limits_are_enforced(kube_api: client.ApiClient, namespace: str,
                                   field: str, value: object) -> None:
    objects.create_trainjob(kube_api, namespace, "limits")

    with pytest.raises(client.ApiException) as caught:
        apply_status(kube_api, namespace, "limits", {**VALID, field: value})

    assert caught.value.status == 422
    assert f"status.trainerStatus.{field}" in caught.value.body


@pytest.mark.usefixtures("trainjob_crd")
def test_cel_rule_requires_last_updated_time(kube_api: client.ApiClient,
                                             namespace: str) -> None:
    objects.create_trainjob(kube_api, namespace, "no-time")
    without_time = {k: v for k, v in VALID.items() if k != "lastUpdatedTime"}

    with pytest.raises(client.ApiException) as caught:
        apply_status(kube_api, namespace, "no-time", without_time)

    assert caught.value.status == 422
    assert "lastUpdatedTime is required" in caught.value.body


@pytest.mark.usefixtures("legacy_trainjob_crd")
def test_legacy_crd_prunes_trainer_status(kube_api: client.ApiClient, namespace: str) -> None:
    objects.create_trainjob(kube_api, namespace, "old-trainer")
    custom = client.CustomObjectsApi(kube_api)

    # A merge patch is accepted (200) but the field, unknown to the old
    # schema, is pruned.
    result = custom.patch_namespaced_custom_object_status(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, "old-trainer",
        {"status": {"trainerStatus": VALID}})

    assert "trainerStatus" not in (result.get("status") or {})
    stored = read_trainjob(kube_api, namespace, "old-trainer")
    assert "trainerStatus" not in (stored.get("status") or {})


@pytest.mark.usefixtures("legacy_trainjob_crd")
def test_legacy_crd_server_side_apply_fails_naming_the_field(kube_api: client.ApiClient,
                                                             namespace: str) -> None:
    # A server-side apply cannot build its typed patch for an undeclared field:
    # the API server answers 500 (not 422) and names the field.  A scraper
    # must treat this as "this cluster's TrainJob has no trainerStatus".
    objects.create_trainjob(kube_api, namespace, "old-apply")

    with pytest.raises(client.ApiException) as caught:
        apply_status(kube_api, namespace, "old-apply", VALID)

    assert caught.value.status == 500
    assert ".status.trainerStatus: field not declared in schema" in caught.value.body


@pytest.mark.usefixtures("trainjob_crd")
def test_current_crd_is_restored_after_legacy_test(kube_api: client.ApiClient,
                                                   namespace: str) -> None:
    # Runs after the legacy test in file order: the swap must not leak.
    objects.create_trainjob(kube_api, namespace, "restored")
    result = apply_status(kube_api, namespace, "restored", VALID)
    assert result["status"]["trainerStatus"] == VALID


@pytest.mark.usefixtures("trainjob_crd")
def test_kubectl_get_trainjob_shows_progress_column(control_plane: ControlPlane,
                                                    kube_api: client.ApiClient,
                                                    namespace: str) -> None:
    objects.create_trainjob(kube_api, namespace, "shown")
    apply_status(kube_api, namespace, "shown", {**VALID, "progressPercentage": 73,
                                                "estimatedRemainingSeconds": 1234})

    out = control_plane.kubectl("get", "trainjob", "shown", "-n", namespace).stdout

    header, row = out.splitlines()[:2]
    assert header.split()[:4] == ["NAME", "STATE", "PROGRESS", "ETA"]
    assert header.split()[-1] == "AGE"

    # kubectl aligns columns: a value starts where its header starts.
    def cell(column: str) -> str:
        return row[header.index(column):].split()[0]

    assert cell("NAME") == "shown"
    assert cell("PROGRESS") == "73"
    assert cell("ETA") == "1234"
