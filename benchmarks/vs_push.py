"""Push vs pull, side by side, at N TrainJobs on the local stack (issues 20, 26 and 37).

``python -m benchmarks.vs_push --plan main|cliff|quick [--jobs N ...] [--budget Q/B]``
runs, on one :class:`localdev.cluster.stack.Cluster` (Trainer v2.3.0 with the
``TrainJobStatus`` gate on), the cases of a plan (:mod:`benchmarks.vs_push_sides`: N,
report interval, percentage rate, window) for each of its sides, one session each, the
same trainings reporting every ``every`` seconds (:mod:`benchmarks.vs_push_training`):

* **push** (``push_as_shipped``, ``push_equal_budget``, ``push_best``): the trainings
  call the Kubeflow SDK's ``update_trainjob_status`` (5 s throttle, 5 s timeout, no
  retry); the Trainer's status server writes as field manager ``trainer-status``.  Each
  session restarts the Trainer with its side's ``statusServer.qps``/``burst`` and, for
  ``push_best``, our patched build (``scripts/stack-assets trainer-best``);
* **pull** (``pull``, ``pull_equal_budget``): the trainings call
  :func:`exporter_lib.update`; our scraper (``python -m scraper run``, its defaults or
  capped at the budget) writes as ``trainjob-scraper``.

The first ``--real`` TrainJobs of a session (at least 2; by default as many as a quarter
of the available memory holds at :data:`TRAINING_BYTES` each, at most
:data:`MAX_REAL`) run a real training process each; the others run
:data:`benchmarks.vs_push_farm.STUB` and their training in a farm process
(:mod:`benchmarks.vs_push_farm`, up to :data:`FARM_CHUNK` TrainJobs per process).

A session: N TrainJobs created; once each has reported (or ``--setup-timeout``), one
window ``[a, b]`` after ``--warmup`` (+ N/20) s.  Then the finals, in two halves of the
TrainJobs (even and odd indices, each with real and farmed trainings): the **clean**
half ends at ``b`` with nothing down, up to ``--settle`` s for its finals; then the
worker (push: the Trainer, whose status server stops with it; pull: the scraper,
SIGKILL) goes down, the **fault** half ends ``fault/2`` later, the worker comes back
``fault`` after it went down, and up to ``--settle`` s for those finals.

Figures per session (:mod:`benchmarks.vs_push_delivery`, one definition for every
side, judged by a watch on the TrainJobs): of the values reported in ``[a, b -
lookahead]`` (:meth:`Session.lookahead`), those shown, superseded and never shown;
progress and metrics freshness over shown values (censored: ``>=``); percent error;
finals delivered with and without the fault.  Cost (:mod:`benchmarks.vs_push_figures`):
API writes per TrainJob-hour from the audit log by field manager; CPU seconds of
kube-apiserver, etcd, the Trainer and the worker over the window (``/proc``); the
Trainer's reconciles of those TrainJobs (its log's "TrainJob update event" lines: its
TrainJob controller's update predicate logs and admits every update); the training's
blocked time per report call by kind of training.

Scaled down for a small machine (every figure says so).  Everything listens on
loopback; every wait is bounded; every process started is stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
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
from benchmarks.procstat import cpu_seconds_of, cpu_used
from benchmarks.report import loadavg, write_report
from benchmarks.vs_push_delivery import delivery, final_shown, finals
from benchmarks.vs_push_farm import SDK_THROTTLE_SECONDS, STUB
from benchmarks.vs_push_figures import (
    AuditWrites,
    StatusWatch,
    costs,
    read_audit,
    trainjob_hours,
)
from benchmarks.vs_push_report import plot, plot_cliff, session_keys, summarise, table
from benchmarks.vs_push_sides import (
    SIDE_KEYS,
    Budget,
    Case,
    Side,
    cliff_cases,
    equal_budget,
    main_cases,
    make_side,
    pull_defaults,
    trainer_best_binary,
)
from benchmarks.waits import wait_until
from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from localdev.cluster import processes
from localdev.cluster.controlplane import ControlPlaneError
from localdev.cluster.mounts import private_mount_prefix, with_bind_mounts
from localdev.cluster.stack import Cluster, trainer_service_host
from localdev.cluster.trainjobs import trainjob_body

RESULTS = Path(__file__).resolve().parent / "results"
TRAINING = Path(__file__).resolve().with_name("vs_push_training.py")
#: The field manager of each design's status writes (upstream's status server; ours).
FIELD_MANAGER = {"push": "trainer-status", "pull": "trainjob-scraper"}
TRAINER = "trainer-controller-manager"
#: What the Trainer v2.3.0 TrainJob controller logs for each update it admits
#: (``pkg/controller/trainjob_controller.go``: its Update predicate returns true).
TRAINER_UPDATE_LINE = "TrainJob update event"
#: Resident memory of one real training process with the SDK imported (measured ~90
#: MB; with exporter_lib ~40 MB) plus the pod runner's share.
TRAINING_BYTES = 120 << 20
#: Fewest real trainings per session (one per half of the finals).
MIN_REAL = 2
#: Most real trainings per session by default: CPU, not memory, binds on a 2-core machine
#: (importing the SDK costs a training process about 2.8 s of CPU, measured here).
MAX_REAL = 20
#: TrainJobs per farm process.
FARM_CHUNK = 250


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


def lookahead(every: float) -> float:
    """Values reported this close to the window's end, where the clean half ends, are
    not judged (seconds): one SDK throttle or report interval plus 1 s, the longest a
    running training of any side waits for its next send; closer to its end a value
    competes with the final, which the finals judge."""
    return max(SDK_THROTTLE_SECONDS, every) + 1.0


#: The two halves of a session's TrainJobs for the finals.
GROUPS = ("clean", "fault")


def group_of(index: int) -> str:
    """The finals half of TrainJob ``job-<index>``: even clean, odd fault."""
    return GROUPS[index % 2]


@dataclass
class Session:
    """One side at one case: its timings (seconds) and real trainings."""

    side: Side
    case: Case
    real: int
    warmup: float
    fault: float
    settle: float
    setup_timeout: float
    keys: tuple[str, ...] = ()  # the JSON keys this session's figures stand for

    @property
    def design(self) -> str:
        return self.side.design

    @property
    def jobs(self) -> int:
        return self.case.jobs

    @property
    def every(self) -> float:
        return self.case.every

    @property
    def label(self) -> str:
        return self.case.label

    @property
    def namespace(self) -> str:
        return (f"vs-{self.side.slug}-{self.jobs}-{self.every:g}s-"
                f"{self.case.percent_seconds:g}p").replace(".", "-")

    def lookahead(self) -> float:
        """:func:`lookahead` of this session's report interval."""
        return lookahead(self.every)

    def max_seconds(self) -> float:
        """Longest a training may run (its bound if the end file never comes)."""
        return (self.setup_timeout + self.warmup + self.case.window + 2 * self.settle
                + self.fault + 180)


