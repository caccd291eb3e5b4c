"""Cluster scale on the real API server: many TrainJobs under the default write budget.

``python -m benchmarks.cluster_scale [--jobs N] [--interval S]`` starts the local
control plane (etcd + kube-apiserver, :class:`localdev.cluster.ControlPlane`), the
scraper as deployed (``python -m scraper run``, default budget: QPS 20, burst 30) and
prints one line per figure, then writes ``benchmarks/results/cluster-<time>.{md,json}``:

a. **N TrainJobs appearing at once**: N TrainJobs and their rank-0 pods (API objects,
   written Running like a kubelet would, owned by a Job owned by a JobSet owned by the
   TrainJob, as the identity checks require) are created as fast as 3 processes of 8
   client threads each can, and then the scraper starts (as after a restart or a leader
   change: all N appear to it at once); each pod's exporter answers a fixed status.
   First status = the first watch event carrying that TrainJob's status, minus the
   time the scraper process was started.  Target: p99 <= N / QPS + one interval.
   Skipped scheduler runs (``trainjob_scraper_skipped_runs_total``) from the start to
   one interval after the last first status: target 0.
b. **steady state, every TrainJob changing every interval** (progress and a
   ``stamp`` metric, each TrainJob at its own phase): the longest gap between two
   writes of one TrainJob seen by the watch over the window.  Target:
   <= max(interval, N / QPS) + 1 s.  The window opens :data:`SETTLE_PERIODS` change
   periods after the exporters start changing (that switch answers every held scrape
   at once); progress freshness is also reported from the switch, and per
   :data:`FRESH_BUCKET_SECONDS` of change time.
c. **a training that logs every 10 s**: real exporter_lib exporters
   (:class:`benchmarks.farm.ExporterFarm`) updated every 10 s, scraped at the
   scraper's default interval (30 s, waiting scrapes on): API writes per TrainJob-hour
   and freshness (update -> TrainJob status seen by the watch).  The upstream push
   design is **modelled by counting**: the Kubeflow SDK's ``update_trainjob_status``
   drops a call made less than ``_MIN_UPDATE_INTERVAL_SECONDS`` (5 s, read from the
   installed SDK) after the last POST, and each POST is one status write, so a log
   every 10 s is one write every 10 s; its freshness is one POST (not run here).
d. **sparse changes**: the same exporters changing once per 30 s, scraped at a 15 s
   interval (pod annotation): update() -> TrainJob status p50/p99.  A change finds the
   target's waiting scrape held (its last answer is an interval or more old), so the
   exporter answers at once.  Target: p99 <= 1 s (polling: up to one interval).

The exporters are one aiohttp server on N loopback ports in a child process (this
module run with ``--serve``); everything listens on 127.0.0.1 only, every wait is
bounded and every process started is stopped in ``finally``.  With 2 cores shared by
the API server, etcd, the scraper, the exporters and the watch, figures are noisy: the
load average is printed with them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from benchmarks.cp import _make_jobs, _metric_sum, _Scraper, _Watcher, percentile
from benchmarks.farm import ExporterFarm, free_ports, wait_http
from benchmarks.procstat import cpu_seconds_of, cpu_used
from benchmarks.report import fmt, loadavg, verdict, write_report
from benchmarks.waits import wait_until
from localdev.cluster import ControlPlane, install_trainjob_crds
from scraper.shared.outcome import WriteOutcome

RESULTS = Path(__file__).resolve().parent / "results"
#: The scraper's defaults this benchmark is about (scraper/config.py).
DEFAULT_QPS = 20.0
DEFAULT_INTERVAL = 30.0
SCALE_NS = "bench-scale"
LOG_NS = "bench-log"
#: Seconds between two logs of the training in scenario c.
LOG_EVERY = 10.0
SPARSE_NS = "bench-sparse"
#: Scenario d: one change per 30 s at a 15 s interval (issue 14's sparse row).
SPARSE_EVERY = 30.0
SPARSE_INTERVAL = 15.0
#: ``--write-qps-max`` of each ``--write-rate``: the scraper's default ceiling, or the
#: floor (a fixed rate, the budget before the adaptive rate).
WRITE_QPS_MAX = {"adaptive": 200.0, "fixed": DEFAULT_QPS}


def write_budget(write_rate: str) -> tuple[float, float]:
    """``(--write-qps, --write-qps-max)`` of a ``--write-rate`` value: ``adaptive`` and
    ``fixed`` (:data:`WRITE_QPS_MAX`), or ``fixed-Q``, a fixed Q writes/s.

    Raises:
        ValueError: another value, or Q not a finite number above 0.
    """
    if write_rate in WRITE_QPS_MAX:
        return DEFAULT_QPS, WRITE_QPS_MAX[write_rate]
    prefix, _, qps = write_rate.partition("-")
    # Digits and one point only: the value names a namespace (a "." becomes "p").
    value = float(qps) if re.fullmatch(r"[0-9]+(\.[0-9]+)?", qps) else math.nan
    if prefix != "fixed" or not 0 < value < math.inf:
        raise ValueError(f"--write-rate={write_rate!r}: adaptive, fixed or fixed-Q with Q "
                         f"writes/s above 0")
    return value, value


def rate_label(write_rate: str) -> str:
    """``write_rate`` as a part of an object name: ``fixed-42.5`` -> ``fixed-42p5``."""
    return write_rate.replace(".", "p")


def _write_rate(text: str) -> str:
    try:
        write_budget(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
#: Nominal concurrency shares of the level the scraper and the pressure client share
#: (kube-apiserver's workload-low has 100).
PRESSURE_SHARES = 10
#: Progress-freshness p99 target of b (seconds; the adaptive rate's target at N=1000
#: with a change per 15 s, the API server otherwise idle).
FRESH_TARGET = 5.0
#: Change periods b waits after the exporters start changing before its window opens:
#: the switch answers every held scrape at once (N writes no training makes), and at
#: N=1000 the adaptive rate drains that burst in about two periods (the writes/s
#: picture of cluster-scale-20261207-0222).  Freshness from the switch is reported too.
SETTLE_PERIODS = 2
#: Upper bounds of the scraper's write-latency buckets read in b (its histogram's).
LATENCY_BUCKETS = ("0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5")
#: Width of the change-time buckets of b's freshness series (seconds).
FRESH_BUCKET_SECONDS = 10.0
#: Processes creating the TrainJobs of scenario a (8 client threads each).
CREATE_WORKERS = 3


# ------------------------------------------------------------------ exporter child


#: The exporter child's longest wait (``Trainjob-Exporter-Contract: 2;max-wait=N``).
MAX_WAIT = 60
#: Ports per exporter child at most: a child holds a listening socket per port and one
#: or two accepted connections per port, within a 20,000-descriptor limit.
PORTS_PER_CHILD = 4000


def serve(ports: list[int], mode_file: Path, duration: float) -> None:
    """Answer on every port: a fixed status while ``mode_file`` reads "static", one that
    changes every ``P`` s (at a per-port phase) once it reads "changing P".  Offers
    waiting scrapes as exporter_lib does (contract 2): a ``Prefer: wait=N`` request whose
    ``If-None-Match`` names the current status is held until the status changes (or the
    mode file does) or ``min(N, MAX_WAIT)`` s pass.  Exits after ``duration`` seconds
    or on SIGTERM."""
    from aiohttp import web

    state: dict[str, Any] = {"period": 0.0, "changed": asyncio.Event()}
    contract = {"Trainjob-Exporter-Contract": f"2;max-wait={MAX_WAIT}"}

    def read_mode() -> float:
        words = mode_file.read_text().split()
        return float(words[1]) if words[0] == "changing" else 0.0

    async def watch_mode() -> None:
        while True:
            with contextlib.suppress(OSError, ValueError, IndexError):
                period = read_mode()
                if period != state["period"]:
                    state["period"] = period
                    changed, state["changed"] = state["changed"], asyncio.Event()
                    changed.set()  # held requests answer under the new mode
            await asyncio.sleep(0.5)

    from benchmarks.write_pressure import phase

    def stamp(port: int) -> int:
        period = state["period"]
        if not period:
            return 0
        return int((time.time() + phase(port, period)) // period)

    def next_change(port: int) -> float:
        """Seconds until ``stamp(port)`` changes (inf while static)."""
        period = state["period"]
        if not period:
            return math.inf
        at = (stamp(port) + 1) * period - phase(port, period)
        return max(0.0, at - time.time())

    async def handle(request: web.Request) -> web.Response:
        sock = request.transport.get_extra_info("sockname") if request.transport else None
        port = int(sock[1]) if sock else 0
        n = stamp(port)
        etag = f'"{n}"'
        wait = request.headers.get("Prefer", "")
        if wait.startswith("wait=") and request.headers.get("If-None-Match") == etag:
            limit = min(float(wait[5:] or 0), MAX_WAIT)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(limit, next_change(port) + 0.01)):
                    await state["changed"].wait()
            n = stamp(port)
            etag = f'"{n}"'
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers={"ETag": etag, **contract})
        body = {"progressPercentage": n % 100,
                "lastUpdatedTime": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                "metrics": [{"name": "stamp", "value": str(n)}]}
        return web.Response(text=json.dumps(body), content_type="application/json",
                            headers={"ETag": etag, **contract})

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for port in ports:
            await web.TCPSite(runner, "127.0.0.1", port, backlog=128).start()
        watcher = asyncio.create_task(watch_mode())
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), duration)
        watcher.cancel()
        await runner.cleanup()

    asyncio.run(main())


def listen_ports(count: int, first: int = 10000) -> list[int]:
    """``count`` free loopback ports below the kernel's ephemeral range (from ``first``).

    :func:`benchmarks.farm.free_ports` takes ephemeral ports; at 10,000 of them the
    outgoing connections of every process on the machine take some between their release
    and the exporters' bind ("address already in use").  Below the range only another
    listener can.
    """
    import socket

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            low = int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    if low - first < count:
        return free_ports(count)
    ports: list[int] = []
    for port in range(first, low):
        if len(ports) == count:
            break
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports if len(ports) == count else free_ports(count)


class _Exporters:
    """The exporter children (``--serve``, :data:`PORTS_PER_CHILD` ports each at most) on
    ``count`` free loopback ports."""

    def __init__(self, count: int, workdir: Path, duration: float) -> None:
        self.ports = listen_ports(count)
        self.mode = workdir / "exporter-mode"
        self.mode.write_text("static")
        self.procs: list[subprocess.Popen[bytes]] = []
        children = -(-count // PORTS_PER_CHILD)
        for i in range(children):
            ports = workdir / f"exporter-ports-{i}.json"
            ports.write_text(json.dumps(self.ports[i::children]))
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "benchmarks.cluster_scale", "--serve", str(ports),
                 "--mode-file", str(self.mode), "--duration", str(duration)],
                stdout=subprocess.DEVNULL,
                stderr=open(workdir / f"exporters-{i}.log", "w")))  # noqa: SIM115
        for port in self.ports[-children:]:
            wait_http(f"http://127.0.0.1:{port}/metrics", 60)

    def changing(self, period: float) -> None:
        self.mode.write_text(f"changing {period}")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


# ------------------------------------------------------------------ helpers


class _Sampler:
    """Samples a process's RSS and open descriptors every ``step`` s in a thread: the
    peak of each and the last sample (``/proc/<pid>/status`` VmRSS, ``/proc/<pid>/fd``)."""

    def __init__(self, pid: int, step: float = 2.0) -> None:
        import threading

        self.pid, self.step = pid, step
        self.peak_rss = self.peak_fds = self.rss = self.fds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> tuple[int, int]:
        from benchmarks.procstat import rss_bytes

        with contextlib.suppress(OSError):
            self.rss, self.fds = rss_bytes(self.pid), len(os.listdir(f"/proc/{self.pid}/fd"))
            self.peak_rss = max(self.peak_rss, self.rss)
            self.peak_fds = max(self.peak_fds, self.fds)
        return self.rss, self.fds

    def _run(self) -> None:
        while not self._stop.wait(self.step):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


# ------------------------------------------------------------------ scenarios


def scale(plane: ControlPlane, api: client.ApiClient, jobs: int, interval: float,
          window: float, *, write_rate: str = "adaptive", namespace: str = SCALE_NS,
          change_every: float | None = None, pressure_qps: float = 0.0,
          pressure_window: float = 30.0, picture: Path | None = None) -> dict[str, Any]:
    """Scenarios a and b (module doc) with one scraper and one exporter child.

    ``write_rate``: ``adaptive`` (the scraper's defaults: ``--write-qps`` 20 rising up to
    ``--write-qps-max`` 200), ``fixed`` (``--write-qps-max`` 20: the fixed budget) or
    ``fixed-Q`` (Q writes/s, :func:`write_budget`); the targets count from the start rate.
    The scraper runs as a ServiceAccount (:func:`benchmarks.write_pressure.bench_account`).
    ``change_every``: seconds between two changes of each exporter in b (default: the
    interval).  ``pressure_qps`` > 0: a :class:`~benchmarks.write_pressure.PressureClient`
    in the scraper's priority level (:func:`~benchmarks.write_pressure.shared_level`)
    runs ``pressure_window`` s alone before the scraper starts, and through b.
    """
    from benchmarks import write_pressure as wp

    qps, qps_max = write_budget(write_rate)
    out: dict[str, Any] = {"jobs": jobs, "interval": interval, "qps": qps,
                           "write_rate": write_rate, "write_qps_max": qps_max}
    period = change_every or interval
    budget = jobs / qps
    exporters = _Exporters(jobs, plane.workdir, duration=3 * budget + window + 900)
    watcher = _Watcher(api, namespace)
    scraper: _Scraper | None = None
    sampler: _Sampler | None = None
    pressure: wp.PressureClient | None = None
    account = f"scraper-{rate_label(write_rate)}"
    try:
        kubeconfig = wp.bench_account(plane, api, namespace, account)
        if pressure_qps > 0:
            pressure_config = wp.bench_account(plane, api, namespace, "pressure")
            wp.shared_level(api, f"bench-{namespace}", {
                f"bench-{namespace}-scraper": (namespace, account),
                f"bench-{namespace}-pressure": (namespace, "pressure")}, shares=PRESSURE_SHARES)
            pressure = wp.PressureClient(pressure_config, namespace, pressure_qps)
        t0 = time.time()
        ran = _make_jobs(api, namespace, exporters.ports, kubeconfig=plane.kubeconfig_path,
                         workers=CREATE_WORKERS)
        out["create_seconds"] = time.time() - t0
        if pressure is not None:
            pressure.start()
            p0 = time.time()
            time.sleep(pressure_window)
            out["pressure_alone"] = pressure.summary(p0 + 2, time.time())
        # All N appear to the scraper at once: it starts (as after a restart or a
        # leader change) when every pod already runs.
        started = time.time()
        scraper = _Scraper(kubeconfig, plane.workdir, namespace,
                           ["--interval", f"{interval:g}s",
                            "--write-qps", f"{qps:g}", "--write-qps-max", f"{qps_max:g}"])
        sampler = _Sampler(scraper.child.process.pid)
        scraper.wait_ready()
        serving = time.time()
        skipped0 = 0.0  # a new process: its counter starts at 0

        def firsts() -> dict[str, float]:
            seen: dict[str, float] = {}
            for job, _, at in list(watcher.seen):
                seen.setdefault(job, at)
            return seen

        wait_until(lambda: len(firsts()) >= jobs, 3 * budget + 60 + interval, 1.0)
        first = firsts()
        lat = [first[j] - started for j in ran if j in first]
        time.sleep(interval)
        out["a"] = {
            "first_status": len(lat),
            "first_p50": percentile(lat, 0.5), "first_p99": percentile(lat, 0.99),
            "first_max": max(lat) if lat else None,
            # The process's own start (imports, informer lists) is in every figure above;
            # from the first status written, the rest is the write budget's.
            "first_min": min(lat) if lat else None, "serving_after": serving - started,
            "target_p99": budget + interval,
            "skipped_runs": scraper.metric("trainjob_scraper_skipped_runs_total") - skipped0,
            "loadavg": loadavg(),
            "rss": sampler.sample()[0], "fds": sampler.fds, "peak_rss": sampler.peak_rss,
            "peak_fds": sampler.peak_fds,
            "held": scraper.metric("trainjob_scraper_held_scrapes"),
        }
        # b: every TrainJob changes every period.
        exporters.changing(period)
        switched = time.time()
        time.sleep(max(interval + 2, SETTLE_PERIODS * period))
        apf0 = wp.flowcontrol_counts(plane) if pressure is not None else None
        # One /metrics read at each end of the window (each read renders every
        # TrainJob's series; the row reports its size).
        w0, text0, a = len(watcher.seen), scraper.metrics(), time.time()
        cpu0 = cpu_seconds_of(scraper.child.process.pid)
        plane_cpu0 = _plane_cpu(plane)
        time.sleep(window)
        b = time.time()
        cpu1 = cpu_seconds_of(scraper.child.process.pid)
        plane_cpu1 = _plane_cpu(plane)
        if pressure is not None and apf0 is not None:
            out["pressure_with_scraper"] = pressure.summary(a, b)
            out["scraper_apf"] = wp.rejected_share(apf0, wp.flowcontrol_counts(plane),
                                                   f"bench-{namespace}-scraper")
        text1 = scraper.metrics()

        def delta(name: str, label: str | None = None) -> float:
            return _metric_sum(text1, name, label) - _metric_sum(text0, name, label)

        scrapes = delta("trainjob_scraper_scrapes_total")
        skipped = delta("trainjob_scraper_skipped_runs_total")
        outcomes = {o.value: delta("trainjob_scraper_status_writes_total", f'result="{o.value}"')
                    for o in WriteOutcome}
        written = outcomes[WriteOutcome.WRITTEN.value]
        req_s = delta("trainjob_scraper_status_write_duration_seconds_sum")
        req_n = delta("trainjob_scraper_status_write_duration_seconds_count")
        pending = _metric_sum(text1, "trainjob_scraper_status_writes_pending")
        # The scraper's own view of the API server: its write latencies' buckets over b.
        latency = {le: delta("trainjob_scraper_status_write_duration_seconds_bucket",
                             f'le="{le}"') for le in LATENCY_BUCKETS}
        per_job: dict[str, list[float]] = {}
        for job, _, at in watcher.seen[w0:]:
            if a <= at <= b:
                per_job.setdefault(job, []).append(at)
        gaps = []
        for name in ran:
            times = [a, *sorted(per_job.get(name, [])), b]  # no write at all: the window
            gaps.append(max(y - x for x, y in itertools.pairwise(times)))
        out["b"] = {
            "window": b - a, "writes": written, "writes_per_s": written / (b - a),
            "jobs_written": len(per_job), "longest_gap": max(gaps) if gaps else None,
            "gap_p50": percentile(gaps, 0.5),
            "target_gap": max(period, budget) + 1.0, "skipped_runs": skipped,
            # Mean request time: with W writers, W / mean caps the rate below the budget.
            "request_mean": req_s / req_n if req_n else None, "pending_end": pending,
            # Every request spends a token: requests/s below the budget means the writers
            # waited elsewhere; outcomes other than "written" are tokens not spent on news.
            "requests_per_s": req_n / (b - a), "outcomes": outcomes,
            "request_over_25ms_share": 1 - latency["0.025"] / req_n if req_n else None,
            "request_p99_bucket": next((le for le, n in latency.items()
                                        if req_n and n >= 0.99 * req_n), None),
            "metrics_bytes": len(text1.encode()),
            "loadavg": loadavg(),
            "cpu_per_s": (cpu1 - cpu0) / (b - a) if cpu0 is not None and cpu1 is not None
            else None,
            "scrapes_per_s": scrapes / (b - a),
            # The API server's side of the writes: CPU-seconds over the window of
            # kube-apiserver and etcd, and per status written (ms).
            **_plane_cost(plane_cpu0, plane_cpu1, written),
            "rss": sampler.sample()[0], "fds": sampler.fds, "peak_rss": sampler.peak_rss,
            "peak_fds": sampler.peak_fds,
            "held": scraper.metric("trainjob_scraper_held_scrapes"),
        }
        port_of = {f"job-{i}": port for i, port in enumerate(exporters.ports)}
        errors = wp.percent_errors([s for s in watcher.seen if a - 60 <= s[2] <= b],
                                   port_of, period, a, b)
        out["b"]["change_every"] = period
        first_shown = wp.first_showings(watcher.seen)
        ages, made = wp.freshness_of(first_shown, port_of, period, a, b)
        out["b"]["progress_freshness_p50"] = percentile(ages, 0.5)
        out["b"]["progress_freshness_p99"] = percentile(ages, 0.99)
        out["b"]["changes_shown"], out["b"]["changes_made"] = len(ages), made
        # The same from the switch (its burst included), and by change time.
        out["b"]["settle"] = a - switched
        since, made_since = wp.freshness_of(first_shown, port_of, period, switched, b)
        out["b"]["progress_freshness_p99_from_switch"] = percentile(since, 0.99)
        out["b"]["changes_shown_from_switch"] = len(since)
        out["b"]["changes_made_from_switch"] = made_since
        out["b"]["freshness_p99_by_bucket"] = [
            percentile(wp.freshness_of(first_shown, port_of, period, t,
                                       t + FRESH_BUCKET_SECONDS)[0], 0.99)
            for t in itertools.takewhile(lambda t: t + FRESH_BUCKET_SECONDS <= b,
                                         itertools.count(switched, FRESH_BUCKET_SECONDS))]
        out["b"]["percent_error_p50"] = percentile(errors, 0.5)
        out["b"]["percent_error_p99"] = percentile(errors, 0.99)
        out["b"]["rate_changes"] = {r: delta("trainjob_scraper_status_write_rate_changes_total",
                                             f'reason="{r}"')
                                    for r in ("writes_fast", "throttled", "apf_rejected",
                                              "timeout", "latency")}
        out["b"]["write_rate_end"] = _metric_sum(
            text1, "trainjob_scraper_status_write_rate_limit_per_second")
        out["writes_per_s"] = wp.writes_per_second(watcher.seen, started, b)
        if picture is not None:
            out["picture"] = str(wp.plot_writes(
                {f"{write_rate}, N={jobs}": out["writes_per_s"]}, picture,
                f"status writes/s from the scraper's start ({write_rate} rate)"))
        out["scraper_cpu_seconds"] = cpu_seconds_of(scraper.child.process.pid)
        out["first_seen_missing"] = sorted(set(ran) - set(first))[:20]
    finally:
        if pressure is not None:
            pressure.stop()
        if sampler is not None:
            sampler.stop()
        watcher.stop()
        if scraper is not None:
            scraper.stop()
        exporters.stop()
    return out


def _nonzero(counts: dict[str, float] | None) -> str:
    """``"written 9700, retried 12"``: the counts above zero, or ``"-"``."""
    shown = [f"{k} {v:.0f}" for k, v in (counts or {}).items() if v > 0]
    return ", ".join(shown) or "-"


def _over_25ms(b: dict[str, Any]) -> str:
    """``" (12.0 % over 25 ms, p99 <= 0.05 s)"``, or ``""`` in a report without them."""
    if b.get("request_over_25ms_share") is None:
        return ""
    return (f" ({100 * b['request_over_25ms_share']:.1f} % over 25 ms, p99 <= "
            f"{b.get('request_p99_bucket') or '>2.5'} s)")


def _plane_cpu(plane: ControlPlane) -> dict[str, float | None]:
    """CPU-seconds so far of kube-apiserver and etcd (None: not readable)."""
    return {"apiserver": cpu_seconds_of(plane.apiserver_pid),
            "etcd": cpu_seconds_of(plane.etcd_pid)}


def _plane_cost(before: dict[str, float | None], after: dict[str, float | None],
                written: float) -> dict[str, float | None]:
    """``apiserver_cpu_s``, ``etcd_cpu_s`` over a window and each per status written
    (``apiserver_cpu_ms_per_write``, ``etcd_cpu_ms_per_write``); None where unknown."""
    out: dict[str, float | None] = {}
    for k, used in cpu_used(before, after).items():
        out[f"{k}_cpu_s"] = used
        out[f"{k}_cpu_ms_per_write"] = (None if used is None or not written
                                         else 1000.0 * used / written)
    return out


def logging_training(plane: ControlPlane, api: client.ApiClient, jobs: int,
                     window: float, *, log_every: float = LOG_EVERY,
                     interval: float = DEFAULT_INTERVAL, namespace: str = LOG_NS,
                     ) -> dict[str, Any]:
    """Scenario c, and d with ``log_every=SPARSE_EVERY, interval=SPARSE_INTERVAL``
    (module doc).  ``interval`` other than the default goes in the pods' annotation."""
    from kubeflow.trainer.backends.kubernetes import utils as sdk_utils

    sdk_gap = float(sdk_utils._MIN_UPDATE_INTERVAL_SECONDS)
    # Push: one POST per log unless within sdk_gap of the last POST (then dropped).
    posts, last = 0, -math.inf
    for k in range(int(3600 / log_every)):
        at = k * log_every
        if at - last >= sdk_gap:
            posts, last = posts + 1, at
    out: dict[str, Any] = {"jobs": jobs, "log_every": log_every, "interval": interval,
                           "push_writes_per_hour": posts, "push_min_gap": sdk_gap}
    farm = ExporterFarm(jobs, period=log_every, jitter=True,
                        duration=window + interval + 240)
    scraper = _Scraper(plane.kubeconfig_path, plane.workdir, namespace, [])  # all defaults
    annotations = (None if interval == DEFAULT_INTERVAL
                   else {"trainjob-progress.dev/interval": f"{interval:g}s"})
    watcher: _Watcher | None = None
    try:
        farm.__enter__()
        scraper.wait_ready()
        watcher = _Watcher(api, namespace)
        _make_jobs(api, namespace, farm.ports, annotations)
        wait_until(lambda: len({j for j, _, _ in list(watcher.seen)}) >= jobs,
              interval + log_every + 60, 1.0)
        time.sleep(log_every)
        a = time.time()
        time.sleep(window)
        b = time.time()
        settle = interval + 5  # an update of the window's end lands within this
        time.sleep(settle)
        farm.stop()  # the farm's update times are read once it stopped
        watcher.stop()
        stamps = farm.stamps()
        port_job = {p: f"job-{i}" for i, p in enumerate(farm.ports)}
        seen_by_job: dict[str, list[tuple[float, float]]] = {}
        writes = 0
        for job, stamp, seen in list(watcher.seen):
            seen_by_job.setdefault(job, []).append((seen, stamp))
            writes += a <= seen <= b
        # Freshness of an update: until the TrainJob shows it or a newer one (an update
        # overtaken by the next before it was scraped counts until that one shows).
        fresh, changes = [], 0
        for port, ss in stamps.items():
            seen_list = sorted(seen_by_job.get(port_job[port], []))
            for s in ss:
                if not a <= s <= b - log_every:
                    continue
                changes += 1
                at = next((t for t, stamp in seen_list if stamp >= s - 1e-3), None)
                if at is not None:
                    fresh.append(at - s)
        out.update({
            "window": b - a, "writes": writes,
            "writes_per_hour": writes / jobs / (b - a) * 3600,
            "changes": changes, "changes_seen": len(fresh),
            "fresh_p50": percentile(fresh, 0.5), "fresh_p99": percentile(fresh, 0.99),
            "loadavg": loadavg(),
        })
    finally:
        if watcher is not None:
            watcher.stop()
        scraper.stop()
        farm.__exit__(None, None, None)
    return out


