"""The container runtime of the local cluster's runner node.

Run as ``python -m localdev.cluster.podrunner`` by :class:`localdev.cluster.stack.Cluster`.

kwok plays the kubelet of the fake nodes but runs nothing.  For the pods bound
to the runner node (:data:`localdev.cluster.stack.RUNNER_NODE`) this process
does what the kubelet and the container runtime would:

* once kwok's ``pod-ready`` stage has given the pod its IP and Running phase,
  it runs each container's ``command`` + ``args`` (``$(VAR)`` expanded) as a
  local process with the container's environment (``env`` values, ``fieldRef``,
  ConfigMap and Secret keys; what the Trainer injects, such as ``PET_NODE_RANK``,
  arrives this way); its stdout and stderr are stored as a node's runtime stores
  them, in CRI log format (:mod:`localdev.cluster.crilog`) at the kubelet's path
  ``<workdir>/logs/<namespace>_<pod>_<uid>/<container>/<restartCount>.log``, and a
  kwok ``Logs`` object (owned by the pod) names that file, so kwok's server
  answers ``kubectl logs`` (``previous`` too) from it; the raw bytes also go to
  ``<workdir>/<namespace>_<pod>_<container>.log`` (both streams, every restart);
* init containers first, in order, as the kubelet does: an ordinary one must exit 0
  before the next starts (a failure fails a ``restartPolicy: Never`` pod, else it
  runs again); a native sidecar (``restartPolicy: Always``) counts once it is
  started: its process runs and its ``startupProbe`` (``httpGet``, ``tcpSocket``
  or ``exec``; run inline, at most ``timeoutSeconds`` each) passed.  Sidecars are
  restarted whenever they exit while the main containers run, get SIGTERM (last
  defined first, each after the previous exited) once every main container has
  ended, SIGKILL after the grace period; their statuses go in
  ``initContainerStatuses``, and the pod's phase comes from the main containers,
  set once the sidecars have stopped (kubelet ``getPhase``).  Readiness and
  liveness probes are not run: a running container is ready;
* ``emptyDir`` volumes are per-pod host directories (``<workdir>/<ns>_<pod>/
  volumes/<name>``); a container's ``mountPath`` of one is rewritten to that
  directory where it begins a path in the container's ``command``, ``args``,
  ``workingDir``, ``env`` values and exec probes;
* ``projected`` (serviceAccountToken by TokenRequest with the source's audience,
  expiry and pod binding; configMap, secret, downwardAPI), ``configMap``,
  ``secret`` and ``downwardAPI`` volumes are written as the kubelet writes them
  (:mod:`localdev.cluster.volumes`) and bind-mounted at the container's
  ``mountPath`` in a private mount namespace of the container's process
  (:mod:`localdev.cluster.mounts`), with the pod's own ``/etc/hosts`` there
  too: the host's, the pod name on its IP, ``hostAliases`` and the runner's
  ``--host-alias`` entries (Service names such as the Trainer's
  ``<svc>.<ns>.svc`` on the loopback address its process listens on).  Nothing
  the controllers injected (env, mounts) is rewritten.  A pod waits, as with a
  kubelet, while a ConfigMap or Secret its volumes need does not exist;
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
* when the pod is deleted it sends SIGTERM (to sidecars once the other
  containers exited), SIGKILL after the grace period, reports the termination
  and then deletes the pod with grace period 0, as the kubelet confirms a deletion.

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
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from exporter_lib.pod import kubelet_hostname
from localdev.cluster import crilog, processes
from localdev.cluster.mounts import private_mount_prefix, with_bind_mounts
from localdev.cluster.volumes import VolumeNotReady, VolumeWriter, bind_mounts, hosts_file

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
#: kwok's Logs objects (``kwok.x-k8s.io/v1alpha1``), one per pod, named as the pod.
KWOK_GROUP, KWOK_VERSION, KWOK_LOGS = "kwok.x-k8s.io", "v1alpha1", "logs"
#: How long an exited container's output pipes may still deliver bytes (a forked
#: helper can hold them open) before its termination is reported.
PUMP_JOIN_SECONDS = 2.0
#: Wait before trying again to write the volumes of a pod whose sources are missing.
VOLUME_RETRY_SECONDS = 1.0
#: Where the pod's hosts file is mounted.
HOSTS_PATH = "/etc/hosts"
WATCH_TIMEOUT_SECONDS = 60
#: Client-side read timeout of the pod watch: longer than the server's own end of it, so
#: only a connection that went silent (no event, no end) trips it and is relisted.
WATCH_READ_TIMEOUT_SECONDS = WATCH_TIMEOUT_SECONDS + 30
#: File in the work directory the runner touches on every loop (its liveness).
HEARTBEAT_FILE = ".heartbeat"
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


def translate_mounts(text: str, mounts: list[tuple[str, str]]) -> str:
    """``text`` with each ``mountPath`` that begins a path replaced by its host directory.

    ``mounts`` are ``(mountPath, host directory)`` pairs; one pass, longest first, so
    a host directory put in is never rewritten again.
    """
    if not mounts:
        return text
    hosts = dict(mounts)
    alternatives = "|".join(re.escape(m) for m in sorted(hosts, key=len, reverse=True))
    pattern = re.compile(rf"(?<![^\s=:,'\"])({alternatives})(?=/|$|[\s:,'\"])")
    return pattern.sub(lambda match: hosts[match.group(1)], text)


#: Kinds of container: a main container, an ordinary init container, a native sidecar.
MAIN, INIT, SIDECAR = "main", "init", "sidecar"


@dataclass
class ContainerRun:
    """One container of a pod, run as a local process."""

    name: str
    spec: dict[str, Any]
    log: Path
    message_file: Path
    kind: str = MAIN
    proc: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    restart_count: int = 0
    terminated: dict[str, Any] | None = None
    last_terminated: dict[str, Any] | None = None
    restart_at: float | None = None
    probed: bool = True  # the startupProbe passed (or there is none)
    probe_at: float = 0.0
    probe_failures: int = 0
    term_sent: bool = False
    cri_dir: Path | None = None  # <workdir>/logs/<ns>_<pod>_<uid>/<container>
    pumps: list[threading.Thread] = field(default_factory=list)
    writer: crilog.CriLogWriter | None = None

    def cri_log(self, restart: int) -> str:
        """The CRI log file of the ``restart``-th start ("" before any)."""
        return "" if self.cri_dir is None or restart < 0 else str(self.cri_dir / f"{restart}.log")

    @property
    def started(self) -> bool:
        """Running and past its startupProbe: the kubelet's ``started``."""
        return self.proc is not None and self.probed

    def terminate_once(self) -> None:
        """SIGTERM the running process, unless it already got one."""
        if self.proc is not None and not self.term_sent:
            processes.signal_group(self.proc, signal.SIGTERM)
            self.term_sent = True

    @property
    def ended(self) -> bool:
        """Exited and not about to start again."""
        return self.proc is None and self.restart_at is None and self.terminated is not None


