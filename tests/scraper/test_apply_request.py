"""The apply PATCH straight through the client's pool (scraper/kube/apply_request.py),
against the real kube-apiserver: the answer, the client's error type, and credentials
read per request (a refreshed token is the one sent)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from localdev.cluster import objects
from scraper.kube.apply_body import encode_apply_body
from scraper.kube.apply_request import apply_patch
from scraper.kube.client import REQUEST_TIMEOUT, without_retries
from scraper.status_writer import FIELD_MANAGER

pytestmark = pytest.mark.usefixtures("trainjob_crd")

QUERY = [("fieldManager", FIELD_MANAGER), ("force", "true")]


def _path(namespace: str, name: str) -> str:
    return f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{namespace}/{TRAINJOB_PLURAL}/{name}/status"


def _body(namespace: str, name: str, progress: int) -> bytes:
    return encode_apply_body({
        "apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "status": {"trainerStatus": {"progressPercentage": progress,
                                     "lastUpdatedTime": "2026-01-01T00:00:00Z"}}})


def test_the_answer_is_the_applied_object(kube_api: client.ApiClient, namespace: str) -> None:
    created = objects.create_trainjob(kube_api, namespace, "a")
    obj = apply_patch(kube_api, _path(namespace, "a"), QUERY, _body(namespace, "a", 42),
                      timeout=REQUEST_TIMEOUT)
    assert obj["metadata"]["uid"] == created["metadata"]["uid"]
    assert obj["status"]["trainerStatus"]["progressPercentage"] == 42
    managers = {m["manager"] for m in obj["metadata"]["managedFields"]}
    assert FIELD_MANAGER in managers


def test_an_error_answer_is_the_clients_api_exception(kube_api: client.ApiClient,
                                                      namespace: str) -> None:
    with pytest.raises(ApiException) as err:
        apply_patch(kube_api, _path(namespace, "missing"), QUERY,
                    _body(namespace, "missing", 1), timeout=REQUEST_TIMEOUT)
    assert err.value.status == 404
    assert b"not found" in err.value.body
    assert err.value.headers is not None and "Content-Type" in err.value.headers


def test_the_token_is_read_at_every_request(control_plane: Any, kube_api: client.ApiClient,
                                            namespace: str) -> None:
    """A refresh hook (as the in-cluster configuration installs) runs before each request,
    so a renewed token is used; a token the API server rejects gives 401."""
    objects.create_trainjob(kube_api, namespace, "t")
    good = control_plane.service_account_token("kube-system", "apply-request-test")
    # The ServiceAccount may not write: 403 proves the token was accepted.
    api = without_retries(control_plane.api_client_for_token("not-a-token"))
    tokens = iter(["not-a-token", good])
    calls: list[str] = []

    def refresh(configuration: client.Configuration) -> None:
        token = next(tokens)
        calls.append(token)
        configuration.api_key = {"authorization": token}

    api.configuration.refresh_api_key_hook = refresh
    try:
        for expected in (401, 403):
            with pytest.raises(ApiException) as err:
                apply_patch(api, _path(namespace, "t"), QUERY, _body(namespace, "t", 3),
                            timeout=REQUEST_TIMEOUT)
            assert err.value.status == expected
    finally:
        api.close()
    assert calls == ["not-a-token", good]