# ------------------------------------------------------------------ report


def table(res: dict[str, Any]) -> str:
    s = res.get("scale") or {}
    a, b, c, w = s.get("a") or {}, s.get("b") or {}, res.get("log") or {}, res.get("writes")
    d = res.get("sparse") or {}
    n, q, iv = s.get("jobs"), s.get("qps"), s.get("interval")
    lines = [
        f"{res['machine']}; load average at start {res['loadavg_start']}, end "
        f"{res.get('loadavg_end')}.", "",
        "| figure | ours | target | verdict | load |", "| --- | --- | --- | --- | --- |",
    ]
    if a:
        lines += [
            f"| {n} TrainJobs at once (QPS {q:g}, interval {iv:g} s): first status p50 / p99 "
            f"/ max from the scraper's start | {fmt(a['first_p50'], '.1f')} / "
            f"{fmt(a['first_p99'], '.1f')} / "
            f"{fmt(a['first_max'], '.1f')} s ({a['first_status']} of {n}; first at "
            f"{fmt(a.get('first_min'), '.1f')} s) | p99 <= {a['target_p99']:g} s | "
            f"{verdict(None if a['first_p99'] is None else a['first_p99'] <= a['target_p99'])}"
            f" | {a['loadavg']} |",
            f"| same: skipped scheduler runs until every first status | "
            f"{a['skipped_runs']:.0f} | 0 | {verdict(a['skipped_runs'] == 0)} | {a['loadavg']} |"]
        if "rss" in a:
            lines += [
                f"| same, at the last first status: scraper RSS / open descriptors (peak so "
                f"far) / waiting scrapes held | {a['rss'] / 2**20:.0f} MiB / {a['fds']} "
                f"({a['peak_rss'] / 2**20:.0f} MiB / {a['peak_fds']}) / {fmt(a['held'], '.0f')}"
                f" | | | {a['loadavg']} |"]
    if b:
        lines += [
            f"| steady, {n} TrainJobs changing every {b.get('change_every', iv):g} s: longest "
            f"gap between two writes of one TrainJob (p50 of per-job longest) | "
            f"{fmt(b['longest_gap'], '.1f')} s "
            f"({fmt(b['gap_p50'], '.1f')} s; {b['writes_per_s']:.1f} writes/s over "
            f"{b['window']:.0f} s, {fmt(b.get('requests_per_s'), '.1f')} requests/s, "
            f"outcomes {_nonzero(b.get('outcomes'))}, "
            f"request mean {fmt(b.get('request_mean'), '.3f')} s"
            f"{_over_25ms(b)}, "
            f"/metrics {fmt((b.get('metrics_bytes') or 0) / 2**20, '.1f')} MiB, "
            f"{fmt(b.get('pending_end'), '.1f')} pending at the end) | <= {b['target_gap']:g} s | "
            f"{verdict(None if b['longest_gap'] is None else b['longest_gap'] <= b['target_gap'])}"
            f" | {b['loadavg']} |",
            f"| same: skipped scheduler runs in the window | {b['skipped_runs']:.0f} | 0 | "
            f"{verdict(b['skipped_runs'] == 0)} | {b['loadavg']} |"]
        if "rss" in b:
            lines += [
                f"| same, steady window: scraper CPU per second / scrapes per second / RSS / "
                f"open descriptors at the end (peak of the run) / waiting scrapes held | "
                f"{fmt(b['cpu_per_s'], '.2f')} s/s / {fmt(b['scrapes_per_s'], '.0f')} / "
                f"{b['rss'] / 2**20:.0f} MiB / {b['fds']} ({b['peak_rss'] / 2**20:.0f} MiB / "
                f"{b['peak_fds']}) / {fmt(b['held'], '.0f')} | | | {b['loadavg']} |"]
        if "progress_freshness_p99" in b:
            p99 = b["progress_freshness_p99"]
            lines += [
                f"| same: progress freshness p50 / p99, a change to the watch's event (changes "
                f"shown of those made in the window) | "
                f"{fmt(b['progress_freshness_p50'], '.2f')} / {fmt(p99, '.2f')} s "
                f"({b['changes_shown']} of {b['changes_made']}) | p99 <= {FRESH_TARGET:g} s | "
                f"{verdict(None if p99 is None else p99 <= FRESH_TARGET)} | {b['loadavg']} |"]
        if "progress_freshness_p99_from_switch" in b:
            buckets = ", ".join(fmt(v, ".1f") for v in b["freshness_p99_by_bucket"])
            lines += [
                f"| same, from the switch to changing ({b['settle']:.0f} s before the window, "
                f"its burst of N answers included): progress freshness p99 (changes shown of "
                f"those made); p99 per {FRESH_BUCKET_SECONDS:g} s of change time | "
                f"{fmt(b['progress_freshness_p99_from_switch'], '.2f')} s "
                f"({b['changes_shown_from_switch']} of {b['changes_made_from_switch']}); "
                f"{buckets} | | | {b['loadavg']} |"]
        if "apiserver_cpu_s" in b:
            lines += [
                f"| same, steady window: kube-apiserver / etcd CPU-seconds, and per status "
                f"written | {fmt(b['apiserver_cpu_s'], '.1f')} / {fmt(b['etcd_cpu_s'], '.1f')}"
                f" s; {fmt(b['apiserver_cpu_ms_per_write'], '.2f')} / "
                f"{fmt(b['etcd_cpu_ms_per_write'], '.2f')} ms | | | {b['loadavg']} |"]
    if c:
        lines += [
            f"| training logging every {c['log_every']:g} s, {c['jobs']} TrainJobs: API "
            f"writes per TrainJob-hour, ours / push (SDK, counted) | "
            f"{fmt(c.get('writes_per_hour'), '.0f')} / {c['push_writes_per_hour']} | | | "
            f"{c.get('loadavg')} |",
            f"| same: freshness p50 / p99, ours (interval {c['interval']:g} s, waiting "
            f"scrapes) | {fmt(c.get('fresh_p50'), '.2f')} / {fmt(c.get('fresh_p99'), '.2f')} s "
            f"({c.get('changes_seen')} of {c.get('changes')} changes) | push: one POST | | "
            f"{c.get('loadavg')} |"]
    if d:
        p99 = d.get("fresh_p99")
        lines += [
            f"| sparse changes, one per {d['log_every']:g} s at a {d['interval']:g} s interval, "
            f"{d['jobs']} TrainJobs: update() -> TrainJob status p50 / p99 | "
            f"{fmt(d.get('fresh_p50'), '.2f')} / {fmt(p99, '.2f')} s ({d.get('changes_seen')} of "
            f"{d.get('changes')} changes) | p99 <= 1 s | "
            f"{verdict(None if p99 is None else p99 <= 1.0)} | {d.get('loadavg')} |"]
    if w:
        lines += [f"| CPU per status write (scraper process), pre-queue (stop 9) / call_api "
                  f"in a thread (stop 10) / urllib3 pool in a thread (stop 11, before) / "
                  f"aiohttp on the loop (after) | {w.get('pre_queue', 0):.0f} / "
                  f"{w.get('call_api', 0):.0f} / {w['before']:.0f} / {w['after']:.0f} us | lower | "
                  f"{verdict(w['after'] < w['before'])} | {w['loadavg']} |"]
    lines += _runs_table(res)
    for key in ("scale_error", "log_error", "sparse_error"):
        if res.get(key):
            lines += ["", f"{key}: `{res[key][:400]}`"]
    return "\n".join(lines)


