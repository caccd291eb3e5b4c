"""Push vs pull, side by side, at N TrainJobs on the local stack (issues 20 and 26).

``python -m benchmarks.vs_push --jobs 20 200 1000 [--every 1] [--every-20 10] [--quick]``
runs, on one :class:`localdev.cluster.stack.Cluster` (Trainer v2.3.0 with the
``TrainJobStatus`` gate on: its status server as shipped, QPS 5 / burst 10), for each N
one session per design, the same trainings reporting every ``every`` seconds
(:mod:`benchmarks.vs_push_training`):

* **push**: the trainings call the Kubeflow SDK's ``update_trainjob_status`` (5 s
  throttle, 5 s timeout, no retry); the status server writes as field manager
  ``trainer-status``;
* **pull**: the trainings call :func:`exporter_lib.update`; our scraper as deployed
  (``python -m scraper run``, its defaults) writes as ``trainjob-scraper``.  Before the
  defaults' window, the same trainings are measured under each setting of the sweep
  (``--sweep``: the scraper restarted with those flags, shorter windows) for the picture.

The first ``--real`` TrainJobs of a session (at least 10; by default as many as a
quarter of the available memory holds at :data:`TRAINING_BYTES` each) run a real
training process each; the others run :data:`benchmarks.vs_push_farm.STUB` and their
training in a farm process (:mod:`benchmarks.vs_push_farm`, up to
:data:`FARM_CHUNK` TrainJobs per process): push with the SDK's request, throttle and
timeout; pull with one ``exporter_lib`` exporter per pod.  Every row says which.

A session: N TrainJobs created; once each has reported (or ``--setup-timeout``), its
windows ``[a, b]`` (after ``--warmup`` s); every training ends at ``end = b + fault/2``
of the last window; at ``b`` the worker (push: the Trainer controller, whose status
server stops with it; pull: the scraper, SIGKILL) goes down and comes back at ``end +
fault/2``, so its outage spans every training's end; then up to ``--settle`` s for the
finals.  Figures per window (:mod:`benchmarks.vs_push_figures`): API writes per
TrainJob-hour from the audit log by field manager; progress and metrics freshness by
watch; training-side cost per report call by kind of training; reports lost (push:
non-200s, timeouts, refused connections); finals delivered; CPU seconds of the worker,
kube-apiserver and the farms over the window (``/proc``); the load average; for pull
the scraper's own figures (``scraper``: held scrapes and pending writes at the window's
start and end, scrapes and writes by result, mean write request time), which tell held
from polled targets and a write queue from slow writes.  Each window after the first
restarts the scraper: its first ``warmup`` seconds hold that start's transient.

Scaled down for a small machine (every figure says so): trainings are report loops,
the windows are minutes, not hours.  Everything listens on loopback; every wait is
bounded; every process started is stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.cp import _Scraper
from benchmarks.procstat import cpu_seconds
from benchmarks.report import loadavg, write_report
from benchmarks.vs_push_farm import SDK_THROTTLE_SECONDS, STUB
from benchmarks.vs_push_figures import (
    AuditWrites,
    StatusWatch,
    costs,
    freshness,
    read_audit,
    stamp_of,
    trainjob_hours,
)
from benchmarks.vs_push_report import plot, summarise, table
from benchmarks.waits import wait_until
from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from localdev.cluster import processes
from localdev.cluster.controlplane import ControlPlaneError
from localdev.cluster.mounts import private_mount_prefix, with_bind_mounts
from localdev.cluster.stack import Cluster, trainer_service_host
from localdev.cluster.trainjobs import trainjob_body

RESULTS = Path(__file__).resolve().parent / "results"
TRAINING = Path(__file__).resolve().with_name("vs_push_training.py")
DESIGNS = ("push", "pull")
#: The field manager of each design's status writes (upstream's status server; ours).
FIELD_MANAGER = {"push": "trainer-status", "pull": "trainjob-scraper"}
TRAINER = "trainer-controller-manager"
#: Resident memory of one real training process with the SDK imported (measured ~90
#: MB; with exporter_lib ~40 MB) plus the pod runner's share.
TRAINING_BYTES = 120 << 20
#: Fewest real trainings per session (issue 26).
MIN_REAL = 10
#: Most real trainings per session by default: CPU, not memory, binds on a 2-core machine
#: (importing the SDK costs a training process about 2.8 s of CPU, measured here).
MAX_REAL = 20
#: TrainJobs per farm process.
FARM_CHUNK = 250


def default_sweep() -> list[tuple[str, tuple[str, ...]]]:
    """The pull settings of the picture besides the defaults, (label, scraper flags): the
    write policy's metrics staleness below and above its default (issue 26); on a
    scraper without that policy, its metrics write interval."""
    from scraper.config import ScraperSettings

    if "metrics_staleness" in ScraperSettings.model_fields:
        return [("metrics staleness 10 s", ("--metrics-staleness", "10s")),
                ("metrics staleness 120 s", ("--metrics-staleness", "120s"))]
    return [("metrics write interval 10 s", ("--metrics-write-interval", "10s")),
            ("metrics write interval 60 s", ("--metrics-write-interval", "60s"))]


def memory_available() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (0 when unknown)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def real_count(jobs: int, available: int, asked: int | None) -> int:
    """Real trainings in a session of ``jobs``: ``asked`` if given, else what a quarter of
    ``available`` bytes holds, at most :data:`MAX_REAL`; at least :data:`MIN_REAL` (or
    ``jobs`` if fewer)."""
    fits = asked if asked is not None else min(MAX_REAL, available // 4 // TRAINING_BYTES)
    return min(jobs, max(fits, MIN_REAL if asked is None else 0))


@dataclass
class Window:
    """One measured window of a session: its label, the scraper's extra flags (pull),
    warm-up and length (seconds)."""

    label: str
    flags: tuple[str, ...]
    warmup: float
    length: float


@dataclass
class Session:
    design: str
    jobs: int
    every: float
    real: int
    windows: list[Window]
    fault: float
    settle: float
    setup_timeout: float
    percent_seconds: float
    label: str = field(init=False)

    def __post_init__(self) -> None:
        self.label = f"N={self.jobs} every={self.every:g}s"

    @property
    def namespace(self) -> str:
        return f"vs-{self.design}-{self.jobs}-{self.every:g}s".replace(".", "-")

    def lookahead(self) -> float:
        """Changes this close to a window's end are not counted (seconds)."""
        return max(SDK_THROTTLE_SECONDS, self.every) + 5.0

    def max_seconds(self) -> float:
        """Longest a training may run (its bound if the end file never comes)."""
        return (self.setup_timeout + sum(w.warmup + w.length + 15 for w in self.windows)
                + self.fault + 120)


