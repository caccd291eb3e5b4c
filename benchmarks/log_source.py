"""The log source on the real stack: freshness, a flooding training, cost per TrainJob-hour.

``python -m benchmarks.log_source`` starts the local stack (:class:`localdev.cluster.Cluster`:
API server, controllers, kwok serving pods/log from the pod runner's CRI files), a
runtime derived from ``torch-distributed`` with ``trainjob-progress.dev/source: logs``,
and the scraper as shipped (``--log-source``); then, one TrainJob at a time, the real
trainings of ``tests/trainings``:

a. **freshness, print -> TrainJob**: each training appends the wall time of each print
   that changes the progress to a side file (``PRINT_LOG``); a watch on the TrainJob
   notes when each progress value first appears.  Freshness = seen - printed, per
   progress value, p50/p99.  Rows: Keras ``verbose=2`` (a ``\\n`` line per epoch), the
   Transformers Trainer (a ``\\n`` logged dict per step), a tqdm ``\\r`` bar at tqdm's
   default redraw rate (about 90 bytes per step: a 16 KiB entry every ~180 steps), and
   the same bar with 10x the steps (16 KiB reached 10x as often).  A ``\\r`` bar's
   readings reach the log only in 16 KiB entries or at its end: the rows show it.
   A value printed several times (the bar redrawn within one percent) is timed from
   its first print: an upper bound.
b. **a training flooding its log** (tqdm redrawn every step plus 4 KiB lines, as fast as
   it prints): scraper CPU per second and bytes per read, against a quiet training.
c. **cost per log-sourced TrainJob-hour at a 30 s interval**: scraper CPU seconds and
   pods/log bytes per read, measured in (b), times 120 reads per hour; for 200
   TrainJobs, times 200.  The exporter path reads nothing through the API server (the
   scraper talks to the pod); its scraper CPU per scrape comes from the same process
   scraping an exporter_lib training (localdev.demo.train_numpy) in this run.

Everything listens on loopback; every process is stopped in ``finally``; every wait is
bounded.  The machine is shared (load average printed); writes the Markdown report to
``benchmarks/reports/log-source.md`` with ``--report``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from benchmarks.cp import percentile
from benchmarks.procstat import cpu_seconds
from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from localdev.cluster import trainjobs
from localdev.cluster.processes import free_port
from localdev.cluster.runtimes import LOG_SOURCE, annotated_runtime
from localdev.cluster.stack import Cluster
from localdev.demo.processes import start_scraper, wait_http_ok

REPO = Path(__file__).resolve().parents[1]
TRAININGS = REPO / "tests" / "trainings"
RUNTIME = "torch-distributed-logs"
NAMESPACE = "bench-logs"
TIMEOUT = 300.0

FRESHNESS = [
    ("Keras verbose=2 (\\n per epoch)", "keras_fit.py",
     {"VERBOSE": "2", "EPOCHS": "15", "STEPS": "4", "SLEEP": "0.5"}),
    ("Transformers Trainer (its \\r bar on stderr, a \\n logged dict per step on stdout)",
     "transformers_trainer.py",
     {"STEPS": "30", "SLEEP": "1", "EVAL_STEPS": "1000"}),
    ("tqdm \\r bar, 100 steps of 0.4 s", "tqdm_loop.py", {"STEPS": "100", "SLEEP": "0.4"}),
    ("tqdm \\r bar, 1000 steps of 0.04 s", "tqdm_loop.py",
     {"STEPS": "1000", "SLEEP": "0.04", "MININTERVAL": "0"}),
]


def metric_value(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


class FirstSeen(threading.Thread):
    """Watches one TrainJob; the wall time each progress value is first seen."""

    def __init__(self, api: client.ApiClient, name: str) -> None:
        super().__init__(daemon=True)
        self.api, self.name = api, name
        self.seen: dict[int, float] = {}
        self.losses: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        custom = client.CustomObjectsApi(self.api)
        while not self.stop.is_set():
            with contextlib.suppress(Exception):
                for event in watch.Watch().stream(
                        custom.list_namespaced_custom_object, API_GROUP, API_VERSION,
                        NAMESPACE, TRAINJOB_PLURAL, field_selector=f"metadata.name={self.name}",
                        timeout_seconds=5):
                    now = time.time()
                    status = ((event["object"].get("status") or {}).get("trainerStatus")
                              or {})
                    progress = status.get("progressPercentage")
                    if progress is not None:
                        self.seen.setdefault(int(progress), now)
                    for metric in status.get("metrics") or []:
                        if metric.get("name") == "loss":
                            self.losses.setdefault(metric["value"], now)
                    if self.stop.is_set():
                        return


def run_training(api: client.ApiClient, name: str, script: str, env: dict[str, str],
                 runtime: str = RUNTIME, command: list[str] | None = None) -> None:
    trainjobs.create(api, trainjobs.trainjob_body(
        NAMESPACE, name, runtime=runtime,
        command=command or [sys.executable, str(TRAININGS / script)],
        env={"PYTHONUNBUFFERED": "1", "KERAS_BACKEND": "torch", **env}))
    finished = trainjobs.wait_finished(api, NAMESPACE, name, TIMEOUT)
    if not trainjobs.condition(finished, "Complete"):
        raise RuntimeError(f"{name} did not complete: {finished.get('status')}")


def lag_row(printed: dict[Any, float], seen: dict[Any, float],
            ordered: bool = False) -> dict[str, Any]:
    """Lags of the values seen; with ``ordered`` (progress) also the catch-up lag of every
    value printed: until the TrainJob shows it or a larger one."""
    lags = [seen[k] - printed[k] for k in printed if k in seen]
    row = {"printed_values": len(printed), "seen_values": len(lags),
           "p50_s": percentile(lags, 0.5), "p99_s": percentile(lags, 0.99),
           "max_s": max(lags) if lags else None}
    if ordered:
        catch = []
        for value, at in printed.items():
            later = [t for v, t in seen.items() if v >= value and t >= at - 1.0]
            if later:
                catch.append(min(later) - at)
        row.update(catchup_p50_s=percentile(catch, 0.5), catchup_p99_s=percentile(catch, 0.99))
    return row


def freshness(api: client.ApiClient, work: Path, index: int, script: str,
              env: dict[str, str]) -> dict[str, dict[str, Any]]:
    name = f"fresh-{index}"
    print_log = work / f"{name}.jsonl"
    seen = FirstSeen(api, name)
    seen.start()
    try:
        run_training(api, name, script, {**env, "PRINT_LOG": str(print_log)})
        time.sleep(5)  # the final status from the log lands after the pod ended
    finally:
        seen.stop.set()
        seen.join(timeout=10)
    printed: dict[int, float] = {}
    losses: dict[str, float] = {}
    for line in print_log.read_text().splitlines():
        entry = json.loads(line)
        printed.setdefault(int(entry["progress"]), float(entry["t"]))
        if "loss" in entry:
            losses.setdefault(entry["loss"], float(entry["t"]))
    rows = {"progress": lag_row(printed, seen.seen, ordered=True)}
    if losses:
        rows["metric loss"] = lag_row(losses, seen.losses)
    return rows


def cpu_window(pid: int, metrics: str, seconds: float) -> dict[str, float]:
    c0, r0 = cpu_seconds(pid), metric_value(metrics, "trainjob_scraper_log_reads_total")
    b0 = metric_value(metrics, "trainjob_scraper_log_read_bytes_total")
    s0 = metric_value(metrics, "trainjob_scraper_scrapes_total")
    time.sleep(seconds)
    c1, r1 = cpu_seconds(pid), metric_value(metrics, "trainjob_scraper_log_reads_total")
    b1 = metric_value(metrics, "trainjob_scraper_log_read_bytes_total")
    s1 = metric_value(metrics, "trainjob_scraper_scrapes_total")
    return {"cpu_per_s": (c1 - c0) / seconds, "reads": r1 - r0, "bytes": b1 - b0,
            "scrapes": s1 - s0, "cpu_s": c1 - c0}


def in_background(api: client.ApiClient, name: str, script: str, env: dict[str, str],
                  **kwargs: Any) -> threading.Thread:
    thread = threading.Thread(target=run_training, args=(api, name, script, env),
                              kwargs=kwargs, daemon=True)
    thread.start()
    return thread


def wait_running(api: client.ApiClient, name: str) -> None:
    pods = trainjobs.wait_pods(api, NAMESPACE, name, count=1, timeout=120)
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(pods[0].metadata.name, NAMESPACE)
        if pod.status.phase == "Running":
            time.sleep(3)  # past the training's imports
            return
        time.sleep(0.5)
    raise RuntimeError(f"{name}: pod not running")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.log_source")
    parser.add_argument("--report", action="store_true",
                        help="write benchmarks/reports/log-source.md")
    parser.add_argument("--window", type=float, default=20.0,
                        help="seconds of each CPU window (default 20)")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"load_before": os.getloadavg()}
    work = Path(tempfile.mkdtemp(prefix="bench-logs-"))
    cluster = Cluster(workdir=work / "cluster")
    try:
        cluster.start()
        api = cluster.api_client()
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
        manifests = cluster.assets.manifests
        assert manifests is not None
        client.CustomObjectsApi(api).create_cluster_custom_object(
            API_GROUP, API_VERSION, "clustertrainingruntimes",
            annotated_runtime(manifests, RUNTIME, LOG_SOURCE))
        scraper = start_scraper(work, kubeconfig=cluster.kubeconfig_path, port=free_port(),
                                options=["--interval", "1s", "--namespaces", NAMESPACE,
                                         "--log-source"])
        try:
            wait_http_ok(scraper.extra["base_url"] + "/readyz", scraper)
            metrics, pid = scraper.extra["metrics_url"], scraper.process.pid
            out["freshness"] = {}
            for index, (label, script, env) in enumerate(FRESHNESS):
                for what, row in freshness(api, work, index, script, env).items():
                    out["freshness"][f"{label}: {what}"] = row
                    print(f"freshness {label}, {what}: {row}", flush=True)
            out["idle"] = cpu_window(pid, metrics, args.window)
            print(f"idle: {out['idle']}", flush=True)
            quiet = in_background(api, "quiet", "tqdm_loop.py",
                                  {"STEPS": str(int((args.window + 15) / 0.2)), "SLEEP": "0.2"})
            wait_running(api, "quiet")
            out["quiet"] = cpu_window(pid, metrics, args.window)
            print(f"quiet tqdm: {out['quiet']}", flush=True)
            quiet.join(timeout=TIMEOUT)
            flood = in_background(api, "flood", "flood.py",
                                  {"SECONDS": str(args.window + 30)})
            wait_running(api, "flood")
            out["flood"] = cpu_window(pid, metrics, args.window)
            print(f"flood: {out['flood']}", flush=True)
            flood.join(timeout=TIMEOUT)
            flood_log = sorted((cluster.workdir / "pods").glob(f"{NAMESPACE}_flood-*_node.log"))
            if flood_log:
                size = flood_log[0].stat().st_size
                out["flood_bytes_per_s"] = size / (args.window + 30)
            exporter = in_background(api, "exporter", "", {}, runtime="torch-distributed",
                                     command=[sys.executable, "-m", "localdev.demo.train_numpy",
                                              "--epochs", "2",
                                              "--log-file", str(work / "numpy.jsonl")])
            wait_running(api, "exporter")
            out["exporter"] = cpu_window(pid, metrics, args.window)
            print(f"exporter path: {out['exporter']}", flush=True)
            exporter.join(timeout=TIMEOUT)
        finally:
            scraper.stop()
    finally:
        cluster.stop()
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=1, default=str))
    if args.report:
        write_report(out)
    return 0


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("tqdm", "keras", "torch", "transformers", "lightning"):
        with contextlib.suppress(PackageNotFoundError):
            out.append(f"{name} {version(name)}")
    return ", ".join(out)


def write_report(out: dict[str, Any]) -> None:
    def per_read(row: dict[str, float], key: str) -> float:
        return row[key] / row["reads"] if row["reads"] else float("nan")

    quiet, flood, exporter, idle = out["quiet"], out["flood"], out["exporter"], out["idle"]
    cpu_read = (quiet["cpu_s"] - idle["cpu_s"]) / max(quiet["reads"], 1)
    bytes_read = per_read(quiet, "bytes")
    cpu_scrape = (exporter["cpu_s"] - idle["cpu_s"]) / max(exporter["scrapes"], 1)
    lines = [
        "# Log source: freshness, flooding, cost per TrainJob-hour",
        "",
        "`python -m benchmarks.log_source --report` (`make bench`) on the local stack: "
        "kube-apiserver, controllers, kwok v0.8.0 serving pods/log from the pod runner's "
        "CRI files; the scraper as shipped with `--log-source`, interval 1 s for (a), (b).",
        f"Load average before {out['load_before']}, after {out['load_after']} "
        "(2 cores shared with six other engineers' work).",
        f"Frameworks: {versions()}.",
        "",
        "## a. Freshness, print -> TrainJob (scrape interval 1 s)",
        "",
        "| output | values printed | values seen | p50 s | p99 s | max s | "
        "until shown or passed: p50 s | p99 s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, row in out["freshness"].items():
        def f(v: Any) -> str:
            return "-" if v is None else f"{v:.2f}"
        lines.append(f"| {label} | {row['printed_values']} | {row['seen_values']} | "
                     f"{f(row['p50_s'])} | {f(row['p99_s'])} | {f(row['max_s'])} | "
                     f"{f(row.get('catchup_p50_s'))} | {f(row.get('catchup_p99_s'))} |")
    lines += [
        "",
        "p50/p99/max: from a value's first print to the TrainJob showing it, over the values "
        "seen.  \"Until shown or passed\": for every value printed, until the TrainJob shows "
        "it or a larger one (what a reader waits).  A `\\r` bar reaches the log only when "
        "the runtime cuts a 16 KiB partial entry or the line ends: values redrawn in "
        "between are never seen (fewer values seen than printed) and wait for the next cut "
        "(the 16 KiB effect: compare the two tqdm rows, about 90 bytes per redraw).",
        "",
        "## b. A training flooding its log",
        "",
        "| training | scraper CPU s/s | log reads | bytes per read |",
        "| --- | --- | --- | --- |",
        f"| none (idle) | {idle['cpu_per_s']:.4f} | {idle['reads']:.0f} | - |",
        f"| tqdm, a redraw every 0.2 s | {quiet['cpu_per_s']:.4f} | {quiet['reads']:.0f} | "
        f"{per_read(quiet, 'bytes'):.0f} |",
        f"| flood ({out.get('flood_bytes_per_s', 0) / 1e6:.1f} MB/s written) | "
        f"{flood['cpu_per_s']:.4f} | {flood['reads']:.0f} | {per_read(flood, 'bytes'):.0f} |",
        "",
        "Each read is bounded by `limitBytes` (64 KiB, two reads when the first is cut): "
        "the flood costs the scraper what reading 64-128 KiB per interval costs, whatever "
        "the training writes.",
        "",
        "## c. Cost per TrainJob-hour at a 30 s interval (120 scrapes), and for 200 TrainJobs",
        "",
        "| path | scraper CPU s per TrainJob-hour | API bytes read per TrainJob-hour | "
        "200 TrainJobs: CPU s/h | 200 TrainJobs: API MB/h |",
        "| --- | --- | --- | --- | --- |",
        f"| log source (tqdm bar) | {cpu_read * 120:.2f} | {bytes_read * 120:.0f} | "
        f"{cpu_read * 120 * 200:.0f} | {bytes_read * 120 * 200 / 1e6:.1f} |",
        f"| log source, flooding training | {per_read(flood, 'cpu_s') * 120:.2f} | "
        f"{per_read(flood, 'bytes') * 120:.0f} | {per_read(flood, 'cpu_s') * 120 * 200:.0f} | "
        f"{per_read(flood, 'bytes') * 120 * 200 / 1e6:.1f} |",
        f"| exporter (exporter_lib, JSON) | {cpu_scrape * 120:.2f} | 0 | "
        f"{cpu_scrape * 120 * 200:.0f} | 0 |",
        "",
        "Measured on one TrainJob at a time and scaled (x120 reads per hour, x200 "
        "TrainJobs): 200 pods at once do not fit this machine (the row leaves out 200 "
        "concurrent pods, and the kubelet of a real node).  The per-read CPU of the log "
        "path is the scraper's CPU over the window minus its idle CPU, over the reads; "
        "the exporter row the same over its answered scrapes (waiting scrapes on).  Both "
        "include the status writes the readings caused (each training changed its status "
        "every interval), computed the same way.  API bytes: the pods/log answers' "
        "bodies; the exporter path reads nothing through the API server.  Noisy: the "
        "load average above.",
        "",
    ]
    path = REPO / "benchmarks" / "reports" / "log-source.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
