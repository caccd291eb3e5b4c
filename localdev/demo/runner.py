"""``python -m localdev.demo`` (``make demo``): the whole path on one machine, with live progress.

Local mode (no ``--kubeconfig`` and no ``KUBECONFIG``):

1. build or reuse the local cluster (:class:`localdev.cluster.stack.Cluster`: etcd,
   kube-apiserver, kube-controller-manager, kube-scheduler, kwok, the JobSet and
   Kubeflow Trainer controllers with their shipped CRDs and runtimes, the pod runner);
2. start the scraper (``trainjob-scraper run``) against it;
3. create a TrainJob on the shipped ``torch-distributed`` runtime whose trainer
   command is a real training process (numpy by default, Transformers on request);
   the controllers make the JobSet, Job and pod, the pod runner runs the command
   at the pod's IP, where its exporter listens;
4. show the TrainJob's ``status.trainerStatus`` live, as the API holds it;
5. when the pod ends (its termination message reported by the pod runner) and the
   TrainJob is Complete, wait for the scraper's final status and print
   ``kubectl get trainjob``, the status, and ``kubectl get jobsets,jobs,pods -o wide``.

Cluster mode (``--kubeconfig`` or ``KUBECONFIG``): run the scraper against that
cluster and show the live table of its TrainJobs until Ctrl-C or ``--duration``
seconds after the start (the scraper's start-up counts).  ``--namespace`` is a
cluster-mode option; local mode refuses it.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config
from rich.console import Console
from rich.live import Live

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL, TrainerStatus
from localdev.cluster.processes import free_port
from localdev.demo.display import render, summary_line, trainer_status
from localdev.demo.processes import Child, start_scraper, wait_http_ok
from scraper.kube.client import request_timeout, without_retries

NAMESPACE = "trainjob-demo"
TRAINJOB = "demo-train"
FINAL_STATUS_TIMEOUT_SECONDS = 60.0
#: Longest wait for the scraper's /readyz in cluster mode (seconds).
READY_TIMEOUT_SECONDS = 60.0
#: Seconds the cluster-mode probe of the API server may take before the demo says it
#: cannot reach it (the scraper keeps trying up to :data:`READY_TIMEOUT_SECONDS`).
PROBE_TIMEOUT_SECONDS = 5.0


def main(args: argparse.Namespace) -> int:
    """Run the demo; return the exit code (0: the final status landed)."""
    console = Console(stderr=False)
    if not console.is_terminal:
        console.soft_wrap = True  # a log or pipe: keep paths and lines whole
    kubeconfig = args.kubeconfig
    # Its first non-blank path; a KUBECONFIG of separators or blanks counts as unset.
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p.strip()]
    if kubeconfig is None and listed and not args.local:
        kubeconfig = Path(listed[0])
        console.print(f"KUBECONFIG is set: cluster mode against {kubeconfig} "
                      "(--local runs the local control plane instead)")
    # SIGTERM ends the demo like Ctrl-C, so the ExitStack tears everything down; SIGINT
    # too when a shell started us in the background with SIGINT ignored.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if kubeconfig is None and args.framework == "transformers" and not _have(
            "torch", "transformers"):
        console.print("[red]--framework transformers needs torch and transformers: "
                      "run scripts/bootstrap test (installs them into .venv) first[/]")
        return 2
    if args.duration is not None and kubeconfig is None:
        # Refused rather than ignored: the local demo ends when its TrainJob does.
        console.print("[red]--duration applies to cluster mode only (with --kubeconfig or "
                      "$KUBECONFIG); local mode ends when its TrainJob completes[/]")
        return 2
    if args.namespace is not None and kubeconfig is None:
        console.print(f"[red]--namespace applies to cluster mode only (with --kubeconfig or "
                      f"$KUBECONFIG); local mode runs its TrainJob in namespace {NAMESPACE}[/]")
        return 2
    try:
        if kubeconfig is not None:
            return _cluster_mode(console, kubeconfig, args)
        return _local_mode(console, args)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; everything started by the demo was stopped[/]")
        return 130


def _have(*modules: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in modules)


@contextmanager
def _workdir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="trainjob-demo-"))
    try:
        yield path
    finally:
        if not keep:
            import shutil

            shutil.rmtree(path, ignore_errors=True)


def _local_mode(console: Console, args: argparse.Namespace) -> int:
    import sys

    from localdev.cluster import trainjobs
    from localdev.cluster.stack import Cluster

    started = time.monotonic()
    with ExitStack() as stack:
        workdir = stack.enter_context(_workdir(args.keep))
        console.rule("[bold]trainjob-progress demo")
        console.print("1/5 local cluster: etcd, kube-apiserver, kube-controller-manager, "
                      "kube-scheduler, kwok, JobSet and Kubeflow Trainer controllers, pod runner "
                      "(the first build takes many minutes, README.md 'Times'; it prints progress)")
        cluster = Cluster(workdir=workdir / "cluster", push=getattr(args, "push", False))
        stack.callback(cluster.stop)
        cluster.start()
        versions = ", ".join(f"{k} {v}" for k, v in cluster.stack_versions.items())
        ready_in = (cluster.startup_seconds or 0) + (cluster.stack_startup_seconds or 0)
        console.print(f"    ready in {ready_in:.1f}s "
                      f"({versions}); kubeconfig {cluster.kubeconfig_path}")
        api = cluster.api_client()
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})

        logs = getattr(args, "zero_code", None) == "logs"
        options = ["--log-source"] if logs else []
        console.print(f"2/5 scraper: trainjob-scraper run --interval {args.interval} "
                      + " ".join(options))
        scraper_child = start_scraper(
            workdir, kubeconfig=cluster.kubeconfig_path, port=free_port(),
            options=["--interval", args.interval, "--namespaces", NAMESPACE, *options],
        )
        stack.callback(scraper_child.stop)
        wait_http_ok(scraper_child.extra["base_url"] + "/readyz", scraper_child)

        module = {"numpy": "localdev.demo.train_numpy",
                  "transformers": "localdev.demo.train_transformers"}[args.framework]
        command = [sys.executable, "-m", module, "--epochs", str(args.epochs),
                   "--log-file", str(workdir / "training-log.jsonl")]
        runtime = "torch-distributed"
        if logs:
            runtime, command, module = _log_runtime(cluster, api)
        console.print(f"3/5 TrainJob {NAMESPACE}/{TRAINJOB} on ClusterTrainingRuntime "
                      f"{runtime}; trainer command: python {module}")
        trainjobs.create(api, trainjobs.trainjob_body(
            NAMESPACE, TRAINJOB, runtime=runtime, command=command,
            env={"PYTHONUNBUFFERED": "1"}))
        pod = trainjobs.wait_pods(api, NAMESPACE, TRAINJOB, count=1, timeout=120)[0]
        console.print(f"4/5 the controllers made JobSet {TRAINJOB}, Job "
                      f"{pod.metadata.labels.get('batch.kubernetes.io/job-name')} and pod "
                      f"{pod.metadata.name} ({pod.status.pod_ip} on {pod.spec.node_name}); "
                      "the pod runner runs its command")
        objects = client.CustomObjectsApi(api)

        def read() -> list[dict[str, Any]]:
            return [objects.get_namespaced_custom_object(
                API_GROUP, API_VERSION, NAMESPACE, TRAINJOB_PLURAL, TRAINJOB)]

        def finished() -> bool:
            obj = read()[0]
            return trainjobs.condition(obj, "Complete") or trainjobs.condition(obj, "Failed")

        console.print("5/5 live status (Ctrl-C stops the demo); the same from another "
                      f"terminal while the demo runs:\n    {_plugin_shown(cluster)}")
        _follow(console, read, until=finished, children=[scraper_child])
        pod = client.CoreV1Api(api).read_namespaced_pod(pod.metadata.name, NAMESPACE)
        terminated = pod.status.container_statuses[0].state.terminated
        if terminated is None or terminated.exit_code != 0:
            console.print(f"[red]training failed: {terminated}[/]\n"
                          + _tail_file(cluster.workdir / "pods", pod.metadata.name))
            return 1
        message = terminated.message or ""
        console.print(f"training finished; pod {pod.metadata.name} ended with its termination "
                      f"message ({len(message.encode())} bytes), TrainJob Complete")
        final = TrainerStatus.from_json(message) if message else None
        landed = _wait_final(console, read, final, scraper_child)

        console.rule("kubectl get trainjob")
        console.print(cluster.kubectl("get", "trainjob", "-n", NAMESPACE).stdout.rstrip(),
                      highlight=False)
        jsonpath = cluster.kubectl("get", "trainjob", TRAINJOB, "-n", NAMESPACE, "-o",
                                   "jsonpath={.status}").stdout
        console.rule("kubectl get trainjob -o jsonpath='{.status}'")
        console.print_json(jsonpath or "null")
        console.rule("kubectl get jobsets,jobs,pods -o wide")
        console.print(cluster.kubectl("get", "jobsets,jobs,pods", "-n", NAMESPACE,
                                      "-o", "wide").stdout.rstrip(), highlight=False)
        console.rule("kubectl trainjob progress (the plugin, trainjob_client)")
        console.print(_run_plugin(cluster), highlight=False)
        hold = getattr(args, "hold", False)
        console.print(f"demo took {time.monotonic() - started:.0f}s; logs in {workdir}"
                      + ("" if args.keep else " (removed when the demo ends; --keep keeps them)"
                         if hold else " (removed; --keep keeps them)"))
        if hold:
            _hold(console, cluster)
        return 0 if landed else 1


def _plugin_env(cluster: Any) -> dict[str, str]:
    """The environment in which ``kubectl trainjob`` reads the demo's cluster: this venv's
    ``kubectl-trainjob`` first on PATH (kubectl finds plugins there) and the cluster's
    kubeconfig (kubectl does not hand its own ``--kubeconfig`` flag to a plugin)."""
    import os
    import sys

    path = f"{Path(cluster.kubectl_path).parent}:{Path(sys.executable).parent}"
    return {**os.environ, "PATH": f"{path}:{os.environ.get('PATH', '')}",
            "KUBECONFIG": str(cluster.kubeconfig_path)}


def _plugin_shown(cluster: Any, verb: str = f"watch {TRAINJOB}") -> str:
    """The plugin command line a user can paste into another terminal."""
    import sys

    path = f"{Path(cluster.kubectl_path).parent}:{Path(sys.executable).parent}"
    return (f"PATH={path}:$PATH KUBECONFIG={cluster.kubeconfig_path} "
            f"kubectl trainjob {verb} -n {NAMESPACE}")


def _run_plugin(cluster: Any) -> str:
    """``kubectl trainjob progress`` against the demo's cluster, as a user runs it."""
    import subprocess

    done = subprocess.run([str(cluster.kubectl_path), "trainjob", "progress", "-n", NAMESPACE,
                           "--metrics", "loss"], env=_plugin_env(cluster),
                          capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        return f"kubectl trainjob failed ({done.returncode}): {done.stderr.strip()}"
    return done.stdout.rstrip()


def _hold(console: Console, cluster: Any) -> None:
    """``--hold``: keep the cluster (and the scraper) up until Ctrl-C or SIGTERM."""
    console.print("--hold: the cluster stays up until Ctrl-C; from another terminal:\n    "
                  + _plugin_shown(cluster, "progress"))
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        console.print("stopping the cluster")


def _log_runtime(cluster: Any, api: client.ApiClient) -> tuple[str, list[str], str]:
    """The runtime whose pods are read from their log, the tqdm training's command."""
    import sys

    from localdev.cluster.runtimes import LOG_SOURCE, annotated_runtime

    name = "torch-distributed-logs"
    manifests = cluster.assets.manifests
    client.CustomObjectsApi(api).create_cluster_custom_object(
        API_GROUP, API_VERSION, "clustertrainingruntimes",
        annotated_runtime(manifests, name, LOG_SOURCE))
    script = str(Path(__file__).with_name("train_tqdm.py"))
    return name, [sys.executable, script], f"{Path(script).name} (plain tqdm, zero code)"


def _tail_file(directory: Path, pod_name: str, lines: int = 30) -> str:
    logs = sorted(directory.glob(f"*_{pod_name}_*.log"))
    if not logs:
        return "(no container log)"
    return "\n".join(logs[0].read_text(errors="replace").splitlines()[-lines:])


def _wait_final(console: Console, read: Callable[[], list[dict[str, Any]]],
                final: TrainerStatus | None, scraper_child: Child) -> bool:
    deadline = time.monotonic() + FINAL_STATUS_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        status = trainer_status(read()[0])
        if status is not None and (final is None or status == final):
            console.print("[green]final status applied by the scraper[/]")
            return True
        if not scraper_child.running():
            break
        time.sleep(0.5)
    console.print("[red]the final status did not land; scraper log:[/]\n"
                  + scraper_child.log_tail())
    return False


def _follow(console: Console, read: Callable[[], list[dict[str, Any]]], *,
            until: Callable[[], bool], children: list[Child],
            deadline: float | None = None) -> None:
    """Show ``read()`` live until ``until()`` (or ``deadline``, monotonic seconds)."""

    def done() -> bool:
        return until() or (deadline is not None and time.monotonic() >= deadline)

    def check_children() -> None:
        for child in children:
            if not child.running():
                raise RuntimeError(f"{child.name} exited with code "
                                   f"{child.process.returncode}:\n{child.log_tail()}")

    if console.is_terminal:
        with Live(render(read()), console=console, refresh_per_second=4) as live:
            while not done():
                check_children()
                time.sleep(0.5)
                live.update(render(read()))
        return
    last: list[str] = []
    while not done():
        check_children()
        lines = [summary_line(t["metadata"]["name"], trainer_status(t)) for t in read()]
        if lines != last:
            for line in lines:
                console.print(line, highlight=False)
            last = lines
        time.sleep(0.5)


def _probe(console: Console, api: client.ApiClient, wait: Callable[[], float]) -> None:
    """Say at once when the kubeconfig's API server does not answer, rather than only
    after the scraper's readiness wait (a newcomer waited 61 s for the first word).

    One request on ``api`` (built without retries), its connect and its read each bounded
    by half of :data:`PROBE_TIMEOUT_SECONDS`; ``wait()``: the seconds the scraper then
    still gets.
    """
    host = api.configuration.host
    try:
        version = client.VersionApi(api).get_code(
            _request_timeout=request_timeout(PROBE_TIMEOUT_SECONDS / 2))
    except Exception as exc:  # any failure is reported, then waited out
        reason = " ".join(str(exc).split())[:300]
        what = (f"cannot reach the API server {host} yet" if isinstance(
                    exc, urllib3.exceptions.HTTPError | OSError)
                else f"{host} answered, but not as a Kubernetes API server")
        console.print(f"[yellow]{what} ({reason}); the scraper keeps trying for up to "
                      f"{wait():.0f}s[/]")
        return
    console.print(f"API server {host}: Kubernetes {version.git_version}")


def _cluster_mode(console: Console, kubeconfig: Path, args: argparse.Namespace) -> int:
    # --duration counts from the start: a scraper slow to get ready eats into it.
    deadline = None if args.duration is None else time.monotonic() + args.duration
    console.rule(f"[bold]trainjob-progress demo against {kubeconfig}")
    if not kubeconfig.is_file():
        why = "not a file" if kubeconfig.exists() else "no such file"
        console.print(f"[red]cannot use kubeconfig {kubeconfig}: {why}[/]")
        return 2
    try:
        # No hidden retries: a server that stops answering is told within one timeout.
        api = without_retries(config.new_client_from_config(config_file=str(kubeconfig)))
    except (config.ConfigException, OSError) as exc:
        console.print(f"[red]cannot use kubeconfig {kubeconfig}: {exc}[/]")
        return 2
    except yaml.YAMLError as exc:
        reason = " ".join(str(exc).split())
        console.print(f"[red]cannot use kubeconfig {kubeconfig}: not valid YAML: {reason}[/]")
        return 2
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        # Not UTF-8 (ValueError), or YAML that is no kubeconfig's mapping (a list, a scalar).
        console.print(f"[red]cannot use kubeconfig {kubeconfig}: not a kubeconfig "
                      f"({type(exc).__name__}: {' '.join(str(exc).split())})[/]")
        return 2

    def ready_wait() -> float:
        """Seconds the scraper may take to get ready: 60, or what --duration leaves."""
        if deadline is None:
            return READY_TIMEOUT_SECONDS
        return float(min(READY_TIMEOUT_SECONDS, max(0.0, deadline - time.monotonic())))

    _probe(console, api, ready_wait)
    objects = client.CustomObjectsApi(api)
    shown: list[dict[str, Any]] = []
    unanswered: list[str] = []  # the last failure, told once until the server answers

    def read() -> list[dict[str, Any]]:
        # Short timeouts: the live view (and --duration) never waits long on a read.
        timeout = request_timeout(PROBE_TIMEOUT_SECONDS / 2)
        try:
            if args.namespace:
                listed = objects.list_namespaced_custom_object(
                    API_GROUP, API_VERSION, args.namespace, TRAINJOB_PLURAL,
                    _request_timeout=timeout)
            else:
                listed = objects.list_cluster_custom_object(
                    API_GROUP, API_VERSION, TRAINJOB_PLURAL, _request_timeout=timeout)
        except (urllib3.exceptions.HTTPError, client.ApiException) as exc:
            if not unanswered:
                reason = " ".join(str(getattr(exc, "reason", None) or exc).split())[:200]
                console.print(f"[yellow]the API server {api.configuration.host} did not "
                              f"answer ({reason}); showing the last list, trying again[/]")
            unanswered[:] = [str(exc)]
            return shown
        if unanswered:
            console.print("[green]the API server answers again[/]")
            unanswered.clear()
        shown[:] = list(listed.get("items", []))
        return shown

    with ExitStack() as stack:
        workdir = stack.enter_context(_workdir(args.keep))
        options = ["--interval", args.interval]
        if args.namespace:
            options += ["--namespaces", args.namespace]
        scraper_child = start_scraper(workdir, kubeconfig=kubeconfig, port=free_port(),
                                      options=options)
        stack.callback(scraper_child.stop)
        try:
            wait_http_ok(scraper_child.extra["base_url"] + "/readyz", scraper_child,
                         timeout=ready_wait())
        except RuntimeError as exc:  # e.g. the cluster's API server cannot be reached
            if deadline is not None and time.monotonic() >= deadline:
                console.print(f"[red]--duration {args.duration}s ended before the scraper "
                              f"was ready: {exc}[/]")
            else:
                console.print(f"[red]the scraper did not get ready: {exc}[/]")
            return 1
        console.print("the scraper reaches pod IPs directly: run this where they are routable "
                      "(inside the cluster network), else install the Helm chart")
        _follow(console, read, until=lambda: False, children=[scraper_child], deadline=deadline)
    return 0