# ------------------------------------------------------------------ processes


def _cpu(pid: int | None) -> float | None:
    if pid is None:
        return None
    with contextlib.suppress(OSError):
        return cpu_seconds(pid)
    return None


def _sleep_until(at: float) -> None:
    time.sleep(max(0.0, at - time.time()))


class _Farms:
    """The farm processes of a session (:mod:`benchmarks.vs_push_farm`)."""

    def __init__(self, cluster: Cluster, session: Session, names: list[str], out: Path,
                 end_file: Path) -> None:
        self.procs = []
        argv = [sys.executable, "-m", "benchmarks.vs_push_farm", "--mode",
                "push" if session.design == "push" else "pull", "--out", str(out),
                "--every", f"{session.every:g}",
                "--percent-seconds", f"{session.percent_seconds:g}",
                "--end-file", str(end_file), "--max-seconds", f"{session.max_seconds():.0f}"]
        # No pod identity for the exporters (the farm is no pod), the checkout importable.
        env = {k: v for k, v in os.environ.items()
               if k not in ("HOSTNAME", "KUBERNETES_SERVICE_HOST")}
        env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
        binds: list[tuple[Path | str, Path | str]] = []
        if session.design == "push":
            # The injected URL names the Trainer's Service: resolved as in the pod.
            hosts = out / "hosts"
            hosts.write_text(Path("/etc/hosts").read_text().rstrip("\n")
                             + f"\n127.0.0.1\t{trainer_service_host()}\n")
            binds.append((hosts, "/etc/hosts"))
        prefix = private_mount_prefix()
        for i in range(0, len(names), FARM_CHUNK):
            cmd = [*argv, "--names", ",".join(names[i:i + FARM_CHUNK])]
            if binds:
                if prefix is None:
                    raise ControlPlaneError("the push farm needs a private mount namespace "
                                            "(unshare) for the Service name's hosts entry")
                cmd = with_bind_mounts(prefix, binds, cmd)
            self.procs.append(processes.spawn(cmd, cluster.workdir / f"farm-{out.name}-{i}.log",
                                              env=env))

    def cpu(self) -> float | None:
        values = [_cpu(p.pid) for p in self.procs]
        return None if not values or None in values else sum(v for v in values if v)

    def stop(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            with contextlib.suppress(Exception):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            processes.stop(proc, 5.0)


class _Worker:
    """The process doing a design's status work: its pid, a kill and a start."""

    def __init__(self, cluster: Cluster, session: Session) -> None:
        self.cluster, self.session = cluster, session
        self.scraper: _Scraper | None = None

    def start(self, flags: tuple[str, ...] = ()) -> None:
        if self.session.design == "push":
            self.cluster.start_component(TRAINER)  # waits for readyz and the status server
            return
        self.scraper = _Scraper(self.cluster.kubeconfig_path, self.cluster.workdir,
                                self.session.namespace, list(flags))
        self.scraper.wait_ready()

    def kill(self) -> None:
        if self.session.design == "push":
            self.cluster.stop_component(TRAINER)
        elif self.scraper is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.scraper.proc.pid, signal.SIGKILL)
            self.scraper.stop()
            self.scraper = None

    def scraper_sample(self) -> dict[str, float] | None:
        """The scraper's :data:`SCRAPER_SERIES` now; None for push or when unreadable."""
        if self.scraper is None:
            return None
        try:
            return scraper_sample(self.scraper.metrics())
        except (OSError, ValueError):
            return None

    def pid(self) -> int | None:
        if self.session.design == "push":
            return self.cluster.process_pid(TRAINER)
        return None if self.scraper is None else self.scraper.proc.pid

    def stop(self) -> None:
        if self.scraper is not None:
            self.scraper.stop()
            self.scraper = None


