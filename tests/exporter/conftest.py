"""Fixtures for the exporter tests: a real exporter on a free port, and HTTP helpers."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter_lib import api


@dataclass
class Response:
    """An HTTP response, whatever its status."""

    status: int
    headers: dict[str, str]
    body: bytes


def http(url: str, *, method: str = "GET", headers: dict[str, str] | None = None,
         body: bytes | None = None) -> Response:
    """One real HTTP request; 4xx/5xx are returned, not raised."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return Response(resp.status, dict(resp.headers), resp.read())
    except urllib.error.HTTPError as err:
        return Response(err.code, dict(err.headers), err.read())


@pytest.fixture
def exporter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[api.Exporter]:
    """A started process-wide exporter on a free port (rank 0), reset afterwards."""
    for var in ("RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                "KUBEFLOW_TRAINER_STATUS_FILE", "KUBEFLOW_TRAINER_SERVER_URL",
                "KUBEFLOW_TRAINER_SERVER_TOKEN"):
        # setenv first, so that teardown restores the variable's absence too: the
        # exporter (enable_push_compat) sets some of them in os.environ itself, and a
        # bare delenv of an absent variable records nothing to undo.
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    api._reset_for_tests()
    started = api.start(port=0, host="127.0.0.1",
                        termination_message_path=str(tmp_path / "termination-log"),
                        install_signal_handler=False)
    assert started.serving
    try:
        yield started
    finally:
        api._reset_for_tests()


@pytest.fixture
def fetch() -> object:
    """The :func:`http` helper, as a fixture (test modules here are not a package)."""
    return http


@pytest.fixture
def metrics_url(exporter: api.Exporter) -> str:
    """``http://127.0.0.1:<port>/metrics`` of the fixture's exporter."""
    return f"{exporter.url}/metrics"
