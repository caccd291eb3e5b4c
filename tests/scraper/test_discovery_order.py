"""Discovery converges whatever order lists and watch events arrive in (issue 21, input 1).

The scraper talks to the real kube-apiserver through :mod:`tests.helpers.fault_proxy`,
which holds chosen list and watch requests back (a big cluster's slow TrainJob list, a
watch that connects late).  Nothing else is faked: the objects are real Pods, Jobs,
JobSets and TrainJobs in the API server, and a target is what the scraper itself
reports (``trainjob_scraper_target_up``, one series per scraped pod).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from localdev.cluster import objects
from tests.helpers.fault_proxy import FaultProxy, write_kubeconfig
from tests.helpers.scraper import (
    FakeExporter,
    ScraperProcess,
    progress_of,
    scraper_service_account,
    status_json,
    wait_for,
)

pytestmark = [pytest.mark.usefixtures("trainjob_crd"), pytest.mark.timeout(120)]


@pytest.fixture
def proxied(kube_api: client.ApiClient, namespace: str, control_plane: Any,
            tmp_path: Path) -> Iterator[tuple[FaultProxy, Path]]:
    """A fault proxy in front of the API server and a kubeconfig through it (SA token)."""
    with (scraper_service_account(kube_api, control_plane, namespace) as token,
          FaultProxy(control_plane.server_url, control_plane.ca_cert_path) as proxy):
        yield proxy, write_kubeconfig(tmp_path / "proxy.kubeconfig", proxy.url, token)


def list_path(namespace: str, kind: str) -> str:
    """The regex of the list (and watch) path of ``kind`` in ``namespace``."""
    prefix = {"trainjobs": "/apis/trainer.kubeflow.org/v1alpha1",
              "jobsets": "/apis/jobset.x-k8s.io/v1alpha2",
              "jobs": "/apis/batch/v1", "pods": "/api/v1"}[kind]
    return f"^{prefix}/namespaces/{namespace}/{kind}$"


def targets(scraper: ScraperProcess, namespace: str) -> set[str]:
    """The pods the scraper scrapes in ``namespace`` (its target_up series)."""
    return {s["pod"] for s in scraper.series("trainjob_scraper_target_up")
            if s.get("namespace") == namespace}


def test_slow_trainjob_list_still_gives_a_target(
    kube_api: client.ApiClient, namespace: str, proxied: tuple[FaultProxy, Path],
    exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    """Input 1: the TrainJob list answers 2 s after the pod list; the pod must still be
    scraped (it used to wait for its owner chain forever)."""
    proxy, kubeconfig = proxied
    exp = exporter_factory(body=status_json(42))
    objects.create_trainjob(kube_api, namespace, "slow")
    pod = objects.create_trainer_pod(kube_api, namespace, "slow", port=exp.port)
    proxy.delay("GET", list_path(namespace, "trainjobs"), 2.0, watch=False)
    started = time.monotonic()
    scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}",
                              kubeconfig=kubeconfig)
    wait_for(lambda: progress_of(kube_api, namespace, "slow") == 42, 15,
             "the status written although the TrainJob list came last")
    print(f"status written {time.monotonic() - started:.1f}s after the scraper started "
          "(TrainJob list held 2 s)")
    held = proxy.requests("GET", list_path(namespace, "trainjobs"), watch=False)
    assert held and held[0].injected  # the delay did hold the TrainJob list
    assert targets(scraper, namespace) == {pod.metadata.name}
