"""Push vs pull, side by side in one run, on the local stack (issue 20, deliverable 4).

``python -m benchmarks.vs_push [--jobs 20,200] [--every 1,10] [--quick]`` runs the same
training (:mod:`benchmarks.vs_push_training`) in N TrainJobs on the real chain
(Trainer -> JobSet -> Job -> runner pods, :class:`localdev.cluster.stack.Cluster`),
reporting every ``every`` seconds, once per design:

* **push**: ``Cluster(push=True)`` (the Trainer's ``TrainJobStatus`` gate on, its status
  server serving); the training calls the Kubeflow SDK's ``update_trainjob_status`` as
  shipped (5 s throttle, no retry); the writer is field manager ``trainer-status``.
* **pull**: the same cluster with the gate off; the training calls
  :func:`exporter_lib.update`; our scraper as deployed (``python -m scraper run``, its
  defaults unless ``--scrape-interval``) writes as field manager ``trainjob-scraper``.

Each run of N TrainJobs at one ``every``: the trainings all end at the same wall time
``end``; the figures are taken over a window ``[a, b]`` from once every pod runs to
``b = end - fault/2``; at ``b`` the process doing the work is stopped (push: the
Trainer controller, which serves the status server, by ``Cluster.stop_component``,
SIGTERM then SIGKILL; pull: the scraper, SIGKILL) and started again at
``end + fault/2``, so its outage spans every training's end.

Figures per design and run (keys of the JSON, each a mapping from the run's label,
e.g. ``N=20 every=1s``, to its value):

* ``api_writes_per_trainjob_hour``: successful writes to ``trainjobs/status`` in the
  run's namespace by the design's field manager, counted from the API server's audit
  log (``Cluster(audit_log="Request")``: user, userAgent, requestURI with
  ``fieldManager``), over the window, per TrainJob-hour of training in the window
  (each training's own start and end, not N times the window);
* ``request_bytes_per_write``: the audit event's ``requestObject`` as compact JSON (the
  body the API server decoded, re-serialised: a close estimate of the bytes sent);
* ``freshness_p50_s`` / ``freshness_p99_s``: a report (its ``stamp`` metric, the
  training's wall time) until a watch of the TrainJobs first shows it or a newer one,
  for reports in ``[a, b - lookahead]`` (lookahead: the longest a design may hold a
  report back, so an outage never counts as staleness);
* ``cpu_seconds_per_trainjob_hour``: push: the Trainer controller's CPU (utime + stime
  from ``/proc``) over the window in the push run minus the same controller's over the
  same run in the pull run (gate off), per TrainJob-hour; pull: the scraper process's;
* ``training_cost_us_per_report``: mean wall time of the report call as the training
  makes it (``perf_counter_ns`` around the call; push: every call, throttled or sent);
* ``finals_delivered`` / ``finals_expected``: TrainJobs whose ``trainerStatus`` shows the
  training's final report (its ``stamp``) once the worker is back and has had
  ``--settle`` seconds.

Scaled down for a 2-core machine (say so with the numbers): a training is a loop that
reports and sleeps (no model), so the trainings' CPU is the report calls and their
imports (~1 s CPU and ~90 MB each with the SDK, ~0.3 s and ~40 MB with exporter_lib);
the window is ``--window`` seconds, not an hour.  Everything listens on loopback; every
wait is bounded; every process started is stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubernetes import client

from benchmarks.cp import _Scraper, _Watcher, percentile
from benchmarks.procstat import cpu_seconds
from benchmarks.report import fmt, loadavg, verdict, write_report
from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from localdev.cluster.controlplane import ControlPlaneError
from localdev.cluster.stack import Cluster
from localdev.cluster.trainjobs import trainjob_body

RESULTS = Path(__file__).resolve().parent / "results"
TRAINING = Path(__file__).resolve().with_name("vs_push_training.py")
DESIGNS = ("push", "pull")
#: The field manager of each design's status writes (upstream's status server;
#: ours, docs/scraper.md).
FIELD_MANAGER = {"push": "trainer-status", "pull": "trainjob-scraper"}
TRAINER = "trainer-controller-manager"
#: The SDK's throttle (``_MIN_UPDATE_INTERVAL_SECONDS``), read from the installed SDK.
SCRAPER_DEFAULT_INTERVAL = 30.0
#: Resident memory of one training process with the SDK imported (measured: ~90 MB; with
#: exporter_lib ~40 MB), plus its pod runner bookkeeping: N is capped to fit.
TRAINING_BYTES = 120 << 20
KEYS = ("api_writes_per_trainjob_hour", "freshness_p50_s", "freshness_p99_s",
        "cpu_seconds_per_trainjob_hour", "training_cost_us_per_report",
        "finals_delivered", "finals_expected")


def sdk_throttle_seconds() -> float:
    """The Kubeflow SDK's minimum gap between two POSTs (seconds), as installed."""
    from kubeflow.trainer.backends.kubernetes import utils

    return float(utils._MIN_UPDATE_INTERVAL_SECONDS)


