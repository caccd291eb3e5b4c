"""The container runtime of the local cluster's runner node.

Run as ``python -m localdev.cluster.podrunner`` by :class:`localdev.cluster.stack.Cluster`.

kwok plays the kubelet of the fake nodes but runs nothing.  For the pods bound
to the runner node (:data:`localdev.cluster.stack.RUNNER_NODE`) this process
does what the kubelet and the container runtime would:

* once kwok's ``pod-ready`` stage has given the pod its IP and Running phase,
  it runs each container's ``command`` + ``args`` (``$(VAR)`` expanded) as a
  local process with the container's environment (``env`` values, ``fieldRef``,
  ConfigMap and Secret keys; what the Trainer injects, such as ``PET_NODE_RANK``,
  arrives this way), its output in ``<workdir>/<namespace>_<pod>_<container>.log``;
* it stands in for the two things a pod has that a local process has not:
  its own network namespace (``TRAINJOB_EXPORTER_HOST`` is set to the pod IP,
  so the exporter listens there) and the termination message file (the
  container's ``terminationMessagePath`` is a file of its own on the host,
  named by ``TRAINJOB_EXPORTER_TERMINATION_MESSAGE_PATH``);
* when a process exits it reports the container terminated with its exit
  code and the message file's first 4096 bytes (with
  ``FallbackToLogsOnError``, the log's last 80 lines / 2048 bytes after a
  failure), and the pod Succeeded or Failed for ``restartPolicy: Never``;
  with ``OnFailure`` a failed container is started again (``restartCount``);
* when the pod is deleted it sends SIGTERM, SIGKILL after the grace period,
  reports the termination and then deletes the pod with grace period 0, as
  the kubelet confirms a deletion.

kwok's ending stages (``pod-complete``, ``pod-delete``) skip this node, so the
two never write the same pod's status (see docs/architecture.md).  The host
environment passed to a container is only ``PATH``, ``HOME``, locale,
``PYTHONPATH``, ``VIRTUAL_ENV`` and ``TMPDIR`` (the "image" is this machine).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from localdev.cluster import processes

#: The kubelet reads at most this many bytes of a termination message file.
MESSAGE_LIMIT_BYTES = 4096
#: FallbackToLogsOnError: the log's last lines, at most this many bytes.
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048
#: Default terminationGracePeriodSeconds of a pod.
DEFAULT_GRACE_SECONDS = 30.0
#: Pause before a container of a restartPolicy OnFailure pod starts again.
RESTART_DELAY_SECONDS = 1.0
#: Host variables a container sees (the rest is the pod's).
HOST_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "VIRTUAL_ENV",
            "TMPDIR")
ENV_EXPORTER_HOST = "TRAINJOB_EXPORTER_HOST"
ENV_TERMINATION_PATH = "TRAINJOB_EXPORTER_TERMINATION_MESSAGE_PATH"
TICK_SECONDS = 0.1
WATCH_TIMEOUT_SECONDS = 60
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known names are replaced, ``$$`` is a ``$``."""
    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return _VAR.sub(sub, text)


def read_message(path: Path, log: Path, *, failed: bool, fallback: bool) -> str:
    """The termination message as the kubelet reports it (bytes cut at the limits)."""
    data = b""
    with contextlib.suppress(OSError), open(path, "rb") as handle:
        data = handle.read(MESSAGE_LIMIT_BYTES)
    if not data and failed and fallback:
        with contextlib.suppress(OSError):
            lines = log.read_bytes().splitlines(keepends=True)[-FALLBACK_LOG_LINES:]
            data = b"".join(lines)[-FALLBACK_LOG_BYTES:]
    return data.decode(errors="replace")


@dataclass
class ContainerRun:
    """One container of a pod, run as a local process."""

    name: str
    spec: dict[str, Any]
    log: Path
    message_file: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    restart_count: int = 0
    terminated: dict[str, Any] | None = None
    last_terminated: dict[str, Any] | None = None
    restart_at: float | None = None


@dataclass
class PodRun:
    """A pod of the runner node and its containers."""

    uid: str
    pod: dict[str, Any]
    containers: dict[str, ContainerRun] = field(default_factory=dict)
    started: bool = False
    kill_at: float | None = None
    reported: bool = False
    deleted: bool = False

    @property
    def key(self) -> str:
        meta = self.pod["metadata"]
        return f"{meta['namespace']}/{meta['name']}"

    def running(self) -> list[ContainerRun]:
        return [c for c in self.containers.values() if c.proc is not None]


