"""Recovery after a kube-apiserver outage (issue 21, input 6): how soon each stage resumes.

``python -m benchmarks.recovery [--jobs 20] [--outage 18] [--runs 1]``

The real local control plane; ``python -m scraper run`` as deployed (default write
budget, ``--interval=1s``), as a ServiceAccount with the chart's rules (so the
authorizer's warm-up after the restart is part of it).  ``--jobs`` TrainJobs with
rank-0 pods whose exporters answer on loopback (a small HTTP server per pod of this
process; no training runs: what is measured is the scraper and the API server).

1. Every first status is written.
2. ``--ending`` pods end (termination message with a final status) and kube-apiserver
   is SIGKILLed right after: their finals are queued ("before").  So that they are
   still queued when it dies (at the default budget the scraper writes a final within
   a few ms), the scraper is paused with SIGSTOP from just before the ends until 0.2 s
   after the kill; the ends are in its watch connection's buffer by then.
3. During the outage the other exporters report new progress (the scrapes go on; the
   writes fail and back off).
4. kube-apiserver starts again on the same etcd; ``up`` is when its ``/readyz`` is ok.
   At once ``--ending`` more pods end ("during": their termination becomes visible only
   now, as a kubelet's status update retried until the API server is back).
5. A LIST of the TrainJobs every 0.1 s records when each final and each surviving
   job's new progress landed.

Prints one Markdown table row per run: seconds after ``/readyz`` (min-max) for each
group, and the pending-writes gauge read just before the API server came back.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from localdev.cluster import ControlPlane, install_trainjob_crds, objects, processes

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "charts" / "trainjob-scraper" / "files" / "clusterrole-rules.yaml"
NAMESPACE = "bench-recovery"


class _Exporters:
    """One loopback HTTP server per pod answering ``bodies[i]`` as exporter JSON."""

    def __init__(self, count: int) -> None:
        self.bodies: list[dict[str, Any]] = [{} for _ in range(count)]
        self.servers: list[ThreadingHTTPServer] = []
        for i in range(count):
            class Handler(BaseHTTPRequestHandler):
                index = i
                bodies = self.bodies

                def do_GET(self) -> None:
                    payload = json.dumps(self.bodies[self.index]).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)

                def log_message(self, *args: Any) -> None:
                    pass

            server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self.servers.append(server)

    def port(self, i: int) -> int:
        return int(self.servers[i].server_address[1])

    def stop(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


def _status(progress: int, final: str | None = None) -> dict[str, Any]:
    metrics = [{"name": "loss", "value": "0.5"}]
    if final is not None:
        metrics.append({"name": "final", "value": final})
    return {"progressPercentage": progress, "metrics": metrics,
            "lastUpdatedTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _service_account(api: client.ApiClient, plane: ControlPlane) -> str:
    rbac = client.RbacAuthorizationV1Api(api)
    name = f"trainjob-scraper-{NAMESPACE}"
    rbac.create_cluster_role({"apiVersion": "rbac.authorization.k8s.io/v1",
                              "kind": "ClusterRole", "metadata": {"name": name},
                              "rules": yaml.safe_load(RULES.read_text())})
    rbac.create_cluster_role_binding({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": NAMESPACE}]})
    return plane.service_account_token(NAMESPACE, "scraper")


def _metric(port: int, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def _trainjobs(api: client.ApiClient) -> dict[str, dict[str, Any]]:
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(
        API_GROUP, API_VERSION, NAMESPACE, TRAINJOB_PLURAL, _request_timeout=2)["items"]
    return {o["metadata"]["name"]: (o.get("status") or {}).get("trainerStatus") or {}
            for o in items}


def _final_of(status: dict[str, Any]) -> str | None:
    return next((m["value"] for m in status.get("metrics") or [] if m["name"] == "final"),
                None)


def run_once(plane: ControlPlane, api: client.ApiClient, kubeconfig: Path, workdir: Path,
             jobs: int, ending: int, outage: float, run: int,
             budget: list[str]) -> dict[str, Any]:
    exporters = _Exporters(jobs)
    names = [f"r{run}-job-{i}" for i in range(jobs)]
    pods = []
    for i, name in enumerate(names):
        exporters.bodies[i] = _status(10 + i % 50)
        objects.create_trainjob(api, NAMESPACE, name)
        pods.append(objects.create_trainer_pod(api, NAMESPACE, name,
                                               port=exporters.port(i)).metadata.name)
    log_path = workdir / f"scraper-{run}.log"
    for _ in range(3):  # a port picked free can be taken before the scraper binds it
        port = processes.free_port()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "scraper", "run", f"--kubeconfig={kubeconfig}",
                 f"--listen-port={port}", "--listen-host=127.0.0.1", "--no-metrics-auth",
                 "--interval=1s", f"--namespaces={NAMESPACE}", "--log-level=INFO",
                 *budget],
                stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
        try:
            proc.wait(8)
        except subprocess.TimeoutExpired:
            break  # still running: it listens
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            held = _trainjobs(api)
            if all((held.get(n) or {}).get("progressPercentage") == 10 + i % 50
                   for i, n in enumerate(names)):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("first statuses not written in 90 s")
        before = list(range(ending))
        during = list(range(ending, 2 * ending))
        surviving = list(range(2 * ending, jobs))
        os.kill(proc.pid, signal.SIGSTOP)
        for i in before:
            objects.terminate_pod(api, NAMESPACE, pods[i],
                                  json.dumps(_status(100, final=f"before-{i}")))
        time.sleep(0.3)  # the watch events reach the paused scraper's socket
        threading.Timer(0.2, os.kill, (proc.pid, signal.SIGCONT)).start()
        # SIGKILL now; restart_apiserver blocks for the outage, so the exporters change
        # from a thread meanwhile (the scrapes go on; their writes fail).
        def change() -> None:
            time.sleep(1.0)
            for i in surviving:
                exporters.bodies[i] = _status(60 + i % 30)
        threading.Thread(target=change, daemon=True).start()
        gauge: list[float | None] = []
        threading.Timer(outage - 0.5, lambda: gauge.append(
            _metric(port, "trainjob_scraper_status_writes_pending"))).start()
        plane.restart_apiserver(outage)
        up = time.monotonic()
        ended_at = {}
        for i in during:
            for _ in range(50):  # the kubelet retries its status update until it lands
                try:
                    objects.terminate_pod(api, NAMESPACE, pods[i],
                                          json.dumps(_status(100, final=f"during-{i}")))
                    break
                except (client.ApiException, OSError):
                    time.sleep(0.1)
            ended_at[i] = time.monotonic()
        landed: dict[int, float] = {}
        deadline = up + 60
        while len(landed) < len(before) + len(during) + len(surviving) and \
                time.monotonic() < deadline:
            try:
                held = _trainjobs(api)
            except (client.ApiException, OSError):
                time.sleep(0.1)
                continue
            now = time.monotonic()
            for i in before + during + surviving:
                status = held.get(names[i]) or {}
                if i in landed:
                    continue
                if (status.get("progressPercentage") == 60 + i % 30 if i in surviving
                        else _final_of(status) is not None):
                    landed[i] = now
            time.sleep(0.1)
        log_text = log_path.read_text(errors="replace")

        def spread(group: list[int], since: dict[int, float] | None = None) -> str:
            values = [landed[i] - (since[i] if since else up) for i in group if i in landed]
            missing = len(group) - len(values)
            text = f"{min(values):.1f}-{max(values):.1f}" if values else "-"
            return text + (f" ({missing} not in 60 s)" if missing else "")

        return {
            "before": spread(before), "during": spread(during, ended_at),
            "during_after_up": spread(during),
            "surviving": spread(surviving),
            "gauge": gauge[0] if gauge else None,
            "finals_failed": sum(f"final status write to TrainJob {NAMESPACE}/{names[i]} "
                                 f"failed" in log_text for i in before),
            "watch_waits": [line.split("retrying in ")[1].split("s")[0]
                            for line in log_text.splitlines()
                            if "watch pods/" in line and "retrying in" in line][-3:],
        }
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        exporters.stop()
        for name in names:
            objects.delete_trainjob(api, NAMESPACE, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--ending", type=int, default=5, help="pods ending before, and "
                        "as many during, the outage")
    parser.add_argument("--outage", type=float, default=18.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--assets", help="directory with kube-apiserver, etcd, kubectl")
    parser.add_argument("--write-qps", default="", help="the scraper's --write-qps "
                        "(default: its own default)")
    parser.add_argument("--write-burst", default="", help="the scraper's --write-burst")
    args = parser.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="bench-recovery-")  # kept: the scraper logs
    print(f"# scraper logs in {tmp}")
    with ControlPlane(args.assets) as plane:
        api = plane.api_client()
        install_trainjob_crds(api)
        client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        token = _service_account(api, plane)
        kubeconfig = plane.kubeconfig_for_token(token, Path(tmp) / "sa.kubeconfig")
        budget = [f"--write-qps={args.write_qps}"] if args.write_qps else []
        budget += [f"--write-burst={args.write_burst}"] if args.write_burst else []
        print(f"# recovery: {args.jobs} TrainJobs at 1 s, kube-apiserver SIGKILLed "
              f"{args.outage:g} s, budget {budget or 'default'}; "
              f"{platform.python_version()}; load {os.getloadavg()}")
        print("| run | finals queued before the kill (s after /readyz) | finals of pods "
              "ended at /readyz (s after their end) | surviving jobs' first write (s after "
              "/readyz) | pending gauge at the end of the outage | finals hit by the "
              "outage | last pod-watch waits (s) |")
        print("|---|---|---|---|---|---|---|")
        for run in range(args.runs):
            r = run_once(plane, api, kubeconfig, Path(tmp), args.jobs, args.ending,
                         args.outage, run, budget)
            print(f"| {run + 1} | {r['before']} | {r['during']} | {r['surviving']} | "
                  f"{r['gauge']} | {r['finals_failed']} of {args.ending} | "
                  f"{', '.join(r['watch_waits'])} |", flush=True)
        print(f"# load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