def memory_available() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (0 when unknown)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def fit_jobs(jobs: int, available: int) -> int:
    """``jobs`` capped so the trainings take at most half of ``available`` bytes (>= 1)."""
    if available <= 0:
        return jobs
    return max(1, min(jobs, available // 2 // TRAINING_BYTES))


def push_supported() -> bool:
    """True when the local stack has the push mode (``Cluster(push=True)``)."""
    return "push" in inspect.signature(Cluster.__init__).parameters


# ------------------------------------------------------------------ audit log


@dataclass
class AuditWrites:
    """Writes to ``trainjobs/status`` read from an audit log, by writer."""

    count: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)

    def writer(self, field_manager: str) -> tuple[int, int]:
        """(writes, request bytes) whose writer key starts with ``field_manager``."""
        keys = [k for k in self.count if k.split(" ", 1)[0] == field_manager]
        return sum(self.count[k] for k in keys), sum(self.bytes[k] for k in keys)


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def read_audit(path: Path, namespace: str, start: float, end: float) -> AuditWrites:
    """Count the successful (2xx) writes to ``trainjobs/status`` in ``namespace`` received
    in ``[start, end]`` (epoch seconds) in audit log ``path`` (JSON lines), keyed by
    ``"<fieldManager> <user> <userAgent product>"``; bytes from ``requestObject`` when the
    policy logged it at Request level (compact JSON), else 0."""
    out = AuditWrites()
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if '"trainjobs"' not in line or '"status"' not in line:
                continue
            try:
                event = json.loads(line)
            except ValueError:  # the last line may be half written
                continue
            ref = event.get("objectRef") or {}
            if (ref.get("resource") != "trainjobs" or ref.get("subresource") != "status"
                    or ref.get("namespace") != namespace
                    or event.get("stage") != "ResponseComplete"
                    or event.get("verb") not in ("patch", "update")):
                continue
            code = (event.get("responseStatus") or {}).get("code", 0)
            if not 200 <= code < 300:
                continue
            if not start <= _stamp(event["requestReceivedTimestamp"]) <= end:
                continue
            query = parse_qs(urlsplit(event.get("requestURI", "")).query)
            manager = (query.get("fieldManager") or ["(none)"])[0]
            agent = (event.get("userAgent") or "").split(" ", 1)[0].split("/", 1)[0]
            key = f"{manager} {(event.get('user') or {}).get('username', '?')} {agent}"
            out.count[key] += 1
            body = event.get("requestObject")
            if body is not None:
                out.bytes[key] += len(json.dumps(body, separators=(",", ":")))
    return out


# ------------------------------------------------------------------ one run


@dataclass
class RunSpec:
    design: str
    jobs: int
    every: float
    window: float
    fault: float
    settle: float
    scrape_interval: float | None

    @property
    def label(self) -> str:
        return f"N={self.jobs} every={self.every:g}s"

    @property
    def namespace(self) -> str:
        return f"vs-{self.design}-{self.jobs}-{self.every:g}s".replace(".", "-")

    def lookahead(self) -> float:
        """Longest a design may hold a report back before writing it (seconds)."""
        interval = self.scrape_interval or SCRAPER_DEFAULT_INTERVAL
        hold = sdk_throttle_seconds() if self.design == "push" else interval
        return hold + self.every + 5.0


def _running_pods(core: client.CoreV1Api, namespace: str) -> int:
    pods = core.list_namespaced_pod(namespace).items
    return sum(1 for p in pods if p.status.phase == "Running"
               and (p.spec.node_selector or {}) and p.status.pod_ip)


def _cpu(pid: int | None) -> float | None:
    if pid is None:
        return None
    with contextlib.suppress(OSError):
        return cpu_seconds(pid)
    return None


def _sleep_until(at: float) -> None:
    time.sleep(max(0.0, at - time.time()))


class _Worker:
    """The process doing a design's status work: its pid, a kill and a start."""

    def __init__(self, cluster: Cluster, spec: RunSpec) -> None:
        self.cluster, self.spec = cluster, spec
        self.scraper: _Scraper | None = None
        if spec.design == "pull":
            self.start()

    def _options(self) -> list[str]:
        iv = self.spec.scrape_interval
        return [] if iv is None else ["--interval", f"{iv:g}s"]

    def start(self) -> None:
        if self.spec.design == "push":
            self.cluster.start_component(TRAINER)  # waits for readyz and the status server
            return
        self.scraper = _Scraper(self.cluster.kubeconfig_path, self.cluster.workdir,
                                self.spec.namespace, self._options())
        self.scraper.wait_ready()

    def kill(self) -> None:
        if self.spec.design == "push":
            self.cluster.stop_component(TRAINER)
        elif self.scraper is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.scraper.proc.pid, signal.SIGKILL)
            self.scraper.stop()
            self.scraper = None

    def pid(self) -> int | None:
        if self.spec.design == "push":
            return self.cluster.process_pid(TRAINER)
        return None if self.scraper is None else self.scraper.proc.pid

    def stop(self) -> None:
        if self.scraper is not None:
            self.scraper.stop()
            self.scraper = None


