"""``make demo ARGS="--zero-code logs"``: an unmodified tqdm training read from its log.

The demo's own local cluster, scraper (``--log-source``) and TrainJob on a runtime whose
pods carry ``trainjob-progress.dev/source: logs``; the training
(``localdev/demo/train_tqdm.py``) imports nothing of this project.  The test reads what
the demo prints: live lines below 100 %, then the final status JSON.
"""

from __future__ import annotations

import re

from tests.helpers.demo import printed_status, run_demo

DEMO_TIMEOUT_SECONDS = 600


def test_zero_code_logs_demo_reaches_100_percent_with_live_progress() -> None:
    result = run_demo("--zero-code", "logs", "--interval", "1s", timeout=DEMO_TIMEOUT_SECONDS)
    out = result.stdout
    assert result.returncode == 0, f"{out}\n{result.stderr[-3000:]}"
    assert "train_tqdm.py (plain tqdm, zero code)" in out
    assert "final status applied by the scraper" in out
    live = [int(p) for p in re.findall(r"^demo-train: (\d+)% ", out, re.MULTILINE)]
    assert any(p < 100 for p in live), out  # the live view showed the bar while it ran
    status = printed_status(out)
    trainer = status["trainerStatus"]
    assert trainer["progressPercentage"] == 100
    assert "loss" in {m["name"] for m in trainer["metrics"]}
