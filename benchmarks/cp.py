"""Our scraper as deployed (``python -m scraper run``) against the real local control plane.

N TrainJobs with rank-0 pods whose exporter is an nginx farm port (unchanged payloads):
CPU per scrape with discovery, API writes in a window without changes (should be 0).
Then M more TrainJobs whose pods point at real exporters that change every ~2.5
intervals: p50/p99 freshness (exporter update -> the TrainJob's status, seen through
a watch) and API writes versus real status changes.

Each window records its schedule as the other runs of ``python -m benchmarks`` do:
``expected`` scrapes (the nginx targets' polls, targets x window / interval; the live
exporters offer waiting scrapes, so theirs are answers per change on top) and the
scraper's own ``trainjob_scraper_skipped_runs_total`` over the window (``skipped``), so
a window that fell behind says so in the report.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import sys
import time
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes import config as k8s_config

from benchmarks.farm import ExporterFarm
from benchmarks.pinning import Pinning, affinity, pinned
from benchmarks.procstat import cpu_seconds, rss_bytes
from benchmarks.status_watch import TrainJobWatch
from localdev.cluster import ControlPlane, install_trainjob_crds, objects, processes
from localdev.demo.processes import start_scraper

STATIC_NS = "bench-static"
LIVE_NS = "bench-live"


def _make_jobs(api: client.ApiClient, namespace: str, ports: list[int],
               annotations: dict[str, str] | None = None, *,
               kubeconfig: Path | None = None, workers: int = 1) -> dict[str, float]:
    """TrainJob + Running rank-0 pod per port (``job-<i>`` for the i-th port), 8 client
    threads each in ``workers`` processes (given ``kubeconfig``: the Python client, not
    the API server, limits one process: 5 TrainJobs/s at 10,000); returns job -> wall
    time its pod ran."""
    items = list(enumerate(ports))
    if kubeconfig is None or workers <= 1:
        return _make_chunk(api, namespace, items, annotations)
    ran: dict[str, float] = {}
    spawn = multiprocessing.get_context("spawn")  # this process runs threads: no fork
    with ProcessPoolExecutor(workers, mp_context=spawn) as pool:
        for part in pool.map(_make_chunk_in_process, [kubeconfig] * workers,
                             [namespace] * workers,
                             [items[w::workers] for w in range(workers)],
                             [annotations] * workers):
            ran.update(part)
    return ran


def _make_chunk_in_process(kubeconfig: Path, namespace: str, items: list[tuple[int, int]],
                           annotations: dict[str, str] | None) -> dict[str, float]:
    with k8s_config.new_client_from_config(str(kubeconfig)) as api:
        return _make_chunk(api, namespace, items, annotations)


def _make_chunk(api: client.ApiClient, namespace: str, items: list[tuple[int, int]],
                annotations: dict[str, str] | None) -> dict[str, float]:
    ran: dict[str, float] = {}

    def one(i_port: tuple[int, int]) -> None:
        i, port = i_port
        name = f"job-{i}"
        trainjob = objects.create_trainjob(api, namespace, name)
        objects.create_trainer_pod(api, namespace, name, port=port,
                                   annotations=annotations, trainjob=trainjob)
        ran[name] = time.time()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, items))
    return ran


def _metric_sum(text: str, name: str, label: str | None = None) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (label is None or label in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


class _Scraper:
    """``python -m scraper run`` as a child process (the demo's launcher) on a free port,
    watching ``namespaces`` with ``options``; its /metrics read on demand."""

    def __init__(self, kubeconfig: Path, workdir: Path, namespaces: str,
                 options: list[str]) -> None:
        self.port = processes.free_port()
        self.child = start_scraper(workdir, kubeconfig=kubeconfig, port=self.port,
                                   options=["--namespaces", namespaces, "--log-level",
                                            "WARNING", *options])
        self.proc = self.child.process

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            return str(r.read().decode())

    def metric(self, name: str, label: str | None = None) -> float:
        """The sum of the samples of ``name`` (with ``label`` when given)."""
        return _metric_sum(self.metrics(), name, label)

    def counts(self) -> tuple[float, float]:
        """(scrapes, status writes) so far."""
        text = self.metrics()
        return (_metric_sum(text, "trainjob_scraper_scrapes_total"),
                _metric_sum(text, "trainjob_scraper_status_writes_total", 'result="written"'))

    def skipped(self) -> float:
        """Scheduled runs skipped so far (the scraper fell behind)."""
        return self.metric("trainjob_scraper_skipped_runs_total")

    def wait_for(self, predicate: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if predicate():
                    return True
            time.sleep(0.5)
        return False

    def wait_ready(self, timeout: float = 60) -> None:
        """Until /metrics answers.

        Raises:
            RuntimeError: the process exited or ``timeout`` seconds passed first.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                self.metric("trainjob_scraper_scrapes_total")
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError("scraper did not serve /metrics")

    def stop(self) -> None:
        self.child.stop(grace=15.0)


class _Watcher(TrainJobWatch):
    """Records (job, stamp metric, wall time seen) of every TrainJob status write in
    ``namespace`` (:class:`benchmarks.status_watch.TrainJobWatch`)."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.seen: list[tuple[str, float, float]] = []  # (job, stamp, wall time seen)
        super().__init__(api, namespace, self._record)

    def _record(self, now: float, name: str, ts: Mapping[str, Any]) -> None:
        for m in ts.get("metrics") or []:
            if m.get("name") == "stamp":
                self.seen.append((name, float(m["value"]), now))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(static_ports: list[int], interval: float, live: int, warmup: float,
            window: float, pin: Pinning | None = None) -> dict[str, Any]:
    """Run both control-plane scenarios; returns their figures.

    ``pin``: the control plane (API server, etcd) and the live exporters start on its farm
    core, the scraper on its scraper core; ``None``: nothing pinned.
    """
    out: dict[str, Any] = {"targets": len(static_ports), "live_targets": live,
                           "interval": interval}
    plane = ControlPlane()
    scraper: _Scraper | None = None
    watcher: _Watcher | None = None
    farm: ExporterFarm | None = None
    try:
        t = time.monotonic()
        with pinned(pin.farm if pin else None):
            plane.start()
        api = plane.api_client()
        install_trainjob_crds(api)
        core = client.CoreV1Api(api)
        for ns in (STATIC_NS, LIVE_NS):
            core.create_namespace({"metadata": {"name": ns}})
        _make_jobs(api, STATIC_NS, static_ports)
        out["setup_seconds"] = time.monotonic() - t
        with pinned(pin.scraper if pin else None):
            scraper = _Scraper(plane.kubeconfig_path, plane.workdir, f"{STATIC_NS},{LIVE_NS}",
                               ["--interval", str(interval), "--write-qps", "500",
                                "--write-burst", "500", "--metrics-staleness", "0s"])
        out["cores"] = sorted(affinity(scraper.proc.pid))
        n = len(static_ports)
        # Every static TrainJob gets its one initial status, then nothing changes.
        if not scraper.wait_for(lambda: scraper.counts()[1] >= n, 60 + n / 20):
            raise RuntimeError(f"scraper did not write {n} initial statuses; see its log")
        time.sleep(warmup)
        pid = scraper.proc.pid
        k0 = scraper.skipped()
        (s0, w0), c0, t0 = scraper.counts(), cpu_seconds(pid), time.monotonic()
        time.sleep(window)
        (s1, w1), c1, t1 = scraper.counts(), cpu_seconds(pid), time.monotonic()
        out["unchanged"] = {"window": t1 - t0, "cpu_seconds": c1 - c0, "scrapes": s1 - s0,
                            "writes": w1 - w0, "real_changes": 0, "rss": rss_bytes(pid),
                            "expected": n * (t1 - t0) / interval,
                            "skipped": scraper.skipped() - k0}

        # Live exporters: each changes every ~2.5 intervals at its own phase.
        live_window = max(window, 8 * interval)
        farm = ExporterFarm(live, period=2.5 * interval, jitter=True,
                            duration=warmup + live_window + 60 + 4 * interval,
                            cores=pin.farm if pin else None)
        farm.__enter__()
        watcher = _Watcher(api, LIVE_NS)
        _make_jobs(api, LIVE_NS, farm.ports)
        if not scraper.wait_for(lambda: scraper.counts()[1] >= n + live, 60):
            raise RuntimeError("scraper did not pick up the live TrainJobs")
        time.sleep(warmup)
        k0 = scraper.skipped()
        (s0, w0), c0, a = scraper.counts(), cpu_seconds(pid), time.time()
        time.sleep(live_window)
        (s1, w1), c1, b = scraper.counts(), cpu_seconds(pid), time.time()
        k1 = scraper.skipped()
        time.sleep(interval + 2)  # let the last changes of the window land
        farm.stop()
        watcher.stop()
        stamps = farm.stamps()
        port_job = {p: f"job-{i}" for i, p in enumerate(farm.ports)}
        # Real changes: updates made during [a, b - interval - 1] (each one must be written).
        changes = {(port_job[p], s) for p, ss in stamps.items() for s in ss
                   if a <= s <= b - interval - 1}
        first_seen: dict[tuple[str, float], float] = {}
        writes_checked = 0  # MODIFIED events carrying a checked change: one per write
        for job, stamp, seen in watcher.seen:
            first_seen.setdefault((job, stamp), seen)
            writes_checked += (job, stamp) in changes
        fresh = [first_seen[c] - c[1] for c in changes if c in first_seen]
        out["changing"] = {
            "window": b - a, "cpu_seconds": c1 - c0, "scrapes": s1 - s0, "writes": w1 - w0,
            "expected": n * (b - a) / interval, "skipped": k1 - k0,
            "real_changes_in_window": sum(1 for ss in stamps.values() for s in ss if a <= s <= b),
            "changes_checked": len(changes), "changes_seen": len(fresh),
            "writes_checked": writes_checked,
            "freshness_p50": percentile(fresh, 0.5), "freshness_p99": percentile(fresh, 0.99),
            "freshness_max": max(fresh) if fresh else None,
        }
    except Exception as exc:  # report what failed; the other phases still count
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        if scraper is not None:
            with contextlib.suppress(OSError):
                out["scraper_log_tail"] = (plane.workdir / "scraper.log").read_text()[-2000:]
    finally:
        if watcher is not None:
            watcher.stop()
        if scraper is not None:
            scraper.stop()
        if farm is not None:
            farm.__exit__(None, None, None)
        plane.stop()
    return out


if __name__ == "__main__":  # manual use: python -m benchmarks.cp PORT...
    print(json.dumps(measure([int(p) for p in sys.argv[1:]], 1.0, 5, 2.0, 5.0), indent=1,
                     default=str))