#: A session starts only with at least this much of the run's time budget left for its
#: setup, after :func:`session_seconds` (seconds).
MIN_SETUP_SECONDS = 60.0


def session_seconds(s: Session) -> float:
    """A session's time after its setup, at most: warm-up, window, both settles, the
    fault, teardown (seconds)."""
    return s.warmup + s.case.window + 2 * s.settle + s.fault + 60


def estimate_seconds(s: Session) -> float:
    """A session's expected wall time at most: its setup, fitted to the setups of
    ``benchmarks/reports/vs-push-20261204-153506.json`` on a quiet machine (about 20 s
    at N=20, 60 s at 200, 450-870 s at 1000: the Trainer's one TrainJob worker), and
    :func:`session_seconds` (both settles taken in full)."""
    return 15 + 0.3 * s.jobs + 4e-4 * s.jobs ** 2 + session_seconds(s)


# ------------------------------------------------------------------ processes


def _sleep_until(at: float) -> None:
    time.sleep(max(0.0, at - time.time()))


class _Farms:
    """The farm processes of a session (:mod:`benchmarks.vs_push_farm`), per finals half
    (each half its own end file)."""

    def __init__(self, cluster: Cluster, session: Session, names: dict[str, list[str]],
                 out: Path, end_files: dict[str, Path]) -> None:
        self.procs = []
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
        for group, members in names.items():
            argv = [sys.executable, "-m", "benchmarks.vs_push_farm", "--mode",
                    session.design, "--out", str(out), "--every", f"{session.every:g}",
                    "--percent-seconds", f"{session.case.percent_seconds:g}",
                    "--end-file", str(end_files[group]),
                    "--max-seconds", f"{session.max_seconds():.0f}"]
            for i in range(0, len(members), FARM_CHUNK):
                cmd = [*argv, "--names", ",".join(members[i:i + FARM_CHUNK])]
                if binds:
                    if prefix is None:
                        raise ControlPlaneError("the push farm needs a private mount namespace "
                                                "(unshare) for the Service name's hosts entry")
                    cmd = with_bind_mounts(prefix, binds, cmd)
                self.procs.append(processes.spawn(
                    cmd, cluster.workdir / f"farm-{out.name}-{group}-{i}.log", env=env))

    def cpu(self) -> float | None:
        values = [cpu_seconds_of(p.pid) for p in self.procs]
        return None if not values or None in values else sum(v for v in values if v)

    def stop(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            with contextlib.suppress(Exception):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            processes.stop(proc, 5.0)


#: Per cluster (``id``), the Trainer's (binary, status QPS, burst) now; absent: as started.
_TRAINER_RUNS: dict[int, tuple[Path | None, float | None, float | None]] = {}


class _Worker:
    """The process doing a side's status work: its pid, a kill and a start."""

    def __init__(self, cluster: Cluster, session: Session, best: Path | None) -> None:
        self.cluster, self.session, self.best = cluster, session, best
        self.scraper: _Scraper | None = None

    def configure(self) -> None:
        """The Trainer restarted with the side's binary and status server budget: push
        (b) and (c) their own; push as shipped and every pull side the shipped binary
        at its defaults (pull's writes make the Trainer reconcile too).  Not restarted
        when it already runs so."""
        side = self.session.side
        budgeted = side.design == "push" and side.key != "push_as_shipped"
        want = (self.best if side.patched else None,
                side.budget.qps if budgeted else None, side.budget.burst if budgeted else None)
        if _TRAINER_RUNS.get(id(self.cluster), (None, None, None)) == want:
            return
        self.cluster.restart_trainer(want[0], status_qps=want[1],
                                     status_burst=int(want[2]) if want[2] is not None else None)
        _TRAINER_RUNS[id(self.cluster)] = want

    def start(self) -> None:
        if self.session.design == "push":
            self.cluster.start_trainer_again()  # waits for readyz and the status server
            return
        self.scraper = _Scraper(self.cluster.kubeconfig_path, self.cluster.workdir,
                                self.session.namespace, list(self.session.side.scraper_flags()))
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


def reconciles(log: Path, offset: int, end: int, namespace: str) -> int:
    """Lines of the Trainer's log between byte ``offset`` and ``end`` that admit an
    update of a TrainJob in ``namespace`` (:data:`TRAINER_UPDATE_LINE`)."""
    with contextlib.suppress(OSError), open(log, "rb") as handle:
        handle.seek(offset)
        text = handle.read(max(0, end - offset)).decode(errors="replace")
        return sum(1 for line in text.splitlines()
                   if (TRAINER_UPDATE_LINE in line and f'"{namespace}"' in line)
                   or (TRAINER_UPDATE_LINE in line and f"{namespace}/" in line))
    return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


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


def _write_end(path: Path, at: float) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{at:.3f}")
    tmp.replace(path)


#: Final report calls whose POST may still be applied: answered 200, or abandoned by
#: the SDK's timeout while the status server still holds it.  A final throttled, refused
#: or never sent cannot arrive: the wait for it ends (delivery is still the watch's).
MAY_ARRIVE = ("ok", "timeout")


def _wait_finals(watcher: StatusWatch, records_dir: Path, names: list[str],
                 timeout: float, design: str) -> None:
    """Until the watch shows every final of ``names`` that can still arrive (their
    records written), or ``timeout`` seconds."""
    def done() -> bool:
        recs = _records(records_dir)
        if not all(n in recs for n in names):
            return False
        seen = dict(watcher.seen)
        return all(final_shown(sorted(seen.get(n, [])), recs[n].get("final"))
                   for n in names
                   if design == "pull" or recs[n].get("final_outcome") in MAY_ARRIVE)
    wait_until(done, timeout, 1.0)


def run_session(cluster: Cluster, s: Session, best: Path | None) -> dict[str, Any]:
    """One side at one case on a running cluster; returns its figures."""
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": s.namespace}})
    out = cluster.workdir / "vs-push-out" / s.namespace
    out.mkdir(parents=True, exist_ok=True)
    end_files = {g: out / f"end-{g}" for g in GROUPS}
    res: dict[str, Any] = {
        "side": s.side.key, "keys": list(s.keys), "side_label": s.side.label,
        "design": s.design, "budget": [s.side.budget.qps, s.side.budget.burst],
        "budget_ceiling": s.side.budget.ceiling,
        "jobs": s.jobs, "every": s.every, "percent_seconds": s.case.percent_seconds,
        "label": s.label, "real": s.real, "farmed": s.jobs - s.real,
        "namespace": s.namespace, "loadavg_start": loadavg()}
    audit_offset = cluster.audit_log_path.stat().st_size
    worker = _Worker(cluster, s, best)
    worker.configure()
    watcher = StatusWatch(api, s.namespace)
    farmed: dict[str, list[str]] = {g: [] for g in GROUPS}
    for i in range(s.real, s.jobs):
        farmed[group_of(i)].append(f"job-{i}")
    farms = _Farms(cluster, s, {g: m for g, m in farmed.items() if m}, out, end_files) \
        if s.jobs > s.real else None
    trainer_log = cluster.workdir / f"{TRAINER}.log"
    try:
        t0 = time.time()
        if s.design == "pull":
            worker.start()
        _create_trainjobs(api, s, out, end_files)
        res["create_seconds"] = time.time() - t0
        wait_until(lambda: len(list(out.glob("job-*.up"))) >= s.jobs,
                   s.setup_timeout - (time.time() - t0), 1.0)
        res["reporting_at_first_window"] = len(list(out.glob("job-*.up")))
        res["setup_seconds"] = time.time() - t0
        a = time.time() + s.warmup
        b = a + s.case.window
        _write_end(end_files["clean"], b)
        _sleep_until(a)
        pids = {"worker": worker.pid(), "apiserver": cluster.apiserver_pid,
                "etcd": cluster.etcd_pid, "trainer": cluster.process_pid(TRAINER)}
        c0 = {k: cpu_seconds_of(p) for k, p in pids.items()}
        f0 = farms.cpu() if farms else None
        m0 = worker.scraper_sample()
        log0 = _size(trainer_log)
        _sleep_until(b)
        c1 = {k: cpu_seconds_of(p) for k, p in pids.items()}
        f1 = farms.cpu() if farms else None
        m1 = worker.scraper_sample()
        res["window"] = {
            "start": a, "end": b, "seconds": b - a, "warmup": s.warmup, "loadavg": loadavg(),
            "cpu_seconds": cpu_used(c0, c1),
            "farm_cpu_seconds": None if f0 is None or f1 is None else f1 - f0,
            "trainer_reconciles": reconciles(trainer_log, log0, _size(trainer_log),
                                             s.namespace),
            "scraper": scraper_window(m0, m1)}
        clean = [f"job-{i}" for i in range(s.jobs) if group_of(i) == "clean"]
        fault = [f"job-{i}" for i in range(s.jobs) if group_of(i) == "fault"]
        # The clean half ended at b with nothing down: its finals.
        _wait_finals(watcher, out, clean, s.settle, s.design)
        res["clean_settled_at"] = time.time()
        # The fault: the worker down across the other half's end.
        down = res["fault_started_at"] = time.time()
        if s.fault > 0:
            worker.kill()
        _write_end(end_files["fault"], down + s.fault / 2)
        _sleep_until(down + s.fault)
        if s.fault > 0:
            worker.start()
        res["restarted_at"] = time.time()
        _wait_finals(watcher, out, fault, s.settle, s.design)
        wait_until(lambda: len(list(out.glob("job-*.json"))) >= s.jobs, 60.0)
        observed_until = res["observed_until"] = time.time()
        records = _records(out)
        seen = dict(watcher.seen)
        res["records"] = len(records)
        w = res["window"]
        w["judged_until"] = b - s.lookahead()
        w.update(delivery(records, seen, a, b - s.lookahead(), observed_until,
                          errors_until=b))
        w["cost"] = costs(records.values(), a, b)
        hours = trainjob_hours(records.values(), a, b)
        audit: AuditWrites = read_audit(cluster.audit_log_path, s.namespace, a, b,
                                        audit_offset)
        writes, nbytes = audit.writer(FIELD_MANAGER[s.design])
        w.update({"trainjob_hours": hours, "writes": writes, "request_bytes": nbytes,
                  "audit_writes_by_writer": dict(audit.count),
                  "api_writes_per_s": writes / (b - a),
                  "api_writes_per_trainjob_hour": writes / hours if hours else None,
                  "request_bytes_per_write": nbytes / writes if writes else None})
        res["finals"] = {"no_fault": finals(records, seen, clean, down),
                         "fault": finals(records, seen, fault, observed_until)}
        outcomes: dict[str, int] = {}
        for r in records.values():
            o = str(r.get("final_outcome"))
            outcomes[o] = outcomes.get(o, 0) + 1
        res["final_call_outcomes"] = outcomes  # what the report calls returned: not delivery
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


def _records(out_dir: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for path in out_dir.glob("job-*.json"):
        with contextlib.suppress(OSError, ValueError):
            found[path.stem] = json.loads(path.read_text())
    return found


def _create_trainjobs(api: client.ApiClient, s: Session, out: Path,
                      end_files: dict[str, Path]) -> None:
    def one(i: int) -> None:
        name = f"job-{i}"
        real = i < s.real
        command = ([sys.executable, str(TRAINING)] if real else ["/bin/sh", "-c", STUB])
        env = {"VS_PUSH_MODE": s.design, "VS_PUSH_EVERY": f"{s.every:g}",
               "VS_PUSH_PERCENT_SECONDS": f"{s.case.percent_seconds:g}",
               "VS_PUSH_END_FILE": str(end_files[group_of(i)]), "VS_PUSH_OUT": str(out),
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
        _TRAINER_RUNS.pop(id(cluster), None)
        cluster.stop()


@dataclass
class Plan:
    """What a run measures (the command line, resolved)."""

    name: str
    cases: list[Case]
    budget: Budget
    warmup: float
    fault: float
    settle: float
    setup_timeout: float | None
    real: int | None
    time_budget: float | None = None  # seconds for the whole run; later sessions skipped
    extra: dict[str, Any] = field(default_factory=dict)
    #: (case label, side key) pairs an earlier run measured (``--resume``): not run again.
    done: frozenset[tuple[str, str]] = frozenset()


def sessions(plan: Plan, available: int) -> list[Session]:
    """The sessions of a run, in case order, per case its sides in :data:`SIDE_KEYS`
    order.  ``pull_equal_budget`` at the scraper's default budget is the ``pull``
    session (one session, both keys) when the case has both; never while the defaults
    adapt their rate (:func:`benchmarks.vs_push_sides.pull_defaults`).  A session all
    of whose keys are in ``plan.done`` is left out."""
    out: list[Session] = []
    for case in plan.cases:
        keys = [k for k in SIDE_KEYS if k in case.sides]
        shared = ("pull" in keys and "pull_equal_budget" in keys
                  and plan.budget == pull_defaults())
        for key in keys:
            if shared and key == "pull_equal_budget":
                continue
            side = make_side(key, plan.budget)
            stands_for = (key, "pull_equal_budget") if shared and key == "pull" else (key,)
            if all((case.label, k) in plan.done for k in stands_for):
                continue
            setup = plan.setup_timeout if plan.setup_timeout is not None \
                else 60 + 2.0 * case.jobs
            out.append(Session(side, case, real_count(case.jobs, available, plan.real),
                               plan.warmup + case.jobs / 20, plan.fault, plan.settle,
                               setup, stands_for))
    return out


def estimate(plan: Plan, available: int) -> dict[str, Any]:
    """Expected wall time of ``plan`` (:func:`estimate_seconds` per session, a cluster
    start of 60 s and the patched Trainer's first build of about 10 minutes aside)."""
    todo = sessions(plan, available)
    per = [(s.label, s.side.key, round(estimate_seconds(s))) for s in todo]
    return {"sessions": len(todo), "seconds": 60 + sum(p[2] for p in per), "per_session": per}


def run(plan: Plan) -> dict[str, Any]:
    """Every session of ``plan`` on one cluster; the JSON's content."""
    available = memory_available()
    res: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": f"{os.cpu_count()} cores",
        "memory_available_bytes": available, "loadavg_start": loadavg(), "runs": [],
        "plan": {"name": plan.name, "cases": [c.__dict__ for c in plan.cases],
                 "budget": [plan.budget.qps, plan.budget.burst], "warmup": plan.warmup,
                 "fault": plan.fault, "settle": plan.settle, "real": plan.real},
        "sides": {k: make_side(k, plan.budget).label for k in SIDE_KEYS}, "errors": {}}
    todo = sessions(plan, available)
    deadline = time.monotonic() + (plan.time_budget or float("inf"))
    best: Path | None = None
    if any(s.side.patched for s in todo):
        try:
            best = trainer_best_binary()
            res["trainer_best_binary"] = str(best)
        except Exception as exc:
            res["errors"]["trainer_best"] = f"{type(exc).__name__}: {exc}"[:2000]
            todo = [s for s in todo if not s.side.patched]
    try:
        t_cluster = time.monotonic()
        with _cluster() as cluster:
            res["cluster_start_seconds"] = time.monotonic() - t_cluster
            res["stack_versions"] = cluster.stack_versions
            for k, s in enumerate(todo):
                head = {"side": s.side.key, "keys": list(s.keys), "jobs": s.jobs,
                        "every": s.every, "percent_seconds": s.case.percent_seconds,
                        "label": s.label}
                left = deadline - time.monotonic() - session_seconds(s)
                if left < MIN_SETUP_SECONDS:
                    res["runs"].append({**head, "error": "not run: the run's time budget "
                                        f"({plan.time_budget:g} s) was spent"})
                    continue
                s.setup_timeout = min(s.setup_timeout, left)
                t_session = time.monotonic()
                try:
                    one = run_session(cluster, s, best)
                except Exception as exc:  # the other sessions still count
                    one = {**head, "error": f"{type(exc).__name__}: {exc}"[:1000]}
                res["runs"].append(one)
                print(json.dumps(_brief(one), default=str), flush=True)
                if k < len(todo) - 1:  # the next session's window does not pay for it
                    _wait_namespace_gone(cluster, s.namespace, 60.0)
                one["wall_seconds"] = time.monotonic() - t_session
    except Exception as exc:
        res["errors"]["cluster"] = f"{type(exc).__name__}: {exc}"[:2000]
    summarise(res)
    return res


def _brief(one: dict[str, Any]) -> dict[str, Any]:
    """A session's headline figures for the console."""
    out = {k: one.get(k) for k in ("side", "label", "real", "setup_seconds", "error")}
    w = one.get("window") or {}
    out.update({k: w.get(k) for k in (
        "api_writes_per_s", "progress_freshness_p99_s", "progress_freshness_p99_censored",
        "metrics_freshness_p99_s", "values_reported", "values_shown", "values_superseded",
        "values_never_shown", "trainer_reconciles")})
    out["finals"] = {g: (f.get("delivered"), f.get("expected"))
                     for g, f in (one.get("finals") or {}).items()}
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


def _budget(text: str) -> Budget:
    qps, sep, burst = text.partition("/")
    try:
        budget = Budget(float(qps), int(burst) if sep else max(1, int(float(qps) * 1.5)))
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"--budget={text!r}: must be QPS/BURST, e.g. 20/30 (QPS alone: burst 1.5 QPS)"
        ) from None
    if not 0 < budget.qps <= 1000:
        raise argparse.ArgumentTypeError(
            f"--budget={text!r}: QPS {budget.qps:g} must be in (0, 1000]")
    if not 1 <= budget.burst <= 10000:
        raise argparse.ArgumentTypeError(
            f"--budget={text!r}: burst {budget.burst} must be in [1, 10000]")
    return budget


def plan_of(args: argparse.Namespace) -> Plan:
    """The plan the command line asks for."""
    jobs = sorted(set(args.jobs)) if args.jobs else None
    if args.plan == "quick":
        cases = [Case(4, 1.0, 3.0, args.window or 12.0, SIDE_KEYS)]
        return Plan("quick", cases, args.budget or equal_budget(), 1.0, 2.0, 15.0,
                    args.setup_timeout or 120.0, 2, args.time_budget)
    if args.plan == "cliff":
        cases = cliff_cases(jobs, args.window or 180.0)
        budget = args.budget or Budget(5.0, 10)
    elif args.plan == "main":
        cases = main_cases(jobs)
        budget = args.budget or equal_budget()
        if args.window:
            cases = [Case(c.jobs, c.every, c.percent_seconds, args.window, c.sides)
                     for c in cases]
    else:  # custom: --jobs at --every for --sides
        cases = [Case(n, args.every or 1.0, args.percent_seconds or 15.0,
                      args.window or 600.0, tuple(args.sides or SIDE_KEYS))
                 for n in (jobs or [20])]
        budget = args.budget or equal_budget()
    if args.sides:
        cases = [Case(c.jobs, c.every, c.percent_seconds, c.window,
                      tuple(k for k in c.sides if k in args.sides)) for c in cases]
    return Plan(args.plan, cases, budget, args.warmup, args.fault, args.settle,
                args.setup_timeout, args.real, args.time_budget)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (argparse exits 2 naming the option, value and limit)."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", choices=("main", "cliff", "custom", "quick"), default="main",
                        help="main: the main table; cliff: N=20..200 at 5/s; custom: --jobs "
                        "at --every for --sides; quick: N=4 (2 real), every side, a 12 s "
                        "window, a 2 s fault")
    parser.add_argument("--jobs", nargs="+", type=int, default=None,
                        help="only these N of the plan (each N may run on its own; "
                        f"2..{MAX_JOBS})")
    parser.add_argument("--sides", nargs="+", choices=SIDE_KEYS, default=None,
                        help="only these sides")
    parser.add_argument("--budget", type=_budget, default=None, metavar="QPS/BURST",
                        help="writes/s and burst of push (b), (c) and pull_equal_budget "
                        "(default: the scraper's defaults; the cliff: 5/10)")
    parser.add_argument("--every", type=float, default=None,
                        help="report interval, s (--plan custom only; default 1)" + _range("every"))
    parser.add_argument("--percent-seconds", type=float, default=None,
                        help="seconds per percentage point (--plan custom only; default 15)"
                        + _range("percent_seconds"))
    parser.add_argument("--window", type=float, default=None,
                        help="seconds measured per session (default: the plan's)"
                        + _range("window"))
    parser.add_argument("--warmup", type=float, default=10.0,
                        help="seconds before a window (plus N/20 for the first writes)"
                        + _range("warmup"))
    parser.add_argument("--fault", type=float, default=30.0,
                        help="seconds the worker is down across the fault half's end"
                        + _range("fault"))
    parser.add_argument("--settle", type=float, default=60.0,
                        help="seconds for each half's finals to land" + _range("settle"))
    parser.add_argument("--setup-timeout", type=float, default=None,
                        help="seconds for N trainings to report (default 60 + 2 N)"
                        + _range("setup_timeout"))
    parser.add_argument("--real", type=int, default=None,
                        help=f"real training processes per session (default: by memory, "
                        f"{MIN_REAL}..{MAX_REAL})" + _range("real"))
    parser.add_argument("--time-budget", type=float, default=None,
                        help="seconds for the whole run: a session that would not end in "
                        "time is not started" + _range("time_budget"))
    parser.add_argument("--estimate", action="store_true",
                        help="print the plan's sessions and expected wall time; run nothing")
    parser.add_argument("--quick", action="store_true", help="the same as --plan quick")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--carry", type=Path, default=None, metavar="RUN.json",
                        help="an earlier run of the same plan: its sessions (case and "
                        "side) this run does not measure join this run's report, marked")
    parser.add_argument("--resume", action="store_true",
                        help="with --carry: run only the sessions (case and side) the "
                        "carried run has no figures of, e.g. after its --time-budget")
    args = parser.parse_args(argv)
    if args.resume and args.carry is None:
        parser.error("--resume: needs --carry RUN.json (the run to resume)")
    if args.quick:
        if args.plan not in ("main", "quick"):  # main: the default, not asked for
            parser.error(f"--quick is --plan quick: not with --plan {args.plan}")
        args.plan = "quick"
    problem = _first_problem(args)
    if problem:
        parser.error(problem)
    return args


