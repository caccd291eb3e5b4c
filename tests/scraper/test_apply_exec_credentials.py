"""A kubeconfig whose user is an exec credential plugin (EKS, GKE, kubelogin, OIDC
helpers): the status write's credential refresh must not block the event loop.

ApplyClient reads credentials with ``ApiClient.update_params_for_auth``.  For a
kubeconfig user with ``exec``, the official client's refresh hook
(kubernetes/config/kube_config.py ``_refresh_api_key``) re-runs the plugin as a blocking
subprocess whenever the token's ``expirationTimestamp`` is within
``EXPIRY_SKEW_PREVENTION_DELAY`` (5 minutes): for the last 5 minutes of every token's
life when the plugin caches its token, and at every request when it returns a token with
less than 5 minutes left.  Read on the loop (the first aiohttp write path), 8 writes
stalled the loop 7 times over 0.2 s; now the credentials are read in a worker thread,
at most every ``CREDENTIALS_SECONDS`` (found by a newcomer's check, 2026-12-01).

Real parts: the real kube-apiserver, a real exec plugin (a shell script printing an
``ExecCredential`` with a real ServiceAccount token), the official client's kubeconfig
loader, ApplyClient.  Nothing is mocked.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from localdev.cluster import objects
from scraper.kube.apply_request import ApplyClient, encode_apply_body
from scraper.kube.client import REQUEST_TIMEOUT, load_client
from scraper.shared.outcome import FIELD_MANAGER
from tests.helpers.scraper import scraper_service_account

pytestmark = [pytest.mark.usefixtures("trainjob_crd"), pytest.mark.timeout(120)]

#: Seconds the plugin takes (gke-gcloud-auth-plugin and `aws eks get-token` take
#: 0.1-1 s; kept small here).
PLUGIN_SECONDS = 0.3
WRITES = 8


def _exec_kubeconfig(path: Path, server: str, ca: Path, token: str, runs: Path) -> Path:
    expiry = (datetime.now(UTC) + timedelta(minutes=4)).strftime("%Y-%m-%dT%H:%M:%SZ")
    credential = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"token": token, "expirationTimestamp": expiry}}
    plugin = path.with_name("plugin.sh")
    plugin.write_text(f"#!/bin/sh\necho run >> {runs}\nsleep {PLUGIN_SECONDS}\n"
                      f"echo '{json.dumps(credential)}'\n")
    plugin.chmod(0o755)
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server,
                                               "certificate-authority": str(ca)}}],
        "users": [{"name": "u", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin),
            "interactiveMode": "Never"}}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(config))
    return path


async def test_exec_plugin_refresh_never_runs_on_the_event_loop(
        control_plane: Any, kube_api: client.ApiClient, namespace: str,
        tmp_path: Path) -> None:
    objects.create_trainjob(kube_api, namespace, "exec")
    runs = tmp_path / "runs"
    with scraper_service_account(kube_api, control_plane, namespace) as token:
        kubeconfig = _exec_kubeconfig(tmp_path / "kubeconfig", control_plane.server_url,
                                      control_plane.ca_cert_path, token, runs)
        api = load_client(kubeconfig)
        loop_thread = threading.get_ident()
        on_loop: list[bool] = []
        hook = api.configuration.refresh_api_key_hook
        assert hook is not None, "the kubeconfig loader installs a refresh hook for exec"

        def recording(configuration: client.Configuration) -> None:
            on_loop.append(threading.get_ident() == loop_thread)
            hook(configuration)
            # The client's hook installs itself again (kube_config._set_config): keep ours.
            configuration.refresh_api_key_hook = recording

        api.configuration.refresh_api_key_hook = recording
        lags: list[float] = []
        done = asyncio.Event()

        async def watch_lag() -> None:
            while not done.is_set():
                before = time.monotonic()
                await asyncio.sleep(0.01)
                lags.append(time.monotonic() - before - 0.01)

        applier = ApplyClient(api, connections=1)
        monitor = asyncio.create_task(watch_lag())
        path = (f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/"
                "trainjobs/exec/status")
        try:
            for i in range(WRITES):
                body = encode_apply_body({
                    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                    "metadata": {"name": "exec", "namespace": namespace},
                    "status": {"trainerStatus": {"progressPercentage": i,
                                                 "lastUpdatedTime": "2026-01-01T00:00:00Z"}}})
                obj = await applier.patch(path, [("fieldManager", FIELD_MANAGER),
                                                 ("force", "true")], body,
                                          request_timeout=REQUEST_TIMEOUT)
                assert obj["status"]["trainerStatus"]["progressPercentage"] == i
        finally:
            done.set()
            await monitor
            await applier.close()
            api.close()
    plugin_runs = len(runs.read_text().splitlines())
    print(f"\nplugin runs {plugin_runs} for {WRITES} writes; hook calls {len(on_loop)}, "
          f"on the loop {sum(on_loop)}; longest loop stall {max(lags):.3f} s, "
          f"stalls over 0.2 s: {sum(lag > 0.2 for lag in lags)}")
    assert on_loop and not any(on_loop), (
        f"the credential refresh (exec plugin, {plugin_runs} runs of {PLUGIN_SECONDS} s) "
        f"ran on the event loop thread {sum(on_loop)} times; longest stall {max(lags):.3f} s")
    # Read once and reused while fresh, not once per write.
    assert len(on_loop) < WRITES, on_loop
