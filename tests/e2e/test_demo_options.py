"""``python -m localdev.demo`` options a newcomer tries: ``--duration`` counts from the
start in cluster mode; ``--namespace`` and ``--duration`` are refused in local mode (they
would be ignored)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from localdev.cluster.processes import free_port
from tests.helpers.demo import run_demo
from tests.helpers.silent_server import SilentServer

pytestmark = pytest.mark.timeout(60)


#: Seconds either option may take to be refused or to end (well inside the timeout mark).
DEMO_TIMEOUT_SECONDS = 45.0


def test_namespace_in_local_mode_is_refused_with_the_reason() -> None:
    result = run_demo("--local", "--namespace", "team-a", timeout=DEMO_TIMEOUT_SECONDS)
    assert result.returncode == 2, result.stdout + result.stderr
    out = " ".join(result.stdout.split())  # rich may wrap the line
    assert "--namespace applies to cluster mode only" in out
    assert "trainjob-demo" in out


def test_duration_in_local_mode_is_refused_with_the_reason() -> None:
    result = run_demo("--local", "--duration", "30", timeout=DEMO_TIMEOUT_SECONDS)
    assert result.returncode == 2, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    assert "--duration applies to cluster mode only" in out
    assert "ends when its TrainJob completes" in out


def test_duration_counts_from_the_start_even_when_the_scraper_never_gets_ready(
    tmp_path: Path,
) -> None:
    # An API server address where nothing listens: the scraper keeps retrying and never
    # gets ready.  Before, --duration started only once it was ready (60 s wait, then
    # an error); now the demo ends when the duration is over and says so.
    server = f"https://127.0.0.1:{free_port()}"
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", server)
    result = run_demo("--kubeconfig", str(kubeconfig), "--duration", "3",
                      timeout=DEMO_TIMEOUT_SECONDS)
    out = " ".join(result.stdout.split())
    assert result.returncode == 1, out + result.stderr
    assert "--duration 3s ended before the scraper was ready" in out, out
    # ...and it said at once that the API server does not answer, naming it.
    assert f"cannot reach the API server {server} yet" in out, out


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {
            "server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    return path


def test_an_api_server_that_accepts_and_never_answers_is_named_within_the_probe_timeout(
    tmp_path: Path,
) -> None:
    """A newcomer's find: the probe's float timeout was dropped by the official client,
    so a server that accepts connections and never answers (here over TLS: the
    handshake hangs) held the demo past ``--duration``."""
    server = SilentServer()
    try:
        address = f"https://127.0.0.1:{server.port}"
        kubeconfig = _kubeconfig(tmp_path / "kubeconfig", address)
        started = time.monotonic()
        result = run_demo("--kubeconfig", str(kubeconfig), "--duration", "8",
                          timeout=DEMO_TIMEOUT_SECONDS)
        took = time.monotonic() - started
    finally:
        server.stop()
    out = " ".join(result.stdout.split())
    assert result.returncode == 1, out + result.stderr
    assert f"cannot reach the API server {address} yet" in out, out
    # The scraper's readiness wait is what --duration leaves after the probe, not 60 s.
    assert "keeps trying for up to 60s" not in out, out
    assert "--duration 8s ended before the scraper was ready" in out, out
    assert took < 8 + 15, took  # the duration, plus start-up and the teardown


@pytest.mark.parametrize(("content", "says"), [
    (None, "no such file"),
    (b"this: is: not: yaml: [\n", "not valid YAML"),
    # A newcomer's finds: these were TypeError and UnicodeDecodeError tracebacks.
    (b"- a\n- b\n", "not a kubeconfig"),
    (b"just a string\n", "not a kubeconfig"),
    (b"\x00\xff\xfe", "not a kubeconfig"),
    ("directory", "not a file"),
])
def test_a_missing_or_malformed_kubeconfig_is_refused_with_the_reason(
    tmp_path: Path, content: bytes | str | None, says: str,
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    if content == "directory":
        kubeconfig.mkdir()
    elif isinstance(content, bytes):
        kubeconfig.write_bytes(content)
    result = run_demo("--kubeconfig", str(kubeconfig), timeout=DEMO_TIMEOUT_SECONDS)
    out = " ".join(result.stdout.split())
    assert result.returncode == 2, out + result.stderr
    assert f"cannot use kubeconfig {kubeconfig}: {says}" in out, out
    assert "Traceback" not in result.stdout + result.stderr
