"""The status writer alone against the real API server: SSA ownership, rate limit, pruning."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from exporter_lib.status import TrainerStatus
from localdev.cluster import objects
from scraper.shared.outcome import FIELD_MANAGER, WriteOutcome
from scraper.shared.trainjobs import TrainJobGone
from tests.helpers.scraper import events, trainer_status
from tests.helpers.writer import running_writer


def _status(progress: int) -> TrainerStatus:
    return TrainerStatus(progress_percentage=progress,
                         last_updated_time=datetime(2025, 1, 1, tzinfo=UTC))




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
    # Its write is quiet at once (grace 0): the rule for other writers lets news in, and
    # force takes the field (docs/scraper.md, "Other writers and time").
    async with running_writer(kube_api, namespace, other_writer_grace=0.0) as (rec, _):
        await _force_and_remove(rec, kube_api, namespace)


async def _force_and_remove(rec: Any, kube_api: client.ApiClient, namespace: str) -> None:
    assert await rec.apply_and_wait(namespace, "own", _status(50)) is WriteOutcome.WRITTEN
    held = trainer_status(kube_api, namespace, "own")
    assert held == {"progressPercentage": 50, "estimatedRemainingSeconds": 9, "metrics": [],
                    "lastUpdatedTime": "2025-01-01T00:00:00Z"}
    assert await rec.apply_and_wait(namespace, "own", _status(50)) is WriteOutcome.UNCHANGED
    # Once we own estimatedRemainingSeconds too, not sending it removes it.
    with_eta = TrainerStatus(progress_percentage=60, estimated_remaining_seconds=30,
                             last_updated_time=datetime(2025, 1, 1, tzinfo=UTC))
    assert await rec.apply_and_wait(namespace, "own", with_eta) is WriteOutcome.WRITTEN
    assert await rec.apply_and_wait(namespace, "own", _status(70)) is WriteOutcome.WRITTEN
    held = trainer_status(kube_api, namespace, "own")
    assert held is not None and "estimatedRemainingSeconds" not in held
    obj = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", "own")
    owners = {m["manager"] for m in obj["metadata"]["managedFields"]
              if "f:trainerStatus" in str(m.get("fieldsV1", {}))}
    assert FIELD_MANAGER in owners

    with pytest.raises(TrainJobGone):
        await rec.apply_and_wait(namespace, "missing", _status(1))


@pytest.mark.usefixtures("trainjob_crd")
async def test_client_side_rate_limit(kube_api: client.ApiClient, namespace: str) -> None:
    for i in range(4):
        objects.create_trainjob(kube_api, namespace, f"rl-{i}")
    # The informer's list knows every TrainJob: no GET before the writes.
    async with running_writer(kube_api, namespace, qps=2, burst=1) as (rec, _):
        started = time.monotonic()
        for i in range(4):
            outcome = await rec.apply_and_wait(namespace, f"rl-{i}", _status(i + 1))
            assert outcome is WriteOutcome.WRITTEN
        # burst 1 then 2/s: the 2nd, 3rd and 4th writes wait about 0.5 s each.
        assert time.monotonic() - started >= 1.3


async def test_pruned_write_detected_without_crd_access(
    kube_api: client.ApiClient, namespace: str, legacy_trainjob_crd: None,
) -> None:
    objects.create_trainjob(kube_api, namespace, "legacy")
    # crd.check() never called: as if CRDs were unreadable
    async with running_writer(kube_api, namespace) as (rec, _):
        assert rec.crd.supported is None
        outcome = await rec.apply_and_wait(namespace, "legacy", _status(10))
        assert outcome is WriteOutcome.NOT_STORED
        assert rec.crd.supported is False
        assert trainer_status(kube_api, namespace, "legacy") is None
        reasons = [e.reason for e in events(kube_api, namespace, "legacy")]
        assert reasons == ["TrainerStatusUnsupported"]
        # Further reports are not sent (and not re-announced) until the re-check period.
        outcome = await rec.apply_and_wait(namespace, "legacy", _status(20))
        assert outcome is WriteOutcome.NOT_STORED
        assert [e.reason for e in events(kube_api, namespace, "legacy")] == reasons
        assert await rec.crd.check() is False
