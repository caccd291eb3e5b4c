"""Fixtures of the image tests: the image, built from this checkout by ``scripts/image``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "image"
#: A first build (debootstrap of the base, pip from the package index) took 4-5 min
#: on 2 shared cores; a warm one, about 10 s.
BUILD_TIMEOUT_SECONDS = 1500


@pytest.fixture(scope="session")
def image(pytestconfig: pytest.Config) -> str:
    """Name of the image built from this checkout (layers cached: seconds when warm)."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    try:
        # Live progress: a first build downloads Debian and the Python dependencies.
        if capture:
            with capture.global_and_fixture_disabled():
                out = _build()
        else:
            out = _build()
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"scripts/image build failed with exit code {exc.returncode}"
                    " (its output is above)", pytrace=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"scripts/image build took more than {BUILD_TIMEOUT_SECONDS}s",
                    pytrace=False)
    return out.strip().splitlines()[-1]


def _build() -> str:
    return subprocess.run([str(SCRIPT), "build"], cwd=REPO, check=True, text=True,
                          stdout=subprocess.PIPE, timeout=BUILD_TIMEOUT_SECONDS).stdout
