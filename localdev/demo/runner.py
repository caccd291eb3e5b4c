"""``python -m localdev.demo`` (``make demo``): the whole path on one machine, with live progress.

Local mode (no ``--kubeconfig`` and no ``KUBECONFIG``):

1. build or reuse the control plane binaries and start etcd + kube-apiserver;
2. install the TrainJob and JobSet CRDs, create a TrainJob and the rank-0 trainer
   Pod as Kubeflow Trainer and JobSet would (no kubelet runs here, so the Pod's
   IP 127.0.0.1 and its Running phase are written through the status subresource);
3. start the scraper (``trainjob-scraper run``) against the local API server;
4. start a real training process (numpy by default, Transformers on request)
   whose exporter serves on the Pod's annotated port;
5. show the TrainJob's ``status.trainerStatus`` live, as the API holds it;
6. when training ends, copy its termination message into the Pod's status as the
   kubelet would, wait for the scraper to apply that final status, and print
   ``kubectl get trainjob`` and the status as kubectl reads it.

Cluster mode (``--kubeconfig`` or ``KUBECONFIG``): run the scraper against that
cluster and show the live table of its TrainJobs until Ctrl-C or ``--duration``.
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

from kubernetes import client, config
from rich.console import Console
from rich.live import Live

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL, TrainerStatus
from localdev.cluster.processes import free_port
from localdev.demo.display import render, summary_line, trainer_status
from localdev.demo.processes import Child, start_scraper, start_training, wait_http_ok

NAMESPACE = "trainjob-demo"
TRAINJOB = "demo-train"
FINAL_STATUS_TIMEOUT_SECONDS = 60.0


def main(args: argparse.Namespace) -> int:
    """Run the demo; return the exit code (0: the final status landed)."""
    console = Console(stderr=False)
    if not console.is_terminal:
        console.soft_wrap = True  # a log or pipe: keep paths and lines whole
    kubeconfig = args.kubeconfig
    if kubeconfig is None and os.environ.get("KUBECONFIG") and not args.local:
        kubeconfig = Path(os.environ["KUBECONFIG"].split(os.pathsep)[0])
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
        console.print("[yellow]--duration applies to cluster mode only; ignored[/]")
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
    from localdev.cluster.controlplane import ControlPlane
    from localdev.cluster.crds import install_trainjob_crds
    from localdev.cluster.objects import create_trainer_pod, create_trainjob, terminate_pod

    started = time.monotonic()
    with ExitStack() as stack:
        workdir = stack.enter_context(_workdir(args.keep))
        console.rule("[bold]trainjob-progress demo")
        console.print("1/5 control plane: building or reusing kube-apiserver, etcd, kubectl "
                      "(the first build takes 10-20 minutes on two cores and prints progress)")
        plane = ControlPlane()
        stack.callback(plane.stop)
        plane.start()
        console.print(f"    kube-apiserver ready at {plane.server_url} "
                      f"in {plane.startup_seconds or 0:.1f}s; kubeconfig {plane.kubeconfig_path}")
        api = plane.api_client()
        install_trainjob_crds(api)
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})

        port = free_port()
        console.print(f"2/5 TrainJob {NAMESPACE}/{TRAINJOB} and its rank-0 trainer pod "
                      f"(exporter port {port})")
        create_trainjob(api, NAMESPACE, TRAINJOB)
        pod = create_trainer_pod(api, NAMESPACE, TRAINJOB, port=port)
        pod_name = pod.metadata.name

        console.print(f"3/5 scraper: trainjob-scraper run --interval {args.interval}")
        scraper_child = start_scraper(
            workdir, kubeconfig=plane.kubeconfig_path, port=free_port(),
            options=["--interval", args.interval, "--namespaces", NAMESPACE],
        )
        stack.callback(scraper_child.stop)
        wait_http_ok(scraper_child.extra["base_url"] + "/readyz", scraper_child)

        console.print(f"4/5 training ({args.framework}, {args.epochs} epochs) with exporter_lib")
        training = start_training(workdir, port=port, framework=args.framework,
                                  args=["--epochs", str(args.epochs)])
        stack.callback(training.stop)

        console.print("5/5 live status (Ctrl-C stops the demo)")
        objects = client.CustomObjectsApi(api)

        def read() -> list[dict[str, Any]]:
            return [objects.get_namespaced_custom_object(
                API_GROUP, API_VERSION, NAMESPACE, TRAINJOB_PLURAL, TRAINJOB)]

        _follow(console, read, until=lambda: not training.running(), children=[scraper_child])
        code = training.wait(timeout=30)
        if code != 0:
            console.print(f"[red]training exited with code {code}:[/]\n{training.log_tail()}")
            return 1

        termination = Path(str(training.extra["termination_log"]))
        message = termination.read_text() if termination.exists() else ""
        console.print(f"training finished; the pod ends with its termination message "
                      f"({len(message.encode())} bytes), as the kubelet would copy it")
        terminate_pod(api, NAMESPACE, pod_name, message)
        final = TrainerStatus.from_json(message) if message else None
        landed = _wait_final(console, read, final, scraper_child)

        console.rule("kubectl get trainjob")
        console.print(plane.kubectl("get", "trainjob", "-n", NAMESPACE).stdout.rstrip(),
                      highlight=False)
        jsonpath = plane.kubectl("get", "trainjob", TRAINJOB, "-n", NAMESPACE, "-o",
                                 "jsonpath={.status.trainerStatus}").stdout
        console.rule("kubectl get trainjob -o jsonpath='{.status.trainerStatus}'")
        console.print_json(jsonpath or "null")
        console.print(f"demo took {time.monotonic() - started:.0f}s; logs in {workdir}"
                      + ("" if args.keep else " (removed; --keep keeps them)"))
        return 0 if landed else 1


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


def _cluster_mode(console: Console, kubeconfig: Path, args: argparse.Namespace) -> int:
    console.rule(f"[bold]trainjob-progress demo against {kubeconfig}")
    try:
        api = config.new_client_from_config(config_file=str(kubeconfig))
    except (config.ConfigException, OSError) as exc:
        console.print(f"[red]cannot use kubeconfig {kubeconfig}: {exc}[/]")
        return 2
    objects = client.CustomObjectsApi(api)

    def read() -> list[dict[str, Any]]:
        if args.namespace:
            listed = objects.list_namespaced_custom_object(
                API_GROUP, API_VERSION, args.namespace, TRAINJOB_PLURAL)
        else:
            listed = objects.list_cluster_custom_object(API_GROUP, API_VERSION, TRAINJOB_PLURAL)
        return list(listed.get("items", []))

    with ExitStack() as stack:
        workdir = stack.enter_context(_workdir(args.keep))
        options = ["--interval", args.interval]
        if args.namespace:
            options += ["--namespaces", args.namespace]
        scraper_child = start_scraper(workdir, kubeconfig=kubeconfig, port=free_port(),
                                      options=options)
        stack.callback(scraper_child.stop)
        wait_http_ok(scraper_child.extra["base_url"] + "/readyz", scraper_child)
        console.print("the scraper reaches pod IPs directly: run this where they are routable "
                      "(inside the cluster network), else install the Helm chart")
        deadline = None if args.duration is None else time.monotonic() + args.duration
        _follow(console, read, until=lambda: False, children=[scraper_child], deadline=deadline)
    return 0

