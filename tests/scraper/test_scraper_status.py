"""Status writes against the real control plane, with the real exporter where it matters."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from exporter_lib.api import Exporter
from exporter_lib.state import State
from exporter_lib.status import TrainerStatus
from localdev.cluster import objects
from tests.helpers.scraper import (
    FakeExporter,
    ScraperProcess,
    events,
    progress_of,
    resource_version,
    status_json,
    trainer_status,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("trainjob_crd")


@pytest.fixture
def real_exporter(tmp_path: Path) -> Iterator[tuple[State, Exporter, Path]]:
    """The project's exporter (in this process, port chosen by the OS)."""
    state = State()
    termination = tmp_path / "termination-log"
    exp = Exporter(state, state, host="127.0.0.1", port=0, status_file=None,
                   termination_message_path=str(termination), serve=True)
    assert exp.port
    try:
        yield state, exp, termination
    finally:
        exp.stop()


def test_status_written_readable_and_unchanged_means_no_write(
    kube_api: client.ApiClient, namespace: str, control_plane: Any,
    real_exporter: tuple[State, Exporter, Path], scraper_factory: Callable[..., ScraperProcess],
) -> None:
    state, exp, _ = real_exporter
    objects.create_trainjob(kube_api, namespace, "job-a")
    assert exp.port is not None
    objects.create_trainer_pod(kube_api, namespace, "job-a", port=exp.port)
    state.update(progress_percentage=25, estimated_remaining_seconds=300,
                 metrics={"loss": 0.75, "phase": "warmup"})
    # Polling: this test counts the 304s of an unchanged exporter (waiting scrapes
    # hold one request open instead: test_unchanged_exporter_holds_one_waiting_scrape).
    scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}",
                              "--no-wait-scrapes")

    wait_for(lambda: progress_of(kube_api, namespace, "job-a") == 25, 20, "progress 25 written")
    out = control_plane.kubectl("get", "trainjob", "job-a", "-n", namespace, "-o",
                                "jsonpath={.status.trainerStatus}").stdout
    written = TrainerStatus.from_api(json.loads(out))
    assert written.same_report(state.status())
    assert written.metrics_dict() == {"loss": "0.75", "phase": "warmup"}

    # Nothing new for several intervals: no write, the object is untouched.
    rv = resource_version(kube_api, namespace, "job-a")
    writes = scraper.value("trainjob_scraper_status_writes_total", result="written")
    assert writes == 1
    time.sleep(5)
    assert resource_version(kube_api, namespace, "job-a") == rv
    assert scraper.value("trainjob_scraper_status_writes_total", result="written") == 1
    # The one request is timed; nothing waits in the write queue.
    assert scraper.value("trainjob_scraper_status_write_duration_seconds_count") == 1
    assert 0 < scraper.value("trainjob_scraper_status_write_duration_seconds_sum") < 25
    assert scraper.value("trainjob_scraper_status_writes_pending") == 0
    assert scraper.value("trainjob_scraper_scrapes_total", result="not_modified") >= 3
    # A repeated report with the same values (new lastUpdatedTime) is no news either.
    state.update(progress_percentage=25)
    time.sleep(3)
    assert resource_version(kube_api, namespace, "job-a") == rv

    state.update(progress_percentage=60, metrics={"loss": 0.5})
    wait_for(lambda: progress_of(kube_api, namespace, "job-a") == 60, 20, "progress 60")
    assert scraper.settled_value("trainjob_scraper_status_writes_total", 2,
                                 result="written") == 2

    # The scraper's own series carry the job's values, labelled namespace and trainjob.
    labels = {"namespace": namespace, "trainjob": "job-a"}
    assert scraper.value("trainjob_progress_ratio", **labels) == pytest.approx(0.6)
    assert scraper.value("trainjob_estimated_remaining_seconds", **labels) == 300
    assert scraper.value("trainjob_metric", name="loss", **labels) == 0.5
    assert scraper.series("trainjob_metric") == [{**labels, "name": "loss"}]  # text not shown
    assert scraper.value("trainjob_scraper_target_up", pod=_pod_name(kube_api, namespace),
                         **labels) == 1
    assert scraper.value("trainjob_scraper_targets") == 1
    assert scraper.value("trainjob_scraper_leader") == 1
    # Only our field manager owns trainerStatus.
    obj = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", "job-a")
    managers = {m["manager"] for m in obj["metadata"]["managedFields"]
                if m.get("subresource") == "status"}
    assert managers == {"trainjob-scraper"}
    assert scraper.terminate() == 0
    assert "stopped" in scraper.log()


