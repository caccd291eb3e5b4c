"""The status writer alone against the real API server: SSA ownership, rate limit, pruning."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from kubernetes import client

from exporter_lib.status import TrainerStatus
from localdev.cluster import objects
from scraper.status_writer import FIELD_MANAGER, StatusWriter, TrainJobGone, WriteOutcome
from tests.helpers.scraper import events, trainer_status


def _status(progress: int) -> TrainerStatus:
    return TrainerStatus(progress_percentage=progress,
                         last_updated_time=datetime(2025, 1, 1, tzinfo=UTC))


def _writer(api: client.ApiClient, qps: float = 50, burst: int = 50) -> StatusWriter:
    return StatusWriter.for_client(api, identity="test", qps=qps, burst=burst, attempts=3)


@pytest.mark.usefixtures("trainjob_crd")
async def test_force_takes_ownership_and_removes_dropped_fields(
    kube_api: client.ApiClient, namespace: str,
) -> None:
    objects.create_trainjob(kube_api, namespace, "own")
    # Another manager wrote trainerStatus first (e.g. a push-mode exporter).
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object_status(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", "own",
        {"status": {"trainerStatus": {"progressPercentage": 5, "estimatedRemainingSeconds": 9,
                                      "lastUpdatedTime": "2025-01-01T00:00:00Z"}}},
        field_manager="someone-else")
    rec = _writer(kube_api)
    assert await rec.apply(namespace, "own", _status(50)) is WriteOutcome.WRITTEN
    held = trainer_status(kube_api, namespace, "own")
    assert held == {"progressPercentage": 50, "estimatedRemainingSeconds": 9, "metrics": [],
                    "lastUpdatedTime": "2025-01-01T00:00:00Z"}
    assert await rec.apply(namespace, "own", _status(50)) is WriteOutcome.UNCHANGED
    # Once we own estimatedRemainingSeconds too, not sending it removes it.
    with_eta = TrainerStatus(progress_percentage=60, estimated_remaining_seconds=30,
                             last_updated_time=datetime(2025, 1, 1, tzinfo=UTC))
    assert await rec.apply(namespace, "own", with_eta) is WriteOutcome.WRITTEN
    assert await rec.apply(namespace, "own", _status(70)) is WriteOutcome.WRITTEN
    held = trainer_status(kube_api, namespace, "own")
    assert held is not None and "estimatedRemainingSeconds" not in held
    obj = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", "own")
    owners = {m["manager"] for m in obj["metadata"]["managedFields"]
              if "f:trainerStatus" in str(m.get("fieldsV1", {}))}
    assert FIELD_MANAGER in owners

    with pytest.raises(TrainJobGone):
        await rec.apply(namespace, "missing", _status(1))


@pytest.mark.usefixtures("trainjob_crd")
async def test_client_side_rate_limit(kube_api: client.ApiClient, namespace: str) -> None:
    for i in range(4):
        objects.create_trainjob(kube_api, namespace, f"rl-{i}")
    rec = _writer(kube_api, qps=2, burst=1)
    for i in range(4):  # warm the cache: GETs are not rate limited
        await rec.cache.held(namespace, f"rl-{i}")
    started = time.monotonic()
    for i in range(4):
        assert await rec.apply(namespace, f"rl-{i}", _status(i + 1)) is WriteOutcome.WRITTEN
    # burst 1 then 2/s: the 2nd, 3rd and 4th writes wait about 0.5 s each.
    assert time.monotonic() - started >= 1.3


async def test_pruned_write_detected_without_crd_access(
    kube_api: client.ApiClient, namespace: str, legacy_trainjob_crd: None,
) -> None:
    objects.create_trainjob(kube_api, namespace, "legacy")
    rec = _writer(kube_api)  # crd.check() never called: as if CRDs were unreadable
    assert rec.crd.supported is None
    assert await rec.apply(namespace, "legacy", _status(10)) is WriteOutcome.NOT_STORED
    assert rec.crd.supported is False
    assert trainer_status(kube_api, namespace, "legacy") is None
    reasons = [e.reason for e in events(kube_api, namespace, "legacy")]
    assert reasons == ["TrainerStatusUnsupported"]
    # Further reports are not sent (and not re-announced) until the re-check period.
    assert await rec.apply(namespace, "legacy", _status(20)) is WriteOutcome.NOT_STORED
    assert [e.reason for e in events(kube_api, namespace, "legacy")] == reasons
    assert await rec.crd.check() is False