def run_entry(out: dict[str, Any]) -> dict[str, Any]:
    """One run's entry of the report's ``runs``: the keys of the adaptive-rate
    acceptance and the pressure figures when there was pressure."""
    a, b = out.get("a") or {}, out.get("b") or {}
    entry: dict[str, Any] = {
        "trainjobs": out.get("jobs"), "write_rate": out.get("write_rate"),
        "write_qps_max": out.get("write_qps_max"),
        "first_status_p99_s": a.get("first_p99"),
        "longest_write_gap_s": b.get("longest_gap"),
        "skipped_runs": (a.get("skipped_runs") or 0) + (b.get("skipped_runs") or 0),
        "writes_per_s": b.get("writes_per_s"), "change_every_s": b.get("change_every"),
        "percent_error_p99": b.get("percent_error_p99"),
        "progress_freshness_p99_s": b.get("progress_freshness_p99"),
        "progress_freshness_p99_from_switch_s": b.get("progress_freshness_p99_from_switch"),
        "rate_changes": b.get("rate_changes"), "write_rate_end": b.get("write_rate_end"),
    }
    if "pressure_alone" in out:
        entry["pressure_p99_alone_s"] = out["pressure_alone"]["p99_s"]
        entry["pressure_p99_with_scraper_s"] = (out.get("pressure_with_scraper") or {}).get(
            "p99_s")
        entry["scraper_429_share"] = (out.get("scraper_apf") or {}).get("rejected_share")
    return entry