def _pod_name(kube_api: client.ApiClient, namespace: str) -> str:
    return str(client.CoreV1Api(kube_api).list_namespaced_pod(namespace).items[0].metadata.name)


def test_unchanged_exporter_holds_one_waiting_scrape(
    kube_api: client.ApiClient, namespace: str,
    real_exporter: tuple[State, Exporter, Path], scraper_factory: Callable[..., ScraperProcess],
) -> None:
    """Waiting scrapes (default) on the real API server: unchanged costs no scrapes,
    a change lands well within one interval (issue 14.1)."""
    state, exp, _ = real_exporter
    objects.create_trainjob(kube_api, namespace, "job-w")
    assert exp.port is not None
    objects.create_trainer_pod(kube_api, namespace, "job-w", port=exp.port)
    state.update(progress_percentage=25)
    scraper = scraper_factory("--interval=5s", f"--namespaces={namespace}")
    wait_for(lambda: progress_of(kube_api, namespace, "job-w") == 25, 20, "progress 25")
    wait_for(lambda: scraper.value("trainjob_scraper_held_scrapes") == 1, 15, "held scrape")
    rv = resource_version(kube_api, namespace, "job-w")
    scrapes = sum(v for (n, _), v in scraper.metrics().items()
                  if n == "trainjob_scraper_scrapes_total")
    time.sleep(11)  # two intervals unchanged: one request held open, nothing answered
    assert resource_version(kube_api, namespace, "job-w") == rv
    assert scrapes == sum(v for (n, _), v in scraper.metrics().items()
                          if n == "trainjob_scraper_scrapes_total")
    assert scraper.value("trainjob_scraper_held_scrapes") == 1
    changed = time.monotonic()
    state.update(progress_percentage=60)
    wait_for(lambda: progress_of(kube_api, namespace, "job-w") == 60, 5, "progress 60",
             period=0.02)
    latency = time.monotonic() - changed
    print(f"update() to TrainJob status with a waiting scrape: {latency:.3f}s (interval 5s)")
    assert latency < 2.5  # half an interval: polling would take up to 5 s
    assert scraper.settled_value("trainjob_scraper_status_writes_total", 2,
                                 result="written") == 2


