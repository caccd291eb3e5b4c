"""The pod runner's init containers and native sidecars, with real processes.

The API server is replaced by an in-process fake of the two calls the runner makes
on a started pod (patch the pod status, read it back): these tests are about the
order in which real processes start and stop, which the stack test
(tests/e2e/test_zero_code.py) shows end to end.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from localdev.cluster import podrunner
from localdev.cluster.processes import free_port

POD_IP = "127.0.0.1"
TIMEOUT_SECONDS = 30.0

SIDECAR = r"""
import signal, socket, sys, time
time.sleep(0.5)  # not listening at once: the probe must wait for it
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
open("/shared/ready", "w").write("yes")
def stop(*_):
    open(sys.argv[2], "w").write("bye from the sidecar")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    time.sleep(0.1)
"""


class FakeCore:
    """Patches of the pod status, applied to ``pod`` (what the API server would keep)."""

    def __init__(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        self.patches: list[dict[str, Any]] = []

    def patch_namespaced_pod_status(self, name: str, namespace: str,
                                    body: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(body["status"])
        self.pod["status"].update(body["status"])
        return self.pod


class Identity:
    def sanitize_for_serialization(self, obj: Any) -> Any:
        return obj


def _runner(tmp_path: Path, spec: dict[str, Any]) -> tuple[podrunner.PodRunner, FakeCore]:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": spec,
           "status": {"phase": "Running", "podIP": POD_IP}}
    runner = podrunner.PodRunner(Identity(), "runner-node-0", tmp_path)
    core = FakeCore(pod)
    runner.core = core
    runner._on_event("MODIFIED", pod)
    return runner, core


def _run_until_phase(runner: podrunner.PodRunner, core: FakeCore) -> str:
    run = runner.pods["u"]
    deadline = time.monotonic() + TIMEOUT_SECONDS
    try:
        while time.monotonic() < deadline:
            runner._tick(run)
            phase = core.pod["status"].get("phase")
            if phase in ("Succeeded", "Failed"):
                return str(phase)
            time.sleep(0.05)
    finally:
        runner.stop_all()
    raise AssertionError(f"no terminal phase; last patch {core.patches[-1]}")


def _state(status: dict[str, Any], name: str) -> dict[str, Any]:
    key = "initContainerStatuses"
    for s in [*status.get(key, []), *status.get("containerStatuses", [])]:
        if s["name"] == name:
            return dict(s["state"])
    raise KeyError(name)


def test_init_then_sidecar_then_main_and_the_sidecar_stops_last(tmp_path: Path) -> None:
    port = free_port()
    shared = {"name": "shared", "mountPath": "/shared"}
    spec = {
        "restartPolicy": "Never",
        "volumes": [{"name": "shared", "emptyDir": {}}],
        "initContainers": [
            {"name": "setup", "volumeMounts": [shared],
             "command": [sys.executable, "-c", "open('/shared/setup', 'w').write('done')"]},
            {"name": "exporter", "restartPolicy": "Always", "volumeMounts": [shared],
             "command": [sys.executable, "-c", SIDECAR, str(port),
                         "$(TRAINJOB_EXPORTER_TERMINATION_MESSAGE_PATH)"],
             "ports": [{"name": "progress", "containerPort": port}],
             "startupProbe": {"tcpSocket": {"port": "progress"}, "periodSeconds": 1,
                              "failureThreshold": 30}},
        ],
        "containers": [{"name": "node", "volumeMounts": [shared], "env": [
            {"name": "SHARED", "value": "/shared"}], "command": [
            sys.executable, "-c",
            "import os; d = os.environ['SHARED']; "
            "assert open(d + '/setup').read() == 'done'; "
            "assert open(d + '/ready').read() == 'yes'; print('main saw both')"]}],
    }
    runner, core = _runner(tmp_path, spec)
    assert _run_until_phase(runner, core) == "Succeeded"
    first = core.patches[0]
    # Before the sidecar is started nothing of the main container runs.
    assert "waiting" in _state(first, "node")
    final = core.pod["status"]
    assert final["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    sidecar = _state(final, "exporter")["terminated"]
    main = _state(final, "node")["terminated"]
    assert main["exitCode"] == 0, (tmp_path / "ns_p_node.log").read_text()
    assert sidecar["message"] == "bye from the sidecar"  # it got SIGTERM, after the main
    assert sidecar["finishedAt"] >= main["finishedAt"]
    # The phase was written only once the sidecar had stopped.
    [ending] = [p for p in core.patches if "phase" in p]
    assert "terminated" in _state(ending, "exporter")
    assert "main saw both" in (tmp_path / "ns_p_node.log").read_text()


def test_failed_init_container_fails_the_pod_and_stops_the_sidecar(tmp_path: Path) -> None:
    spec = {
        "restartPolicy": "Never",
        "initContainers": [
            {"name": "exporter", "restartPolicy": "Always",
             "command": [sys.executable, "-c", "import time; time.sleep(60)"]},
            {"name": "setup", "command": [sys.executable, "-c", "raise SystemExit(3)"]},
        ],
        "containers": [{"name": "node", "command": [sys.executable, "-c", "print('ran')"]}],
    }
    runner, core = _runner(tmp_path, spec)
    assert _run_until_phase(runner, core) == "Failed"
    final = core.pod["status"]
    assert _state(final, "setup")["terminated"]["exitCode"] == 3
    assert "waiting" in _state(final, "node")  # never started
    assert _state(final, "exporter")["terminated"]["exitCode"] == 128 + 15  # SIGTERM


def test_mount_paths_are_rewritten_only_where_a_path_begins() -> None:
    mounts = [("/var/run/x", "/host/x"), ("/var", "/host/var")]
    assert podrunner.translate_mounts("--token-file=/var/run/x/token", mounts) == \
        "--token-file=/host/x/token"
    assert podrunner.translate_mounts("/var/run/xy", mounts) == "/host/var/run/xy"
    assert podrunner.translate_mounts("a/var/run/x", mounts) == "a/var/run/x"
    assert podrunner.translate_mounts("/variable", mounts) == "/variable"
    assert podrunner.translate_mounts("/var/run/x", []) == "/var/run/x"


def test_a_pod_without_its_ip_yet_is_left_alone(tmp_path: Path) -> None:
    runner = podrunner.PodRunner(Identity(), "runner-node-0", tmp_path)
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
           "spec": {"containers": [{"name": "node", "command": ["true"]}]},
           "status": {"phase": "Pending"}}
    core = FakeCore(pod)
    runner.core = core
    runner._on_event("MODIFIED", pod)
    for _ in range(3):
        runner._tick(runner.pods["u"])
    assert core.patches == []  # kwok's pod-ready gives it an IP first; nothing ran


def test_file_volumes_and_hosts_are_mounted_for_the_process_only(tmp_path: Path) -> None:
    """A downwardAPI volume at its mountPath and a ``--host-alias`` name, seen by the
    container's process in its own mount namespace; the host sees neither."""
    mount_path = tmp_path / "mnt" / "podinfo"
    spec = {
        "restartPolicy": "Never",
        "volumes": [{"name": "podinfo", "downwardAPI": {"items": [
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}}],
        "containers": [{"name": "node", "volumeMounts": [
            {"name": "podinfo", "mountPath": str(mount_path)}], "command": [
            sys.executable, "-c",
            f"import socket; name = open({str(mount_path / 'name')!r}).read(); "
            "addr = socket.gethostbyname('svc.ns.svc'); "
            "mine = socket.gethostbyname('p'); print('saw', name, addr, mine)"]}],
    }
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": spec,
           "status": {"phase": "Running", "podIP": POD_IP}}
    runner = podrunner.PodRunner(Identity(), "runner-node-0", tmp_path,
                                 [("127.0.0.7", ["svc.ns.svc"])])
    assert runner.mount_prefix is not None, "no private mount namespace on this machine"
    core = FakeCore(pod)
    runner.core = core
    runner._on_event("MODIFIED", pod)
    assert _run_until_phase(runner, core) == "Succeeded", (tmp_path / "ns_p_node.log").read_text()
    assert f"saw p 127.0.0.7 {POD_IP}" in (tmp_path / "ns_p_node.log").read_text()
    assert list(mount_path.iterdir()) == []  # only an empty mount point on the host
    assert "svc.ns.svc" not in Path("/etc/hosts").read_text()