# ------------------------------------------------------------------ one session


#: The scraper's own figures read at a window's start and end (issue 26: whether its
#: targets were held or polled, and whether the writes queued or were slow).
SCRAPER_SERIES = ("trainjob_scraper_held_scrapes", "trainjob_scraper_targets",
                  "trainjob_scraper_status_writes_pending", "trainjob_scraper_scrapes_total",
                  "trainjob_scraper_status_writes_total",
                  "trainjob_scraper_status_write_duration_seconds_sum",
                  "trainjob_scraper_status_write_duration_seconds_count")


def scraper_sample(text: str) -> dict[str, float]:
    """``SCRAPER_SERIES`` of a scraper's /metrics text, keyed ``name`` or
    ``name{label=value}`` (one label at most in these series)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in SCRAPER_SERIES:
                label = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{label}}}" if label else sample.name] = sample.value
    return out


def scraper_window(before: dict[str, float] | None,
                   after: dict[str, float] | None) -> dict[str, Any] | None:
    """The scraper over a window: gauges at its start and end, counters' increase, and
    the mean write request time (seconds); None without both samples."""
    if before is None or after is None:
        return None
    gauges = ("trainjob_scraper_held_scrapes", "trainjob_scraper_targets",
              "trainjob_scraper_status_writes_pending")
    out: dict[str, Any] = {g: [before.get(g), after.get(g)] for g in gauges}
    out["increase"] = {k: v - before.get(k, 0.0) for k, v in sorted(after.items())
                       if k not in gauges}
    n = out["increase"].get("trainjob_scraper_status_write_duration_seconds_count", 0.0)
    total = out["increase"].get("trainjob_scraper_status_write_duration_seconds_sum", 0.0)
    out["write_seconds_mean"] = total / n if n else None
    return out


def _records(out_dir: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for path in out_dir.glob("job-*.json"):
        with contextlib.suppress(OSError, ValueError):
            found[path.stem] = json.loads(path.read_text())
    return found


def _held(api: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL)["items"]
    return {o["metadata"]["name"]: (o.get("status") or {}).get("trainerStatus") or {}
            for o in items}


def _create_trainjobs(api: client.ApiClient, s: Session, out: Path, end_file: Path) -> None:
    def one(i: int) -> None:
        name = f"job-{i}"
        real = i < s.real
        command = ([sys.executable, str(TRAINING)] if real else ["/bin/sh", "-c", STUB])
        env = {"VS_PUSH_MODE": s.design, "VS_PUSH_EVERY": f"{s.every:g}",
               "VS_PUSH_PERCENT_SECONDS": f"{s.percent_seconds:g}",
               "VS_PUSH_END_FILE": str(end_file), "VS_PUSH_OUT": str(out),
               "VS_PUSH_MAX_SECONDS": f"{s.max_seconds():.0f}", "VS_PUSH_NAME": name}
        body = trainjob_body(s.namespace, name, command=command, env=env, num_nodes=1)
        for attempt in range(5):  # the Trainer's webhook may time out under load
            try:
                client.CustomObjectsApi(api).create_namespaced_custom_object(
                    API_GROUP, API_VERSION, s.namespace, TRAINJOB_PLURAL, body)
                return
            except client.ApiException as exc:
                if exc.status == 409 or attempt == 4:
                    if exc.status == 409:
                        return
                    raise
                time.sleep(1.0 + attempt)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(s.jobs)))


def _window_figures(cluster: Cluster, s: Session, records: dict[str, dict[str, Any]],
                    seen: dict[str, list[tuple[float, int, float]]], w: dict[str, Any],
                    audit_offset: int) -> None:
    a, b = w["start"], w["end"]
    w.update(freshness(records, seen, a, b, s.lookahead()))
    w["cost"] = costs(records.values(), a, b)
    hours = trainjob_hours(records.values(), a, b)
    audit: AuditWrites = read_audit(cluster.audit_log_path, s.namespace, a, b, audit_offset)
    writes, nbytes = audit.writer(FIELD_MANAGER[s.design])
    w.update({"trainjob_hours": hours, "writes": writes, "request_bytes": nbytes,
              "audit_writes_by_writer": dict(audit.count),
              "api_writes_per_trainjob_hour": writes / hours if hours else None,
              "request_bytes_per_write": nbytes / writes if writes else None})


def run_session(cluster: Cluster, s: Session) -> dict[str, Any]:
    """One design at one N on a running cluster; returns its figures per window."""
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": s.namespace}})
    out = cluster.workdir / "vs-push-out" / s.namespace
    out.mkdir(parents=True, exist_ok=True)
    end_file = out / "end-at"
    res: dict[str, Any] = {"design": s.design, "jobs": s.jobs, "every": s.every,
                           "label": s.label, "real": s.real, "farmed": s.jobs - s.real,
                           "namespace": s.namespace, "loadavg_start": loadavg(),
                           "percent_seconds": s.percent_seconds, "windows": []}
    audit_offset = cluster.audit_log_path.stat().st_size
    worker = _Worker(cluster, s)
    watcher = StatusWatch(api, s.namespace)
    names = [f"job-{i}" for i in range(s.real, s.jobs)]
    farms = _Farms(cluster, s, names, out, end_file) if names else None
    apiserver = cluster.apiserver_pid  # not pids[-1]: that is the last controller's
    try:
        t0 = time.time()
        if s.design == "pull":
            worker.start(s.windows[0].flags)
        _create_trainjobs(api, s, out, end_file)
        res["create_seconds"] = time.time() - t0
        wait_until(lambda: len(list(out.glob("job-*.up"))) >= s.jobs,
                    s.setup_timeout - (time.time() - t0), 1.0)
        res["reporting_at_first_window"] = len(list(out.glob("job-*.up")))
        res["setup_seconds"] = time.time() - t0
        end = 0.0
        for k, win in enumerate(s.windows):
            last = k == len(s.windows) - 1
            if k and s.design == "pull":
                worker.stop()
                worker.start(win.flags)
            a = time.time() + win.warmup
            b = a + win.length
            if last:  # every training ends half the fault after b
                end = b + s.fault / 2
                tmp = end_file.with_suffix(".tmp")
                tmp.write_text(f"{end:.3f}")
                tmp.replace(end_file)
            _sleep_until(a)
            pids = {"worker": worker.pid(), "apiserver": apiserver,
                    "trainer": cluster.process_pid(TRAINER)}
            c0 = {k2: _cpu(p) for k2, p in pids.items()}
            f0 = farms.cpu() if farms else None
            m0 = worker.scraper_sample()
            _sleep_until(b)
            c1 = {k2: _cpu(p) for k2, p in pids.items()}
            f1 = farms.cpu() if farms else None
            m1 = worker.scraper_sample()
            res["windows"].append({
                "label": win.label, "flags": list(win.flags), "start": a, "end": b,
                "seconds": b - a, "warmup": win.warmup, "loadavg": loadavg(),
                "cpu_seconds": {k2: None if c0[k2] is None or c1[k2] is None
                                else c1[k2] - c0[k2] for k2 in pids},  # type: ignore[operator]
                "farm_cpu_seconds": None if f0 is None or f1 is None else f1 - f0,
                "scraper": scraper_window(m0, m1)})
        # The fault: the worker down across every training's end.
        if s.fault > 0:
            worker.kill()
            _sleep_until(end + s.fault / 2)
            worker.start()
            res["restarted_at"] = time.time()
        wait_until(lambda: len(list(out.glob("job-*.json"))) >= s.jobs, 90.0)
        records = _records(out)
        res["records"] = len(records)
        res.update(_finals(api, s, records))
        seen = dict(watcher.seen)
        for w in res["windows"]:
            _window_figures(cluster, s, records, seen, w, audit_offset)
        res["loadavg_end"] = loadavg()
    finally:
        watcher.stop()
        worker.stop()
        if farms is not None:
            farms.stop(30.0)
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(s.namespace)
        api.close()
    return res


def _finals(api: client.ApiClient, s: Session,
            records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Finals delivered: TrainJobs whose trainerStatus shows the training's final report
    (its ``stamp``, progress 100), polled until all that were sent arrived or ``settle``."""
    finals = {n: r["final"] for n, r in records.items() if r.get("final")}
    # A push final that was never sent (throttled, refused) cannot arrive later.
    sent = {n for n, r in records.items() if r.get("final_outcome") == "ok"}
    deadline = time.time() + s.settle
    delivered: set[str] = set()
    while True:
        held = _held(api, s.namespace)
        delivered = {n for n, f in finals.items()
                     if (stamp_of(held.get(n, {})) or 0) >= f - 1e-3
                     and held.get(n, {}).get("progressPercentage") == 100}
        if sent <= delivered or time.time() > deadline:
            break
        time.sleep(1.0)
    outcomes: dict[str, int] = {}
    for r in records.values():
        o = str(r.get("final_outcome"))
        outcomes[o] = outcomes.get(o, 0) + 1
    return {"finals_delivered": len(delivered), "finals_expected": s.jobs,
            "final_outcomes": outcomes,
            "finals_missing": sorted(set(f"job-{i}" for i in range(s.jobs)) - delivered)[:20]}


