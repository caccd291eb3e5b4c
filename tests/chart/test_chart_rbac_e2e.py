"""The chart's RBAC is enough for the scraper's whole job, and nothing more.

One end-to-end run on the local control plane:

* the chart is rendered and its ServiceAccount, ClusterRole, ClusterRoleBinding and
  Lease Role/RoleBinding are applied for real;
* a TokenRequest token of that ServiceAccount is the scraper's only credential
  (``python -m scraper run --kubeconfig <token kubeconfig> --config <the chart's
  config.yaml>``, leader election on);
* a real ``exporter_lib`` exporter runs in a child process on loopback, and a
  trainer Pod (localdev.cluster builders, Running, podIP 127.0.0.1) points at it;
* the scraper discovers the pod, scrapes it and writes ``status.trainerStatus``;
  a second TrainJob's pod serves a status breaking the API limits, so the scraper
  records a Warning Event (the Events grant is used too);
* the scraper's /metrics needs a bearer token (the chart's default): a real Prometheus
  sends the token of its own ServiceAccount, bound by ``metrics.auth.readers`` to the
  chart's metrics-reader ClusterRole, and the scraper checks it with TokenReview and
  SubjectAccessReview through the chart's metrics-auth ClusterRole; no token is a 401;
* the chart's ValidatingAdmissionPolicy is applied too: the scraper's writes pass it;
* Prometheus scrapes the scraper every second; every PromQL expression of
  the Grafana dashboard (template variables substituted as Grafana would) is
  executed there: none may fail to parse, and every panel but "Pod watch
  restarts" must return data (the core panels only for this run's namespace);
* with the same token, requests outside the scraper's job are denied (403), and so is
  a change of another status field than trainerStatus (by the policy).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from localdev.cluster import objects
from localdev.cluster.controlplane import ControlPlane
from localdev.cluster.processes import free_port
from localdev.cluster.prometheus import PrometheusServer, ScrapeTarget
from tests.helpers.chart import (
    CORE_PANELS,
    REPO,
    Helm,
    dashboard,
    dashboard_expressions,
    grafana_to_promql,
)

START_TIMEOUT = 60.0
STATUS_TIMEOUT = 60.0
PROMETHEUS_TIMEOUT = 60.0
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
POLICY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
PROMETHEUS_SA = "prometheus"

EXPORTER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import exporter_lib

    exporter = exporter_lib.start(port=0, host="127.0.0.1", install_signal_handler=False,
                                  termination_message_path=sys.argv[1])
    print(exporter.port, flush=True)
    for step in range(1, 100000):  # a training loop, ended by the test (SIGTERM)
        exporter_lib.update(progress_percentage=min(99, 10 + step),
                            estimated_remaining_seconds=max(0, 3600 - 10 * step),
                            metrics={"loss": round(1.0 / step, 6), "lr": 0.001,
                                     "phase": "train"})
        time.sleep(0.5)
    """
)