#: Each numeric option's lower bound, whether the bound itself is allowed, and its upper
#: bound (allowed): a typo such as ``--window 60000`` would otherwise hold the machine
#: for days before anything is reported (the plans' windows are 5 and 10 minutes).
_BOUNDS: dict[str, tuple[float, bool, float]] = {
    "every": (0.0, False, 3600.0), "percent_seconds": (0.0, False, 3600.0),
    "window": (5.0, True, 3600.0), "warmup": (0.0, True, 3600.0),
    "fault": (0.0, True, 3600.0), "settle": (0.0, True, 3600.0),
    "setup_timeout": (0.0, False, 86400.0), "time_budget": (0.0, False, 7 * 86400.0),
    "real": (float(MIN_REAL), True, 10000.0)}

#: A run expected to take longer than this (seconds) needs ``--time-budget``: without
#: one it could hold the machine for days.
MAX_UNBUDGETED_SECONDS = 86400.0

#: The command's name in its usage and its errors.
PROG = "python -m benchmarks.vs_push"

#: The largest N a session takes: the largest any benchmark here has run
#: (``benchmarks/cluster_scale.py``).
MAX_JOBS = 10000


def _range(name: str) -> str:
    """``name``'s accepted range, for its help: ``" (> 0, <= 3600)"``."""
    low, inclusive, high = _BOUNDS[name]
    return f" ({'>=' if inclusive else '>'} {low:g}, <= {high:g})"


