"""``python -m exporter_lib serve --push``: the zero-code sidecar, as its own process.

The pushing client is Transformers' real built-in ``KubeflowCallback``, driven through
its public hooks with a real ``TrainerState``; the error cases are raw requests.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter_lib.identity import (
    ENV_PET_MASTER_ADDR,
    ENV_POD_NAMESPACE,
    ENV_SERVER_URL,
    ENV_TRAINJOB_NAME,
)
from exporter_lib.push import status_path
from exporter_lib.status import TrainerStatus
from localdev.cluster.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE, TRAINJOB = "team-a", "job-1"
START_TIMEOUT_SECONDS = 15.0

Fetch = Callable[..., Any]
#: What exporter_lib.identity reads to learn the pod's TrainJob.
_IDENTITY_ENV = (ENV_TRAINJOB_NAME, ENV_POD_NAMESPACE, ENV_SERVER_URL, ENV_PET_MASTER_ADDR,
                 "KUBEFLOW_TRAINER_SERVER_TOKEN", "KUBEFLOW_TRAINER_SERVER_CA_CERT")


class Sidecar:
    """A running ``serve --push`` child and where it writes."""

    def __init__(self, tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.token_file = tmp_path / "shared" / "token"
        self.token_file.parent.mkdir(exist_ok=True)
        self.termination = tmp_path / "termination-log"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        # Hermetic: what this test process inherited or an earlier test set (an upstream
        # server URL, PET_MASTER_ADDR) would tell the sidecar another TrainJob.
        inherited = {k: v for k, v in os.environ.items() if k not in _IDENTITY_ENV}
        child_env = {**inherited, "PYTHONPATH": str(ROOT), "TRAINJOB_NAME": TRAINJOB,
                     "POD_NAMESPACE": NAMESPACE, **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "exporter_lib", "serve", "--push",
             "--token-file", str(self.token_file), "--port", str(self.port),
             "--host", "127.0.0.1", "--termination-message-path", str(self.termination),
             *extra], env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    @property
    def url(self) -> str:
        return self.base + status_path(NAMESPACE, TRAINJOB)

    def token(self) -> str:
        return self.token_file.read_text().strip()

    def wait_serving(self, fetch: Fetch) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()[1].decode()
            try:
                fetch(self.base + "/metrics")
                return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("the sidecar did not serve")

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, err.decode()


@pytest.fixture
def sidecar(tmp_path: Path, fetch: Fetch) -> Iterator[Sidecar]:
    child = Sidecar(tmp_path)
    try:
        child.wait_serving(fetch)
        yield child
    finally:
        child.stop()


def _post(fetch: Fetch, url: str, body: bytes, token: str | None,
          content_type: str = "application/json") -> Any:
    headers = {"Content-Type": content_type}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return fetch(url, method="POST", headers=headers, body=body)


def _json(fetch: Fetch, url: str) -> TrainerStatus | None:
    resp = fetch(url, headers={"Accept": "application/json"})
    return None if resp.status == 204 else TrainerStatus.from_json(resp.body)


def test_transformers_callback_pushes_through_the_sidecar(
        sidecar: Sidecar, fetch: Fetch, monkeypatch: pytest.MonkeyPatch) -> None:
    # The token exists once the sidecar serves (written before the server starts
    # answering pushes), private to its owner by default.
    assert stat.S_IMODE(sidecar.token_file.stat().st_mode) == 0o600
    assert len(sidecar.token()) >= 32
    assert _json(fetch, sidecar.base + "/metrics") is None  # nothing pushed yet: 204

    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations.integration_utils import KubeflowCallback

    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", sidecar.url)
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(sidecar.token_file))
    monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_CA_CERT", raising=False)
    callback = KubeflowCallback()
    args = TrainingArguments(output_dir=str(sidecar.token_file.parent), report_to="none",
                             use_cpu=True)
    state, control = TrainerState(max_steps=40), TrainerControl()
    callback.on_train_begin(args, state, control)
    begun = _json(fetch, sidecar.base + "/metrics")
    assert begun is not None and begun.progress_percentage == 0
    assert begun.metrics_dict() == {"total_steps": "40"}
    state.global_step = 40
    callback.on_log(args, state, control, logs={"loss": 0.25})
    callback.on_train_end(args, state, control)
    ended = _json(fetch, sidecar.base + "/metrics")
    assert ended is not None and ended.progress_percentage == 100
    assert ended.metrics_dict()["loss"] == "0.25"
    assert b"trainjob_progress_ratio 1.0" in fetch(sidecar.base + "/metrics").body

    code, err = sidecar.stop()
    assert code == 0, err
    assert "accepting pushes on" in err and str(sidecar.token_file) in err
    final = TrainerStatus.from_json(sidecar.termination.read_bytes())
    assert final == ended


def test_sidecar_refuses_bad_pushes(sidecar: Sidecar, fetch: Fetch) -> None:
    good = json.dumps({"trainerStatus": {"progressPercentage": 7,
                                         "lastUpdatedTime": "2025-01-01T00:00:00Z"}}).encode()
    token = sidecar.token()
    cases = [
        (_post(fetch, sidecar.url, good, "wrong"), 401, "Unauthorized"),
        (_post(fetch, sidecar.url, good, None), 401, "Unauthorized"),
        (_post(fetch, sidecar.base + status_path(NAMESPACE, "other-job"), good, token), 403,
         "Forbidden"),
        (_post(fetch, sidecar.base + status_path("team-z", TRAINJOB), good, token), 403,
         "Forbidden"),
        (_post(fetch, sidecar.url, b"{not json", token), 400, "BadRequest"),
        (_post(fetch, sidecar.url, b'{"status": {}}', token), 400, "BadRequest"),
        (_post(fetch, sidecar.url, good, token, content_type="text/plain"), 415,
         "UnsupportedMediaType"),
        (_post(fetch, sidecar.url, json.dumps({"trainerStatus": {
            "progressPercentage": 101, "lastUpdatedTime": "2025-01-01T00:00:00Z"}}).encode(),
            token), 422, "Invalid"),
    ]
    for resp, code, reason in cases:
        assert resp.status == code, (code, resp.body)
        body = json.loads(resp.body)
        assert body["kind"] == "Status" and body["reason"] == reason, body
    forbidden = json.loads(cases[2][0].body)["message"]
    assert f"{NAMESPACE}/{TRAINJOB}" in forbidden and "TRAINJOB_NAME" in forbidden
    assert _json(fetch, sidecar.base + "/metrics") is None  # nothing refused was applied
    assert _post(fetch, sidecar.url, good, token).status == 200
    served = _json(fetch, sidecar.base + "/metrics")
    assert served is not None and served.progress_percentage == 7


def test_token_mode_for_a_trainer_of_another_uid(tmp_path: Path, fetch: Fetch) -> None:
    child = Sidecar(tmp_path, "--token-mode", "0640")
    try:
        child.wait_serving(fetch)
        assert stat.S_IMODE(child.token_file.stat().st_mode) == 0o640
        assert [p.name for p in child.token_file.parent.iterdir()] == ["token"]  # no temp left
    finally:
        code, err = child.stop()
    assert code == 0, err
    assert not child.termination.exists()  # nothing was pushed: no final status to leave


def test_unknown_trainjob_is_said_not_hidden(tmp_path: Path, fetch: Fetch) -> None:
    child = Sidecar(tmp_path, env={"TRAINJOB_NAME": "", "POD_NAMESPACE": ""})
    try:
        child.wait_serving(fetch)
    finally:
        code, err = child.stop()
    assert code == 0, err
    assert "pushes naming any TrainJob are accepted" in err, err


@pytest.mark.parametrize(("args", "says"), [
    (["--push"], "--push needs --token-file"),
    (["--push", "--token-file", "t", "--token-mode", "0644"], "'0644': must be one of"),
    (["--push", "--token-file", "t", "--token-mode", "rw"], "'rw': must be one of"),
    (["--push", "--token-file", "t", "--status-file", "s"], "not allowed with argument"),
    (["--status-file", "s", "--token-file", "t"], "--token-file is only used with --push"),
    (["--status-file", "s", "--port", "99999"], "--port: 99999: must be between 0 and 65535"),
    (["--status-file", "s", "--port", "http"], "--port: 'http': not an integer"),
])
def test_bad_arguments_name_the_flag(args: list[str], says: str) -> None:
    result = subprocess.run([sys.executable, "-m", "exporter_lib", "serve", *args],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 2, result
    assert says in result.stderr, result.stderr


def test_unwritable_token_file_exits_with_the_reason(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-volume" / "token"
    result = subprocess.run(
        [sys.executable, "-m", "exporter_lib", "serve", "--push", "--token-file", str(missing),
         "--port", str(free_port()), "--host", "127.0.0.1"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=60, check=False)
    assert result.returncode == 1, result
    assert f"cannot write the token file {missing}" in result.stderr, result.stderr


def test_a_restarted_sidecar_keeps_the_pods_token(tmp_path: Path, fetch: Fetch) -> None:
    """Clients cache the token (Transformers: 5 minutes): a sidecar restarted in the same
    pod (same emptyDir) must keep accepting it; a file that is not one of ours is replaced."""
    first = Sidecar(tmp_path)
    try:
        first.wait_serving(fetch)
        token = first.token()
    finally:
        first.stop()
    second = Sidecar(tmp_path)
    try:
        second.wait_serving(fetch)
        assert second.token() == token
        body = json.dumps({"trainerStatus": {"progressPercentage": 12,
                                              "lastUpdatedTime": "2026-12-01T00:00:00Z"}}).encode()
        assert _post(fetch, second.url, body, token).status == 200
    finally:
        second.stop()

    for planted, mode in (("short", 0o600), (token, 0o644)):
        second.token_file.write_text(planted)
        second.token_file.chmod(mode)
        third = Sidecar(tmp_path)
        try:
            third.wait_serving(fetch)
            fresh = third.token()
            assert fresh not in (planted, "short"), "a foreign or too-open token file was kept"
            assert stat.S_IMODE(third.token_file.stat().st_mode) == 0o600
        finally:
            third.stop()