def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _child_env() -> dict[str, str]:
    """The test's environment without anything that could hand the child other credentials
    or a rank (the exporter would not serve on a non-zero rank)."""
    drop = ("KUBECONFIG", "RANK", "LOCAL_RANK", "WORLD_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_RANK",
            "TRAINJOB_SCRAPER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@contextlib.contextmanager
def _exporter(tmp_path: Path) -> Iterator[int]:
    """A training process with the real exporter on loopback; yields its port."""
    proc = subprocess.Popen(
        [sys.executable, "-c", EXPORTER_SCRIPT, str(tmp_path / "termination-log")],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "exporter.log", "wb"),  # noqa: SIM115
        env=_child_env(), text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # bounded: the child prints its port or exits
        assert line.strip().isdigit(), (
            f"exporter did not start: {(tmp_path / 'exporter.log').read_text()}")
        yield int(line)
    finally:
        _stop(proc)


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@contextlib.contextmanager
def _invalid_exporter() -> Iterator[int]:
    """An exporter stand-in serving a status the Trainer API would reject (150 %)."""
    body = json.dumps({"progressPercentage": 150,
                       "lastUpdatedTime": "2026-01-01T00:00:00Z"}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@dataclass
class Scraper:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    token: str = ""  # a bearer token allowed to get /metrics

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> str:
        status, body = _get(f"http://127.0.0.1:{self.port}/metrics", self.token)
        assert status == 200, body
        return body


@contextlib.contextmanager
def _scraper(config: Path, kubeconfig: Path, tmp_path: Path, identity: str) -> Iterator[Scraper]:
    port = free_port()
    log_path = tmp_path / "scraper.log"
    env = _child_env()
    env["TRAINJOB_SCRAPER_IDENTITY"] = identity  # as the chart's Deployment sets it
    proc = subprocess.Popen(
        [sys.executable, "-m", "scraper", "run", f"--config={config}",
         f"--kubeconfig={kubeconfig}", "--listen-host=127.0.0.1", f"--listen-port={port}",
         "--interval=1s", "--scrape-timeout=900ms", "--resync-interval=5s"],
        stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, env=env,  # noqa: SIM115
    )
    scraper = Scraper(proc, port, log_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert proc.poll() is None, f"scraper exited {proc.returncode}:\n{scraper.log()}"
            with contextlib.suppress(OSError):
                if _get(f"http://127.0.0.1:{port}/readyz")[0] == 200:
                    break
            assert time.monotonic() < deadline, f"scraper not ready:\n{scraper.log()}"
            time.sleep(0.2)
        yield scraper
    finally:
        _stop(proc)


def _wait(what: str, check: Any, timeout: float, detail: Any = lambda: "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not within {timeout}s\n{detail()}")
        time.sleep(0.25)


@pytest.fixture
def release_namespace(control_plane: ControlPlane) -> str:
    name = f"scraper-{secrets.token_hex(3)}"
    control_plane.kubectl("create", "namespace", name)
    return name


def test_chart_rbac_runs_a_full_cycle_and_denies_everything_else(
    control_plane: ControlPlane, kube_api: client.ApiClient, trainjob_crd: None,
    namespace: str, release_namespace: str, helm: Helm, tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    release = f"rbac-{secrets.token_hex(3)}"
    fullname = f"{release}-trainjob-scraper"
    readers = [{"kind": "ServiceAccount", "name": PROMETHEUS_SA,
                "namespace": release_namespace}]
    rendered = helm.template({"metrics": {"auth": {"readers": readers}},
                              "validatingAdmissionPolicy": {"enabled": True}},
                             release=release, namespace=release_namespace)

    # -- the chart's RBAC and policy, applied for real; the scraper gets nothing else
    rbac = [o for o in rendered.objects if o["kind"] in RBAC_KINDS | POLICY_KINDS]
    assert {o["kind"] for o in rbac} == RBAC_KINDS | POLICY_KINDS
    manifest = tmp_path / "rbac.yaml"
    manifest.write_text(yaml.safe_dump_all(rbac))
    control_plane.kubectl("apply", "--server-side", f"--filename={manifest}")
    # cluster-scoped leftovers would outlive the test's namespace
    request.addfinalizer(lambda: control_plane.kubectl(
        "delete", "--ignore-not-found", "--wait=false", f"--filename={manifest}", check=False))
    token = control_plane.service_account_token(release_namespace, fullname)
    kubeconfig = control_plane.kubeconfig_for_token(token, tmp_path / "scraper.kubeconfig")
    config = tmp_path / "config.yaml"
    config.write_text(rendered.one("ConfigMap", fullname)["data"]["config.yaml"])
    assert yaml.safe_load(config.read_text())["metrics_auth"] is True
    prometheus_token = control_plane.service_account_token(release_namespace, PROMETHEUS_SA)
    prometheus_token_file = tmp_path / "prometheus-token"
    prometheus_token_file.write_text(prometheus_token)

    # -- a TrainJob whose rank-0 pod runs the real exporter on loopback
    trainjob = "llm-finetune"
    objects.create_trainjob(kube_api, namespace, trainjob)
    custom = client.CustomObjectsApi(kube_api)

    broken = "broken-reporter"
    objects.create_trainjob(kube_api, namespace, broken)

    with _exporter(tmp_path) as exporter_port, _invalid_exporter() as invalid_port:
        pod = objects.create_trainer_pod(kube_api, namespace, trainjob, port=exporter_port,
                                         ip="127.0.0.1")
        objects.create_trainer_pod(kube_api, namespace, broken, port=invalid_port,
                                   ip="127.0.0.1")
        with _scraper(config, kubeconfig, tmp_path, identity=f"{fullname}-0") as scraper, \
                PrometheusServer([ScrapeTarget(
                    "trainjob-scraper", f"127.0.0.1:{scraper.port}",
                    bearer_token_file=str(prometheus_token_file))]) as prometheus:
            scraper.token = prometheus_token
            # /metrics is guarded: no token, or the scraper's own (not a reader), is refused
            url = f"http://127.0.0.1:{scraper.port}/metrics"
            assert _get(url)[0] == 401
            assert _get(url, token)[0] == 403

            def trainer_status() -> dict[str, Any] | None:
                obj = custom.get_namespaced_custom_object(
                    API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob)
                status: dict[str, Any] | None = (obj.get("status") or {}).get("trainerStatus")
                return status if status and status.get("progressPercentage") else None

            status = _wait("status.trainerStatus written", trainer_status, STATUS_TIMEOUT,
                           scraper.log)
            assert 10 < status["progressPercentage"] < 100
            assert {"name": "phase", "value": "train"} in status["metrics"]
            obj = custom.get_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob)
            managers = {(m["manager"], m.get("subresource")) for m in
                        obj["metadata"]["managedFields"]}
            assert ("trainjob-scraper", "status") in managers

            # progress keeps flowing (the exporter reports every 0.5 s)
            first = status["progressPercentage"]
            _wait("a newer progress written",
                  lambda: (trainer_status() or {}).get("progressPercentage", 0) > first,
                  STATUS_TIMEOUT, scraper.log)

            # the scraper led through the Lease the chart's Role covers
            lease = client.CoordinationV1Api(kube_api).read_namespaced_lease(
                fullname, release_namespace)
            assert lease.spec.holder_identity == f"{fullname}-0"
            assert "trainjob_scraper_leader 1.0" in scraper.metrics()
            # the endpoints the chart's probes use
            assert _get(f"http://127.0.0.1:{scraper.port}/healthz")[0] == 200
            assert _get(f"http://127.0.0.1:{scraper.port}/readyz")[0] == 200

            # the invalid report is refused with a Warning Event on its TrainJob
            def invalid_event() -> list[Any]:
                events = client.CoreV1Api(kube_api).list_namespaced_event(namespace).items
                return [e for e in events if e.reason == "InvalidTrainerStatus"
                        and e.involved_object.name == broken]

            (event,) = _wait("InvalidTrainerStatus Event", invalid_event, STATUS_TIMEOUT,
                             scraper.log)
            assert event.type == "Warning"
            assert event.source.component == "trainjob-scraper"
            assert "progressPercentage" in event.message
            broken_obj = custom.get_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, broken)
            assert "trainerStatus" not in (broken_obj.get("status") or {})

            _check_dashboard_queries(prometheus, namespace, trainjob)

            log = scraper.log()
            for word in ("Forbidden", "forbidden", " 403"):
                assert word not in log, f"the scraper was denied something:\n{log}"

        _check_denied(control_plane, token, namespace, trainjob, pod.metadata.name,
                      release_namespace, fullname)


def _check_dashboard_queries(prometheus: PrometheusServer, namespace: str,
                             trainjob: str) -> None:
    prometheus.wait_for_targets_up(timeout=PROMETHEUS_TIMEOUT)
    selector = f'trainjob_progress_ratio{{namespace="{namespace}", trainjob="{trainjob}"}}'
    prometheus.wait_for_data(selector, timeout=PROMETHEUS_TIMEOUT)
    # rate() over the 30s window needs two samples of the counters; wait for them.
    prometheus.wait_for_data(
        "count_over_time(trainjob_scraper_scrapes_total[30s]) >= 3", timeout=PROMETHEUS_TIMEOUT)

    variables = {"namespace": namespace, "trainjob": trainjob, "metric": ".*"}
    empty: list[str] = []
    for title, expr in dashboard_expressions(dashboard()):
        promql = grafana_to_promql(expr, **variables)
        body = prometheus.api("query", {"query": promql})
        assert body["status"] == "success", (
            f"panel {title!r}: {promql!r} failed: {body.get('errorType')}: {body.get('error')}")
        if not body["data"]["result"]:
            empty.append(title)
        if title in CORE_PANELS:
            for sample in body["data"]["result"]:
                if "namespace" in sample["metric"]:
                    assert sample["metric"]["namespace"] == namespace
    # Every panel has data after this run, except the watch restarts (none need happen).
    assert set(empty) <= {"Pod watch restarts"}, f"panels without data: {empty}"
    # the training-metric panel shows the numeric metrics only ("phase" is text)
    metrics = prometheus.query(
        f'trainjob_metric{{namespace="{namespace}", trainjob="{trainjob}"}}')["result"]
    assert {s["metric"]["name"] for s in metrics} == {"loss", "lr"}
    progress = prometheus.query(selector)["result"]
    assert 0.1 < float(progress[0]["value"][1]) < 1.0


def _check_denied(control_plane: ControlPlane, token: str, namespace: str, trainjob: str,
                  pod: str, release_namespace: str, fullname: str) -> None:
    """Everything outside the scraper's job is answered 403 for its token."""
    with control_plane.api_client_for_token(token) as api:
        custom = client.CustomObjectsApi(api)
        core = client.CoreV1Api(api)
        coordination = client.CoordinationV1Api(api)
        current = custom.get_namespaced_custom_object(  # allowed: get
            API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob)
        attempts = {
            "patch TrainJob spec": lambda: custom.patch_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob,
                {"spec": {"suspend": True}}),
            "update TrainJob": lambda: custom.replace_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob, current),
            "delete TrainJob": lambda: custom.delete_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob),
            "create TrainJob": lambda: custom.create_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL,
                {**current, "metadata": {"name": "other", "namespace": namespace}}),
            "list Secrets": lambda: core.list_namespaced_secret(namespace),
            "get Secret": lambda: core.read_namespaced_secret("any", namespace),
            "list Secrets cluster-wide": lambda: core.list_secret_for_all_namespaces(),
            "list ConfigMaps": lambda: core.list_namespaced_config_map(namespace),
            # get Pod is granted: a pod is read again before an answer that states no
            # pod is written (scraper/discovery/pod_confirm.py).
            "patch Pod": lambda: core.patch_namespaced_pod(
                pod, namespace, {"metadata": {"labels": {"x": "y"}}}),
            "patch Pod status": lambda: core.patch_namespaced_pod_status(
                pod, namespace, {"status": {"phase": "Failed"}}),
            "delete Pod": lambda: core.delete_namespaced_pod(pod, namespace),
            "exec/create Pod": lambda: core.create_namespaced_pod(namespace, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                "spec": {"containers": [{"name": "x", "image": "x"}]}}),
            "create Lease elsewhere": lambda: coordination.create_namespaced_lease(
                namespace, {"metadata": {"name": fullname}, "spec": {}}),
            "update another Lease": lambda: coordination.read_namespaced_lease(
                "kube-scheduler", release_namespace),
            "delete own Lease": lambda: coordination.delete_namespaced_lease(
                fullname, release_namespace),
            "list Namespaces": lambda: core.list_namespace(),
            # RBAC allows status patches; the chart's ValidatingAdmissionPolicy does not
            # let this identity touch other status fields than trainerStatus
            "patch TrainJob status.conditions": lambda: objects.apply_trainjob_status(
                api, namespace, trainjob, {"conditions": [{
                    "type": "Complete", "status": "True", "reason": "Forged", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
                field_manager="trainjob-scraper"),
        }
        allowed = []
        for name, attempt in attempts.items():
            try:
                attempt()
            except client.ApiException as exc:
                assert exc.status == 403, f"{name}: expected 403, got {exc.status} {exc.reason}"
            else:
                allowed.append(name)
        assert not allowed, f"the scraper's token may: {allowed}"
