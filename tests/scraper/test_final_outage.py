"""Final statuses survive a real kube-apiserver outage (issue 13, input 1).

20 trainings report; five pods end; kube-apiserver (the real process, not a proxy) is
SIGKILLed while their final statuses wait in the write queue (a budget of one write per
second keeps them there), stays down for 18 s and is started again on the same port and
etcd.  Every final status must land afterwards, with no scraper restart.  The scraper
runs as a ServiceAccount with the chart's rules, so the authorizer's warm-up after the
restart (403s) is part of what it has to get through.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from localdev.cluster import objects
from tests.helpers.scraper import (
    FakeExporter,
    ScraperProcess,
    progress_of,
    scraper_service_account,
    status_json,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("trainjob_crd")

OUTAGE_SECONDS = 18.0
JOBS = 20
ENDING = 5


def test_final_statuses_land_after_the_api_server_comes_back(
    kube_api: client.ApiClient, namespace: str, control_plane: Any, tmp_path: Path,
    exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    pods = []
    for i in range(JOBS):
        exp = exporter_factory(body=status_json(10 + i))
        objects.create_trainjob(kube_api, namespace, f"job-{i}")
        pods.append(objects.create_trainer_pod(kube_api, namespace, f"job-{i}", port=exp.port))
    with scraper_service_account(kube_api, control_plane, namespace) as token:
        kubeconfig = control_plane.kubeconfig_for_token(token, tmp_path / "sa.kubeconfig")
        scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}",
                                  # A fixed budget: the adaptive rate (a ceiling above
                                  # the start) would write the finals before the kill.
                                  "--write-qps=1", "--write-qps-max=1", "--write-burst=1",
                                  "--no-metrics-auth",
                                  kubeconfig=kubeconfig)
        wait_for(lambda: all(progress_of(kube_api, namespace, f"job-{i}") == 10 + i
                             for i in range(JOBS)), 60, "every first status")

        for i in range(ENDING):
            final = {"progressPercentage": 100, "lastUpdatedTime": "2026-01-01T00:00:00Z",
                     "metrics": [{"name": "final", "value": str(i)}]}
            objects.terminate_pod(kube_api, namespace, pods[i].metadata.name, json.dumps(final))
        # Kill as soon as the pod watch delivered the ends: at one write per second
        # most finals are still queued.
        wait_for(lambda: scraper.log().count("final status of TrainJob") >= ENDING, 20,
                 "every final status queued", period=0.02)
        down = time.monotonic()
        control_plane.restart_apiserver(OUTAGE_SECONDS)
        up = time.monotonic()
        wait_for(lambda: all(_final_of(kube_api, namespace, i) == str(i)
                             for i in range(ENDING)), 60, "every final status after the outage")
        all_in = time.monotonic()
        # Which finals the outage hit, from the scraper's own log: reading the TrainJobs
        # once the API server is back raced the retries, which land within a second.
        log = scraper.log()
        hit = [i for i in range(ENDING)
               if f"final status write to TrainJob {namespace}/job-{i} failed" in log]
        print(f"outage {up - down:.1f}s (killed, {OUTAGE_SECONDS:.0f}s down, ready again); "
              f"finals landed {all_in - up:.1f}s after /readyz; "
              f"{len(hit)} of {ENDING} finals failed at least once during the outage")
        assert len(hit) >= 3  # the outage did hit queued finals
        assert scraper.value("trainjob_scraper_status_writes_total", result="retried") > 0
        assert scraper.proc.poll() is None  # no restart needed
        for i in range(ENDING, JOBS):  # the others keep their status
            assert progress_of(kube_api, namespace, f"job-{i}") == 10 + i


def _final_of(kube_api: client.ApiClient, namespace: str, i: int) -> str | None:
    try:
        obj = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", f"job-{i}")
    except (client.ApiException, OSError):
        return None
    metrics = ((obj.get("status") or {}).get("trainerStatus") or {}).get("metrics") or []
    return next((m["value"] for m in metrics if m["name"] == "final"), None)