def test_final_status_from_termination_message(
    kube_api: client.ApiClient, namespace: str, real_exporter: tuple[State, Exporter, Path],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    state, exp, termination = real_exporter
    objects.create_trainjob(kube_api, namespace, "job-f")
    assert exp.port is not None
    pod = objects.create_trainer_pod(kube_api, namespace, "job-f", port=exp.port)
    state.update(progress_percentage=40, metrics={"loss": 0.9})
    scraper = scraper_factory("--interval=2s", f"--namespaces={namespace}")
    wait_for(lambda: progress_of(kube_api, namespace, "job-f") == 40, 20, "progress 40")

    # The last report lands between two scrapes, then the process exits: the
    # exporter writes its final JSON to the termination message and stops serving.
    state.update(progress_percentage=100, estimated_remaining_seconds=0,
                 metrics={"loss": 0.1})
    exp.write_final_status()
    exp.stop()
    objects.terminate_pod(kube_api, namespace, pod.metadata.name, termination.read_text())

    wait_for(lambda: progress_of(kube_api, namespace, "job-f") == 100, 20, "final progress")
    final = trainer_status(kube_api, namespace, "job-f")
    assert final is not None and final["estimatedRemainingSeconds"] == 0
    assert final["metrics"] == [{"name": "loss", "value": "0.1"}]
    # Scraping stopped: no target left, and the exporter being gone causes no failures.
    wait_for(lambda: scraper.value("trainjob_scraper_targets") == 0, 10, "target removed")
    failures = scraper.value("trainjob_scraper_scrapes_total", result="refused")
    time.sleep(3)
    assert scraper.value("trainjob_scraper_scrapes_total", result="refused") == failures
    assert scraper.value("trainjob_progress_ratio", namespace=namespace,
                         trainjob="job-f") == 1.0


def test_final_status_from_a_native_sidecar(
    kube_api: client.ApiClient, namespace: str, exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    """The zero-code sidecar ends after the trainer: its message wins, unless annotated."""
    # One exporter per pod: two live pods at one address whose exporter states no pod
    # are refused (SharedAddress, tests/scraper/test_shared_address.py).
    exp_s, exp_n = exporter_factory(body=status_json(50)), exporter_factory(body=status_json(50))
    objects.create_trainjob(kube_api, namespace, "job-s")
    objects.create_trainjob(kube_api, namespace, "job-n")
    pod_s = objects.create_trainer_pod(kube_api, namespace, "job-s", port=exp_s.port,
                                       sidecars=["trainjob-exporter"])
    pod_n = objects.create_trainer_pod(kube_api, namespace, "job-n", port=exp_n.port,
                                       sidecars=["trainjob-exporter"], annotations={
                                           "trainjob-progress.dev/container": "node"})
    scraper_factory("--interval=1s", f"--namespaces={namespace}")
    for job in ("job-s", "job-n"):
        wait_for(lambda job=job: progress_of(kube_api, namespace, job) == 50, 20, "progress 50")

    trainer, sidecar = json.dumps(status_json(99)), json.dumps(status_json(100))
    for pod in (pod_s, pod_n):
        objects.terminate_pod(kube_api, namespace, pod.metadata.name, trainer,
                              sidecar_messages={"trainjob-exporter": sidecar})
    wait_for(lambda: progress_of(kube_api, namespace, "job-s") == 100, 20, "sidecar's final")
    wait_for(lambda: progress_of(kube_api, namespace, "job-n") == 99, 20, "annotated final")
    stored = client.CoreV1Api(kube_api).read_namespaced_pod(pod_s.metadata.name, namespace)
    assert [s.name for s in stored.status.init_container_statuses] == ["trainjob-exporter"]


def test_invalid_termination_message_keeps_status_and_records_event(
    kube_api: client.ApiClient, namespace: str, exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    exporter = exporter_factory(body=status_json(30))
    objects.create_trainjob(kube_api, namespace, "job-t")
    pod = objects.create_trainer_pod(kube_api, namespace, "job-t", port=exporter.port)
    scraper_factory("--interval=1s", f"--namespaces={namespace}")
    wait_for(lambda: progress_of(kube_api, namespace, "job-t") == 30, 20, "progress 30")
    objects.terminate_pod(kube_api, namespace, pod.metadata.name,
                          json.dumps({"progressPercentage": 250}), exit_code=1)
    wait_for(lambda: [e for e in events(kube_api, namespace, "job-t")
                      if e.reason == "InvalidFinalTrainerStatus"], 20, "event")
    assert progress_of(kube_api, namespace, "job-t") == 30


def test_pod_deleted_and_trainjob_deleted(
    kube_api: client.ApiClient, namespace: str, exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    exp_a = exporter_factory(body=status_json(10))
    exp_b = exporter_factory(body=status_json(20))
    objects.create_trainjob(kube_api, namespace, "job-a")
    objects.create_trainjob(kube_api, namespace, "job-b")
    pod_a = objects.create_trainer_pod(kube_api, namespace, "job-a", port=exp_a.port)
    objects.create_trainer_pod(kube_api, namespace, "job-b", port=exp_b.port)
    scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}",
                              "--resync-interval=2s")
    wait_for(lambda: progress_of(kube_api, namespace, "job-a") == 10
             and progress_of(kube_api, namespace, "job-b") == 20, 20, "both written")
    assert scraper.value("trainjob_scraper_targets") == 2

    objects.delete_pod(kube_api, namespace, pod_a.metadata.name)
    wait_for(lambda: scraper.value("trainjob_scraper_targets") == 1, 10, "pod target dropped")
    requests = exp_a.requests
    time.sleep(2.5)
    assert exp_a.requests == requests  # no longer scraped
    assert not [s for s in scraper.series("trainjob_progress_ratio") if s["trainjob"] == "job-a"]

    # The TrainJob goes away (its pod stays, as without a garbage collector): the
    # scraper notices, stops scraping and the job's series disappear.
    objects.delete_trainjob(kube_api, namespace, "job-b", cascade=False)
    wait_for(lambda: scraper.value("trainjob_scraper_targets") == 0, 15, "trainjob dropped")
    assert scraper.series("trainjob_progress_ratio") == []
    assert scraper.series("trainjob_scraper_target_up") == []
    assert "is gone" in scraper.log()
