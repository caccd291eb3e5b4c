"""Running ``python -m localdev.demo`` as a newcomer does, and reading what it prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

#: The status section's start (the rule line's ``kubectl get ... -o jsonpath='{.status}'``)
#: and the next command's, between which the demo prints the TrainJob status JSON.
_STATUS_START = "jsonpath='{.status}'"
_STATUS_END = "kubectl get jobsets,jobs,pods -o wide"


def run_demo(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m localdev.demo args`` with this interpreter, its output captured (text),
    with no ``KUBECONFIG`` (the demo's own cluster, whatever this shell points at).

    Raises :class:`subprocess.TimeoutExpired` after ``timeout`` seconds; a non-zero exit
    is left to the caller (``check=False``).
    """
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.run([sys.executable, "-m", "localdev.demo", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, check=False)


def printed_status(out: str) -> dict[str, Any]:
    """The TrainJob ``status`` the demo printed in ``out`` (its stdout): the JSON between
    the jsonpath command's line and the ``kubectl get jobsets,jobs,pods`` one, without
    the rule lines (``─``) around it.

    Raises IndexError when ``out`` has no status section, ValueError when it is not JSON.
    """
    section = out.split(_STATUS_START, 1)[1].split("\n", 1)[1]
    section = section.split(_STATUS_END, 1)[0]
    status: dict[str, Any] = json.loads("\n".join(
        line for line in section.splitlines() if not line.strip().startswith("─")))
    return status
