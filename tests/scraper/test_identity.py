"""Identity (issue 13, inputs 2 and 3) on the real API server: the owner chain decides
which TrainJob object a pod reports for, and one pod per TrainJob is the target."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kubernetes import client

from localdev.cluster import objects
from tests.helpers.scraper import (
    FakeExporter,
    ScraperProcess,
    progress_of,
    status_json,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("trainjob_crd")


def _touch(kube_api: client.ApiClient, namespace: str, pod: str, value: str) -> None:
    """A pod change, so the scraper's pod watch delivers the pod again."""
    client.CoreV1Api(kube_api).patch_namespaced_pod(
        pod, namespace, {"metadata": {"annotations": {"test/touch": value}}})


def test_recreated_trainjob_never_gets_the_old_pods_status(
    kube_api: client.ApiClient, namespace: str, exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    exp = exporter_factory(body=status_json(30))
    objects.create_trainjob(kube_api, namespace, "job")
    pod = objects.create_trainer_pod(kube_api, namespace, "job", port=exp.port)
    scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}")
    wait_for(lambda: progress_of(kube_api, namespace, "job") == 30, 20, "progress 30")

    # Deleted without cascading (the pod, its Job and JobSet stay), created again.
    objects.delete_trainjob(kube_api, namespace, "job", cascade=False)
    wait_for(lambda: scraper.value("trainjob_scraper_targets") == 0, 15, "target dropped")
    objects.create_trainjob(kube_api, namespace, "job")
    exp.body = status_json(75)
    _touch(kube_api, namespace, pod.metadata.name, "1")
    # A fresh scraper (a restart) lists the old pod too.
    fresh = scraper_factory("--interval=1s", f"--namespaces={namespace}")
    time.sleep(5)
    assert progress_of(kube_api, namespace, "job") is None  # never 75, never anything
    for s in (scraper, fresh):
        assert s.value("trainjob_scraper_targets") == 0
        lines = [ln for ln in s.log().splitlines()
                 if f"pod {namespace}/{pod.metadata.name} is not a target" in ln]
        assert len(lines) == 1, lines  # one clear line, not one per watch event
        assert "re-created" in lines[0]


def test_hand_made_pod_naming_a_trainjob_is_not_a_target(
    kube_api: client.ApiClient, namespace: str, exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    exp = exporter_factory(body=status_json(99))
    objects.create_trainjob(kube_api, namespace, "victim")
    pod = objects.create_trainer_pod(kube_api, namespace, "victim", port=exp.port,
                                     owner_chain=False)
    scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}")
    wait_for(lambda: f"pod {namespace}/{pod.metadata.name} is not a target" in scraper.log(),
             15, "the refusal logged")
    time.sleep(2)
    assert progress_of(kube_api, namespace, "victim") is None
    assert exp.requests == 0  # never even scraped


def test_terminating_pod_and_its_replacement_make_one_target(
    kube_api: client.ApiClient, namespace: str, exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    old_exp = exporter_factory(body=status_json(30))
    new_exp = exporter_factory(body=status_json(61))
    objects.create_trainjob(kube_api, namespace, "restart")
    old = objects.create_trainer_pod(kube_api, namespace, "restart", port=old_exp.port)
    core = client.CoreV1Api(kube_api)
    # The JobSet restart: the old pod is Terminating (grace 600 s, no kubelet ends it)
    # and the replacement of restart attempt 1 runs beside it; both answer.
    core.delete_namespaced_pod(old.metadata.name, namespace, grace_period_seconds=600)
    new = objects.create_trainer_pod(kube_api, namespace, "restart", port=new_exp.port)
    core.patch_namespaced_pod(new.metadata.name, namespace, {"metadata": {"labels": {
        "jobset.sigs.k8s.io/restart-attempt": "1"}}})
    scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}")
    wait_for(lambda: progress_of(kube_api, namespace, "restart") == 61, 20, "progress 61")
    seen = set()
    for _ in range(20):  # 5 s of samples: the status never goes back to 30
        seen.add(progress_of(kube_api, namespace, "restart"))
        time.sleep(0.25)
    assert seen == {61}
    assert scraper.value("trainjob_scraper_targets") == 1
    assert scraper.value("trainjob_scraper_status_writes_total", result="written") == 1
    assert old_exp.requests == 0  # the terminating pod is not scraped at all
    # Progress of the replacement keeps landing.
    new_exp.body = status_json(62)
    wait_for(lambda: progress_of(kube_api, namespace, "restart") == 62, 10, "progress 62")