def _runs_table(res: dict[str, Any]) -> list[str]:
    runs = res.get("runs") or []
    if not runs:
        return []
    lines = ["", "| write rate | TrainJobs | first status p99 | longest write gap | skipped "
             "runs | writes/s (b) | percent error p99 | 429 share | other client p99 alone "
             "/ with the scraper |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        share = r.get("scraper_429_share")
        lines.append(
            f"| {r['write_rate']} (max {fmt(r.get('write_qps_max'), 'g')}) | {r['trainjobs']} | "
            f"{fmt(r['first_status_p99_s'], '.1f')} s | {fmt(r['longest_write_gap_s'], '.1f')} s"
            f" | {r['skipped_runs']:.0f} | {fmt(r.get('writes_per_s'), '.1f')} | "
            f"{fmt(r.get('percent_error_p99'), '.0f')} points | "
            f"{'-' if share is None else f'{100 * share:.2f} %'} | "
            f"{fmt(r.get('pressure_p99_alone_s'), '.3f')} / "
            f"{fmt(r.get('pressure_p99_with_scraper_s'), '.3f')} s |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster_scale",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000, help="TrainJobs in a and b")
    parser.add_argument("--interval", type=float, default=5.0, help="scrape interval in a, b")
    parser.add_argument("--window", type=float, default=None,
                        help="steady-state window of b (default 2.5 x jobs/QPS)")
    parser.add_argument("--log-jobs", type=int, default=20, help="TrainJobs in c")
    parser.add_argument("--log-window", type=float, default=120.0)
    parser.add_argument("--sparse-window", type=float, default=150.0,
                        help="seconds of scenario d (changes once per 30 s, 15 s interval)")
    parser.add_argument("--writes", type=int, default=300,
                        help="status writes per path for the CPU-per-write row (0: skip)")
    parser.add_argument("--scale-only", action="store_true",
                        help="scenarios a and b only (no c, d or the CPU-per-write row)")
    parser.add_argument("--write-rate", action="append", type=_write_rate,
                        help="adaptive (--write-qps 20 up to --write-qps-max 200, the "
                        "default), fixed (20/s) or fixed-Q (Q/s); repeat for one run of a "
                        "and b each")
    parser.add_argument("--change-every", type=float, default=None,
                        help="seconds between two changes of each exporter in b "
                        "(default: --interval)")
    parser.add_argument("--pressure-qps", type=float, default=0.0,
                        help="a second client applying ConfigMaps at this rate in the "
                        "scraper's priority level (0: none)")
    parser.add_argument("--pressure-window", type=float, default=30.0,
                        help="seconds the pressure client runs alone first")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--mode-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--duration", type=float, default=600.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(json.loads(args.serve.read_text()), args.mode_file, args.duration)
        return 0
    if args.jobs < 1 or args.log_jobs < 1:
        parser.error(f"--jobs={args.jobs}, --log-jobs={args.log_jobs}: each at least 1")
    if args.interval < 1:
        parser.error(f"--interval={args.interval:g}: at least 1 s (the scraper's minimum)")
    if args.pressure_qps < 0 or (args.change_every is not None and args.change_every <= 0):
        parser.error(f"--pressure-qps={args.pressure_qps:g}, --change-every="
                     f"{args.change_every}: --pressure-qps at least 0, --change-every above 0")
    rates = args.write_rate or ["adaptive"]
    if len(set(rates)) < len(rates):
        parser.error(f"--write-rate={rates}: each value at most once (one namespace each)")
    window = args.window or 2.5 * args.jobs / DEFAULT_QPS
    res: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                           "machine": f"{os.cpu_count()} cores",
                           "loadavg_start": loadavg()}
    started = time.monotonic()
    try:
        # API Priority and Fairness on: kube-apiserver's default, and what the adaptive
        # rate reads.
        with ControlPlane(priority_and_fairness=True) as plane:
            api = plane.api_client()
            install_trainjob_crds(api)
            core = client.CoreV1Api(api)
            spaces = {rate: f"{SCALE_NS}-{rate_label(rate)}" for rate in rates}
            for ns in (LOG_NS, SPARSE_NS, *spaces.values()):
                core.create_namespace({"metadata": {"name": ns}})
            stamp = time.strftime("%Y%m%d-%H%M%S")
            res["runs"], res["scale_runs"] = [], []
            for rate in rates:
                try:
                    out = scale(plane, api, args.jobs, args.interval, window,
                                write_rate=rate, namespace=spaces[rate],
                                change_every=args.change_every,
                                pressure_qps=args.pressure_qps,
                                pressure_window=args.pressure_window,
                                picture=args.out / f"cluster-writes-{stamp}-{rate}.png")
                    res["scale_runs"].append(out)
                    res["runs"].append(run_entry(out))
                    res.setdefault("scale", out)
                    print(json.dumps(res["runs"][-1], default=str), flush=True)
                except Exception as exc:  # the other scenarios still count
                    res["scale_error"] = f"{rate}: {type(exc).__name__}: {exc}"
            if args.scale_only:
                api.close()
                return 0
            try:
                res["log"] = logging_training(plane, api, args.log_jobs, args.log_window)
                print(json.dumps(res["log"], default=str), flush=True)
            except Exception as exc:
                res["log_error"] = f"{type(exc).__name__}: {exc}"
            try:
                res["sparse"] = logging_training(
                    plane, api, args.log_jobs, args.sparse_window, log_every=SPARSE_EVERY,
                    interval=SPARSE_INTERVAL, namespace=SPARSE_NS)
                print(json.dumps(res["sparse"], default=str), flush=True)
            except Exception as exc:
                res["sparse_error"] = f"{type(exc).__name__}: {exc}"
            api.close()
        if args.writes:
            from benchmarks.breakdown import status_writes

            paths = asyncio.run(status_writes(args.writes))
            res["writes"] = {**paths, "before": paths["pool_thread"], "after": paths["today"],
                             "count": args.writes, "loadavg": loadavg()}
    finally:
        write_report(res, args.out, "cluster", table, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