def _reports(out_dir: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for path in out_dir.glob("job-*.json"):
        with contextlib.suppress(OSError, ValueError):
            found[path.stem] = json.loads(path.read_text())
    return found


def _trainer_status(api: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL)["items"]
    return {o["metadata"]["name"]: (o.get("status") or {}).get("trainerStatus") or {}
            for o in items}


def _stamp_of(status: dict[str, Any]) -> float | None:
    for m in status.get("metrics") or []:
        if m.get("name") == "stamp":
            with contextlib.suppress(ValueError):
                return float(m["value"])
    return None


def run_one(cluster: Cluster, spec: RunSpec, setup_timeout: float) -> dict[str, Any]:
    """One design at one N and one ``every`` on a running cluster; returns its figures
    (keys: see the module doc, plus the raw counts they come from)."""
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    ns = spec.namespace
    core.create_namespace({"metadata": {"name": ns}})
    out_dir = cluster.workdir / "vs-push-out" / ns
    out_dir.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"design": spec.design, "jobs": spec.jobs, "every": spec.every,
                           "namespace": ns, "loadavg_start": loadavg()}
    worker = _Worker(cluster, spec)
    watcher = _Watcher(api, ns)
    trainer_pid = cluster.process_pid(TRAINER)
    try:
        t0 = time.time()
        end_file = out_dir / "end-at"
        for i in range(spec.jobs):
            name = f"job-{i}"
            body = trainjob_body(ns, name, command=[sys.executable, str(TRAINING)], env={
                "VS_PUSH_MODE": spec.design, "VS_PUSH_EVERY": f"{spec.every:g}",
                "VS_PUSH_END_FILE": str(end_file),
                "VS_PUSH_MAX_SECONDS": f"{setup_timeout + spec.window + spec.fault + 60:.0f}",
                "VS_PUSH_OUT": str(out_dir), "VS_PUSH_NAME": name}, num_nodes=1)
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                API_GROUP, API_VERSION, ns, TRAINJOB_PLURAL, body)
        res["create_seconds"] = time.time() - t0
        deadline = t0 + setup_timeout
        up = 0
        while time.time() < deadline:
            up = len(list(out_dir.glob("job-*.up")))
            if up >= spec.jobs:
                break
            time.sleep(1.0)
        res["reporting_at_window_start"] = up
        res["running_pods_at_window_start"] = _running_pods(core, ns)
        res["setup_seconds"] = time.time() - t0
        # Every training ends at `end`; the window: one report after every training
        # reported (or the setup budget ran out) to b, when the worker goes down.
        a = time.time() + spec.every
        end = a + spec.window + spec.fault / 2
        b = end - spec.fault / 2
        tmp = end_file.with_suffix(".tmp")
        tmp.write_text(f"{end:.3f}")
        tmp.replace(end_file)
        _sleep_until(a)
        pid = worker.pid()
        c0 = (_cpu(trainer_pid), _cpu(pid))
        _sleep_until(b)
        c1 = (_cpu(trainer_pid), _cpu(pid))
        res.update({"window_start": a, "window_end": b, "window_seconds": b - a,
                    "trainer_cpu_seconds": None if None in (c0[0], c1[0])
                    else c1[0] - c0[0],  # type: ignore[operator]
                    "worker_cpu_seconds": None if None in (c0[1], c1[1])
                    else c1[1] - c0[1],  # type: ignore[operator]
                    "loadavg_window": loadavg()})
        # The fault: the worker killed across every training's end.
        if spec.fault > 0:
            worker.kill()
            _sleep_until(end + spec.fault / 2)
            worker.start()
            res["restarted_at"] = time.time()
        # Finals: every training's file written, then until the TrainJobs show them.
        _wait_until(lambda: len(_reports(out_dir)) >= spec.jobs, 60.0)
        reports = _reports(out_dir)
        finals = {name: r["final"] for name, r in reports.items()}
        settle_end = time.time() + spec.settle
        delivered: set[str] = set()
        while True:
            held = _trainer_status(api, ns)
            delivered = {n for n, f in finals.items()
                         if (_stamp_of(held.get(n, {})) or 0) >= f - 1e-3}
            if len(delivered) >= spec.jobs or time.time() > settle_end:
                break
            time.sleep(1.0)
        res["finals_delivered"] = len(delivered)
        res["finals_expected"] = spec.jobs
        res["finals_missing"] = sorted(set(f"job-{i}" for i in range(spec.jobs)) - delivered)[:20]
        res.update(_figures(spec, reports, watcher.seen, a, b))
        audit = read_audit(cluster.audit_log_path, ns, a, b)
        writes, nbytes = audit.writer(FIELD_MANAGER[spec.design])
        hours = res["trainjob_hours"]
        res.update({
            "audit_writes_by_writer": dict(audit.count),
            "writes": writes, "request_bytes": nbytes,
            "api_writes_per_trainjob_hour": writes / hours if hours else None,
            "request_bytes_per_write": nbytes / writes if writes else None,
            "request_bytes_per_trainjob_hour": nbytes / hours if hours else None,
        })
        if spec.design == "pull" and res["worker_cpu_seconds"] is not None and hours:
            res["cpu_seconds_per_trainjob_hour"] = res["worker_cpu_seconds"] / hours
        if res["trainer_cpu_seconds"] is not None and hours:
            res["trainer_cpu_seconds_per_trainjob_hour"] = res["trainer_cpu_seconds"] / hours
        res["loadavg_end"] = loadavg()
    finally:
        watcher.stop()
        worker.stop()
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(ns)
        api.close()
    return res


