"""Status file, termination message and sidecar mode, with real files and processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporter_lib.files import (
    TERMINATION_MESSAGE_MAX_BYTES,
    StatusFileWriter,
    fit_termination_message,
    write_atomic,
)
from exporter_lib.state import State
from exporter_lib.status import TrainerStatus
from localdev.cluster.processes import free_port

Fetch = Callable[..., Any]
ROOT = Path(__file__).resolve().parents[2]


def _big_metrics(count: int = 256) -> dict[str, str]:
    return {f"metric_{i:03d}_{'n' * 50}": f"{i}{'v' * 60}" for i in range(count)}


def test_fit_termination_message_drops_metrics_keeps_json() -> None:
    state = State()
    state.update(progress_percentage=77, estimated_remaining_seconds=5, metrics=_big_metrics())
    status = state.status()
    assert status is not None and len(status.to_json()) > TERMINATION_MESSAGE_MAX_BYTES
    body = fit_termination_message(status)
    assert len(body) <= TERMINATION_MESSAGE_MAX_BYTES
    parsed = TrainerStatus.from_json(body)
    assert parsed.progress_percentage == 77 and 0 < len(parsed.metrics) < 256
    assert parsed.metrics == status.metrics[: len(parsed.metrics)]
    one_more = status.model_copy(update={"metrics": status.metrics[: len(parsed.metrics) + 1]})
    assert len(one_more.to_json()) > TERMINATION_MESSAGE_MAX_BYTES  # the longest prefix


def _run_child(code: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    full_env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    for var in ("RANK", "LOCAL_RANK"):
        full_env.pop(var, None)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


CHILD = """
    import time
    import exporter_lib
    exporter_lib.start(port=0, host="127.0.0.1")
    exporter_lib.update(progress_percentage=64, estimated_remaining_seconds=9,
                        metrics={f"m{i:03d}_{'n' * 50}": f"{i}{'v' * 60}" for i in range(256)})
    print("ready", flush=True)
    if WAIT:
        time.sleep(60)
"""


def test_termination_message_on_normal_exit(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    child = _run_child(CHILD.replace("WAIT", "False"),
                       {"TRAINJOB_EXPORTER_TERMINATION_MESSAGE_PATH": str(path)})
    _, err = child.communicate(timeout=60)
    assert child.returncode == 0, err.decode()
    body = path.read_bytes()
    assert 0 < len(body) <= TERMINATION_MESSAGE_MAX_BYTES
    status = TrainerStatus.from_json(body)
    assert status.progress_percentage == 64 and status.estimated_remaining_seconds == 9
    assert status.metrics  # as many as fit


def test_termination_message_on_sigterm(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    status_file = tmp_path / "status.json"
    child = _run_child(CHILD.replace("WAIT", "True"), {
        "TRAINJOB_EXPORTER_TERMINATION_MESSAGE_PATH": str(path),
        "KUBEFLOW_TRAINER_STATUS_FILE": str(status_file)})
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"ready"
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=30)
    finally:
        child.kill()
    assert child.returncode == -signal.SIGTERM  # the default action still happens
    body = path.read_bytes()
    assert len(body) <= TERMINATION_MESSAGE_MAX_BYTES
    assert TrainerStatus.from_json(body).progress_percentage == 64
    assert len(TrainerStatus.from_json(status_file.read_bytes()).metrics) == 256


def test_default_termination_path_not_created_outside_kubernetes(tmp_path: Path) -> None:
    child = _run_child(CHILD.replace("WAIT", "False"), {})
    child.communicate(timeout=60)
    assert child.returncode == 0
    # /dev/termination-log is only written when the kubelet created it; nothing to assert
    # beyond a clean exit unless it exists already.


def test_concurrent_reader_never_sees_partial_status_file(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    state = State()
    writer = StatusFileWriter(str(path), state, interval=0.001)
    stop = threading.Event()
    seen: list[int] = []
    failures: list[str] = []

    def reader() -> None:
        for _ in range(20000):
            if stop.is_set():
                return
            try:
                body = path.read_bytes()
            except FileNotFoundError:
                continue
            try:
                seen.append(TrainerStatus.from_json(body).progress_percentage or 0)
            except Exception as exc:
                failures.append(f"{exc}: {body[:80]!r}")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(400):
            state.update(progress_percentage=i % 101, metrics={**_big_metrics(200), "i": i})
            time.sleep(0.0005)
            direct = TrainerStatus.from_api({"lastUpdatedTime": "2025-01-01T00:00:00Z",
                                             "progressPercentage": i % 101})
            if i % 50 == 0:
                write_atomic(str(path), direct.to_json())
    finally:
        stop.set()
        thread.join(timeout=30)
        writer.stop()
    assert not failures, failures[:3]
    assert len(seen) > 10
    final = TrainerStatus.from_json(path.read_bytes())
    assert final.metrics_dict()["i"] == "399"  # stop() flushes the newest status



def test_sidecar_serves_a_status_file(tmp_path: Path, fetch: Fetch) -> None:
    status_file = tmp_path / "status.json"
    termination = tmp_path / "termination-log"
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-m", "exporter_lib", "serve", "--status-file", str(status_file),
         "--port", str(port), "--host", "127.0.0.1",
         "--termination-message-path", str(termination)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        for _ in range(100):  # up to ~10 s for the interpreter to start
            try:
                first = fetch(url, headers={"Accept": "application/json"})
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError("sidecar did not start")
        assert first.status == 204
        text = json.dumps({"progressPercentage": 12, "lastUpdatedTime": "2025-01-01T00:00:00Z",
                           "metrics": [{"name": "loss", "value": "0.50"}]})
        write_atomic(str(status_file), text.encode())  # as any language would: temp + rename
        resp = fetch(url, headers={"Accept": "application/json"})
        assert resp.status == 200
        assert TrainerStatus.from_json(resp.body).metrics_dict() == {"loss": "0.50"}
        assert b'trainjob_progress_ratio 0.12' in fetch(url).body
        write_atomic(str(status_file), b"{broken")  # an invalid file keeps the last good status
        assert TrainerStatus.from_json(
            fetch(url, headers={"Accept": "application/json"}).body).progress_percentage == 12
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=30)
    assert child.returncode == 0
    assert TrainerStatus.from_json(termination.read_bytes()).progress_percentage == 12
