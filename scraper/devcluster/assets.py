"""Locate (and if needed build) the control plane binaries.

The binaries come from ``scripts/controlplane-assets``, which builds
kube-apiserver, kubectl, etcd and helm from the Go modules pinned under
``tools/controlplane/`` into a per-version cache directory outside the
repository (or honours ``KUBEBUILDER_ASSETS``).  This module runs that script,
streams its progress to stderr and returns the directory it prints last.
"""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: Upper bound for one run of the asset script (seconds).  The first build of
#: Kubernetes from source takes tens of minutes on a small machine.
BUILD_TIMEOUT_SECONDS = 2 * 60 * 60

REQUIRED_BINARIES = ("kube-apiserver", "etcd", "kubectl")


class AssetsError(RuntimeError):
    """The control plane binaries could not be found or built."""


@dataclass(frozen=True)
class Assets:
    """Paths of the control plane binaries (``helm`` is ``None`` when absent)."""

    directory: Path
    kube_apiserver: Path
    etcd: Path
    kubectl: Path
    helm: Path | None

    @classmethod
    def from_directory(cls, directory: Path | str) -> Assets:
        """Describe the binaries in ``directory``.

        Raises:
            AssetsError: one of kube-apiserver, etcd, kubectl is missing or not executable.
        """
        path = Path(directory)
        missing = [b for b in REQUIRED_BINARIES if not os.access(path / b, os.X_OK)]
        if missing:
            raise AssetsError(f"{path} lacks executable {', '.join(missing)}")
        helm = path / "helm"
        return cls(
            directory=path,
            kube_apiserver=path / "kube-apiserver",
            etcd=path / "etcd",
            kubectl=path / "kubectl",
            helm=helm if os.access(helm, os.X_OK) else None,
        )


def repo_root() -> Path:
    """The repository checkout this package runs from (holds ``scripts/``).

    Raises:
        AssetsError: the package is not running from a checkout (installed wheel).
    """
    root = Path(__file__).resolve().parents[2]
    if not (root / "scripts" / "controlplane-assets").is_file():
        raise AssetsError(
            f"scripts/controlplane-assets not found under {root}: building the control plane "
            "needs a repository checkout; or set KUBEBUILDER_ASSETS to a directory with "
            "kube-apiserver, etcd and kubectl"
        )
    return root


@functools.cache
def ensure_assets(assets_dir: str | None = None) -> Assets:
    """Return the control plane binaries, building them on first use.

    ``assets_dir`` (a directory holding the binaries) wins; otherwise the asset
    script runs (it honours ``KUBEBUILDER_ASSETS`` and its cache, so a warm run
    takes well under a second).  The script's progress lines go to this
    process's stderr as they come.  The result is cached per process.

    Raises:
        AssetsError: the script failed, timed out (:data:`BUILD_TIMEOUT_SECONDS`),
            or its directory lacks a binary.
    """
    if assets_dir is not None:
        return Assets.from_directory(assets_dir)
    script = repo_root() / "scripts" / "controlplane-assets"
    try:
        # stderr is inherited (fd 2): the build's progress reaches the user as it comes.
        result = subprocess.run(
            ["bash", str(script)],
            stdout=subprocess.PIPE,
            stderr=None,
            text=True,
            timeout=BUILD_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssetsError(f"{script} took longer than {BUILD_TIMEOUT_SECONDS}s") from exc
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0 or not lines:
        raise AssetsError(f"{script} failed with exit code {result.returncode} (see its stderr)")
    return Assets.from_directory(lines[-1].strip())
