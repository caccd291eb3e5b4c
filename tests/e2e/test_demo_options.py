"""``python -m localdev.demo`` options a newcomer tries: ``--duration`` counts from the
start in cluster mode; ``--namespace`` and ``--duration`` are refused in local mode (they
would be ignored)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from localdev.cluster.processes import free_port
from tests.helpers.demo import run_demo

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
    kubeconfig = tmp_path / "kubeconfig"
    server = f"https://127.0.0.1:{free_port()}"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {
            "server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    result = run_demo("--kubeconfig", str(kubeconfig), "--duration", "3",
                      timeout=DEMO_TIMEOUT_SECONDS)
    out = " ".join(result.stdout.split())
    assert result.returncode == 1, out + result.stderr
    assert "--duration 3s ended before the scraper was ready" in out, out
    # ...and it said at once that the API server does not answer, naming it.
    assert f"cannot reach the API server {server} yet" in out, out