# ------------------------------------------------------------------ the run


@contextlib.contextmanager
def _cluster() -> Iterator[Cluster]:
    # One retry: a free port picked for a controller can be taken before it binds.
    for attempt in range(2):
        cluster = Cluster(push=True, audit_log="Request")
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


@dataclass
class Plan:
    """What a run measures (the command line, resolved)."""

    jobs: list[int]
    every: float
    every_small: float | None  # also this interval at the smallest N
    window: float
    sweep_window: float
    sweep: list[tuple[str, tuple[str, ...]]]
    warmup: float
    fault: float
    settle: float
    setup_timeout: float | None
    percent_seconds: float
    real: int | None
    budget: float | None = None  # seconds for the whole run; later sessions are skipped


def session_seconds(s: Session) -> float:
    """A session's time after its setup: windows, fault, settle, teardown (seconds)."""
    return sum(w.warmup + w.length + 10 for w in s.windows) + s.fault + s.settle + 60


def sessions(plan: Plan, available: int) -> list[Session]:
    """The sessions of a run, in order: per N push then pull (pull with the sweep) at
    ``every``, then the smallest N at ``every_small`` (last: a time budget cuts it first)."""
    out: list[Session] = []
    pairs = [(n, plan.every, True) for n in plan.jobs]
    if plan.every_small is not None:
        pairs.append((min(plan.jobs), plan.every_small, False))
    for n, every, swept in pairs:
        for design in DESIGNS:
            warmup = plan.warmup + n / 20  # the first statuses at the write budget
            windows = [Window(label, flags, warmup, plan.sweep_window)
                       for label, flags in (plan.sweep if swept and design == "pull"
                                            else [])]
            windows.append(Window("defaults", (), warmup, plan.window))
            setup = plan.setup_timeout if plan.setup_timeout is not None else 60 + 2.0 * n
            out.append(Session(design, n, every, real_count(n, available, plan.real),
                               windows, plan.fault, plan.settle, setup,
                               plan.percent_seconds))
    return out


