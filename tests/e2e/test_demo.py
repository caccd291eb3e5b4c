"""The README's first command, ``make demo`` (``python -m localdev.demo``), as a newcomer runs it.

Its own local cluster (controllers, kwok, pod runner), TrainJob and scraper, end to
end; the test reads what the demo prints (the TrainJob status JSON and the
controllers' JobSet, Job and pod as ``kubectl get -o wide`` lists them).
"""

from __future__ import annotations

import re

from tests.helpers.demo import printed_status, run_demo

DEMO_TIMEOUT_SECONDS = 600


def test_demo_runs_the_whole_path_and_ends_at_100_percent() -> None:
    result = run_demo("--epochs", "2", "--interval", "1s", timeout=DEMO_TIMEOUT_SECONDS)
    out = result.stdout
    assert result.returncode == 0, f"{out}\n{result.stderr[-3000:]}"
    assert "final status applied by the scraper" in out
    # At least one live line before the end: progress was seen while training ran.
    live = re.findall(r"^demo-train: (\d+)% ", out, re.MULTILINE)
    assert live, out
    status = printed_status(out)
    trainer = status["trainerStatus"]
    assert trainer["progressPercentage"] == 100
    assert {"loss", "eval_accuracy"} <= {m["name"] for m in trainer["metrics"]}
    assert any(c["type"] == "Complete" and c["status"] == "True" for c in status["conditions"])
    # The controllers' objects, as kubectl lists them: JobSet, Job and the pod on the
    # runner node with a loopback IP from its podCIDR (127.x.y.z: each cluster picks
    # its own, localdev.cluster.stack.pod_cidrs).
    objects = out.split("kubectl get jobsets,jobs,pods -o wide", 1)[1].split(
        "kubectl trainjob progress", 1)[0]
    assert re.search(r"^jobset\.jobset\.x-k8s\.io/demo-train\s+Completed", objects, re.M), objects
    assert re.search(r"^job\.batch/demo-train-node-0\s+Complete\s+1/1", objects, re.M), objects
    assert re.search(r"^pod/demo-train-node-0-0-\w+\s+0/1\s+Completed\s.*127\.\d+\.\d+\.\d+\s+"
                     r"runner-node-0", objects, re.M), objects
    # The kubectl plugin, run by the real kubectl against the demo's cluster as the demo
    # tells a user to: the TrainJob's row at 100 % with its loss column.
    plugin = out.split("kubectl trainjob progress (the plugin", 1)[1]
    assert "kubectl trainjob failed" not in plugin, plugin
    header, row = [line for line in plugin.splitlines() if line.strip()][1:3]
    assert header.split()[:2] == ["NAME", "STATE"] and "LOSS" in header, plugin
    assert row.startswith("demo-train") and "100%" in row and "Complete" in row, plugin
    assert "kubectl trainjob watch demo-train -n trainjob-demo" in " ".join(out.split())
