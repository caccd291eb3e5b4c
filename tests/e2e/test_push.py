"""Upstream's push design for real: Kubeflow Trainer v2.3.0 with its TrainJobStatus gate on.

The cluster (:func:`push_stack`) runs the Trainer controller with the gate on, so its
status server serves (TLS with the Trainer's certificate, port from its configuration)
and checks each request's bearer token by OIDC discovery of the API server's
ServiceAccount issuer (``pkg/statusserver/auth.go``).  The Trainer injects into the
trainer container ``KUBEFLOW_TRAINER_SERVER_URL`` (``https://<webhook service>.
<namespace>.svc:<port>/...``), the CA and token paths and a projected volume
(serviceAccountToken with the TrainJob's audience, the ``<trainjob>-tls-config``
ConfigMap); the pod runner writes that volume as a kubelet does and mounts it, with
a hosts file resolving the Service name to the loopback address, in a private mount
namespace of the process.  No scraper runs here: the only writer is upstream's.

What is not real: kwok and the pod runner stand in for the kubelet and container
runtime; the Service name resolves through the pod's hosts file, not cluster DNS.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION
from localdev.cluster import trainjobs
from localdev.cluster.owners import PUSH_MANAGER, owners, trainer_status_entries
from localdev.cluster.stack import Cluster, trainer_service_host
from tests.helpers import waits
from tests.helpers.stack import python_command, recording

TRAINING_TIMEOUT_SECONDS = 420
FINAL_TIMEOUT_SECONDS = 30
TOKEN_MOUNT = "/var/run/secrets/kubeflow/trainer"


def audience(namespace: str, name: str) -> str:
    """The token audience the status server expects (``statusserver.TokenAudience``)."""
    return f"trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


def status_path(namespace: str, name: str) -> str:
    return f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{namespace}/trainjobs/{name}/status"


def _claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def _logged_losses(path: Path) -> list[str]:
    return [repr(e["loss"]) if isinstance(e["loss"], float) else str(e["loss"])
            for e in map(json.loads, path.read_text().splitlines()) if "loss" in e]


def _explain(cluster: Cluster, pod: client.V1Pod) -> str:
    meta = pod.metadata
    logs = sorted((cluster.workdir / "pods").glob(f"{meta.namespace}_{meta.name}_*.log"))
    logs += [cluster.workdir / "pod-runner.log", cluster.workdir / "trainer-controller-manager.log"]
    return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-20:])
                     for p in logs if p.exists())


def test_unmodified_transformers_training_pushes_to_the_real_status_server(
        push_stack: Cluster, push_api: client.ApiClient, push_namespace: str,
        tmp_path: Path) -> None:
    ns, name = push_namespace, "pushed"
    log_file = tmp_path / "training-log.jsonl"
    # Unmodified: torch and Transformers only, report_to at its default, no exporter.
    command = python_command("localdev.demo.train_unmodified", "--epochs", "2",
                             "--samples", "128", "--logging-steps", "2",
                             "--log-file", str(log_file))
    with recording(push_api, ns, name) as recorder:
        created = trainjobs.create(push_api, trainjobs.trainjob_body(
            ns, name, command=command, env={"PYTHONUNBUFFERED": "1"}))
        finished = trainjobs.wait_finished(push_api, ns, name, TRAINING_TIMEOUT_SECONDS)
        [pod] = trainjobs.pods(push_api, ns, name)
        [trainer] = pod.status.container_statuses
        assert trainjobs.condition(finished, "Complete"), _explain(push_stack, pod)
        assert trainer.state.terminated.exit_code == 0, _explain(push_stack, pod)
        final = recorder.wait_for(
            lambda o: o.uid == created["metadata"]["uid"] and o.status is not None
            and o.status.progress_percentage == 100,
            FINAL_TIMEOUT_SECONDS, "the callback's final push").status
        assert final is not None

    # What the Trainer injected, unchanged by the pod runner.
    [container] = [c for c in pod.spec.containers if c.name == "node"]
    env = {e.name: e.value for e in container.env or []}
    assert env["KUBEFLOW_TRAINER_SERVER_URL"] == (
        f"https://{trainer_service_host()}:{push_stack.status_server_port}"
        f"{status_path(ns, name)}")
    assert env["KUBEFLOW_TRAINER_SERVER_CA_CERT"] == f"{TOKEN_MOUNT}/ca.crt"
    assert env["KUBEFLOW_TRAINER_SERVER_TOKEN"] == f"{TOKEN_MOUNT}/token"
    [mount] = [m for m in container.volume_mounts if m.mount_path == TOKEN_MOUNT]
    [volume] = [v for v in pod.spec.volumes if v.name == mount.name]
    token_source = next(s.service_account_token for s in volume.projected.sources
                        if s.service_account_token)
    assert (token_source.audience, token_source.expiration_seconds) == (audience(ns, name), 3600)

    # The token the pod runner wrote, as the kubelet asks for it: the audience, the
    # expiry and bound to this pod.
    written = push_stack.workdir / "pods" / f"{ns}_{pod.metadata.name}" / "files" / mount.name
    claims = _claims((written / "token").read_text())
    assert claims["aud"] == [audience(ns, name)]
    assert claims["exp"] - claims["iat"] == 3600
    assert claims["kubernetes.io"]["pod"] == {"name": pod.metadata.name,
                                              "uid": pod.metadata.uid}
    assert (written / "ca.crt").read_bytes() == push_stack.trainer_ca_cert

    # The status the TrainJob stores, written by upstream's status server only.
    live = trainjobs.get(push_api, ns, name)
    assert owners(live) == {PUSH_MANAGER}, trainer_status_entries(live)
    [entry] = trainer_status_entries(live)
    assert (entry["operation"], entry.get("subresource")) == ("Apply", "status")
    held = live["status"]["trainerStatus"]
    assert held["progressPercentage"] == 100 and held["estimatedRemainingSeconds"] == 0
    logged = _logged_losses(log_file)
    assert logged, "training logged no loss"
    metrics = {m["name"]: m["value"] for m in held["metrics"]}
    assert metrics["loss"] == logged[-1]
    # Live: the callback pushed while training (its 99 % cap before the end).
    progress = [s.progress_percentage for s in recorder.statuses(created["metadata"]["uid"])]
    assert [p for p in progress if p is not None and p < 100], progress
    # v2.2+ writes its own status by merge patch: the Complete condition did not erase it.
    assert trainjobs.condition(live, "Complete")


def _token(api: client.ApiClient, namespace: str, audiences: list[str]) -> str:
    result = client.CoreV1Api(api).create_namespaced_service_account_token(
        "default", namespace, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=audiences, expiration_seconds=600)))
    return str(result.status.token)


def _post(cluster: Cluster, path: str, token: str, body: dict[str, Any]) -> int:
    context = ssl.create_default_context(cadata=cluster.trainer_ca_cert.decode())
    assert cluster.status_server_url is not None
    request = urllib.request.Request(
        cluster.status_server_url + path, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_status_server_checks_audience_and_namespace_of_the_token(
        push_stack: Cluster, push_api: client.ApiClient, push_namespace: str) -> None:
    ns, name = push_namespace, "suspended"
    trainjobs.create(push_api, trainjobs.trainjob_body(ns, name, suspend=True))
    other_ns = f"{ns}-other"[:63]
    client.CoreV1Api(push_api).create_namespace({"metadata": {"name": other_ns}})
    try:
        waits.default_service_account(push_api, other_ns)
        body = {"trainerStatus": {"progressPercentage": 42,
                                  "lastUpdatedTime": "2026-01-01T00:00:00Z"}}
        path = status_path(ns, name)
        # Another TrainJob's audience, and the right audience from another namespace.
        assert _post(push_stack, path, _token(push_api, ns, [audience(ns, "other")]), body) == 403
        assert _post(push_stack, path, _token(push_api, other_ns, [audience(ns, name)]),
                     body) == 403
        assert trainer_status_entries(trainjobs.get(push_api, ns, name)) == []
        # The right one: applied as field manager trainer-status.
        assert _post(push_stack, path, _token(push_api, ns, [audience(ns, name)]), body) == 200
        live = trainjobs.get(push_api, ns, name)
        assert live["status"]["trainerStatus"]["progressPercentage"] == 42
        assert owners(live) == {PUSH_MANAGER}
    finally:
        client.CoreV1Api(push_api).delete_namespace(other_ns)