def run(plan: Plan) -> dict[str, Any]:
    """Every session of ``plan`` on one cluster; the JSON's content."""
    available = memory_available()
    res: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": f"{os.cpu_count()} cores",
        "memory_available_bytes": available, "loadavg_start": loadavg(), "runs": [],
        "plan": {k: v for k, v in plan.__dict__.items()}, "errors": {}}
    todo = sessions(plan, available)
    deadline = time.monotonic() + (plan.budget or float("inf"))
    try:
        with _cluster() as cluster:
            res["stack_versions"] = cluster.stack_versions
            for s in todo:
                left = deadline - time.monotonic() - session_seconds(s)
                if left < 60:
                    res["runs"].append({"design": s.design, "jobs": s.jobs, "every": s.every,
                                        "label": s.label, "error": "not run: the run's time "
                                        f"budget ({plan.budget:g} s) was spent"})
                    continue
                s.setup_timeout = min(s.setup_timeout, left)
                try:
                    one = run_session(cluster, s)
                except Exception as exc:  # the other sessions still count
                    one = {"design": s.design, "jobs": s.jobs, "every": s.every,
                           "label": s.label, "error": f"{type(exc).__name__}: {exc}"[:1000]}
                res["runs"].append(one)
                print(json.dumps(_brief(one), default=str), flush=True)
                _wait_namespace_gone(cluster, s.namespace, 60.0)
    except Exception as exc:
        res["errors"]["cluster"] = f"{type(exc).__name__}: {exc}"[:2000]
    summarise(res)
    return res