def _first_problem(args: argparse.Namespace) -> str | None:
    """The first option of ``args`` out of its range, as one line naming the option, the
    value and the limit; None when all are in range."""
    if args.jobs and min(args.jobs) < 2:
        return f"--jobs={args.jobs}: each N must be >= 2 (one TrainJob per finals half)"
    if args.jobs and max(args.jobs) > MAX_JOBS:
        return f"--jobs={args.jobs}: each N must be <= {MAX_JOBS}"
    if args.jobs and args.plan == "main":
        known = sorted({c.jobs for c in main_cases()})
        if unknown := sorted(set(args.jobs) - set(known)):
            return f"--jobs={unknown}: the main plan's N are {known} (--plan custom for others)"
    if args.plan != "custom":
        for name in ("every", "percent_seconds"):
            if getattr(args, name) is not None:
                return (f"--{name.replace('_', '-')}={getattr(args, name):g}: only with "
                        f"--plan custom (plan {args.plan} sets its own)")
    for name, (low, inclusive, high) in _BOUNDS.items():
        value = getattr(args, name)
        if value is None:
            continue
        flag = f"--{name.replace('_', '-')}={value:g}"
        if not math.isfinite(value):
            return f"{flag}: must be a finite number"
        if value < low or (value == low and not inclusive):
            return f"{flag}: must be {'>=' if inclusive else '>'} {low:g}"
        if value > high:
            return f"{flag}: must be <= {high:g}"
    return None


