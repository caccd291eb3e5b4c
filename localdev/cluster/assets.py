"""Locate (and if needed build) the local cluster's binaries and manifests.

They come from ``scripts/stack-assets``: it runs ``scripts/controlplane-assets``
(kube-apiserver, kubectl, etcd and helm from the Go modules pinned under
``tools/controlplane/``, or ``KUBEBUILDER_ASSETS``), builds
kube-controller-manager, kube-scheduler, kwok, the JobSet controller (v0.12.0) and
the Kubeflow Trainer controller (v2.3.0; v2.0.0 for the "before-v2.2" flavour and
Kueue v0.17.0 for ``Cluster(kueue=True)`` only when asked for, see :data:`OPTIONAL_PARTS`;
``tools/controlplane/kube``, ``tools/stack/*``),
copies the manifests those projects ship out of the Go module cache, and prints
one bundle directory.  This module runs that script, streams its progress to
stderr and returns the directory it prints last.
"""

from __future__ import annotations

import collections
import functools
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

#: Upper bound for one run of the asset script (seconds).  The first build of
#: Kubernetes from source takes tens of minutes on a small machine.
BUILD_TIMEOUT_SECONDS = 2 * 60 * 60

REQUIRED_BINARIES = ("kube-apiserver", "etcd", "kubectl")
#: Binaries of the controllers every cluster runs (in every bundle of ``scripts/stack-assets``).
STACK_BINARIES = ("kube-controller-manager", "kube-scheduler", "kwok",
                  "jobset-controller-manager", "trainer-controller-manager")
#: The optional parts of ``scripts/stack-assets`` (its arguments) and their binaries:
#: built only for a cluster that runs them (the demo runs neither).
OPTIONAL_PARTS = {"trainer-legacy": "trainer-controller-manager-v2.0.0",
                  "kueue": "kueue-controller-manager"}
#: Lines of the script's stderr quoted in an :class:`AssetsError`.
STDERR_TAIL_LINES = 20


class AssetsError(RuntimeError):
    """The control plane binaries could not be found or built."""


@dataclass(frozen=True)
class Assets:
    """Paths of the local cluster's binaries (``helm`` is ``None`` when absent).

    ``stack`` maps each of :data:`STACK_BINARIES` and of the :data:`OPTIONAL_PARTS`'
    binaries present to its path; it is empty for a directory with only the control
    plane (``KUBEBUILDER_ASSETS`` style).
    ``manifests`` is the directory of the shipped manifests (``kwok/stage``,
    ``jobset/crd``, ``jobset/webhook/``, ``trainer/crds``, ``trainer/webhook/``,
    ``trainer/runtimes/``, and the same three under ``trainer-v2.0.0/``), or ``None``.
    """

    directory: Path
    kube_apiserver: Path
    etcd: Path
    kubectl: Path
    helm: Path | None
    stack: dict[str, Path]
    manifests: Path | None

    def require_stack(self, parts: tuple[str, ...] = ()) -> dict[str, Path]:
        """The controllers' binaries, with those of the optional ``parts``.

        Raises:
            AssetsError: the directory lacks one of :data:`STACK_BINARIES`, a binary of
                ``parts`` (keys of :data:`OPTIONAL_PARTS`) or the manifests.
        """
        wanted = [*STACK_BINARIES, *(OPTIONAL_PARTS[p] for p in parts)]
        missing = [b for b in wanted if b not in self.stack]
        if missing or self.manifests is None:
            raise AssetsError(f"{self.directory} lacks {', '.join(missing) or 'manifests/'}: "
                              "build the stack with scripts/stack-assets")
        return self.stack

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
        manifests = path / "manifests"
        return cls(
            directory=path,
            kube_apiserver=path / "kube-apiserver",
            etcd=path / "etcd",
            kubectl=path / "kubectl",
            helm=helm if os.access(helm, os.X_OK) else None,
            stack={b: path / b for b in (*STACK_BINARIES, *OPTIONAL_PARTS.values())
                   if os.access(path / b, os.X_OK)},
            manifests=manifests if manifests.is_dir() else None,
        )


def repo_root() -> Path:
    """The repository checkout this package runs from (holds ``scripts/``).

    Raises:
        AssetsError: the package is not running from a checkout (installed wheel).
    """
    root = Path(__file__).resolve().parents[2]
    if not (root / "scripts" / "stack-assets").is_file():
        raise AssetsError(
            f"scripts/stack-assets not found under {root}: building the control plane "
            "needs a repository checkout; or set KUBEBUILDER_ASSETS to a directory with "
            "kube-apiserver, etcd and kubectl"
        )
    return root


@functools.cache
def ensure_assets(assets_dir: str | None = None, parts: tuple[str, ...] = ()) -> Assets:
    """Return the local cluster's binaries, building them on first use.

    ``parts`` names the optional parts to build too (keys of :data:`OPTIONAL_PARTS`,
    the arguments of ``scripts/stack-assets``); without them the bundle holds what
    every cluster runs.

    ``assets_dir`` (a directory holding the binaries) wins; otherwise the asset
    script runs (it honours ``KUBEBUILDER_ASSETS`` and its cache, so a warm run
    takes well under a second).  The script's progress lines go to this
    process's stderr as they come.  The result is cached per process.

    Raises:
        AssetsError: ``parts`` names an unknown part; the script failed (the
            message quotes its last stderr lines),
            timed out (:data:`BUILD_TIMEOUT_SECONDS`), or its directory lacks a binary.
    """
    if assets_dir is not None:
        return Assets.from_directory(assets_dir)
    unknown = [p for p in parts if p not in OPTIONAL_PARTS]
    if unknown:
        raise AssetsError(f"parts={unknown!r}: must be among {sorted(OPTIONAL_PARTS)}")
    script = repo_root() / "scripts" / "stack-assets"
    proc = subprocess.Popen(["bash", str(script), *sorted(parts)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    # The script's own timeouts bound each build; this bounds the whole run.
    timer = threading.Timer(BUILD_TIMEOUT_SECONDS, proc.terminate)
    timer.start()
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
    try:
        assert proc.stderr is not None and proc.stdout is not None
        # Relay progress line by line as it comes (fd 2: shown even under
        # pytest's capture when the caller disables it), keeping a tail for errors.
        # A warm cache says only "up to date": that is kept for errors, not shown (under
        # pytest it landed inside the progress line); the first line shown starts a line.
        shown = False
        for line in proc.stderr:
            tail.append(line.rstrip("\n"))
            if "] up to date: " in line:
                continue
            os.write(2, (("" if shown else "\n") + line).encode(errors="replace"))
            shown = True
        stdout = proc.stdout.read()
        returncode = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            # SIGTERM first: the script's trap then stops its go build, which runs in a
            # session of its own and would outlive a SIGKILLed script.
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    lines = [line for line in stdout.splitlines() if line.strip()]
    if returncode != 0 or not lines:
        why = "timed out" if returncode in (-9, -15, 143) else f"failed with exit code {returncode}"
        raise AssetsError(f"{script} {why}:\n" + "\n".join(tail))
    return Assets.from_directory(lines[-1].strip())
