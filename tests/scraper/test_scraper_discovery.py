"""Discovery by the default selector and a custom one; CRDs without trainerStatus."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kubernetes import client

from localdev.cluster import objects
from tests.helpers.scraper import (
    FakeExporter,
    ScraperProcess,
    events,
    progress_of,
    status_json,
    trainer_status,
    wait_for,
)


@pytest.mark.usefixtures("trainjob_crd")
def test_default_selector_picks_rank0_node_and_launcher(
    kube_api: client.ApiClient, namespace: str, exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    node = exporter_factory(body=status_json(11))
    launcher = exporter_factory(body=status_json(22))
    worker = exporter_factory(body=status_json(33))
    other = exporter_factory(body=status_json(44))
    for name in ("torch", "mpi", "rank1", "other"):
        objects.create_trainjob(kube_api, namespace, name)
    objects.create_trainer_pod(kube_api, namespace, "torch", port=node.port)
    objects.create_trainer_pod(kube_api, namespace, "mpi", port=launcher.port,
                               replicated_job="launcher")
    objects.create_trainer_pod(kube_api, namespace, "rank1", port=worker.port, rank0=False)
    objects.create_trainer_pod(kube_api, namespace, "other", port=other.port,
                               replicated_job="dataset-initializer")
    pending = objects.create_trainer_pod(kube_api, namespace, "torch", port=node.port,
                                         phase="Pending", rank0=False)
    assert pending.status.phase == "Pending"
    scraper = scraper_factory("--interval=1s")  # all namespaces
    wait_for(lambda: progress_of(kube_api, namespace, "torch") == 11
             and progress_of(kube_api, namespace, "mpi") == 22, 20, "rank-0 pods written")
    time.sleep(2)
    assert (worker.requests, other.requests) == (0, 0)
    assert trainer_status(kube_api, namespace, "rank1") is None
    assert trainer_status(kube_api, namespace, "other") is None
    mine = [s for s in scraper.series("trainjob_scraper_target_up") if s["namespace"] == namespace]
    assert sorted(s["trainjob"] for s in mine) == ["mpi", "torch"]


@pytest.mark.usefixtures("trainjob_crd")
def test_custom_selector_and_pod_that_becomes_running(
    kube_api: client.ApiClient, namespace: str, exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    exp = exporter_factory(body=status_json(70))
    node = exporter_factory(body=status_json(1))
    objects.create_trainjob(kube_api, namespace, "custom")
    objects.create_trainjob(kube_api, namespace, "plain")
    objects.create_trainer_pod(kube_api, namespace, "plain", port=node.port)
    scraper = scraper_factory(
        "--interval=1s", f"--namespaces={namespace}",
        "--selector=jobset.sigs.k8s.io/jobset-name,jobset.sigs.k8s.io/replicatedjob-name=evaluator",
    )
    # The pod appears Pending (no IP), then gets one: discovered without a restart.
    pod = objects.create_trainer_pod(kube_api, namespace, "custom", port=exp.port,
                                     replicated_job="evaluator", phase="Pending")
    time.sleep(2)
    assert exp.requests == 0
    core = client.CoreV1Api(kube_api)
    body = kube_api.sanitize_for_serialization(core.read_namespaced_pod(pod.metadata.name,
                                                                        namespace))
    body["status"].update(phase="Running", podIP="127.0.0.1", podIPs=[{"ip": "127.0.0.1"}])
    core.replace_namespaced_pod_status(pod.metadata.name, namespace, body)
    wait_for(lambda: progress_of(kube_api, namespace, "custom") == 70, 20, "custom selector")
    assert node.requests == 0 and trainer_status(kube_api, namespace, "plain") is None
    assert scraper.value("trainjob_scraper_targets") == 1


def test_crd_without_trainer_status_is_reported(
    kube_api: client.ApiClient, namespace: str, legacy_trainjob_crd: None,
    exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    exp = exporter_factory(body=status_json(50))
    objects.create_trainjob(kube_api, namespace, "old")
    objects.create_trainer_pod(kube_api, namespace, "old", port=exp.port)
    scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}")
    msgs = wait_for(lambda: [e.message for e in events(kube_api, namespace, "old")
                             if e.reason == "TrainerStatusUnsupported"], 20, "unsupported event")
    assert "upgrade the Kubeflow Trainer CRDs" in msgs[0]
    log = scraper.log()
    lines = [line for line in log.splitlines() if "cannot store status.trainerStatus" in line]
    assert len(lines) == 1 and "Upgrade the Kubeflow Trainer CRDs" in lines[0]
    assert trainer_status(kube_api, namespace, "old") is None
    time.sleep(2)
    assert scraper.value("trainjob_scraper_status_writes_total", result="written") == 0
    assert scraper.value("trainjob_scraper_status_writes_total", result="not_stored") >= 1


@pytest.mark.usefixtures("trainjob_crd")
def test_misconfigured_annotation_is_logged_once_and_opt_out_is_silent(
    kube_api: client.ApiClient, namespace: str,
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    objects.create_trainjob(kube_api, namespace, "badport")
    objects.create_trainjob(kube_api, namespace, "optout")
    scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}")
    pod = objects.create_trainer_pod(
        kube_api, namespace, "badport", port=28080,
        annotations={"trainjob-progress.dev/port": "http"})
    objects.create_trainer_pod(kube_api, namespace, "optout", port=28080,
                               annotations={"trainjob-progress.dev/scrape": "false"})
    # More watch events for the same pod must not repeat the warning.
    client.CoreV1Api(kube_api).patch_namespaced_pod(
        pod.metadata.name, namespace, {"metadata": {"labels": {"touched": "yes"}}})

    def warned() -> list[str]:
        return [line for line in scraper.log().splitlines()
                if "WARNING" in line and "not scraped" in line]

    wait_for(warned, 20, "a warning for the misconfigured pod")
    time.sleep(2)
    lines = warned()
    assert len(lines) == 1, lines
    assert f"{namespace}/{pod.metadata.name}" in lines[0] and "'http'" in lines[0]
    assert "port annotation" in lines[0]
    assert scraper.value("trainjob_scraper_targets") == 0


@pytest.mark.usefixtures("trainjob_crd")
def test_watch_resumes_after_the_server_ends_it(
    kube_api: client.ApiClient, namespace: str, exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    from scraper.kube.informer import WATCH_TIMEOUT_SECONDS

    exp = exporter_factory(body=status_json(64))
    objects.create_trainjob(kube_api, namespace, "late")
    scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}")
    # Past the server-side watch timeout: the watch must have been resumed from its
    # resourceVersion (not restarted as an error) to see the new pod.
    time.sleep(WATCH_TIMEOUT_SECONDS + 3)
    objects.create_trainer_pod(kube_api, namespace, "late", port=exp.port)
    wait_for(lambda: progress_of(kube_api, namespace, "late") == 64, 20, "late pod written")
    assert scraper.value("trainjob_scraper_watch_restarts_total", reason="error") == 0
    assert scraper.value("trainjob_scraper_watch_restarts_total", reason="gone") == 0
