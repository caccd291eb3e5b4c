"""The scraper image, built with buildah from the repository's Dockerfile and run with podman.

Run as the chart runs it: UID/GID 65532, read-only root filesystem, /tmp a small
tmpfs, no capabilities, no privilege escalation, configuration and kubeconfig mounted
read-only (``scripts/image run`` holds those options).  The container uses the host
network so it reaches the session's API server and the exporter on 127.0.0.1 (the
local cluster has no pod network); it authenticates as a ServiceAccount bound to the
chart's ClusterRole rules.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from exporter_lib.api import Exporter
from exporter_lib.state import State
from localdev.cluster import objects
from localdev.cluster.processes import free_port
from tests.helpers.scraper import progress_of, scraper_service_account, trainer_status, wait_for

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "image"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
#: Requirements of the demo and dev extras that must never reach the image.
DEV_ONLY = ("cryptography", "rich", "numpy", "pytest", "torch", "transformers")
#: Where the chart mounts the scraper's ConfigMap.
CONFIG_DIR = "/etc/trainjob-scraper"

# The first test's setup may build the image from nothing (see conftest.py).
pytestmark = [pytest.mark.timeout(1800)]


def run_image(*args: str, podman: tuple[str, ...] = (), timeout: float = 120
              ) -> subprocess.CompletedProcess[str]:
    """``scripts/image run PODMAN... -- ARGS...`` to completion, output captured."""
    return subprocess.run([str(SCRIPT), "run", *podman, "--", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout)


def test_the_engines_build_context_is_the_product_only(image: str) -> None:
    listed = subprocess.run([str(SCRIPT), "context"], cwd=REPO, check=True, text=True,
                            capture_output=True, timeout=300).stdout.split()
    context = {path.removeprefix("./") for path in listed}
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, check=True, capture_output=True, text=True).stdout.split()
    product = {f for f in files if (REPO / f).is_file()
               and (f.split("/", 1)[0] in ("exporter_lib", "scraper")
                    or f in ("pyproject.toml", "README.md", "constraints.txt"))}
    assert context == product, (sorted(context - product), sorted(product - context))
    assert not [p for p in context if "__pycache__" in p or p.endswith(".pyc")]


def test_image_config_runs_the_scraper_as_65532(image: str) -> None:
    out = subprocess.run([str(SCRIPT), "podman", "image", "inspect", image], check=True, text=True,
                         capture_output=True, timeout=60).stdout
    (info,) = json.loads(out)
    config = info["Config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["trainjob-scraper"]
    assert config["Cmd"] == ["run"]
    assert "8080/tcp" in config["ExposedPorts"]
    assert any(e.startswith("PATH=/opt/venv/bin:") for e in config["Env"])


def test_help_runs_as_non_root_on_a_read_only_root(image: str) -> None:
    result = run_image("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: trainjob-scraper"), result.stdout
    assert " run " in result.stdout or "{run" in result.stdout

    probe = run_image("-c", """
import json, os
def writable(path):
    try:
        with open(os.path.join(path, ".probe"), "w"):
            pass
        return True
    except OSError as exc:
        return exc.strerror
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
                  "root": writable("/"), "venv": writable("/opt/venv"),
                  "etc": writable("/etc"), "tmp": writable("/tmp")}))
""", podman=("--entrypoint", "python"))
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert (seen["uid"], seen["gid"]) == (65532, 65532)
    assert seen["root"] == seen["venv"] == seen["etc"] == "Read-only file system"
    assert seen["tmp"] is True  # the tmpfs the chart's emptyDir stands for


def test_image_holds_the_product_and_its_runtime_dependencies_only(image: str) -> None:
    result = run_image("-c", """
import importlib.metadata as md, importlib.util, json, os, platform, sys
print(json.dumps({
    "python": platform.python_version(), "prefix": sys.prefix,
    "dists": {d.metadata["Name"].lower().replace("_", "-"): d.version
              for d in md.distributions()},
    "direct_url": md.distribution("trainjob-progress").read_text("direct_url.json"),
    "importable": {m: importlib.util.find_spec(m) is not None
                   for m in ("scraper", "exporter_lib", "localdev", "tests", "benchmarks",
                             "cryptography")},
    "src": os.path.exists("/src"),
}))
""", podman=("--entrypoint", "python"))
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["python"].startswith("3.11."), seen["python"]
    assert seen["prefix"] == "/opt/venv"
    assert seen["dists"]["trainjob-progress"] == VERSION
    assert {"kubernetes", "aiohttp", "prometheus-client", "pydantic"} <= set(seen["dists"])
    assert not [d for d in seen["dists"] if d.startswith(DEV_ONLY)], sorted(seen["dists"])
    assert seen["importable"] == {"scraper": True, "exporter_lib": True, "localdev": False,
                                  "tests": False, "benchmarks": False, "cryptography": False}
    # installed from a built wheel, not an editable checkout; no source tree shipped
    assert seen["direct_url"] is None or '"editable": true' not in seen["direct_url"]
    assert seen["src"] is False


# ------------------------------------------------------------- against the cluster


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[tuple[State, Exporter, Path]]:
    """The project's exporter in this process on 127.0.0.1 (port chosen by the OS)."""
    state = State()
    termination = tmp_path / "termination-log"
    exp = Exporter(state, state, host="127.0.0.1", port=0, status_file=None,
                   termination_message_path=str(termination), serve=True)
    try:
        yield state, exp, termination
    finally:
        exp.stop()


