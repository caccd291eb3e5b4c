"""Fixtures for the Helm chart tests: the pinned helm binary and a chart renderer.

``helm`` is the binary built from ``tools/controlplane/helm`` by
``scripts/controlplane-assets`` (through :func:`localdev.cluster.ensure_assets`),
or ``$TRAINJOB_HELM``; a missing binary fails the test with the reason, it is never
skipped.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from localdev.cluster.assets import AssetsError, ensure_assets
from tests.helpers.chart import Helm


@pytest.fixture(scope="session")
def helm_binary() -> Path:
    """The helm built from the pinned module (fails the test when it cannot be had).

    ``$TRAINJOB_HELM`` (a helm binary) wins, for running these tests without the
    rest of the control plane assets.
    """
    override = os.environ.get("TRAINJOB_HELM")
    if override:
        if not os.access(override, os.X_OK):
            pytest.fail(f"TRAINJOB_HELM={override} is not an executable file", pytrace=False)
        return Path(override)
    try:
        assets = ensure_assets()
    except AssetsError as exc:
        pytest.fail(f"control plane assets (with helm) unavailable: {exc}", pytrace=False)
    if assets.helm is None:
        pytest.fail(
            f"no helm binary in {assets.directory}: scripts/controlplane-assets builds it "
            "from tools/controlplane/helm",
            pytrace=False,
        )
    return assets.helm


@pytest.fixture(scope="session")
def helm(helm_binary: Path) -> Iterator[Helm]:
    with tempfile.TemporaryDirectory(prefix="helm-") as work:
        yield Helm(helm_binary, Path(work))
