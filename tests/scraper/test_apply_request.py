"""The apply PATCH on the event loop (scraper/kube/apply_request.py), against the real
kube-apiserver: the answer, the client's error type, credentials read per request (a
refreshed token is the one sent), and TLS as the client's configuration sets it."""

from __future__ import annotations

import asyncio
import copy
import socket
from typing import Any
from urllib.parse import urlsplit

import certifi
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from localdev.cluster import objects
from scraper.kube.apply_request import ApplyClient, encode_apply_body
from scraper.kube.client import REQUEST_TIMEOUT, without_retries
from scraper.shared.outcome import FIELD_MANAGER

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


async def _patch(api: client.ApiClient, path: str, body: bytes) -> dict[str, Any]:
    applier = ApplyClient(api, connections=1)
    try:
        return await applier.patch(path, QUERY, body, request_timeout=REQUEST_TIMEOUT)
    finally:
        await applier.close()


async def test_the_answer_is_the_applied_object(kube_api: client.ApiClient,
                                                namespace: str) -> None:
    created = objects.create_trainjob(kube_api, namespace, "a")
    obj = await _patch(kube_api, _path(namespace, "a"), _body(namespace, "a", 42))
    assert obj["metadata"]["uid"] == created["metadata"]["uid"]
    assert obj["status"]["trainerStatus"]["progressPercentage"] == 42
    managers = {m["manager"] for m in obj["metadata"]["managedFields"]}
    assert FIELD_MANAGER in managers


async def test_an_error_answer_is_the_clients_api_exception(kube_api: client.ApiClient,
                                                            namespace: str) -> None:
    with pytest.raises(ApiException) as err:
        await _patch(kube_api, _path(namespace, "missing"), _body(namespace, "missing", 1))
    assert err.value.status == 404
    assert b"not found" in err.value.body
    assert err.value.headers is not None and "Content-Type" in err.value.headers


async def test_the_credentials_are_read_again_after_a_401(
        control_plane: Any, kube_api: client.ApiClient, namespace: str) -> None:
    """The refresh hook (as the in-cluster configuration installs) runs before the first
    request and again after a 401, so a renewed token is used; a token the API server
    rejects gives 401, the next one is accepted (403: the ServiceAccount may not write)."""
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
    applier = ApplyClient(api, connections=1)
    try:
        for expected in (401, 403):
            with pytest.raises(ApiException) as err:
                await applier.patch(_path(namespace, "t"), QUERY, _body(namespace, "t", 3),
                                    request_timeout=REQUEST_TIMEOUT)
            assert err.value.status == expected
    finally:
        await applier.close()
        api.close()
    assert calls == ["not-a-token", good]


async def test_tls_follows_the_clients_configuration(control_plane: Any,
                                                     namespace: str) -> None:
    """The server's certificate is checked against ``ssl_ca_cert`` (a CA that did not sign
    it: a ConnectionError, nothing sent); ``verify_ssl`` false skips the check, as the
    client's own requests do; no client certificate and no token: the anonymous user,
    whom RBAC refuses."""
    api = control_plane.api_client()
    objects.create_trainjob(api, namespace, "tls")
    anonymous = without_retries(control_plane.api_client_for_token(""))
    anonymous.configuration.api_key = {}
    try:
        api.configuration.ssl_ca_cert = certifi.where()
        with pytest.raises(ConnectionError, match="certificate"):
            await _patch(api, _path(namespace, "tls"), _body(namespace, "tls", 5))
        api.configuration.verify_ssl = False
        obj = await _patch(api, _path(namespace, "tls"), _body(namespace, "tls", 6))
        assert obj["status"]["trainerStatus"]["progressPercentage"] == 6
        with pytest.raises(ApiException) as err:
            await _patch(anonymous, _path(namespace, "tls"), _body(namespace, "tls", 7))
        assert err.value.status == 403 and b"system:anonymous" in err.value.body
    finally:
        api.close()
        anonymous.close()


async def test_a_refused_connection_is_a_connection_error(kube_api: client.ApiClient,
                                                          namespace: str) -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = client.Configuration()
    cfg.host = f"https://127.0.0.1:{port}"
    api = client.ApiClient(cfg)
    try:
        with pytest.raises(ConnectionError, match=r"127\.0\.0\.1"):
            await _patch(api, _path(namespace, "x"), _body(namespace, "x", 1))
    finally:
        api.close()


async def _tunnel(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        data = await reader.read(65536)
        if not data:
            break
        writer.write(data)
        await writer.drain()
    writer.close()


async def test_the_proxy_of_the_configuration_carries_the_patch(
        kube_api: client.ApiClient, namespace: str) -> None:
    """``proxy`` set: the PATCH goes through it (an HTTP CONNECT tunnel, TLS end to end
    with the API server); ``no_proxy`` covering the API server's host: straight there.
    The proxy is a minimal CONNECT tunnel on loopback written for this test."""
    objects.create_trainjob(kube_api, namespace, "p")
    asked: list[str] = []

    async def connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, target = head.split(b" ")[:2]
        asked.append(f"{method.decode()} {target.decode()}")
        host, port = target.decode().rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(_tunnel(reader, up_writer), _tunnel(up_reader, writer))

    server = await asyncio.start_server(connect, "127.0.0.1", 0)
    proxy_port = server.sockets[0].getsockname()[1]
    api_host = urlsplit(kube_api.configuration.host).netloc
    cfg = copy.copy(kube_api.configuration)
    cfg.proxy = f"http://127.0.0.1:{proxy_port}"
    via_proxy = client.ApiClient(cfg)
    try:
        obj = await _patch(via_proxy, _path(namespace, "p"), _body(namespace, "p", 8))
        assert obj["status"]["trainerStatus"]["progressPercentage"] == 8
        assert asked == [f"CONNECT {api_host}"]
        cfg.no_proxy = "127.0.0.1"
        direct = client.ApiClient(cfg)
        try:
            obj = await _patch(direct, _path(namespace, "p"), _body(namespace, "p", 9))
        finally:
            direct.close()
        assert obj["status"]["trainerStatus"]["progressPercentage"] == 9
        assert asked == [f"CONNECT {api_host}"]  # no second tunnel
    finally:
        via_proxy.close()
        server.close()
        await server.wait_closed()
