"""The cluster churn benchmark (``python -m benchmarks.churn --api``): issue 13, input 8.

The whole scraper process (``python -m scraper run`` under
:mod:`benchmarks.churn_probe`) against the local control plane (etcd +
kube-apiserver).  Every pod, base or churned, is a TrainJob of its own with the owner
chain the controllers set (TrainJob -> JobSet -> Job -> Pod, by UID, so the identity
check passes), and its own pod IP (``127.a.b.c``, never reused).  Pods are of the
kinds of :mod:`benchmarks.churn_farm` in turn: ``json`` (first status written,
waiting scrapes held), ``refused``, ``html`` (Warning Events), and every second
churned pod ends with a termination message (a final status write) before it is
deleted.  One cycle: create the TrainJob, JobSet, Job and Pod, mark the pod Running
at its IP, hold it ``hold`` seconds, end it (or not), delete the pod, Job, JobSet and
TrainJob; ``workers`` cycles at once.

After each round, once settled, one JSON line: the scraper's RSS and what the probe
reports (smaps_rollup anonymous memory, glibc heap in use and free, threads, live
objects), and the RSS after ``malloc_trim`` when ``trim``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client

from benchmarks.churn_farm import ChurnFarm
from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from localdev.cluster.controlplane import ControlPlane
from localdev.cluster.crds import install_trainjob_crds

NAMESPACE = "churn"
JOBSET = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NAMESPACE}/jobsets"
TRAINJOBS = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{NAMESPACE}/{TRAINJOB_PLURAL}"
JOBS = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
KINDS = ("json", "refused", "json", "html")
IMAGE = "trainer:bench"


def pod_ips() -> Iterator[str]:
    """Distinct loopback addresses, 127.1.0.1 onwards (never .0 or .255)."""
    n = 0
    while True:
        a, b, c = 1 + n // (254 * 256), (n // 254) % 256, 1 + n % 254
        yield f"127.{a}.{b}.{c}"
        n += 1


def _owner(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
            "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


class Cluster:
    """Raw JSON calls (no client models: the benchmark's own CPU stays small)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def req(self, method: str, path: str, body: Any = None,
            content_type: str = "application/json") -> dict[str, Any]:
        resp = self.api.call_api(path, method, body=body,
                                 header_params={"Content-Type": content_type,
                                                "Accept": "application/json"},
                                 _preload_content=False, _return_http_data_only=True,
                                 auth_settings=["BearerToken"])
        out: dict[str, Any] = json.loads(resp.data) if resp.data else {}
        return out

    def delete(self, path: str) -> None:
        try:
            self.req("DELETE", path, {"propagationPolicy": "Background",
                                      "gracePeriodSeconds": 0})
        except client.ApiException as exc:
            if exc.status != 404:
                raise

    def make(self, name: str, kind: str, port: int, ip: str) -> None:
        """TrainJob ``name`` with its JobSet, Job and a Running rank-0 pod at ``ip``."""
        tj = self.req("POST", TRAINJOBS, {
            "apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "TrainJob",
            "metadata": {"name": name},
            "spec": {"runtimeRef": {"name": "torch-distributed", "apiGroup": API_GROUP,
                                    "kind": "ClusterTrainingRuntime"},
                     "trainer": {"numNodes": 1}}})
        js = self.req("POST", JOBSET, {
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "ownerReferences": [_owner(tj)]},
            "spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {
                "spec": {"template": {"spec": {"containers": [
                    {"name": "node", "image": IMAGE}]}}}}}]}})
        labels = {"jobset.sigs.k8s.io/jobset-name": name,
                  "jobset.sigs.k8s.io/replicatedjob-name": "node",
                  "jobset.sigs.k8s.io/jobset-uid": js["metadata"]["uid"]}
        job = self.req("POST", JOBS, {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"{name}-node-0", "labels": labels,
                         "ownerReferences": [_owner(js)]},
            "spec": {"completions": 1, "template": {"metadata": {"labels": labels}, "spec": {
                "restartPolicy": "Never", "containers": [{"name": "node", "image": IMAGE}]}}}})
        pod_name = f"{name}-node-0-0"
        self.req("POST", PODS, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "labels": {
                **labels, "batch.kubernetes.io/job-completion-index": "0",
                "jobset.sigs.k8s.io/job-index": "0"},
                "annotations": {"trainjob-progress.dev/port": str(port),
                                "trainjob-progress.dev/interval": "1s",
                                "kind": kind},
                "ownerReferences": [_owner(job)]},
            "spec": {"nodeName": "bench-node", "restartPolicy": "Never",
                     "containers": [{"name": "node", "image": IMAGE}]}})
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.req("PATCH", f"{PODS}/{pod_name}/status", {"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": ip,
            "startTime": now, "containerStatuses": [{
                "name": "node", "image": IMAGE, "imageID": "", "ready": True,
                "restartCount": 0, "state": {"running": {"startedAt": now}}}]}},
            content_type="application/merge-patch+json")

    def end(self, name: str, message: str | None) -> None:
        """End the pod (with a termination ``message`` if given), delete all four."""
        pod_name = f"{name}-node-0-0"
        if message is not None:
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.req("PATCH", f"{PODS}/{pod_name}/status", {"status": {
                "phase": "Succeeded", "containerStatuses": [{
                    "name": "node", "image": IMAGE, "imageID": "", "ready": False,
                    "restartCount": 0, "state": {"terminated": {
                        "exitCode": 0, "reason": "Completed", "message": message,
                        "startedAt": now, "finishedAt": now}}}]}},
                content_type="application/merge-patch+json")
        self.delete(f"{PODS}/{pod_name}")
        self.delete(f"{JOBS}/{name}-node-0")
        self.delete(f"{JOBSET}/{name}")
        self.delete(f"{TRAINJOBS}/{name}")