class UsageError(Exception):
    """An option the run cannot take, found after parsing (a ``--carry`` file that cannot
    be carried, a window no value is judged in, a time budget no session fits, a run
    over a day without one): reported as argparse reports its own, on stderr with exit
    status 2, by :func:`main` alone."""


def load_carry(path: Path, name: str, cases: list[dict[str, Any]],
               budget: list[float] | None = None) -> dict[str, Any]:
    """The earlier run ``path`` (its JSON), checked to be of plan ``name`` with ``cases``
    (dicts of :class:`Case` fields) and, when given, ``budget`` (``[writes/s, burst]``),
    so that a run is not started that could not carry it.

    Raises:
        UsageError: ``path`` cannot be read as a run's JSON, or it is of another plan, or
            its cases or its budget differ.
    """
    def key(of: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(c["jobs"], c["every"], c["percent_seconds"], c["window"]) for c in of]

    try:
        old = json.loads(path.read_text())
        theirs = (old["plan"]["name"], key(old["plan"]["cases"]))
        if not isinstance(old["runs"], list):
            raise TypeError("runs is not a list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--carry={path}: not a readable run of this benchmark "
                         f"({type(exc).__name__}: {exc})") from None
    if theirs != (name, key(cases)):
        raise UsageError(f"--carry={path}: plan {theirs[0]!r} with cases {theirs[1]}; this "
                         f"run: {name!r} with {key(cases)}")
    if budget is not None and old["plan"].get("budget") != list(budget):
        raise UsageError(f"--carry={path}: budget {old['plan'].get('budget')} (writes/s, "
                         f"burst); this run: {list(budget)}")
    # Carry it into an empty run and report that, as after the run: a file whose runs
    # cannot be reported stops here, not after hours of measuring.
    probe: dict[str, Any] = {"started": "-", "commit": "-", "runs": [], "errors": {},
                             "plan": old["plan"], "sides": {}, "machine": "-",
                             "loadavg_start": "-"}
    try:
        carry(probe, path, json.loads(json.dumps(old)))
        table(probe)
    except Exception as exc:  # any shape the report cannot take
        raise UsageError(f"--carry={path}: its runs cannot be reported "
                         f"({type(exc).__name__}: {exc})") from None
    return old  # type: ignore[no-any-return]


