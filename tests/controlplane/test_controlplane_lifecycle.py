"""Start-up failures are explained and nothing outlives the control plane."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from scraper.devcluster.assets import Assets
from scraper.devcluster.controlplane import ControlPlane, ControlPlaneError


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