def _final(i: int) -> str:
    return json.dumps({"progressPercentage": 100, "lastUpdatedTime": "2025-01-01T00:00:00Z",
                       "metrics": [{"name": "cycle", "value": str(i)}]})


def _probe(proc: subprocess.Popen[bytes], path: str, timeout: float = 60.0) -> dict[str, Any]:
    """Signal the probe and read its report (it runs between two of the loop's steps)."""
    if os.path.exists(path):
        os.unlink(path)
    proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the scraper's probe did not answer")
        time.sleep(0.1)
    with open(path) as handle:
        out: dict[str, Any] = json.load(handle)
    return out


def _row(r: int, report: dict[str, Any], took: float) -> dict[str, Any]:
    smaps = report["smaps_rollup_kib"]
    row = {"round": r, "rss_mib": round(report["rss_kib"] / 1024, 1),
           "anon_mib": round(smaps.get("Anonymous", 0) / 1024, 1),
           "heap_in_use_mib": round(report["malloc"]["in_use_kib"] / 1024, 1),
           "heap_free_mib": round(report["malloc"]["free_kib"] / 1024, 1),
           "pymalloc_mib": round(report["pymalloc"].get("total_bytes", 0) / 2 ** 20, 1),
           "pymalloc_free_mib": round(report["pymalloc"].get("available_bytes", 0) / 2 ** 20,
                                      1),
           "pooled_idle": sum(c["idle"] for c in report["connectors"]),
           "threads": report["threads"], "gc_objects": report["gc_objects"],
           "round_seconds": round(took, 1)}
    if "rss_after_trim_kib" in report:
        row["rss_after_trim_mib"] = round(report["rss_after_trim_kib"] / 1024, 1)
    if "tracemalloc_kib" in report:
        row["tracemalloc_mib"] = round(report["tracemalloc_kib"] / 1024, 1)
    return row


def run_api(targets: int, rounds: int, cycles: int, settle: float, *, hold: float = 1.5,
            workers: int = 48, trim: bool = False, verbose: bool = False,
            env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run the benchmark (module doc); returns one row per round (round 0: base only)."""
    out: list[dict[str, Any]] = []
    farm = ChurnFarm().start()
    ips = pod_ips()
    ip_lock = threading.Lock()

    def next_ip() -> str:
        with ip_lock:
            return next(ips)

    workdir = tempfile.mkdtemp(prefix="churn-")
    report_path = os.path.join(workdir, "probe.json")
    try:
        with ControlPlane() as cp, ThreadPoolExecutor(workers) as pool:
            api = cp.api_client()
            api.configuration.connection_pool_maxsize = workers
            api.rest_client.pool_manager.connection_pool_kw["maxsize"] = workers
            install_trainjob_crds(api)
            client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
            cluster = Cluster(api)

            def base(i: int) -> None:
                kind = "json" if i % 4 else "refused"
                cluster.make(f"base-{i}", kind, farm.ports[kind], next_ip())

            list(pool.map(base, range(targets)))
            penv = dict(os.environ, **(env or {}))
            if trim:
                penv["TRAINJOB_CHURN_TRIM"] = "1"
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.churn_probe", report_path, "--", "run",
                 f"--kubeconfig={cp.kubeconfig_path}", f"--namespaces={NAMESPACE}",
                 "--listen-host=127.0.0.1", "--listen-port=0", "--no-metrics-auth",
                 "--log-level=WARNING", "--interval=1s"],
                stdout=subprocess.DEVNULL, stderr=None if verbose else subprocess.DEVNULL,
                env=penv)
            try:
                time.sleep(settle)
                for r in range(rounds + 1):
                    started = time.monotonic()
                    if r:
                        def cycle(c: int, r: int = r) -> None:
                            kind = KINDS[c % len(KINDS)]
                            name = f"c{r}-{c}"
                            cluster.make(name, kind, farm.ports[kind], next_ip())
                            time.sleep(hold)
                            cluster.end(name, _final(c) if c % 2 else None)
                        list(pool.map(cycle, range(cycles)))
                    took = time.monotonic() - started
                    time.sleep(settle)
                    row = _row(r, _probe(proc, report_path), took)
                    print(json.dumps(row), flush=True)
                    out.append(row)
                    if proc.poll() is not None:
                        raise RuntimeError(f"the scraper exited ({proc.returncode})")
            finally:
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(20)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(5)
    finally:
        farm.stop()
    return out