def carry(res: dict[str, Any], path: Path, old: dict[str, Any] | None = None) -> None:
    """Add to ``res`` the sessions of the earlier run ``path`` (its JSON) whose side this
    run did not measure, each marked ``carried_from`` with that run's file, start and
    commit, and summarise again.  For rerunning one side of a plan after a fix of that
    side alone: the carried sessions keep their own settings and figures.

    A session that run had itself carried keeps the run it came from; ``res["carried"]
    ["from"]`` names the file each carried side came from.  ``old``: ``path``'s run as
    :func:`load_carry` returned it (None: read here).

    Raises:
        UsageError: as :func:`load_carry`.
    """
    if old is None:
        old = load_carry(path, res["plan"]["name"], res["plan"]["cases"],
                         res["plan"].get("budget"))
    measured = measured_pairs(res["runs"])
    tried = {(r["label"], k) for r in res["runs"] for k in session_keys(r)}
    source = {"file": path.name, "started": old.get("started"),
              "commit": old.get("commit", "not recorded")}
    # Figures beat an error of the same session, whichever run has them; of two errors
    # (a resumed run cut short again), this run's stands.  A shared session keeps only
    # the keys this run did not measure again.
    kept: list[dict[str, Any]] = []
    for r in old["runs"]:
        keys = [k for k in session_keys(r) if (r["label"], k) not in measured]
        if keys and not ("error" in r and any((r["label"], k) in tried for k in keys)):
            kept.append({**r, "keys": keys, "carried_from": r.get("carried_from", source)})
    kept_pairs = measured_pairs(kept)
    fresh = [r for r in res["runs"] if "error" not in r
             or not all((r["label"], k) in kept_pairs for k in session_keys(r))]
    res["runs"] = kept + fresh
    origins: dict[str, set[str]] = {}
    for r in kept:
        origins.setdefault(r["side"], set()).add(r["carried_from"]["file"])
    res["carried"] = {**source, "sides": sorted(origins),
                      "from": {k: ", ".join(sorted(v)) for k, v in origins.items()}}
    this_run = {k for _, k in measured}
    res["sides"] = {**old.get("sides", {}), **{k: v for k, v in res["sides"].items()
                                                if k in this_run}}
    summarise(res)


