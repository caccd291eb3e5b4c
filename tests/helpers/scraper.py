"""Helpers for the scraper tests: a scriptable exporter and scraper subprocesses.

The scraper always runs as a real ``python -m scraper run`` process against the
session's control plane, so signals, leader election and the HTTP endpoints are
exercised as deployed.  Exporters listen on 127.0.0.1; trainer pods carry that
IP and the exporter's port (the local cluster has no kubelet or pod network).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from aiohttp import web
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from exporter_lib.pod import POD_HEADER, PodIdentity
from exporter_lib.status import TrainerStatus
from localdev.cluster.processes import free_port
from tests.helpers.fault_proxy import FaultProxy, write_kubeconfig

REPO = Path(__file__).resolve().parents[2]
#: The least-privilege rules the chart ships (the chart renders its ClusterRole from them).
RULES = REPO / "charts" / "trainjob-scraper" / "files" / "clusterrole-rules.yaml"
#: What ``--status-target annotation|auto`` needs besides (the chart adds it then).
ANNOTATION_RULES = REPO / "charts" / "trainjob-scraper" / "files" / "annotation-rules.yaml"



def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             period: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # keep polling: the object may not exist yet
            last_exc = exc
        time.sleep(period)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                         + (f" (last error: {last_exc})" if last_exc else ""))


def status_json(progress: int, *, remaining: int | None = None, loss: str = "0.5",
                at: int = 1_700_000_000) -> dict[str, Any]:
    """A valid exporter JSON body (camelCase)."""
    body: dict[str, Any] = {
        "progressPercentage": progress,
        "metrics": [{"name": "loss", "value": loss}],
        "lastUpdatedTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)),
    }
    if remaining is not None:
        body["estimatedRemainingSeconds"] = remaining
    return body


# ---------------------------------------------------------------- fake exporter


@dataclass
class FakeExporter:
    """An exporter whose behaviour a test sets: ``mode`` and ``body``.

    Modes: ``json`` (body as JSON, ETag/304 like the real exporter), ``text``
    (``body`` is Prometheus text), ``garbage`` (``body`` sent as JSON as is),
    ``huge`` (a body of ``huge_bytes``), ``slow`` (answers after ``delay`` s),
    ``redirect`` (302 to ``/elsewhere``), ``empty`` (204).  It listens on ``host``
    (another loopback address gives a test a pod IP of its own) and states no pod
    (no ``Trainjob-Exporter-Pod``), as a third-party exporter, unless ``pod`` is set
    (a :class:`exporter_lib.pod.PodIdentity`): then it states that pod, as exporter_lib
    does in a pod.
    """

    mode: str = "json"
    host: str = "127.0.0.1"
    body: Any = None
    huge_bytes: int = 4 << 20
    delay: float = 30.0
    requests: int = 0
    elsewhere_hits: int = 0
    not_modified: int = 0
    port: int = 0
    pod: PodIdentity | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _runner: web.AppRunner | None = None
    _thread: threading.Thread | None = None
    _stopped: asyncio.Event | None = field(default=None)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        mode, body = self.mode, self.body
        if mode == "empty":
            return web.Response(status=204)
        if mode == "redirect":
            raise web.HTTPFound("/elsewhere")
        if mode == "slow":
            await asyncio.sleep(self.delay)
            return web.json_response(body)
        if mode == "huge":
            return web.Response(body=b"{" + b" " * self.huge_bytes + b"}",
                                content_type="application/json")
        if mode == "garbage":
            return web.Response(body=body if isinstance(body, bytes) else json.dumps(body),
                                content_type="application/json")
        if mode == "text":
            return web.Response(text=body, content_type="text/plain")
        payload = json.dumps(body, separators=(",", ":")).encode()
        etag = f'"{abs(hash(payload))}-json"'
        if request.headers.get("If-None-Match") == etag:
            self.not_modified += 1
            return web.Response(status=304, headers={"ETag": etag})
        stated = self.pod.header() if self.pod is not None else None
        return web.Response(body=payload, content_type="application/json",
                            headers={"ETag": etag, **({POD_HEADER: stated} if stated else {})})

    async def _elsewhere(self, request: web.Request) -> web.Response:
        self.elsewhere_hits += 1
        return web.json_response(status_json(99))

    def start(self) -> FakeExporter:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application()
            app.router.add_get("/metrics", self._handle)
            app.router.add_get("/elsewhere", self._elsewhere)
            self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self.host, 0)
            loop.run_until_complete(site.start())
            self.port = int(self._runner.addresses[0][1])
            self._stopped = asyncio.Event()
            ready.set()
            loop.run_until_complete(self._stopped.wait())
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        """Stop listening: connections to the port are then refused."""
        if self._loop is not None and self._stopped is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(10)
            self._loop = None


@pytest.fixture
def exporter_factory() -> Iterator[Callable[..., FakeExporter]]:
    started: list[FakeExporter] = []

    def make(**kwargs: Any) -> FakeExporter:
        exp = FakeExporter(**kwargs).start()
        started.append(exp)
        return exp

    yield make
    for exp in started:
        exp.stop()


# ---------------------------------------------------------------- scraper process


class ScraperProcess:
    """A ``python -m scraper run`` child process with its own /metrics port and log."""

    #: Starts tried when another process took the free port between free_port() and the
    #: scraper's bind (seen under load: "address already in use", exit code 1).
    PORT_TRIES = 3

    def __init__(self, kubeconfig: Path, args: list[str], log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self._kubeconfig = kubeconfig
        self._args = args
        self._env = env
        self._tries = 1
        self._start()
        self._http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=1, read=5),
                                         retries=False)

    def _start(self) -> None:
        self.port = free_port()
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        cmd = [sys.executable, "-m", "scraper", "run", f"--kubeconfig={self._kubeconfig}",
               f"--listen-port={self.port}", "--listen-host=127.0.0.1", "--log-level=DEBUG",
               # loopback only; the /metrics authentication has its own tests
               # (tests/scraper/test_metrics_auth.py); a test may pass --metrics-auth
               "--no-metrics-auth", *self._args]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(self._env or {})})

    def _lost_its_port(self) -> bool:
        """The process ended because its listen port was taken: started again on another."""
        if self._tries >= self.PORT_TRIES or "ddress already in use" not in self.log():
            return False
        self._log.close()
        self._tries += 1
        self._start()
        return True

    def get(self, path: str) -> tuple[int, str]:
        resp = self._http.request("GET", f"http://127.0.0.1:{self.port}{path}")
        return resp.status, resp.data.decode()

    def wait_ready(self, timeout: float = 30) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None and not self._lost_its_port():
                raise AssertionError(f"scraper exited with {self.proc.returncode}:\n{self.log()}")
            return self.get("/readyz")[0] == 200

        wait_for(ready, timeout, "scraper /readyz")

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """Every sample of the scraper's /metrics as ``{(name, labels): value}``."""
        status, text = self.get("/metrics")
        assert status == 200
        out = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return out

    def value(self, metric: str, /, **labels: str) -> float:
        """One sample's value (0 when absent)."""
        return self.metrics().get((metric, frozenset(labels.items())), 0.0)

    def settled_value(self, metric: str, expected: float, /, timeout: float = 5.0,
                      **labels: str) -> float:
        """The metric's value once it reaches ``expected`` (or ``timeout`` seconds pass),
        then after one more second, so a count that overshoots shows.  A write counts
        when its answer is back in the scraper, a moment after the API server holds it."""
        deadline = time.monotonic() + timeout
        while self.value(metric, **labels) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        return self.value(metric, **labels)

    def series(self, name: str) -> list[dict[str, str]]:
        """The label sets of every sample named ``name``."""
        return [dict(labels) for (n, labels) in self.metrics() if n == name]

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def scraper_factory(control_plane: Any, tmp_path: Path,
                    request: pytest.FixtureRequest) -> Iterator[Callable[..., ScraperProcess]]:
    """Start scrapers: ``make(*args, kubeconfig=None, env=None)``; all stopped after the test."""
    started: list[ScraperProcess] = []

    def make(*args: str, kubeconfig: Path | None = None,
             env: dict[str, str] | None = None, ready: bool = True) -> ScraperProcess:
        proc = ScraperProcess(kubeconfig or control_plane.kubeconfig_path, list(args),
                              tmp_path / f"scraper-{len(started)}.log", env)
        started.append(proc)
        if ready:
            proc.wait_ready()
        return proc

    yield make
    for proc in started:
        with contextlib.suppress(Exception):
            proc.terminate()
    # rep_call: set by the pytest_runtest_makereport hook in tests/conftest.py.
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        for proc in started:
            sys.stderr.write(f"--- {proc.log_path}\n{proc.log()[-6000:]}\n")