def _wait_until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


def _figures(spec: RunSpec, reports: dict[str, dict[str, Any]],
             seen: Iterable[tuple[str, float, float]], a: float, b: float) -> dict[str, Any]:
    """Freshness, training-side cost and TrainJob-hours from the trainings' files and the
    watch's (job, stamp, seen at) records."""
    by_job: dict[str, list[tuple[float, float]]] = {}
    for job, stamp, at in list(seen):
        by_job.setdefault(job, []).append((at, stamp))
    fresh: list[float] = []
    unseen = 0
    last = b - spec.lookahead()
    calls: list[int] = []
    hours = 0.0
    for job, rep in reports.items():
        views = sorted(by_job.get(job, []))
        for stamp in rep["stamps"]:
            if not a <= stamp <= last:
                continue
            at = next((t for t, s in views if s >= stamp - 1e-3), None)
            if at is None:
                unseen += 1
            else:
                fresh.append(max(0.0, at - stamp))
        calls += rep["call_ns"]
        hours += max(0.0, min(b, rep["final"]) - max(a, rep["started"])) / 3600
    sent = sum(1 for rep in reports.values() for r in rep["results"] if r is True)
    return {"reports_checked": len(fresh) + unseen, "reports_unseen": unseen,
            "freshness_p50_s": percentile(fresh, 0.5), "freshness_p99_s": percentile(fresh, 0.99),
            "freshness_max_s": max(fresh) if fresh else None,
            "training_cost_us_per_report": sum(calls) / len(calls) / 1e3 if calls else None,
            "training_cost_p50_us": (percentile([float(c) for c in calls], 0.5) or 0) / 1e3,
            "report_calls": len(calls), "push_posts_ok": sent, "trainjob_hours": hours}


