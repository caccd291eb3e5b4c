"""Leader election between two scrapers, and the scraper on least-privilege RBAC."""

from __future__ import annotations

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
    events,
    leaders,
    progress_of,
    scraper_service_account,
    status_json,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("trainjob_crd")

#: The resync interval of the least-privilege test's scraper (seconds).
RESYNC_SECONDS = 2.0
LEASE = ["--leader-election", "--lease-duration=4s", "--renew-deadline=3s",
         "--retry-period=0.5s"]


def _written(scrapers: list[ScraperProcess]) -> float:
    return sum(s.value("trainjob_scraper_status_writes_total", result="written")
               for s in scrapers if s.proc.poll() is None)


def _scrapes(scraper: ScraperProcess) -> float:
    """Scrapes the scraper ended, whatever their result."""
    return sum(v for (name, _), v in scraper.metrics().items()
               if name == "trainjob_scraper_scrapes_total")


def test_standby_takes_over_when_leader_dies_and_only_one_writes(
    kube_api: client.ApiClient, namespace: str, exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    exp = exporter_factory(body=status_json(10))
    objects.create_trainjob(kube_api, namespace, "ha")
    objects.create_trainer_pod(kube_api, namespace, "ha", port=exp.port)
    args = ["--interval=1s", f"--namespaces={namespace}", f"--lease-namespace={namespace}",
            *LEASE]
    a = scraper_factory(*args, "--identity=replica-a")
    b = scraper_factory(*args, "--identity=replica-b")
    both = [a, b]
    first = wait_for(lambda: leaders(both), 15, "a leader")
    assert len(first) == 1
    leader = first[0]
    standby = b if leader is a else a
    wait_for(lambda: progress_of(kube_api, namespace, "ha") == 10, 20, "progress 10")
    # Changes are written once each, by the leader only; the standby never scrapes.
    for progress in (20, 30):
        exp.body = status_json(progress)
        wait_for(lambda p=progress: progress_of(kube_api, namespace, "ha") == p, 20, "progress")
    assert leader.settled_value("trainjob_scraper_status_writes_total", 3,
                                result="written") == 3
    assert standby.metrics().get(("trainjob_scraper_status_writes_total",
                                  frozenset({("result", "written")})), 0) == 0
    assert standby.value("trainjob_scraper_scrapes_total", result="ok") == 0
    assert standby.series("trainjob_scraper_target_up") == []  # no stale per-job series
    assert standby.get("/readyz")[0] == 200  # warm: it has listed the pods too
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease("trainjob-scraper",
                                                                     namespace)
    assert lease.spec.holder_identity == ("replica-a" if leader is a else "replica-b")

    # The leader dies without a goodbye (no release): the standby takes over within
    # the lease duration (4 s) plus a few retry periods.
    scraped = _scrapes(standby)
    leader.kill()
    died = time.monotonic()
    wait_for(lambda: leaders([standby]), 10, "takeover")
    assert time.monotonic() - died < 4 + 3
    # It does not rewrite what the TrainJob already holds (after its first scrape of the
    # unchanged exporter, the chance to write, and the settling second of
    # settled_value), and writes what is new.
    wait_for(lambda: _scrapes(standby) > scraped, 15, "a scrape by the new leader")
    assert standby.settled_value("trainjob_scraper_status_writes_total", 0,
                                 result="written") == 0
    exp.body = status_json(40)
    wait_for(lambda: progress_of(kube_api, namespace, "ha") == 40, 20, "progress 40")
    assert standby.settled_value("trainjob_scraper_status_writes_total", 1,
                                 result="written") == 1

    # Graceful stop: quick, clean, and the Lease is released at once.
    stopping = time.monotonic()
    assert standby.terminate() == 0
    assert time.monotonic() - stopping < 5
    log = standby.log()
    assert log.index("stopping: no new scrapes") < log.index("released Lease") < log.index(
        "stopped")
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease("trainjob-scraper",
                                                                     namespace)
    assert lease.spec.holder_identity in (None, "")


def test_least_privilege_cluster_role(
    kube_api: client.ApiClient, namespace: str, control_plane: Any, tmp_path: Path,
    exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    with scraper_service_account(kube_api, control_plane, namespace) as token:
        kubeconfig = control_plane.kubeconfig_for_token(token, tmp_path / "sa.kubeconfig")

        exp = exporter_factory(body=status_json(15))
        objects.create_trainjob(kube_api, namespace, "rbac")
        pod = objects.create_trainer_pod(kube_api, namespace, "rbac", port=exp.port)
        scraper = scraper_factory("--interval=1s", f"--lease-namespace={namespace}",
                                  f"--resync-interval={RESYNC_SECONDS:g}s", *LEASE,
                                  kubeconfig=kubeconfig)
        wait_for(lambda: progress_of(kube_api, namespace, "rbac") == 15, 20, "progress 15")
        # Events (create, then patch of a repeat) work with these rules.
        exp.mode, exp.body = "garbage", {"progressPercentage": -1}
        wait_for(lambda: [e for e in events(kube_api, namespace, "rbac")
                          if e.reason == "InvalidTrainerStatus"], 20, "event")
        # Final status via the pod watch; resync (trainjobs list) runs without errors.
        objects.terminate_pod(kube_api, namespace, pod.metadata.name,
                              '{"progressPercentage":100,"lastUpdatedTime":"2025-01-01T00:00:00Z"}')
        wait_for(lambda: progress_of(kube_api, namespace, "rbac") == 100, 20, "final status")
        # A resync (every 2 s) after the final: a Forbidden has no event to wait for, so
        # the test gives one resync interval and its slack, then reads the log.
        time.sleep(RESYNC_SECONDS + 0.5)
        log = scraper.log()
        assert "Forbidden" not in log and "HTTP 403" not in log, log[-3000:]
        assert scraper.value("trainjob_scraper_leader") == 1
        # Nothing beyond the rules: the token cannot, e.g., read secrets.
        denied = control_plane.kubectl("get", "secrets", "-n", namespace, token=token,
                                       check=False)
        assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