def leaders(scrapers: list[ScraperProcess]) -> list[ScraperProcess]:
    """The running scrapers among ``scrapers`` that hold the lease
    (``trainjob_scraper_leader`` 1)."""
    return [s for s in scrapers
            if s.proc.poll() is None and s.value("trainjob_scraper_leader") == 1]


# ---------------------------------------------------------------- cluster reads


def trainer_status(kube_api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    obj = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", name)
    return (obj.get("status") or {}).get("trainerStatus")


def resource_version(kube_api: client.ApiClient, namespace: str, name: str) -> str:
    obj = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", name)
    return str(obj["metadata"]["resourceVersion"])


def events(kube_api: client.ApiClient, namespace: str, name: str) -> list[client.CoreV1Event]:
    """Events recorded on TrainJob ``name``."""
    return [e for e in client.CoreV1Api(kube_api).list_namespaced_event(namespace).items
            if e.involved_object.kind == "TrainJob" and e.involved_object.name == name]


def progress_of(kube_api: client.ApiClient, namespace: str, name: str) -> int | None:
    status = trainer_status(kube_api, namespace, name)
    return None if status is None else TrainerStatus.from_api(status).progress_percentage


@contextlib.contextmanager
def scraper_service_account(kube_api: client.ApiClient, control_plane: Any,
                            namespace: str, *, extra_rules: Path | None = None) -> Iterator[str]:
    """ServiceAccount ``scraper`` in ``namespace`` bound to :data:`RULES` (and the rules
    in the file ``extra_rules``, e.g. :data:`ANNOTATION_RULES`); yields its token.

    The ClusterRole and its binding are deleted afterwards, also when the test fails.
    """
    rbac = client.RbacAuthorizationV1Api(kube_api)
    role = f"trainjob-scraper-{namespace}"
    rbac.create_cluster_role({"apiVersion": "rbac.authorization.k8s.io/v1",
                              "kind": "ClusterRole", "metadata": {"name": role},
                              "rules": yaml.safe_load(RULES.read_text()) + (
                                  yaml.safe_load(extra_rules.read_text()) if extra_rules
                                  else [])})
    try:
        rbac.create_cluster_role_binding({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": namespace}],
        })
        yield control_plane.service_account_token(namespace, "scraper")
    finally:
        for delete in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role):
            try:
                delete(role)
            except client.ApiException as exc:
                if exc.status != 404:  # absent if its creation failed
                    raise


@pytest.fixture
def proxied(kube_api: client.ApiClient, namespace: str, control_plane: Any,
            tmp_path: Path) -> Iterator[tuple[FaultProxy, Path]]:
    """A :class:`~tests.helpers.fault_proxy.FaultProxy` in front of the API server and a
    kubeconfig through it, authenticated as :func:`scraper_service_account`'s token."""
    with (scraper_service_account(kube_api, control_plane, namespace) as token,
          FaultProxy(control_plane.server_url, control_plane.ca_cert_path) as proxy):
        yield proxy, write_kubeconfig(tmp_path / "proxy.kubeconfig", proxy.url, token)