# ------------------------------------------------------------------ the run


@contextlib.contextmanager
def _cluster(design: str) -> Iterator[Cluster]:
    kwargs: dict[str, Any] = {"audit_log": "Request"}
    if design == "push":
        kwargs["push"] = True
    # One retry: a free port picked for a controller can be taken before it binds
    # (seen with seven engineers' clusters on one machine).
    for attempt in range(2):
        cluster = Cluster(**kwargs)
        try:
            cluster.start()
            break
        except ControlPlaneError:
            if attempt:
                raise
    try:
        yield cluster
    finally:
        cluster.stop()


def run(jobs: list[int], every: list[float], window: float, fault: float, settle: float,
        scrape_interval: float | None, setup_timeout: float | None) -> dict[str, Any]:
    """Both designs, every (N, every) pair; the JSON's content (module doc)."""
    res: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                           "machine": f"{os.cpu_count()} cores",
                           "loadavg_start": loadavg(), "runs": [],
                           "sdk_throttle_seconds": sdk_throttle_seconds(),
                           "scrape_interval": scrape_interval or SCRAPER_DEFAULT_INTERVAL,
                           "window": window, "fault": fault, "errors": {}}
    # The same N for both designs (like with like), capped once to fit this machine.
    available = memory_available()
    fitted = [fit_jobs(n, available) for n in jobs]
    res["jobs_asked"], res["jobs"] = jobs, fitted
    res["memory_available_bytes"] = available
    jobs = list(dict.fromkeys(fitted))
    for design in DESIGNS:
        if design == "push" and not push_supported():
            res["errors"]["push"] = ("push mode not on this stack: Cluster has no push=True "
                                     "(branch push-stack: Trainer v2.3.0, TrainJobStatus gate, "
                                     "status server, projected tokens in the pod runner)")
            continue
        try:
            with _cluster(design) as cluster:
                res.setdefault("stack_versions", {})[design] = cluster.stack_versions
                for n in jobs:
                    for e in every:
                        spec = RunSpec(design, n, e, window, fault, settle, scrape_interval)
                        budget = setup_timeout if setup_timeout is not None else 30 + 1.5 * n
                        try:
                            one = run_one(cluster, spec, budget)
                        except Exception as exc:  # the other runs still count
                            one = {"design": design, "jobs": n, "every": e,
                                   "error": f"{type(exc).__name__}: {exc}"[:1000]}
                        one["label"] = spec.label
                        res["runs"].append(one)
                        print(json.dumps({k: v for k, v in one.items()
                                          if k != "audit_writes_by_writer"}, default=str),
                              flush=True)
        except Exception as exc:
            res["errors"][design] = f"{type(exc).__name__}: {exc}"[:2000]
    summarise(res)
    return res


