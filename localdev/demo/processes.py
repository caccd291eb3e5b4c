"""Child processes of the demo and the end-to-end tests: a training run and the scraper.

Each runs as its own OS process, as in a cluster: the training process knows
only its exporter port, the scraper only a kubeconfig.  Both are started by
:mod:`localdev.cluster.processes` (own session, never outliving this
process) and write their output to a log file whose tail goes into errors.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localdev.cluster import processes


@dataclass
class Child:
    """A child process with its log file.  ``stop()`` is idempotent."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    extra: dict[str, Any] = field(default_factory=dict)

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the log (empty when there is none)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def running(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds; return the exit code.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout``.
        """
        return self.process.wait(timeout=timeout)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds; return the exit code."""
        processes.stop(self.process, grace)
        return self.process.returncode


def spawn(name: str, argv: Sequence[str], log_path: Path,
          env: Mapping[str, str] | None = None) -> Child:
    """Start ``argv`` (see :func:`localdev.cluster.processes.spawn`) with ``env`` added."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.unlink(missing_ok=True)
    process = processes.spawn(argv, log_path, env={**os.environ, **(env or {})})
    return Child(name, process, log_path)


def start_scraper(workdir: Path, *, kubeconfig: Path | str | None, port: int,
                  options: Sequence[str] = (), env: Mapping[str, str] | None = None,
                  name: str = "scraper") -> Child:
    """Start ``trainjob-scraper run`` serving its own /metrics on ``127.0.0.1:port``.

    ``options`` are extra command-line flags (``--interval 1s``, ``--namespaces x``).
    ``extra["metrics_url"]`` of the returned child is its /metrics URL.
    """
    # Loopback only, read by the local Prometheus without a token: the trusted-network
    # opt-out of the /metrics authentication (docs/operator-guide.md).
    argv = [sys.executable, "-m", "scraper", "run", "--listen-host", "127.0.0.1",
            "--listen-port", str(port), "--no-metrics-auth", *options]
    if kubeconfig is not None:
        argv += ["--kubeconfig", str(kubeconfig)]
    child = spawn(name, argv, workdir / f"{name}.log", env={"PYTHONUNBUFFERED": "1", **(env or {})})
    child.extra["metrics_url"] = f"http://127.0.0.1:{port}/metrics"
    child.extra["base_url"] = f"http://127.0.0.1:{port}"
    return child


def wait_http_ok(url: str, child: Child, timeout: float = 60.0) -> None:
    """Poll ``url`` until it answers 200, while ``child`` runs.

    Raises:
        RuntimeError: ``child`` exited, or no 200 within ``timeout`` seconds
            (the message holds the tail of the child's log).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.running():
            raise RuntimeError(f"{child.name} exited with code {child.process.returncode}:\n"
                               f"{child.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout:.0f}s; {child.name} log:\n"
                       f"{child.log_tail()}")
