"""The readers take what the scraper's annotation mode writes (``--status-target
annotation``) on a Trainer before v2.2: the real kubectl running the plugin, and the
SDK helper on the real Kubeflow SDK.  The write is the scraper's status writer itself
(informer, write queue, server-side apply on the real API server)."""

from __future__ import annotations

import json

from kubeflow.trainer import TrainerClient
from kubernetes import client

from exporter_lib.status import TrainerStatus, now
from localdev.cluster import objects
from scraper.shared.outcome import WriteOutcome
from scraper.write.annotation_target import StatusTarget
from tests.helpers.client import Kubectl
from tests.helpers.writer import running_writer
from trainjob_client import get_trainer_status
from trainjob_client.annotation import TRAINER_STATUS_ANNOTATION

#: Metric text the YAML reader of an apply body would mangle if sent carelessly.
TRICKY = "lr\u2028\U0001f680"


async def test_plugin_and_sdk_read_the_annotation_the_scraper_wrote(
        kubectl: Kubectl, sdk: TrainerClient, kube_api: client.ApiClient,
        legacy_trainjob_crd: None, namespace: str) -> None:
    objects.create_trainjob(kube_api, namespace, "old")
    reported = TrainerStatus.from_api({
        "progressPercentage": 55, "estimatedRemainingSeconds": 3600,
        "metrics": [{"name": "loss", "value": "1.25"}, {"name": TRICKY, "value": "3e-05"}],
        "lastUpdatedTime": now()})
    async with running_writer(kube_api, namespace, target=StatusTarget.ANNOTATION) as (w, _):
        assert await w.apply_and_wait(namespace, "old", reported) is WriteOutcome.WRITTEN

    result = kubectl("trainjob", "progress", "old", "-n", namespace, "-o", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["source"] == f"metadata.annotations[{TRAINER_STATUS_ANNOTATION}]"
    assert TrainerStatus.from_api(data["trainerStatus"]) == reported

    got = get_trainer_status("old", sdk)
    assert got is not None
    assert (got.progress_percentage, got.estimated_remaining_seconds) == (55, 3600)
    assert [(m.name, m.value) for m in got.metrics or []] == [("loss", "1.25"),
                                                              (TRICKY, "3e-05")]