def measured_pairs(runs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """The (case label, side key) pairs that ``runs`` (a run's JSON ``runs``) have
    figures of: every key of each session that ran without an error."""
    return {(r["label"], k) for r in runs if "error" not in r for k in session_keys(r)}


def _no_session_fits(plan: Plan) -> str | None:
    """One line naming ``--time-budget``, its value and the limit when :func:`run` would
    start no session (each needs :data:`MIN_SETUP_SECONDS` left after
    :func:`session_seconds`), yet would start the cluster; None otherwise."""
    if plan.time_budget is None:
        return None
    todo = sessions(plan, memory_available())
    if not todo:
        return None
    shortest = min(session_seconds(s) for s in todo)
    if plan.time_budget - shortest >= MIN_SETUP_SECONDS:
        return None
    return (f"--time-budget={plan.time_budget:g}: shorter than the shortest session asked "
            f"for ({shortest:g} s after its setup) plus {MIN_SETUP_SECONDS:g} s: no "
            "session would run")


def _checked(args: argparse.Namespace, plan: Plan) -> dict[str, Any] | None:
    """The ``--carry`` run (None without one), read once the plan's windows are checked,
    before anything starts.

    Raises:
        UsageError: a window no value is judged in, or a ``--carry`` file
            :func:`load_carry` refuses.
    """
    for case in plan.cases:
        if case.window <= lookahead(case.every):
            raise UsageError(f"--window={case.window:g}: must be longer than the lookahead "
                             f"of {case.label} ({lookahead(case.every):g} s): nothing "
                             "would be judged")
    # Read before the run: a file it could not carry would lose the run.
    earlier = (load_carry(args.carry, plan.name, [c.__dict__ for c in plan.cases],
                          [plan.budget.qps, plan.budget.burst])
               if args.carry else None)
    return earlier


def _no_session(args: argparse.Namespace, plan: Plan) -> str:
    """Why a plan has no session: the options that left none, with their values."""
    given = [f"--plan={plan.name}"]
    if args.sides:
        given.append(f"--sides={','.join(args.sides)}")
    if args.jobs:
        given.append(f"--jobs={','.join(str(n) for n in args.jobs)}")
    return (f"{' '.join(given)}: no session to run (the plan's cases are "
            f"{', '.join(c.label for c in plan.cases) or 'none'}; none of them has these "
            "sides)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = plan_of(args)
    try:
        earlier = _checked(args, plan)
        if args.resume and earlier is not None:
            plan.done = frozenset(measured_pairs(earlier["runs"]))
        if not sessions(plan, memory_available()):
            if args.resume:
                print(f"--resume: {args.carry} has figures of every session asked for; "
                      "nothing to run")
                return 0
            raise UsageError(_no_session(args, plan))
        if problem := _no_session_fits(plan):
            raise UsageError(problem)
        expected = estimate(plan, memory_available())
        if args.estimate:
            print(json.dumps(expected, indent=1))
            return 0
        if plan.time_budget is None and expected["seconds"] > MAX_UNBUDGETED_SECONDS:
            raise UsageError(f"the plan is expected to take {expected['seconds']:g} s, over "
                             f"{MAX_UNBUDGETED_SECONDS:g} s: give --time-budget to run it")
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    res = run(plan)
    if args.carry:
        carry(res, args.carry, earlier)
    stem = write_report(res, args.out, f"vs-push-{plan.name}", table, started)
    plot(res, stem)
    if plan.name == "cliff":
        plot_cliff(res, stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["AuditWrites", "main", "read_audit", "run", "sessions", "summarise", "table"]