def _brief(one: dict[str, Any]) -> dict[str, Any]:
    """A session's headline figures for the console."""
    keep = ("design", "label", "real", "setup_seconds", "finals_delivered", "error")
    out = {k: one.get(k) for k in keep}
    for w in one.get("windows", []):
        out[w["label"]] = {k: w.get(k) for k in (
            "api_writes_per_trainjob_hour", "progress_freshness_p99_s",
            "metrics_freshness_p99_s", "progress_censored")}
    return out


def _wait_namespace_gone(cluster: Cluster, namespace: str, timeout: float) -> None:
    """Until the session's namespace (its TrainJobs, pods, processes) is gone, bounded:
    the next session's window should not pay for this one's teardown."""
    with cluster.api_client() as api:
        core = client.CoreV1Api(api)

        def gone() -> bool:
            try:
                core.read_namespace(namespace)
            except client.ApiException as exc:
                return bool(exc.status == 404)
            return False
        wait_until(gone, timeout, 2.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vs_push", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", nargs="+", type=int, default=[20, 200, 1000],
                        help="N (TrainJobs) of each session pair")
    parser.add_argument("--every", type=float, default=1.0, help="report interval (s)")
    parser.add_argument("--every-small", type=float, default=10.0,
                        help="also this report interval at the smallest N (0: not)")
    parser.add_argument("--window", type=float, default=90.0,
                        help="seconds measured at the defaults")
    parser.add_argument("--sweep-window", type=float, default=45.0,
                        help="seconds measured per sweep setting")
    parser.add_argument("--sweep", action="append", default=None, metavar="LABEL=FLAGS",
                        help="a pull setting of the picture: a label, '=', scraper flags "
                        "(repeatable; default: the policy's staleness and floor values)")
    parser.add_argument("--warmup", type=float, default=10.0,
                        help="seconds before a window (plus N/20 for the first writes)")
    parser.add_argument("--fault", type=float, default=30.0,
                        help="seconds the worker is down across the trainings' end")
    parser.add_argument("--settle", type=float, default=60.0,
                        help="seconds after the restart for the finals to land")
    parser.add_argument("--setup-timeout", type=float, default=None,
                        help="seconds for N trainings to report (default 60 + 2 N)")
    parser.add_argument("--percent-seconds", type=float, default=15.0,
                        help="seconds per percentage point of the trainings")
    parser.add_argument("--real", type=int, default=None,
                        help="real training processes per session (default: by memory, "
                        f">= {MIN_REAL})")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the whole run: a session that would not end in "
                        "time is not started, setups are cut to fit")
    parser.add_argument("--quick", action="store_true",
                        help="N=4 (2 real), every 1 s, one 20 s sweep window, 30 s window, "
                        "10 s fault, 30 s settle")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    sweep = (default_sweep() if args.sweep is None else
             [(text.split("=", 1)[0], tuple(shlex.split(text.split("=", 1)[1])))
              for text in args.sweep if "=" in text])
    plan = Plan(sorted(set(args.jobs)), args.every, args.every_small or None, args.window,
                args.sweep_window, sweep, args.warmup, args.fault, args.settle,
                args.setup_timeout, args.percent_seconds, args.real, args.budget)
    if args.quick:
        plan = Plan([4], 1.0, None, 30.0, 20.0, sweep[:1], 5.0, 10.0, 30.0,
                    args.setup_timeout or 120.0, 5.0, 2)
    if min(plan.jobs) < 1 or plan.every <= 0 or plan.window < 20 or plan.fault < 0:
        parser.error(f"--jobs={plan.jobs} (each >= 1), --every={plan.every:g} (> 0), "
                     f"--window={plan.window:g} (>= 20), --fault={plan.fault:g} (>= 0)")
    started = time.monotonic()
    res = run(plan)
    stem = write_report(res, args.out, "vs-push", table, started)
    plot(res, stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["AuditWrites", "main", "read_audit", "run", "sessions", "summarise", "table"]
