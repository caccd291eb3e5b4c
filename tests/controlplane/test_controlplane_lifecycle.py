"""Start-up failures are explained and nothing outlives the control plane."""

from __future__ import annotations

import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localdev.cluster.assets import Assets
from localdev.cluster.controlplane import ControlPlane, ControlPlaneError

REPO = Path(__file__).resolve().parents[2]


def _script(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); check its state.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _pids_running(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and _alive(int(proc.name)):
            try:
                if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@pytest.mark.cluster  # starts a control plane of its own
def test_failed_start_quotes_the_log_and_leaves_no_process(tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    assets.mkdir()
    # etcd stand-in that would run forever (findable by its odd duration);
    # kube-apiserver stand-in that fails.
    marker = f"299.{secrets.randbelow(10**6):06d}"
    _script(assets / "etcd", f"exec sleep {marker}")
    _script(assets / "kube-apiserver", "echo 'E0101 bad flag: simulated failure' >&2\nexit 7")
    _script(assets / "kubectl", "exit 0")
    plane = ControlPlane(assets_dir=assets, workdir=tmp_path / "work")

    with pytest.raises(ControlPlaneError) as caught:
        plane.start()

    message = str(caught.value)
    assert "kube-apiserver exited with code 7" in message
    assert "simulated failure" in message
    assert (tmp_path / "work" / "kube-apiserver.log").exists()
    assert _pids_running(marker) == []


def test_context_manager_stops_processes(control_plane: ControlPlane) -> None:
    # A second, independent control plane from the same binaries.
    assets = Assets.from_directory(control_plane.kubectl_path.parent)
    with ControlPlane(assets_dir=assets.directory) as plane:
        assert plane.running
        assert plane.startup_seconds is not None
        workdir = plane.workdir
        pids = plane.pids
        version = plane.kubectl("version", "-o", "json").stdout
        assert '"serverVersion"' in version
    assert len(pids) == 2
    assert not any(_alive(pid) for pid in pids)
    assert not workdir.exists()
    assert not plane.running


# The owner gets Python's own SIGINT handling, as in a terminal: a shell starts a
# background job (CI run with "&") with SIGINT ignored, and children inherit that.
_OWNER = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from localdev.cluster.controlplane import ControlPlane
plane = ControlPlane(assets_dir=sys.argv[1])
plane.start()
print(plane.workdir, *plane.pids, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL],
                         ids=["SIGTERM", "SIGINT", "SIGKILL"])
def test_no_orphans_when_the_owner_is_signalled(control_plane: ControlPlane,
                                                sig: signal.Signals) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(control_plane.kubectl_path.parent)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert owner.stdout is not None
        ready, _, _ = select.select([owner.stdout], [], [], 60)
        assert ready, "owner did not start its control plane within 60 s"
        workdir, *pids = owner.stdout.readline().split()
        assert len(pids) == 2, owner.stderr.read() if owner.stderr else ""

        owner.send_signal(sig)
        owner.wait(timeout=30)
    finally:
        owner.kill()
        owner.wait(timeout=10)

    # SIGKILL leaves it to PR_SET_PDEATHSIG, which the kernel delivers promptly.
    deadline = time.monotonic() + 10
    while any(_alive(int(pid)) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(int(pid)) for pid in pids)
    if sig != signal.SIGKILL:  # nothing can clean up after SIGKILL but the kernel
        assert not Path(workdir).exists()
    else:
        shutil.rmtree(workdir, ignore_errors=True)