class PodRunner:
    """Runs the pods bound to ``node`` (see the module docstring)."""

    def __init__(self, api: client.ApiClient, node: str, workdir: Path) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.node = node
        self.workdir = workdir
        self.pods: dict[str, PodRun] = {}
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.stopping = threading.Event()

    # ----------------------------------------------------------------- watch

    def _watch(self) -> None:
        """List then watch this node's pods forever; events go to :attr:`events`."""
        selector = f"spec.nodeName={self.node}"
        while not self.stopping.is_set():
            try:
                listed = self.core.list_pod_for_all_namespaces(field_selector=selector)
                seen = set()
                for pod in listed.items:
                    body = self.api.sanitize_for_serialization(pod)
                    seen.add(body["metadata"]["uid"])
                    self.events.put(("MODIFIED", body))
                self.events.put(("SYNC", {"uids": sorted(seen)}))
                stream = watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces, field_selector=selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=WATCH_TIMEOUT_SECONDS)
                for event in stream:
                    if self.stopping.is_set():
                        return
                    obj = event["raw_object"]
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self.events.put((event["type"], obj))
            except Exception as exc:
                print(f"pod watch error, relisting: {exc}", flush=True)
                time.sleep(0.5)

    # ----------------------------------------------------------------- main loop

    def run(self, ready_file: Path) -> None:
        """Process pod events and container exits until SIGTERM/SIGINT."""
        thread = threading.Thread(target=self._watch, name="pod-watch", daemon=True)
        thread.start()
        synced = False
        while not self.stopping.is_set():
            deadline = time.monotonic() + TICK_SECONDS
            while True:
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    break
                try:
                    kind, obj = self.events.get(timeout=timeout)
                except queue.Empty:
                    break
                if kind == "SYNC":
                    self._sync(set(obj["uids"]))
                    if not synced:
                        synced = True
                        ready_file.write_text("ready\n")
                    continue
                self._on_event(kind, obj)
            for run in list(self.pods.values()):
                self._tick(run)

    def stop_all(self) -> None:
        """Kill every container (exit path)."""
        self.stopping.set()
        for run in self.pods.values():
            for container in run.running():
                assert container.proc is not None
                processes.stop(container.proc, grace=2.0)

    def _sync(self, uids: set[str]) -> None:
        for uid in [u for u in self.pods if u not in uids]:
            self._forget(self.pods[uid])

    def _forget(self, run: PodRun) -> None:
        for container in run.running():
            assert container.proc is not None
            processes.stop(container.proc, grace=0.5)
            container.proc = None
        self.pods.pop(run.uid, None)

    def _on_event(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        run = self.pods.get(uid)
        if kind == "DELETED":
            if run is not None:
                run.deleted = True
                self._forget(run)
            return
        if run is None:
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") \
                    and not pod["metadata"].get("deletionTimestamp"):
                return  # ended before this runner started: nothing to run
            run = self.pods[uid] = PodRun(uid=uid, pod=pod)
        run.pod = pod
        status = pod.get("status") or {}
        if pod["metadata"].get("deletionTimestamp"):
            if run.kill_at is None:
                grace = pod["metadata"].get("deletionGracePeriodSeconds")
                if grace is None:
                    grace = pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
                run.kill_at = time.monotonic() + float(grace)
                for container in run.running():
                    assert container.proc is not None
                    processes.signal_group(container.proc, signal.SIGTERM)
                for container in run.containers.values():
                    container.restart_at = None
            return
        if not run.started and status.get("phase") == "Running" and status.get("podIP"):
            self._start_pod(run)

    # ----------------------------------------------------------------- containers

    def _start_pod(self, run: PodRun) -> None:
        run.started = True
        meta = run.pod["metadata"]
        base = self.workdir / f"{meta['namespace']}_{meta['name']}"
        base.mkdir(parents=True, exist_ok=True)
        for spec in run.pod["spec"]["containers"]:
            container = ContainerRun(
                name=spec["name"], spec=spec,
                log=self.workdir / f"{meta['namespace']}_{meta['name']}_{spec['name']}.log",
                message_file=base / f"{spec['name']}.termination-log")
            run.containers[spec["name"]] = container
            self._start_container(run, container)
        self._report(run)

    def _env(self, run: PodRun, spec: dict[str, Any], message_file: Path) -> dict[str, str]:
        pod = run.pod
        env = {k: v for k, v in os.environ.items() if k in HOST_ENV or k.startswith("LC_")}
        env["HOSTNAME"] = pod["metadata"]["name"]
        for source in spec.get("envFrom") or []:
            data = self._env_from(pod["metadata"]["namespace"], source)
            prefix = source.get("prefix", "")
            env.update({prefix + k: v for k, v in data.items()})
        for var in spec.get("env") or []:
            if "value" in var:
                env[var["name"]] = expand(var["value"], env)
            elif "valueFrom" in var:
                value = self._value_from(pod, var["valueFrom"])
                if value is not None:
                    env[var["name"]] = value
            else:
                env[var["name"]] = ""
        env.setdefault(ENV_EXPORTER_HOST, pod["status"]["podIP"])
        env.setdefault(ENV_TERMINATION_PATH, str(message_file))
        return env

    def _env_from(self, namespace: str, source: dict[str, Any]) -> dict[str, str]:
        with contextlib.suppress(client.ApiException):
            if "configMapRef" in source:
                cm = self.core.read_namespaced_config_map(source["configMapRef"]["name"],
                                                          namespace)
                return dict(cm.data or {})
            if "secretRef" in source:
                import base64

                secret = self.core.read_namespaced_secret(source["secretRef"]["name"], namespace)
                return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
        return {}

    def _value_from(self, pod: dict[str, Any], source: dict[str, Any]) -> str | None:
        meta, status = pod["metadata"], pod.get("status") or {}
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
            if match:
                return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
            fields = {
                "metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
                "metadata.uid": meta["uid"], "spec.nodeName": pod["spec"].get("nodeName", ""),
                "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
                "status.hostIP": status.get("hostIP", ""), "status.podIP": status.get("podIP", ""),
                "status.podIPs": ",".join(i["ip"] for i in status.get("podIPs") or []),
            }
            return str(fields.get(path, ""))
        namespace = meta["namespace"]
        with contextlib.suppress(client.ApiException):
            if "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                cm = self.core.read_namespaced_config_map(ref["name"], namespace)
                return (cm.data or {}).get(ref["key"])
            if "secretKeyRef" in source:
                import base64

                ref = source["secretKeyRef"]
                secret = self.core.read_namespaced_secret(ref["name"], namespace)
                raw = (secret.data or {}).get(ref["key"])
                return None if raw is None else base64.b64decode(raw).decode()
        return None  # resourceFieldRef: no resources here

    def _start_container(self, run: PodRun, container: ContainerRun) -> None:
        spec = container.spec
        env = self._env(run, spec, container.message_file)
        argv = [expand(a, env) for a in (spec.get("command") or []) + (spec.get("args") or [])]
        container.message_file.unlink(missing_ok=True)
        container.started_at = _now()
        container.terminated = None
        if not spec.get("command"):
            container.terminated = self._cannot_run(
                container, "the pod runner needs an explicit command (no image entrypoint here)")
            return
        workdir = Path(spec.get("workingDir") or container.message_file.parent)
        if not workdir.is_dir():
            workdir = container.message_file.parent
        try:
            container.proc = processes.spawn(argv, container.log, env=env, cwd=workdir)
        except OSError as exc:
            container.terminated = self._cannot_run(container, f"{argv[0]}: {exc}")

    def _cannot_run(self, container: ContainerRun, message: str) -> dict[str, Any]:
        with open(container.log, "a") as log:
            log.write(f"pod runner: {message}\n")
        return {"exitCode": 128, "reason": "StartError", "message": message[:MESSAGE_LIMIT_BYTES],
                "startedAt": container.started_at, "finishedAt": _now()}

    def _tick(self, run: PodRun) -> None:
        changed = False
        restart_policy = run.pod["spec"].get("restartPolicy", "Always")
        for container in run.containers.values():
            if container.proc is not None and container.proc.poll() is not None:
                code = container.proc.returncode
                processes.forget(container.proc)
                # The kubelet reports a signal's death as 128 + the signal number.
                exit_code = code if code >= 0 else 128 - code
                policy = container.spec.get("terminationMessagePolicy", "File")
                container.terminated = {
                    "exitCode": exit_code,
                    "reason": "Completed" if exit_code == 0 else "Error",
                    "message": read_message(container.message_file, container.log,
                                            failed=exit_code != 0,
                                            fallback=policy == "FallbackToLogsOnError"),
                    "startedAt": container.started_at, "finishedAt": _now(),
                }
                container.proc = None
                changed = True
                restart = (run.kill_at is None and (restart_policy == "Always" or (
                    restart_policy == "OnFailure" and exit_code != 0)))
                if restart:
                    container.restart_at = time.monotonic() + RESTART_DELAY_SECONDS
            if container.restart_at is not None and time.monotonic() >= container.restart_at:
                container.restart_at = None
                container.last_terminated = container.terminated
                container.restart_count += 1
                self._start_container(run, container)
                changed = True
        if run.kill_at is not None:
            if run.running() and time.monotonic() >= run.kill_at:
                for container in run.running():
                    assert container.proc is not None
                    processes.signal_group(container.proc, signal.SIGKILL)
            if not run.running():
                if run.started and not run.reported:
                    self._report(run)
                self._delete(run)
            return
        if changed:
            self._report(run)

    # ----------------------------------------------------------------- status

    def _container_status(self, container: ContainerRun) -> dict[str, Any]:
        status: dict[str, Any] = {
            "name": container.name, "image": container.spec.get("image", ""), "imageID": "",
            "containerID": f"podrunner://{container.name}-{container.restart_count}",
            "restartCount": container.restart_count,
        }
        if container.proc is not None or container.restart_at is not None:
            status.update(ready=container.proc is not None, started=container.proc is not None,
                          state={"running": {"startedAt": container.started_at}}
                          if container.proc is not None else
                          {"waiting": {"reason": "CrashLoopBackOff"}})
        else:
            status.update(ready=False, started=False,
                          state={"terminated": container.terminated or {}})
        if container.last_terminated is not None:
            status["lastState"] = {"terminated": container.last_terminated}
        return status

    def _report(self, run: PodRun) -> None:
        """Write the containers' states (and a terminal phase once all ended) to the pod."""
        current = run.pod.get("status") or {}
        ours = {c.name: self._container_status(c) for c in run.containers.values()}
        statuses = [ours.get(s["name"], s) for s in current.get("containerStatuses") or []]
        statuses += [s for n, s in ours.items()
                     if n not in {x["name"] for x in current.get("containerStatuses") or []}]
        ended = all(c.proc is None and c.restart_at is None and c.terminated is not None
                    for c in run.containers.values())
        now = _now()
        patch: dict[str, Any] = {"containerStatuses": statuses}
        ready = "True" if all(s.get("ready") for s in statuses) else "False"
        conditions = [dict(c) for c in current.get("conditions") or []]
        for cond in conditions:
            if cond.get("type") in ("Ready", "ContainersReady") and cond.get("status") != ready:
                cond.update(status=ready, lastTransitionTime=now)
        patch["conditions"] = conditions
        if ended:
            failed = any((c.terminated or {}).get("exitCode") for c in run.containers.values())
            patch["phase"] = "Failed" if failed else "Succeeded"
            run.reported = True
        meta = run.pod["metadata"]
        try:
            result = self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"],
                                                           {"status": patch})
            run.pod = self.api.sanitize_for_serialization(result)
        except client.ApiException as exc:
            if exc.status != 404:
                print(f"pod {run.key}: status write failed: {exc.status} {exc.reason}",
                      flush=True)

    def _delete(self, run: PodRun) -> None:
        if run.deleted:
            return
        run.deleted = True
        meta = run.pod["metadata"]
        with contextlib.suppress(client.ApiException):
            self.core.delete_namespaced_pod(
                meta["name"], meta["namespace"], grace_period_seconds=0,
                body=client.V1DeleteOptions(grace_period_seconds=0,
                                            preconditions=client.V1Preconditions(uid=run.uid)))


def main(argv: list[str] | None = None) -> int:
    """Run the pod runner until SIGTERM or SIGINT; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m localdev.cluster.podrunner",
                                     description="The container runtime of the runner node.")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node", required=True, help="the node whose pods this runs")
    parser.add_argument("--workdir", type=Path, required=True,
                        help="directory for container logs and termination message files")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    api = config.new_client_from_config(config_file=args.kubeconfig)
    runner = PodRunner(api, args.node, args.workdir)

    def on_signal(signum: int, frame: object) -> None:
        runner.stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        runner.run(args.workdir / ".ready")
    finally:
        runner.stop_all()
        processes.kill_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
