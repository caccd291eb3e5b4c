"""``kubectl logs`` on a runner pod: the pod runner's CRI files served by kwok.

A TrainJob on the shipped torch-distributed runtime runs a command that prints a
40 KiB line (three runtime entries: two 16 KiB partial ones and the rest), a ``\\r``
redraw, stderr lines, and a last line without ``\\n``.  Trainer -> JobSet -> Job make
the pod, the pod runner stores its output, and the real ``kubectl logs`` reads it back
through the API server, which asks kwok's kubelet endpoint; kwok reads the file with
the kubelet's own reader.  What is not real: kwok and the pod runner stand in for the
kubelet and the container runtime.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from kubernetes import client

from localdev.cluster import crilog, trainjobs
from localdev.cluster.stack import Cluster
from tests.logsource.conftest import render

TIMEOUT_SECONDS = 180
LONG = 40 * 1024
SCRIPT = f"""
import sys, time
out, err = sys.stdout, sys.stderr
out.write("first\\n"); out.flush()
err.write("to stderr\\n"); err.flush()
out.write("x" * {LONG} + "\\n"); out.flush()
out.write("\\r 10%|bar|\\r 20%|bar|\\n"); out.flush()
time.sleep(2.2)
out.write("late 1\\nlate 2\\n"); out.flush()
out.write("no newline"); out.flush()
"""


def test_kubectl_logs_reads_the_runtime_split_output(
    kube_stack: Cluster, stack_api: client.ApiClient, stack_namespace: str,
) -> None:
    namespace, name = stack_namespace, "pod-logs"
    trainjobs.create(stack_api, trainjobs.trainjob_body(
        namespace, name, command=[sys.executable, "-c", SCRIPT]))
    finished = trainjobs.wait_finished(stack_api, namespace, name, TIMEOUT_SECONDS)
    assert trainjobs.condition(finished, "Complete"), finished.get("status")
    [pod] = trainjobs.pods(stack_api, namespace, name)
    pod_name = pod.metadata.name

    def logs(*args: str) -> str:
        # The real kubectl, its bytes as sent (text mode would turn each \r into \n).
        return subprocess.run(
            [str(kube_stack.assets.kubectl), f"--kubeconfig={kube_stack.kubeconfig_path}",
             "logs", "-n", namespace, pod_name, "-c", "node", *args],
            capture_output=True, check=True, timeout=60).stdout.decode()

    whole = logs()
    lines = whole.split("\n")
    # Both streams (in the order their pipes were read, as a runtime's), the partial
    # entries joined back into one line, \r kept, the last line as printed (no \n added).
    assert lines[0] in ("first", "to stderr") and "to stderr" in lines and "first" in lines
    assert "x" * LONG in lines
    assert "\r 10%|bar|\r 20%|bar|" in lines
    assert whole.endswith("late 1\nlate 2\nno newline")

    # The file as a runtime writes it: 16 KiB partial entries, then the rest of the line.
    cri = sorted((kube_stack.workdir / "pods" / "logs").glob(f"{namespace}_{pod_name}_*"))
    [entries_file] = [p for d in cri for p in (d / "node").glob("0.log")]
    entries = [crilog.parse_entry(e) for e in Path(entries_file).read_bytes().split(b"\n")[:-1]]
    xs = [(partial, len(content)) for _, _, partial, content in entries
          if content and set(content) == {ord("x")}]
    assert xs == [(True, 16384), (True, 16384), (False, LONG - 2 * 16384)]
    assert entries[-1][2] and entries[-1][3] == b"no newline"

    # tailLines counts entries: the last two are "late 2" and the partial last line.
    assert logs("--tail=2") == "late 2\nno newline"
    # limitBytes cuts from the start of what would be sent.
    assert logs("--limit-bytes=9") == whole[:9]
    # sinceTime: the entries printed after the sleep only (entry times, whole seconds).
    late = datetime.fromisoformat(
        next(ts for ts, _, _, c in entries if c == b"late 1").replace("Z", "+00:00"))
    first = datetime.fromisoformat(entries[0][0].replace("Z", "+00:00"))
    assert late - first > timedelta(seconds=2)
    since = (late.replace(microsecond=0)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert logs(f"--since-time={since}") == "late 1\nlate 2\nno newline"
    # timestamps: each entry's own time, RFC 3339 with nanoseconds.
    stamped = logs("--timestamps", "--tail=1")
    assert stamped.endswith(" no newline") and stamped.startswith(str(late.year))
    # ... in front of an entry that starts a line only: the 40 KiB line's three entries
    # come joined behind the first one's.  The log source's tests render pods/log so
    # (tests/logsource/conftest.py); this pins that rendering to the real one.
    assert logs("--timestamps").encode() == render(entries)