def summarise(res: dict[str, Any]) -> None:
    """Fill ``res["push"]`` and ``res["pull"]``: each of :data:`KEYS` as {label: value};
    push's CPU is its Trainer controller minus the pull run's (gate off), same label."""
    by: dict[tuple[str, str], dict[str, Any]] = {
        (r["design"], r["label"]): r for r in res["runs"] if "error" not in r}
    for design in DESIGNS:
        res[design] = {k: {} for k in KEYS}
    for (design, label), r in by.items():
        d = res[design]
        for key in KEYS:
            d[key][label] = r.get(key)
        if design == "push":
            off = by.get(("pull", label), {}).get("trainer_cpu_seconds_per_trainjob_hour")
            on = r.get("trainer_cpu_seconds_per_trainjob_hour")
            d["cpu_seconds_per_trainjob_hour"][label] = (
                None if on is None or off is None else on - off)
    res["targets"] = targets(res)


def _labels(res: dict[str, Any]) -> list[str]:
    """The runs' labels measured by either design, in the order they ran."""
    done = {*res["push"]["finals_expected"], *res["pull"]["finals_expected"]}
    return [lb for lb in dict.fromkeys(r["label"] for r in res["runs"]) if lb in done]


def _ratio(x: Any, y: Any) -> float | None:
    return None if x is None or not y else x / y