@dataclass
class PodRun:
    """A pod of the runner node and its containers."""

    uid: str
    pod: dict[str, Any]
    containers: dict[str, ContainerRun] = field(default_factory=dict)
    inits: list[ContainerRun] = field(default_factory=list)
    init_index: int = 0
    mains_started: bool = False
    init_failed: bool = False
    sidecar_kill_at: float | None = None
    started: bool = False
    kill_at: float | None = None
    reported: bool = False
    deleted: bool = False
    volumes: dict[str, Path] = field(default_factory=dict)
    hosts: Path | None = None
    volume_retry_at: float | None = None

    @property
    def key(self) -> str:
        meta = self.pod["metadata"]
        return f"{meta['namespace']}/{meta['name']}"

    def all(self) -> list[ContainerRun]:
        return [*self.inits, *self.containers.values()]

    def running(self) -> list[ContainerRun]:
        return [c for c in self.all() if c.proc is not None]

    def sidecars(self) -> list[ContainerRun]:
        return [c for c in self.inits if c.kind == SIDECAR]

    def mains_ended(self) -> bool:
        """Every main container ran and ended (or an init container failed for good)."""
        return self.init_failed or (
            self.mains_started and all(c.ended for c in self.containers.values()))


class PodRunner:
    """Runs the pods bound to ``node`` (see the module docstring)."""

    def __init__(self, api: client.ApiClient, node: str, workdir: Path,
                 host_aliases: list[tuple[str, list[str]]] | None = None) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.node = node
        self.workdir = workdir
        self.host_aliases = host_aliases or []
        self.volume_writer = VolumeWriter(self.core, self._value_from)
        self.mount_prefix = private_mount_prefix()
        if self.mount_prefix is None:
            print("no private mount namespace (unshare missing or refused): file volumes "
                  "and the pod hosts file are not mounted", flush=True)
        self.pods: dict[str, PodRun] = {}
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.stopping = threading.Event()
        self._logged_failures: set[tuple[str, str, str]] = set()

    # ----------------------------------------------------------------- watch

    def _watch(self) -> None:
        """List then watch this node's pods forever; events go to :attr:`events`."""
        selector = f"spec.nodeName={self.node}"
        while not self.stopping.is_set():
            try:
                listed = self.core.list_pod_for_all_namespaces(
                    field_selector=selector, _request_timeout=(10, WATCH_READ_TIMEOUT_SECONDS))
                seen = set()
                for pod in listed.items:
                    body = self.api.sanitize_for_serialization(pod)
                    seen.add(body["metadata"]["uid"])
                    self.events.put(("MODIFIED", body))
                self.events.put(("SYNC", {"uids": sorted(seen)}))
                stream = watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces, field_selector=selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=WATCH_TIMEOUT_SECONDS,
                    _request_timeout=(10, WATCH_READ_TIMEOUT_SECONDS))
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
        # Touched every loop: a stuck runner is told from a dead one (Cluster.check_running).
        heartbeat = ready_file.with_name(HEARTBEAT_FILE)
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
                # As a kubelet: one pod's failure is that pod's, never the node's.
                try:
                    self._on_event(kind, obj)
                except Exception:
                    self._failed(obj.get("metadata", {}).get("uid", ""), f"{kind} event")
            for run in list(self.pods.values()):
                try:
                    if (not run.started and run.volume_retry_at is not None
                            and time.monotonic() >= run.volume_retry_at
                            and run.kill_at is None and run.uid in self.pods):
                        self._start_pod(run)
                    self._tick(run)
                except Exception:
                    self._failed(run.uid, "tick")
            heartbeat.touch()

    def _failed(self, uid: str, what: str) -> None:
        """Log an unexpected error of one pod's handling, once per pod and kind of error
        (a tick repeats every :data:`TICK_SECONDS`), with its traceback."""
        error = sys.exc_info()[1]
        key = (uid, what, type(error).__name__)
        if key in self._logged_failures:
            return
        self._logged_failures.add(key)
        run = self.pods.get(uid)
        print(f"pod {run.key if run else uid}: {what} failed, the runner goes on:\n"
              f"{traceback.format_exc()}", flush=True)

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
            self._join_pumps(container)
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
                # Sidecars last: they get SIGTERM once the other containers exited (_tick).
                for container in run.running():
                    assert container.proc is not None
                    if container.kind != SIDECAR:
                        processes.signal_group(container.proc, signal.SIGTERM)
                for container in run.all():
                    container.restart_at = None
            return
        if not run.started and status.get("phase") == "Running" and status.get("podIP"):
            self._start_pod(run)

    # ----------------------------------------------------------------- containers

    def _start_pod(self, run: PodRun) -> None:
        meta, spec = run.pod["metadata"], run.pod["spec"]
        base = self._pod_dir(run)
        base.mkdir(parents=True, exist_ok=True)
        if self.mount_prefix is not None:
            try:
                run.volumes = self.volume_writer.write(run.pod, base / "files")
            except (VolumeNotReady, client.ApiException) as exc:
                # As the kubelet: the pod waits for what its volumes need.
                if run.volume_retry_at is None:
                    print(f"pod {run.key}: volumes not ready, waiting: {exc}", flush=True)
                run.volume_retry_at = time.monotonic() + VOLUME_RETRY_SECONDS
                return
            run.hosts = base / "hosts"
            with open("/etc/hosts") as host_file:
                run.hosts.write_text(hosts_file(run.pod, self.host_aliases, host_file.read()))
        run.started = True
        run.volume_retry_at = None
        for volume in spec.get("volumes") or []:
            if "emptyDir" in volume:
                (base / "volumes" / volume["name"]).mkdir(parents=True, exist_ok=True)

        def container(c: dict[str, Any], kind: str) -> ContainerRun:
            return ContainerRun(
                name=c["name"], spec=c, kind=kind,
                log=self.workdir / f"{meta['namespace']}_{meta['name']}_{c['name']}.log",
                message_file=base / f"{c['name']}.termination-log",
                cri_dir=self.workdir / "logs" / f"{meta['namespace']}_{meta['name']}_{run.uid}"
                / c["name"])

        run.inits = [container(c, SIDECAR if c.get("restartPolicy") == "Always" else INIT)
                     for c in spec.get("initContainers") or []]
        run.containers = {c["name"]: container(c, MAIN) for c in spec["containers"]}
        self._advance(run)
        self._report(run)

    def _pod_dir(self, run: PodRun) -> Path:
        meta = run.pod["metadata"]
        return self.workdir / f"{meta['namespace']}_{meta['name']}"

    def _advance(self, run: PodRun) -> bool:
        """Start what may start now: the next init container, then the main containers.

        Returns True when something started.
        """
        if not run.started or run.kill_at is not None or run.init_failed:
            return False  # not started: kwok has not given the pod its IP yet
        changed = False
        while run.init_index < len(run.inits):
            init = run.inits[run.init_index]
            if not init.started_at:
                self._start_container(run, init)
                changed = True
            if init.kind == SIDECAR:
                if not init.started:
                    return changed
            elif not init.ended or (init.terminated or {}).get("exitCode") != 0:
                return changed  # running, restarting, or failed for good (_tick decides)
            run.init_index += 1
        if not run.mains_started:
            run.mains_started = True
            for main in run.containers.values():
                self._start_container(run, main)
            changed = True
        return changed

    def _mounts(self, run: PodRun, spec: dict[str, Any]) -> list[tuple[str, str]]:
        """``(mountPath, host directory)`` of the container's emptyDir mounts."""
        empty = {v["name"] for v in run.pod["spec"].get("volumes") or [] if "emptyDir" in v}
        mounts = []
        for mount in spec.get("volumeMounts") or []:
            if mount.get("name") in empty and mount.get("mountPath"):
                host = self._pod_dir(run) / "volumes" / mount["name"]
                if mount.get("subPath"):
                    host = host / mount["subPath"]
                host.mkdir(parents=True, exist_ok=True)
                mounts.append((mount["mountPath"].rstrip("/") or "/", str(host)))
        return mounts

    def _env(self, run: PodRun, spec: dict[str, Any], message_file: Path,
             mounts: list[tuple[str, str]]) -> dict[str, str]:
        pod = run.pod
        env = {k: v for k, v in os.environ.items() if k in HOST_ENV or k.startswith("LC_")}
        # As the container runtime does: the exporter states it as the answering pod.
        env["HOSTNAME"] = kubelet_hostname(pod["metadata"]["name"], pod["spec"].get("hostname"))
        for source in spec.get("envFrom") or []:
            data = self._env_from(pod["metadata"]["namespace"], source)
            prefix = source.get("prefix", "")
            env.update({prefix + k: v for k, v in data.items()})
        for var in spec.get("env") or []:
            if "value" in var:
                env[var["name"]] = expand(translate_mounts(var["value"], mounts), env)
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
        mounts = self._mounts(run, spec)
        env = self._env(run, spec, container.message_file, mounts)
        argv = [expand(translate_mounts(a, mounts), env)
                for a in (spec.get("command") or []) + (spec.get("args") or [])]
        container.message_file.unlink(missing_ok=True)
        container.started_at = _now()
        container.terminated = None
        container.term_sent = False
        probe = spec.get("startupProbe") if container.kind == SIDECAR else None
        container.probed = probe is None
        container.probe_failures = 0
        container.probe_at = time.monotonic() + float((probe or {}).get("initialDelaySeconds", 0))
        if not spec.get("command"):
            container.terminated = self._cannot_run(
                container, "the pod runner needs an explicit command (no image entrypoint here)")
            return
        workdir = Path(translate_mounts(spec.get("workingDir") or "", mounts)
                       or container.message_file.parent)
        if not workdir.is_dir():
            workdir = container.message_file.parent
        if self.mount_prefix is not None and (run.volumes or run.hosts):
            # The program is looked up here, so a missing one is still a StartError.
            if shutil.which(argv[0], path=env.get("PATH")) is None:
                container.terminated = self._cannot_run(container, f"{argv[0]}: not found")
                return
            binds: list[tuple[Path | str, Path | str]] = list(
                bind_mounts(spec, run.volumes))
            if run.hosts is not None:
                binds.append((run.hosts, HOSTS_PATH))
            argv = with_bind_mounts(self.mount_prefix, binds, argv)
        try:
            container.proc = processes.spawn(argv, None, env=env, cwd=workdir)
        except OSError as exc:
            container.terminated = self._cannot_run(container, f"{argv[0]}: {exc}")
            return
        self._pump_output(run, container)

    def _pump_output(self, run: PodRun, container: ContainerRun) -> None:
        """Store the new process's stdout and stderr as CRI entries (threads), name the file."""
        assert container.proc is not None and container.cri_dir is not None
        plain = open(container.log, "ab")  # noqa: SIM115 - closed by _join_pumps
        container.writer = crilog.CriLogWriter(
            Path(container.cri_log(container.restart_count)), plain=plain)
        container.pumps = []
        for stream, pipe in ((crilog.STDOUT, container.proc.stdout),
                             (crilog.STDERR, container.proc.stderr)):
            assert pipe is not None
            thread = threading.Thread(
                target=crilog.pump, args=(os.dup(pipe.fileno()), stream, container.writer),
                name=f"log-{run.key}-{container.name}-{stream}", daemon=True)
            pipe.close()
            thread.start()
            container.pumps.append(thread)
        self._name_logs(run)

    @staticmethod
    def _join_pumps(container: ContainerRun) -> None:
        deadline = time.monotonic() + PUMP_JOIN_SECONDS
        for thread in container.pumps:
            thread.join(max(0.0, deadline - time.monotonic()))
        container.pumps = []
        if container.writer is not None:
            plain = container.writer.plain
            container.writer.close()
            if plain is not None:
                plain.close()
            container.writer = None

    def _name_logs(self, run: PodRun) -> None:
        """Create or update the pod's kwok ``Logs`` object: each container's CRI file."""
        meta = run.pod["metadata"]
        logs = [{"containers": [c.name], "logsFile": c.cri_log(c.restart_count),
                 "previousLogsFile": c.cri_log(c.restart_count - 1), "follow": True}
                for c in run.all() if c.started_at]
        body = {"apiVersion": f"{KWOK_GROUP}/{KWOK_VERSION}", "kind": "Logs",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                                  "name": meta["name"], "uid": run.uid}]},
                "spec": {"logs": logs}}
        custom = client.CustomObjectsApi(self.api)
        try:
            try:
                custom.create_namespaced_custom_object(KWOK_GROUP, KWOK_VERSION,
                                                       meta["namespace"], KWOK_LOGS, body)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
                custom.patch_namespaced_custom_object(KWOK_GROUP, KWOK_VERSION,
                                                      meta["namespace"], KWOK_LOGS,
                                                      meta["name"], {"spec": body["spec"]})
        except Exception as exc:  # the container runs on; only kubectl logs lacks it
            print(f"pod {run.key}: Logs object not written: {exc}", flush=True)

    def _cannot_run(self, container: ContainerRun, message: str) -> dict[str, Any]:
        with open(container.log, "a") as log:
            log.write(f"pod runner: {message}\n")
        return {"exitCode": 128, "reason": "StartError", "message": message[:MESSAGE_LIMIT_BYTES],
                "startedAt": container.started_at, "finishedAt": _now()}

    def _tick(self, run: PodRun) -> None:
        changed = False
        restart_policy = run.pod["spec"].get("restartPolicy", "Always")
        for container in run.all():
            if container.proc is not None and container.proc.poll() is not None:
                self._exited(run, container, restart_policy)
                changed = True
            if (container.proc is not None and not container.probed
                    and time.monotonic() >= container.probe_at):
                changed |= self._probe_step(run, container)
            if container.restart_at is not None and time.monotonic() >= container.restart_at:
                container.restart_at = None
                container.last_terminated = container.terminated
                container.restart_count += 1
                self._start_container(run, container)
                changed = True
        changed |= self._advance(run)
        if run.kill_at is not None:
            if not [c for c in run.running() if c.kind != SIDECAR]:
                for sidecar in run.running():
                    sidecar.terminate_once()
            if run.running() and time.monotonic() >= run.kill_at:
                for container in run.running():
                    assert container.proc is not None
                    processes.signal_group(container.proc, signal.SIGKILL)
            if not run.running():
                if run.started and not run.reported:
                    self._report(run)
                self._delete(run)
            return
        if run.mains_ended():
            changed |= self._stop_sidecars(run)
        if changed:
            self._report(run)

    def _exited(self, run: PodRun, container: ContainerRun, restart_policy: str) -> None:
        assert container.proc is not None
        code = container.proc.returncode
        processes.forget(container.proc)
        self._join_pumps(container)
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
        if run.kill_at is not None:
            return
        if container.kind == SIDECAR:
            restart = not container.term_sent and not run.mains_ended()
        elif container.kind == INIT:
            restart = exit_code != 0 and restart_policy != "Never"
            run.init_failed = exit_code != 0 and restart_policy == "Never"
        else:
            restart = restart_policy == "Always" or (
                restart_policy == "OnFailure" and exit_code != 0)
        if restart:
            container.restart_at = time.monotonic() + RESTART_DELAY_SECONDS

    def _stop_sidecars(self, run: PodRun) -> bool:
        """The main containers ended: stop the sidecars, last defined first."""
        changed = False
        for sidecar in run.sidecars():
            if sidecar.restart_at is not None:  # no restart once the pod is done
                sidecar.restart_at = None
                changed = True
        running = [c for c in run.sidecars() if c.proc is not None]
        if not running:
            return changed
        if run.sidecar_kill_at is None:
            grace = run.pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
            run.sidecar_kill_at = time.monotonic() + float(grace)
        running[-1].terminate_once()
        if time.monotonic() >= run.sidecar_kill_at:
            for sidecar in running:
                assert sidecar.proc is not None
                processes.signal_group(sidecar.proc, signal.SIGKILL)
        return changed

    # ----------------------------------------------------------------- probes

    def _probe_step(self, run: PodRun, container: ContainerRun) -> bool:
        """Run the startupProbe once; True when it passed (the container is started)."""
        probe = container.spec["startupProbe"]
        if self._probe(run, container, probe):
            container.probed = True
            return True
        container.probe_failures += 1
        threshold = int(probe.get("failureThreshold", 3))
        if container.probe_failures >= threshold:
            with open(container.log, "a") as log:
                log.write(f"pod runner: startup probe failed {threshold} times; killing\n")
            assert container.proc is not None
            processes.signal_group(container.proc, signal.SIGKILL)
            container.probe_at = float("inf")  # its exit restarts it, with a fresh probe
        else:
            container.probe_at = time.monotonic() + float(probe.get("periodSeconds", 10))
        return False

    def _probe(self, run: PodRun, container: ContainerRun, probe: dict[str, Any]) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        pod_ip = run.pod["status"]["podIP"]
        try:
            if "httpGet" in probe:
                get = probe["httpGet"]
                scheme = str(get.get("scheme", "HTTP")).lower()
                url = (f"{scheme}://{get.get('host') or pod_ip}:"
                       f"{_port(container.spec, get['port'])}{get.get('path', '/')}")
                headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
                # The kubelet does not verify an HTTPS probe's certificate either.
                context = ssl._create_unverified_context() if scheme == "https" else None
                request = urllib.request.Request(url, headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=timeout,
                                                context=context) as response:
                        return 200 <= int(response.status) < 400
                except urllib.error.HTTPError as exc:
                    return 200 <= exc.code < 400
            if "tcpSocket" in probe:
                tcp = probe["tcpSocket"]
                address = (tcp.get("host") or pod_ip, _port(container.spec, tcp["port"]))
                socket.create_connection(address, timeout=timeout).close()
                return True
            if "exec" in probe:
                mounts = self._mounts(run, container.spec)
                argv = [translate_mounts(a, mounts) for a in probe["exec"]["command"]]
                env = self._env(run, container.spec, container.message_file, mounts)
                return subprocess.run(argv, env=env, capture_output=True, timeout=timeout,
                                      check=False).returncode == 0
        except (OSError, ValueError, KeyError, subprocess.SubprocessError):
            return False
        with open(container.log, "a") as log:
            log.write(f"pod runner: unsupported probe {sorted(probe)}: it never passes\n")
        return False

    # ----------------------------------------------------------------- status

    def _container_status(self, container: ContainerRun) -> dict[str, Any]:
        status: dict[str, Any] = {
            "name": container.name, "image": container.spec.get("image", ""), "imageID": "",
            "containerID": f"podrunner://{container.name}-{container.restart_count}",
            "restartCount": container.restart_count,
        }
        if not container.started_at:
            status.update(ready=False, started=False,
                          state={"waiting": {"reason": "PodInitializing"}})
        elif container.proc is not None or container.restart_at is not None:
            status.update(ready=container.started, started=container.started,
                          state={"running": {"startedAt": container.started_at}}
                          if container.proc is not None else
                          {"waiting": {"reason": "CrashLoopBackOff"}})
        else:
            status.update(ready=False, started=False,
                          state={"terminated": container.terminated or {}})
        if container.last_terminated is not None:
            status["lastState"] = {"terminated": container.last_terminated}
        return status

    @staticmethod
    def _merged(current: list[dict[str, Any]], ours: dict[str, dict[str, Any]]
                ) -> list[dict[str, Any]]:
        names = {s["name"] for s in current}
        return [ours.get(s["name"], s) for s in current] + [
            s for n, s in ours.items() if n not in names]

    def _report(self, run: PodRun) -> None:
        """Write the containers' states (and a terminal phase once all ended) to the pod."""
        current = run.pod.get("status") or {}
        mains = {c.name: self._container_status(c) for c in run.containers.values()}
        inits = {c.name: self._container_status(c) for c in run.inits}
        patch: dict[str, Any] = {
            "containerStatuses": self._merged(current.get("containerStatuses") or [], mains)}
        if inits:
            patch["initContainerStatuses"] = self._merged(
                current.get("initContainerStatuses") or [], inits)
        # As kubelet getPhase: running sidecars keep the pod Running; their exit codes
        # never decide the phase.
        ended = run.mains_ended() and not any(
            c.proc is not None or c.restart_at is not None for c in run.all())
        now = _now()
        ready = "True" if run.mains_started and all(
            s.get("ready") for s in mains.values()) and all(
            c.started for c in run.sidecars()) else "False"
        wanted = {"Ready": ready, "ContainersReady": ready,
                  "Initialized": "True" if run.mains_started else "False"}
        conditions = [dict(c) for c in current.get("conditions") or []]
        for cond in conditions:
            if cond.get("type") in wanted and cond.get("status") != wanted[cond["type"]]:
                cond.update(status=wanted[cond["type"]], lastTransitionTime=now)
        patch["conditions"] = conditions
        if ended:
            failed = run.init_failed or any((c.terminated or {}).get("exitCode")
                                            for c in run.containers.values())
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


def _port(spec: dict[str, Any], port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ``ports``.

    Raises:
        ValueError: a name the container does not declare.
    """
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in spec.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f"no container port named {port!r}")


def main(argv: list[str] | None = None) -> int:
    """Run the pod runner until SIGTERM or SIGINT; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m localdev.cluster.podrunner",
                                     description="The container runtime of the runner node.")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node", required=True, help="the node whose pods this runs")
    parser.add_argument("--workdir", type=Path, required=True,
                        help="directory for container logs and termination message files")
    parser.add_argument("--host-alias", action="append", default=[], metavar="IP=NAME[,NAME]",
                        help="an entry of every pod's /etc/hosts (repeatable)")
    args = parser.parse_args(argv)
    aliases = []
    for entry in args.host_alias:
        address, sep, names = entry.partition("=")
        if not sep or not address or not names:
            parser.error(f"--host-alias {entry!r}: expected IP=NAME[,NAME]")
        aliases.append((address, names.split(",")))
    args.workdir.mkdir(parents=True, exist_ok=True)
    api = config.new_client_from_config(config_file=args.kubeconfig)
    runner = PodRunner(api, args.node, args.workdir, aliases)

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
