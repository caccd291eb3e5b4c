"""The README's first command, ``make demo`` (``python -m localdev.demo``), as a newcomer runs it.

Its own control plane, training process and scraper, end to end; the test reads
what the demo prints (the final ``kubectl get trainjob`` and the status JSON).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

DEMO_TIMEOUT_SECONDS = 600


def test_demo_runs_the_whole_path_and_ends_at_100_percent() -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    result = subprocess.run(
        [sys.executable, "-m", "localdev.demo", "--epochs", "2", "--interval", "1s"],
        capture_output=True, text=True, timeout=DEMO_TIMEOUT_SECONDS, env=env, check=False,
    )
    out = result.stdout
    assert result.returncode == 0, f"{out}\n{result.stderr[-3000:]}"
    assert "final status applied by the scraper" in out
    # At least one live line before the end: progress was seen while training ran.
    live = re.findall(r"^demo-train: (\d+)% ", out, re.MULTILINE)
    assert live, out
    table = out.split("kubectl get trainjob", 1)[1]
    header, row = [line for line in table.splitlines() if line.strip()][1:3]
    assert row[header.index("PROGRESS"):].split()[0] == "100", table
    status = json.loads(out.split("jsonpath='{.status.trainerStatus}'", 1)[1]
                        .split("─", 1)[-1].rsplit("demo took", 1)[0].strip().lstrip("─\n "))
    assert status["progressPercentage"] == 100
    names = {m["name"] for m in status["metrics"]}
    assert {"loss", "eval_accuracy"} <= names