def targets(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The issue's three targets per label: value, limit and verdict (None: not measured)."""
    push, pull = res["push"], res["pull"]
    out: dict[str, dict[str, Any]] = {}
    for label in _labels(res):
        every = float(label.split("every=")[1].rstrip("s"))
        w = _ratio(pull["api_writes_per_trainjob_hour"].get(label),
                   push["api_writes_per_trainjob_hour"].get(label))
        p99_pull = pull["freshness_p99_s"].get(label)
        p99_push = push["freshness_p99_s"].get(label)
        fresh_ok = None if p99_pull is None or p99_push is None else p99_pull <= p99_push + every
        c = _ratio(pull["training_cost_us_per_report"].get(label),
                   push["training_cost_us_per_report"].get(label))
        fd, fe = pull["finals_delivered"].get(label), pull["finals_expected"].get(label)
        out[label] = {
            "writes_ratio": w, "freshness_p99_limit_s": None if p99_push is None
            else p99_push + every,
            "writes_met": None if w is None or fresh_ok is None else (w <= 0.5 and fresh_ok),
            "finals_met": None if fd is None else fd == fe,
            "cost_ratio": c, "cost_met": None if c is None else c <= 0.01,
        }
    return out


# ------------------------------------------------------------------ report


def table(res: dict[str, Any]) -> str:
    """The Markdown table of a run's figures and targets."""
    push, pull = res["push"], res["pull"]
    by = {(r["design"], r["label"]): r for r in res["runs"] if "error" not in r}
    lines = [
        f"{res['machine']}; load average at start {res['loadavg_start']}, end "
        f"{res.get('loadavg_end')}; window {res['window']:g} s per run, fault "
        f"{res['fault']:g} s across the end; SDK throttle {res['sdk_throttle_seconds']:g} s; "
        f"scraper interval {res['scrape_interval']:g} s (waiting scrapes on); N asked "
        f"{res['jobs_asked']}, run {res['jobs']} (capped to half the available memory at "
        f"{TRAINING_BYTES >> 20} MiB per training).", "",
        "| run | design | writes / TrainJob-hour (audit) | bytes / write (audit) | "
        "freshness p50 / p99 | CPU-s / TrainJob-hour | training cost / report | finals | "
        "load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label in _labels(res):
        for design, d in (("push", push), ("pull", pull)):
            if label not in d["finals_expected"]:
                continue
            r = by.get((design, label), {})
            cpu_note = " (controller on - off)" if design == "push" else " (scraper)"
            lines.append(
                f"| {label} | {design} | {fmt(d['api_writes_per_trainjob_hour'][label], '.0f')} | "
                f"{fmt(r.get('request_bytes_per_write'), '.0f')} | "
                f"{fmt(d['freshness_p50_s'][label], '.2f')} / "
                f"{fmt(d['freshness_p99_s'][label], '.2f')} s | "
                f"{fmt(d['cpu_seconds_per_trainjob_hour'][label], '.2f')}{cpu_note} | "
                f"{fmt(d['training_cost_us_per_report'][label], '.1f')} us | "
                f"{d['finals_delivered'][label]} of {d['finals_expected'][label]} | "
                f"{r.get('loadavg_window')} |")
    lines += ["", "| run | target | value | verdict |", "| --- | --- | --- | --- |"]
    for label, t in res["targets"].items():
        lines += [
            f"| {label} | pull writes <= 0.5x push at freshness p99 <= push p99 + one interval "
            f"({fmt(t['freshness_p99_limit_s'], '.2f')} s) | {fmt(t['writes_ratio'], '.2f')}x | "
            f"{verdict(t['writes_met'])} |",
            f"| {label} | pull delivers every final under its fault | "
            f"{pull['finals_delivered'].get(label)} of {pull['finals_expected'].get(label)} | "
            f"{verdict(t['finals_met'])} |",
            f"| {label} | pull training-side cost <= 0.01x push | {fmt(t['cost_ratio'], '.4f')}x | "
            f"{verdict(t['cost_met'])} |"]
    for design, err in res["errors"].items():
        lines += ["", f"{design} not run: {err[:400]}"]
    for r in res["runs"]:
        if "error" in r:
            lines += ["", f"{r['design']} {r['label']} failed: `{r['error'][:400]}`"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vs_push", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", default="20,200", help="comma-separated N (TrainJobs)")
    parser.add_argument("--every", default="1,10", help="comma-separated report intervals (s)")
    parser.add_argument("--window", type=float, default=120.0, help="seconds measured per run")
    parser.add_argument("--fault", type=float, default=30.0,
                        help="seconds the worker is down across the trainings' end (0: none)")
    parser.add_argument("--settle", type=float, default=60.0,
                        help="seconds after the restart for the finals to land")
    parser.add_argument("--scrape-interval", type=float, default=None,
                        help="the scraper's --interval (default: its own, 30 s)")
    parser.add_argument("--setup-timeout", type=float, default=None,
                        help="seconds for N pods to run (default 30 + 1.5 N)")
    parser.add_argument("--quick", action="store_true",
                        help="N=3, every 1 s, 45 s window, 10 s fault, 40 s settle, 5 s "
                             "scrape interval, 90 s setup")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    jobs = [int(x) for x in args.jobs.split(",")]
    every = [float(x) for x in args.every.split(",")]
    window, fault, settle, interval = args.window, args.fault, args.settle, args.scrape_interval
    setup = args.setup_timeout
    if args.quick:
        jobs, every, window, fault, settle, interval = [3], [1.0], 45.0, 10.0, 40.0, 5.0
        setup = 90.0 if setup is None else setup
    if min(jobs) < 1 or min(every) <= 0 or window < 20 or fault < 0:
        parser.error(f"--jobs={args.jobs} (each >= 1), --every={args.every} (> 0), "
                     f"--window={window:g} (>= 20), --fault={fault:g} (>= 0)")
    started = time.monotonic()
    res = run(jobs, every, window, fault, settle, interval, setup)
    write_report(res, args.out, "vs-push", table, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["AuditWrites", "main", "read_audit", "run", "summarise", "table", "targets"]
