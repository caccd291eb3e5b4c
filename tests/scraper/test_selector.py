"""The label selector is validated by the API server itself (a list with limit=1 at start)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kubernetes import client

from localdev.cluster import ControlPlane, objects
from scraper.config import ConfigError
from scraper.discovery.pods import probe_selector
from tests.helpers.scraper import (
    FakeExporter,
    ScraperProcess,
    progress_of,
    status_json,
    trainer_status,
    wait_for,
)


@pytest.mark.parametrize("selector", ["app in (a,b", "app==x y", "a=b,,", "app=$bad"])
async def test_a_selector_the_api_server_rejects_is_a_config_error(
    kube_api: client.ApiClient, namespace: str, selector: str,
) -> None:
    with pytest.raises(ConfigError) as err:
        await probe_selector(client.CoreV1Api(kube_api), selector, namespace)
    text = str(err.value)
    assert text.startswith(f"invalid configuration: selector={selector!r}: "), text
    # The reason is the API server's own (not an HTTP code alone).
    assert "HTTP 400" not in text and len(text) > len(f"invalid configuration: "
                                                      f"selector={selector!r}: ") + 10, text


@pytest.mark.parametrize("selector", ["gpu>1", "gpu<3,!canary", "tier notin (x), app",
                                      "jobset.sigs.k8s.io/jobset-name", "app in ()"])
async def test_selectors_the_api_server_accepts_pass(
    kube_api: client.ApiClient, namespace: str, selector: str,
) -> None:
    core = client.CoreV1Api(kube_api)
    # True only when the API server answered the list: a probe that could not ask it
    # (refused, 403, timeout) returns False and fails here.
    assert await probe_selector(core, selector, namespace) is True
    assert await probe_selector(core, selector, None) is True  # all namespaces


async def test_a_probe_that_cannot_ask_the_api_server_says_so(
    control_plane: ControlPlane, namespace: str,
) -> None:
    """No access (403 from the real API server: a ServiceAccount with no RoleBinding) is
    not an accepted selector: the probe says it could not check (the watch reports and
    retries), and raises nothing."""
    token = control_plane.service_account_token(namespace, "no-grants")
    with control_plane.api_client_for_token(token) as api:
        assert await probe_selector(client.CoreV1Api(api), "app=x", namespace) is False


def test_scraper_exits_2_naming_a_rejected_selector(
    control_plane: object, scraper_factory: Callable[..., ScraperProcess],
) -> None:
    scraper = scraper_factory("--selector=app in (a,b", ready=False)
    assert scraper.proc.wait(30) == 2
    log = scraper.log()
    assert "invalid configuration: selector='app in (a,b': " in log, log


@pytest.mark.usefixtures("trainjob_crd")
def test_set_based_selector_our_old_grammar_refused_scrapes_rank0(
    kube_api: client.ApiClient, namespace: str, exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    rank0 = exporter_factory(body=status_json(64))
    rank1 = exporter_factory(body=status_json(65))
    for name in ("lt0", "lt1"):
        objects.create_trainjob(kube_api, namespace, name)
    objects.create_trainer_pod(kube_api, namespace, "lt0", port=rank0.port)
    objects.create_trainer_pod(kube_api, namespace, "lt1", port=rank1.port, rank0=False)
    scraper_factory("--interval=1s", f"--namespaces={namespace}",
                    "--selector=jobset.sigs.k8s.io/jobset-name,"
                    "batch.kubernetes.io/job-completion-index<1")
    wait_for(lambda: progress_of(kube_api, namespace, "lt0") == 64, 20, "rank 0 written")
    time.sleep(2)
    assert rank1.requests == 0
    assert trainer_status(kube_api, namespace, "lt1") is None