class Container:
    """``trainjob-scraper run`` in the image, in the foreground of a podman process."""

    def __init__(self, config_dir: Path, port: int, log: Path) -> None:
        self.name = f"trainjob-scraper-test-{secrets.token_hex(4)}"
        self.port = port
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [str(SCRIPT), "run", "--name", self.name, "--network", "host",
             "--volume", f"{config_dir}:{CONFIG_DIR}:ro", "--",
             "run", f"--config={CONFIG_DIR}/config.yaml"],
            cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT)
        self._http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=1, read=5),
                                         retries=False)

    def get(self, path: str) -> tuple[int, str]:
        resp = self._http.request("GET", f"http://127.0.0.1:{self.port}{path}")
        return resp.status, resp.data.decode()

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str, **labels: str) -> float:
        status, text = self.get("/metrics")
        assert status == 200
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return 0.0

    def wait_ready(self, timeout: float) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"container exited with {self.proc.returncode}:\n"
                                     + self.log())
            return self.get("/readyz")[0] == 200

        wait_for(ready, timeout, "the container's /readyz")

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM through podman's signal proxy; the exit code, or None if it hung."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                # Only the container this test started, by its unique name.
                subprocess.run([str(SCRIPT), "podman", "rm", "--force", "--time=0", self.name],
                               capture_output=True, timeout=60)
                self.proc.wait(30)
                self._log.close()
                return None
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def container_factory(tmp_path: Path, request: pytest.FixtureRequest
                      ) -> Iterator[Callable[[dict[str, Any], Path, str], Container]]:
    started: list[Container] = []

    def make(options: dict[str, Any], ca_cert: Path, token: str) -> Container:
        # What the chart mounts: a read-only directory the container user can read.
        config_dir = tmp_path / "config"
        config_dir.mkdir(mode=0o755)
        (config_dir / "ca.crt").write_bytes(ca_cert.read_bytes())
        kubeconfig = {
            "apiVersion": "v1", "kind": "Config", "current-context": "local",
            "clusters": [{"name": "local", "cluster": {
                "server": options.pop("server"),
                "certificate-authority": f"{CONFIG_DIR}/ca.crt"}}],
            "users": [{"name": "scraper", "user": {"token": token}}],
            "contexts": [{"name": "local",
                          "context": {"cluster": "local", "user": "scraper"}}],
        }
        (config_dir / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        port = free_port()
        config = {**options, "kubeconfig": f"{CONFIG_DIR}/kubeconfig",
                  "listen-host": "127.0.0.1", "listen-port": port}
        (config_dir / "config.yaml").write_text(yaml.safe_dump(config))
        for path in config_dir.iterdir():
            path.chmod(0o644)  # a throw-away token of a test namespace's ServiceAccount
        container = Container(config_dir, port, tmp_path / f"container-{len(started)}.log")
        started.append(container)
        return container

    yield make
    failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
    for container in started:
        if container.stop() is None:
            failed = True
        if failed:
            print(f"--- {container.log_path}\n{container.log()[-6000:]}")


@pytest.mark.usefixtures("trainjob_crd")
def test_run_in_the_image_writes_progress_and_the_final_status(
    image: str, kube_api: client.ApiClient, control_plane: Any, namespace: str,
    exporter: tuple[State, Exporter, Path],
    container_factory: Callable[[dict[str, Any], Path, str], Container],
) -> None:
    state, exp, termination = exporter
    assert exp.port is not None
    objects.create_trainjob(kube_api, namespace, "in-image")
    pod = objects.create_trainer_pod(kube_api, namespace, "in-image", port=exp.port)
    state.update(progress_percentage=40, estimated_remaining_seconds=120,
                 metrics={"loss": 0.25})

    with scraper_service_account(kube_api, control_plane, namespace) as token:
        container = container_factory(
            {"server": control_plane.server_url, "namespaces": namespace, "interval": "1s",
             "resync-interval": "2s", "leader-election": True,
             "lease-namespace": namespace, "lease-duration": "4s", "renew-deadline": "3s",
             "retry-period": "0.5s", "identity": "in-image",
             # /metrics authentication is tested against the real API server in
             # tests/scraper/test_metrics_auth.py; here the test reads the series directly.
             "metrics-auth": False},
            control_plane.ca_cert_path, token)
        # The first start of a container on the shared cores can take some seconds.
        container.wait_ready(timeout=90)

        wait_for(lambda: progress_of(kube_api, namespace, "in-image") == 40, 30,
                 "progress 40 written from the container")
        written = trainer_status(kube_api, namespace, "in-image")
        assert written is not None
        assert written["estimatedRemainingSeconds"] == 120
        assert written["metrics"] == [{"name": "loss", "value": "0.25"}]
        assert container.metric("trainjob_scraper_leader") == 1
        assert container.metric("trainjob_scraper_status_writes_total", result="written") == 1
        lease = client.CoordinationV1Api(kube_api).read_namespaced_lease(
            "trainjob-scraper", namespace)
        assert lease.spec.holder_identity == "in-image"

        # The training ends: the final status travels in the termination message.
        state.update(progress_percentage=100, estimated_remaining_seconds=0,
                     metrics={"loss": 0.125})
        exp.write_final_status()
        exp.stop()
        objects.terminate_pod(kube_api, namespace, pod.metadata.name, termination.read_text())
        wait_for(lambda: progress_of(kube_api, namespace, "in-image") == 100, 30,
                 "final progress from the termination message")
        final = trainer_status(kube_api, namespace, "in-image")
        assert final is not None and final["metrics"] == [{"name": "loss", "value": "0.125"}]

        assert container.stop() == 0, container.log()
        assert "Traceback" not in container.log(), container.log()
