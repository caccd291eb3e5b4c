"""The local cluster with its controllers: TrainJobs go through the real chain.

On top of :class:`~localdev.cluster.controlplane.ControlPlane` (etcd +
kube-apiserver), :class:`Cluster` starts, all built from Go modules by
``scripts/stack-assets``:

* kube-controller-manager (Job, garbage collector, namespace, ServiceAccount
  and token controllers, ...), kube-scheduler;
* kwok, which plays the kubelet of fake nodes (node status and lease, pod IPs
  from the node's loopback ``podCIDR``, pod start and end) using the Stage
  objects kwok ships, and serves the nodes' kubelet endpoint: ``pods/log``
  requests are answered from the CRI log files named by ``Logs`` objects;
* the JobSet controller (v0.12.0) and the Kubeflow Trainer controller (v2.3.0;
  v2.0.0 for the "before-v2.2" flavour), with the CRDs, admission webhooks and
  ClusterTrainingRuntimes their modules ship, unchanged;
* with ``push=True``, the Trainer's ``TrainJobStatus`` feature gate on: its status
  server serves (TLS, projected ServiceAccount tokens checked by OIDC discovery of
  the API server's issuer) and trainer pods push to it;
* with ``kueue=True``, Kueue (v0.17.0) with its TrainJob integration
  (:mod:`localdev.cluster.kueue`): its shipped CRDs and webhooks, as JobSet's;
* the pod runner (:mod:`localdev.cluster.podrunner`), the container runtime of
  the runner node: it runs a pod's container command as a local process.

Nodes: ``kwok-node-0`` (pods are simulated end to end by kwok's stages) and
``runner-node-0`` (tainted :data:`RUNNER_TAINT_KEY`; kwok gives its pods their
IP and Running state, the pod runner runs them and owns their end).  A pod goes
to the runner node through the TrainJob: Trainer v2.3.0's ``runtimePatches``
(:func:`runner_runtime_patches`), v2.0.0's ``podSpecOverrides``
(:func:`runner_pod_overrides`); both set a node selector and a toleration.

Every process runs in its own process group with PDEATHSIG
(:mod:`localdev.cluster.processes`), so none outlives the caller.  The
controllers use the admin kubeconfig (the RBAC of their real deployments is
not exercised here).
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from localdev.cluster import podrunner, processes
from localdev.cluster.controlplane import ControlPlane, ControlPlaneError
from localdev.cluster.crds import (
    FLAVOUR_CURRENT,
    FLAVOUR_LEGACY,
    FLAVOURS,
    install_crd,
    install_shipped_crds,
    load_yaml_file,
    trainer_manifests,
    trainjob_crd,
    wait_trainer_status_schema,
)
from localdev.cluster.kueue import (
    KUEUE_BINARY,
    KUEUE_FEATURE_GATES,
    KUEUE_METRICS_CERT_DIR,
    KUEUE_NAMESPACE,
    kueue_configuration,
)
from localdev.cluster.mounts import private_mount_prefix, with_bind_mounts
from localdev.cluster.pki import serving_pki

#: Fake nodes.  Their pod CIDRs are loopback ranges: a process bound to a pod IP
#: is reached over ``lo`` like any 127.0.0.0/8 address.  These are the defaults'
#: shapes; each cluster picks its own pair (:func:`pod_cidrs`), so exporters of two
#: clusters on one machine do not get the same pod IP and port.
KWOK_NODE = "kwok-node-0"
KWOK_NODE_CIDR = "127.0.20.0/24"
RUNNER_NODE = "runner-node-0"
RUNNER_NODE_CIDR = "127.0.21.0/24"
#: Capacity of each fake node (kwok's defaults plus GPUs the shipped runtimes request).
NODE_CAPACITY = {"cpu": "1k", "memory": "1Ti", "pods": "1M", "nvidia.com/gpu": "64"}
#: Label kwok manages nodes by.
KWOK_NODE_LABEL = "type"
KWOK_NODE_LABEL_VALUE = "kwok"
#: Label and NoSchedule taint of the runner node: only pods that select and
#: tolerate it land there, so nothing else is run as a local process.
RUNNER_TAINT_KEY = "trainjob-progress.dev/pod-runner"
#: Namespace and names the Trainer controller hard-codes (v2.0.0) or defaults to (v2.3.0,
#: ``pkg/apis/config/v1alpha1/defaults.go``; the namespace is read from the
#: ServiceAccount namespace file, ``pkg/util/cert/cert.go``).
TRAINER_NAMESPACE = "kubeflow-system"
TRAINER_SERVICE_ACCOUNT = "kubeflow-trainer-controller-manager"
TRAINER_WEBHOOK_SECRET = "kubeflow-trainer-webhook-cert"
TRAINER_WEBHOOK_SERVICE = "kubeflow-trainer-controller-manager"
TRAINER_WEBHOOK_CONFIGURATION = "validator.trainer.kubeflow.org"
TRAINER_CA_NAME = "kubeflow-trainer-ca"
#: The serving-certificate directory of Trainer v2.0.0 and v2.3.0: its certificate
#: rotator writes to this compiled-in path (``pkg/util/cert/cert.go``) while its webhook
#: server reads controller-runtime's default, ``k8s-webhook-server/serving-certs`` under
#: Go's ``os.TempDir()``, which is ``$TMPDIR`` when set.  So the controller runs with
#: ``TMPDIR=/tmp`` (:data:`TRAINER_TMPDIR`): with the caller's ``TMPDIR`` elsewhere it
#: failed to start ("open $TMPDIR/k8s-webhook-server/serving-certs/tls.crt: no such file
#: or directory").  v2.3.0's status server serves the same
#: certificate (``cert.SetupTLSConfig``).
TRAINER_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
TRAINER_TMPDIR = "/tmp"
#: Where a pod's process finds its ServiceAccount token and namespace; Trainer v2.3.0
#: reads both at these compiled-in paths (``pkg/statusserver/auth.go``, ``pkg/util/cert``).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: The Trainer v2.3.0 feature gate of the push status server (Alpha, off by default).
TRAINER_STATUS_GATE = "TrainJobStatus"
#: Lifetime of the controller's own ServiceAccount token; it is read once, when the
#: status server starts (seconds).
CONTROLLER_TOKEN_SECONDS = 24 * 3600
#: The Trainer v2.0.0 binary in the bundle (``scripts/stack-assets``).
LEGACY_TRAINER_BINARY = "trainer-controller-manager-v2.0.0"
#: cert-controller replaces certificates valid for less than 90 days.
TRAINER_CERT_DAYS = 730
#: Give up waiting for a controller to be ready after this many seconds.
READY_TIMEOUT_SECONDS = 120.0
#: Name of the pod runner among the stack's processes (its log: ``<workdir>/pod-runner.log``).
POD_RUNNER = "pod-runner"
#: A pod runner whose loop (a turn every 0.1 s) has not turned for this long is stuck.
POD_RUNNER_STUCK_SECONDS = 60.0
#: kwok's defaults set explicitly (a config file gets no defaults for them);
#: one pod at a time, since parallel pod stages handed two pods the same IP.
KWOK_OPTIONS = {
    "cidr": KWOK_NODE_CIDR,
    "nodeIP": "127.0.0.1",
    "manageAllNodes": False,
    "manageNodesWithLabelSelector": f"{KWOK_NODE_LABEL}={KWOK_NODE_LABEL_VALUE}",
    "podPlayStageParallelism": 1,
    "nodePlayStageParallelism": 1,
    "nodeLeaseParallelism": 1,
    "podsOnNodeSyncParallelism": 1,
    "nodeLeaseDurationSeconds": 40,
    # Its server answers the API server's pods/log requests (the node's kubelet
    # endpoint) from the files the pod runner's Logs objects name.
    "enableDebuggingHandlers": True,
    "enableCRDs": ["Logs"],
}
#: kwok's CRDs in use (under the bundle's ``manifests/kwok/crd``).
KWOK_CRDS = ("kwok.x-k8s.io_logs.yaml",)
#: kwok's shipped stages in use (under the bundle's ``manifests/kwok/stage``).
KWOK_NODE_STAGES = ("node/fast/node-initialize.yaml",
                    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml")
KWOK_POD_STAGES = ("pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml",
                   "pod/fast/pod-delete.yaml")
#: Pod stages that end a pod: the runner node's pods are excluded from them.
KWOK_ENDING_STAGES = ("pod-complete", "pod-delete")


def pod_cidrs() -> tuple[str, str]:
    """A random pair of loopback /24s for the kwok and the runner node of one cluster
    (``127.<64..191>.<0..254>.0/24`` and the next /24): concurrent clusters on one
    machine (tests of several engineers) then hand their pods different IPs."""
    second, third = secrets.choice(range(64, 192)), secrets.choice(range(0, 254, 2))
    return f"127.{second}.{third}.0/24", f"127.{second}.{third + 1}.0/24"


def trainer_configuration(*, webhook_port: int, probe_port: int, status_port: int,
                          push: bool, status_qps: float | None = None,
                          status_burst: int | None = None) -> dict[str, Any]:
    """Trainer v2.3.0's ``--config`` file (``config.trainer.kubeflow.org/v1alpha1``).

    The shipped ``manifests/base/manager/controller_manager_config.yaml`` with the
    ports of this cluster (free loopback ports: several clusters share the
    machine, so the status server's default 10443 is not used), no leader
    election, no metrics server, and the ``TrainJobStatus`` gate set to ``push``.
    Every other value stays the shipped default (certificate management on,
    status server QPS 5, burst 10), unless ``status_qps``/``status_burst`` set the
    status server client's documented ``statusServer.qps``/``burst``
    (``pkg/apis/config/v1alpha1/configuration_types.go``).
    """
    status: dict[str, Any] = {"port": status_port}
    if status_qps is not None:
        status["qps"] = status_qps
    if status_burst is not None:
        status["burst"] = status_burst
    return {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1", "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1"},
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": True, "webhookServiceName": TRAINER_WEBHOOK_SERVICE,
                           "webhookSecretName": TRAINER_WEBHOOK_SECRET},
        "statusServer": status,
        "featureGates": {TRAINER_STATUS_GATE: push},
    }


def trainer_service_host() -> str:
    """The Service name the Trainer puts in ``KUBEFLOW_TRAINER_SERVER_URL``
    (``<webhook service>.<operator namespace>.svc``)."""
    return f"{TRAINER_WEBHOOK_SERVICE}.{TRAINER_NAMESPACE}.svc"


#: The manager name of the local cluster's TrainJob ``runtimePatches`` entry.
RUNTIME_PATCH_MANAGER = "trainjob-progress.dev/local-cluster"


def runner_runtime_patches(*jobs: str) -> list[dict[str, Any]]:
    """Trainer v2.3.0 TrainJob ``spec.runtimePatches`` that put the pods of ``jobs`` on
    the runner node (the field replaced ``podSpecOverrides``; one entry, manager
    :data:`RUNTIME_PATCH_MANAGER`).  Pods of other jobs stay on the kwok node.
    """
    pod_spec = {
        "nodeSelector": {RUNNER_TAINT_KEY: "true"},
        "tolerations": [{"key": RUNNER_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
    }
    return [{"manager": RUNTIME_PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": [{"name": job, "template": {"spec": {"template": {"spec": pod_spec}}}}
                           for job in jobs]}}}}]


def runner_pod_overrides(*jobs: str) -> list[dict[str, Any]]:
    """TrainJob ``spec.podSpecOverrides`` that put the pods of ``jobs`` on the runner node.

    ``jobs`` are replicated job names of the runtime (``node``, ``launcher``).
    Pods of other jobs (e.g. torchtune's initializers) stay on the kwok node,
    where kwok completes them.
    """
    return [{
        "targetJobs": [{"name": job} for job in jobs],
        "nodeSelector": {RUNNER_TAINT_KEY: "true"},
        "tolerations": [{"key": RUNNER_TAINT_KEY, "operator": "Exists",
                         "effect": "NoSchedule"}],
    }]


def kwok_stages(stage_dir: Path, runner_nodes: list[str]) -> list[dict[str, Any]]:
    """kwok's shipped node and pod stages; the ending pod stages skip ``runner_nodes``.

    The only change to the shipped files: ``pod-complete`` and ``pod-delete``
    get the selector expression ``.spec.nodeName NotIn runner_nodes``, so the
    pod runner alone ends (and deletes) the pods it runs.  ``pod-ready`` stays
    as shipped: kwok allocates every pod's IP from its node's ``podCIDR``.
    """
    stages = []
    for rel in (*KWOK_NODE_STAGES, *KWOK_POD_STAGES):
        stage = load_yaml_file(stage_dir / rel)
        if stage["metadata"]["name"] in KWOK_ENDING_STAGES:
            selector = stage["spec"].setdefault("selector", {})
            selector.setdefault("matchExpressions", []).append(
                {"key": ".spec.nodeName", "operator": "NotIn", "values": list(runner_nodes)})
        stages.append(stage)
    return stages


def webhook_configurations(rendered: str, port: int, ca_bundle: bytes,
                           name_prefix: str = "") -> list[dict[str, Any]]:
    """Webhook configurations from ``kubectl kustomize`` output, pointed at 127.0.0.1.

    Each webhook's ``clientConfig.service`` becomes ``url:
    https://127.0.0.1:<port><path>`` with ``caBundle`` (there is no Service
    and no cluster DNS here); everything else stays as shipped.
    """
    result = []
    for doc in yaml.safe_load_all(rendered):
        if not doc or doc.get("kind") not in ("MutatingWebhookConfiguration",
                                              "ValidatingWebhookConfiguration"):
            continue
        doc["metadata"] = {"name": name_prefix + doc["metadata"]["name"]}
        for hook in doc.get("webhooks", []):
            path = hook["clientConfig"].get("service", {}).get("path", "/")
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                                    "caBundle": base64.b64encode(ca_bundle).decode()}
        result.append(doc)
    return result


class Cluster(ControlPlane):
    """A :class:`ControlPlane` plus the controllers, kwok and the pod runner.

    ``flavour`` picks the Trainer: :data:`~localdev.cluster.crds.FLAVOUR_CURRENT`
    ("v2.2-and-later": Trainer v2.3.0, its CRDs, webhooks and runtimes as shipped,
    ``status.trainerStatus`` included) or :data:`~localdev.cluster.crds.FLAVOUR_LEGACY`
    ("before-v2.2": Trainer v2.0.0 and its manifests; its CRD has no
    ``trainerStatus``).  :meth:`install_flavour` swaps only the TrainJob CRD on a
    running cluster (the controller stays).

    ``push`` turns the v2.3.0 Trainer's ``TrainJobStatus`` gate on: its status
    server serves at :attr:`status_server_url` and the Trainer injects its URL, CA
    and a projected token into trainer containers, which the pod runner mounts.

    ``kueue`` also starts Kueue with its TrainJob integration (flavour
    :data:`~localdev.cluster.crds.FLAVOUR_CURRENT` only); the queues are the
    caller's (:func:`localdev.cluster.kueue.queue_objects`).

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, assets_dir: str | Path | None = None,
                 workdir: str | Path | None = None, *, flavour: str = FLAVOUR_CURRENT,
                 push: bool = False, kueue: bool = False,
                 audit_log: str | None = None) -> None:
        super().__init__(assets_dir, workdir, controllers=True, audit_log=audit_log)
        if flavour not in FLAVOURS:
            raise ValueError(f"flavour={flavour!r}: must be one of {FLAVOURS}")
        if push and flavour != FLAVOUR_CURRENT:
            raise ValueError(f"push=True needs flavour={FLAVOUR_CURRENT!r} (Trainer v2.3.0); "
                             f"Trainer v2.0.0 has no status server")
        if kueue and flavour != FLAVOUR_CURRENT:
            raise ValueError(f"kueue=True needs flavour={FLAVOUR_CURRENT!r} (Kueue's TrainJob "
                             "integration uses the v2.2+ TrainJob API)")
        self.flavour = flavour
        self.push = push
        self.kueue = kueue
        self.kwok_cidr, self.runner_cidr = pod_cidrs()
        """Pod CIDRs of the kwok node and the runner node (loopback, this cluster's own)."""
        self._trainer_flavour = flavour
        self.status_server_port: int | None = None
        """Port of the Trainer's status server (any interface; ``push`` only)."""
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._spawned: dict[str, tuple[list[str], dict[str, str] | None]] = {}
        self._jobset_probe = self._trainer_probe = self._kueue_probe = ""
        self._trainer_ca = b""
        self._trainer_ports = (0, 0)
        self.stack_startup_seconds: float | None = None
        """Wall time from the API server ready to the whole stack ready (seconds)."""

    # ----------------------------------------------------------------- lifecycle

    def _asset_parts(self) -> tuple[str, ...]:
        """Trainer v2.0.0 for the "before-v2.2" flavour, Kueue with ``kueue=True``."""
        return (*(("trainer-legacy",) if self.flavour == FLAVOUR_LEGACY else ()),
                *(("kueue",) if self.kueue else ()))

    def start(self) -> None:
        """Start the control plane, then the controllers; wait until all serve.

        Raises:
            AssetsError: the binaries cannot be found or built.
            ControlPlaneError: a process exited or did not become ready within
                :data:`READY_TIMEOUT_SECONDS`; the message quotes its log.
        """
        super().start()
        started = time.monotonic()
        try:
            self._start_stack()
        except BaseException:
            self.stop()
            raise
        self.stack_startup_seconds = time.monotonic() - started

    def _stop_processes(self) -> None:
        # Controllers first (the pod runner stops its containers), then the API server.
        for name in reversed(list(self._children)):
            processes.stop(self._children.pop(name))
        super()._stop_processes()

    @property
    def pids(self) -> list[int]:
        """Process ids of every process of the cluster (each leads its own group)."""
        return [*super().pids, *(p.pid for p in self._children.values())]

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self._spawned[name] = (args, env)
        self._children[name] = processes.spawn(args, self.workdir / f"{name}.log", env=env)

    def process_pid(self, name: str) -> int:
        """Process id of the stack's process ``name`` (e.g. ``trainer-controller-manager``).

        Raises:
            KeyError: no such process is running.
        """
        return self._children[name].pid

    def stop_component(self, name: str) -> None:
        """SIGTERM (then SIGKILL) one process of the stack, e.g. ``"trainer-controller-manager"``
        (with ``push`` its status server stops with it): a fault test's outage.

        Raises:
            KeyError: no running component of that name.
        """
        processes.stop(self._children.pop(name))

    def start_component(self, name: str) -> None:
        """Start a component stopped by :meth:`stop_component` again, with the same
        arguments (ports, certificates, ServiceAccount files); return once it is ready
        (the Trainer: its readiness probe, and with ``push`` its status server).

        Raises:
            KeyError: ``name`` was never started.
            ControlPlaneError: it exited or did not get ready in time.
        """
        if name not in self._children:
            args, env = self._spawned[name]
            if name == POD_RUNNER:
                self._pod_runner_ready.unlink(missing_ok=True)
            self._children[name] = processes.spawn(args, self.workdir / f"{name}.log", env=env)
        if name == POD_RUNNER:
            self._wait("pod runner", self._pod_runner_ready.exists)
        if name == KUEUE_BINARY:
            self._wait("Kueue controller", lambda: _http_ok(self._kueue_probe))
        if name == "trainer-controller-manager":
            self._wait("Trainer controller", lambda: _http_ok(self._trainer_probe))
            if self.push:
                self._wait("Trainer status server", self._status_server_serves)

    def restart_trainer(self, binary: Path | None = None, *, status_qps: float | None = None,
                        status_burst: int | None = None) -> None:
        """Stop the v2.3.0 Trainer controller and start it again with another binary
        (``None``: the bundle's) and status server ``qps``/``burst`` (``None``: the
        shipped defaults), the same ports, certificates and ServiceAccount files; return
        once it is ready (a benchmark's variants of push on one cluster).

        Raises:
            ValueError: the cluster runs the v2.0.0 Trainer (no status server).
            ControlPlaneError: it did not get ready again.
        """
        name = "trainer-controller-manager"
        if self.flavour != FLAVOUR_CURRENT or self.status_server_port is None:
            raise ValueError(f"restart_trainer needs flavour={FLAVOUR_CURRENT!r}")
        args, env = self._spawned[name]
        shipped = str(self.assets.require_stack()[name])
        current = next(a for a in args if Path(a).name == name)
        if name in self._children:
            self.stop_component(name)
        webhook_port, probe_port = self._trainer_ports
        (self.workdir / "trainer-config.yaml").write_text(yaml.safe_dump(trainer_configuration(
            webhook_port=webhook_port, probe_port=probe_port,
            status_port=self.status_server_port, push=self.push, status_qps=status_qps,
            status_burst=status_burst), sort_keys=False))
        chosen = str(binary) if binary is not None else shipped
        self._spawned[name] = ([chosen if a == current else a for a in args], env)
        self.start_trainer_again()

    def start_trainer_again(self, attempts: int = 4) -> None:
        """Start the stopped Trainer controller, up to ``attempts`` times 2 s apart: its
        status server listens on a fixed port of all interfaces, which an outgoing
        connection's ephemeral port may hold for a moment while it is down.

        Raises:
            ControlPlaneError: the last attempt did not get ready.
        """
        name = "trainer-controller-manager"
        for attempt in range(attempts):
            try:
                self.start_component(name)
                return
            except ControlPlaneError:
                if attempt == attempts - 1:
                    raise
                if name in self._children:
                    self.stop_component(name)
                time.sleep(2.0)

    def check_running(self) -> None:
        """Check that every process of the stack still runs and the pod runner's loop
        still turns (its heartbeat file is at most :data:`POD_RUNNER_STUCK_SECONDS` old).

        Raises:
            ControlPlaneError: a process exited or the pod runner is stuck; the message
                quotes its log.
        """
        self._check_children()
        heartbeat = self.workdir / "pods" / podrunner.HEARTBEAT_FILE
        with contextlib.suppress(FileNotFoundError):
            age = time.time() - heartbeat.stat().st_mtime
            if age > POD_RUNNER_STUCK_SECONDS:
                raise ControlPlaneError(f"pod runner: its loop has not turned for {age:.0f}s "
                                        f"(log {self._log_tail(POD_RUNNER)})")

    def restart_stopped(self) -> list[str]:
        """Start again every process of the stack that exited or was stopped and not
        started again (a stuck pod runner is stopped first), so the next user gets a
        whole stack; returns their names.

        Raises:
            ControlPlaneError: one did not get ready again.
        """
        restarted = []
        for name in list(self._spawned):
            proc = self._children.get(name)
            stuck = name == POD_RUNNER and self._pod_runner_stuck()
            if proc is not None and (proc.poll() is not None or stuck):
                processes.stop(self._children.pop(name))
            if name not in self._children:
                self.start_component(name)
                restarted.append(name)
        return restarted

    def _pod_runner_stuck(self) -> bool:
        heartbeat = self.workdir / "pods" / podrunner.HEARTBEAT_FILE
        try:
            return time.time() - heartbeat.stat().st_mtime > POD_RUNNER_STUCK_SECONDS
        except FileNotFoundError:
            return False

    def _log_tail(self, name: str, lines: int = 40) -> str:
        log = self.workdir / f"{name}.log"
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        return f"{log}):\n{tail}"

    def _check_children(self) -> None:
        for name, proc in self._children.items():
            if proc.poll() is not None:
                raise ControlPlaneError(f"{name} exited with code {proc.returncode} "
                                        f"(log {self._log_tail(name)}")

    def _wait(self, what: str, ready: Callable[[], bool],
              timeout: float = READY_TIMEOUT_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_children()
            with contextlib.suppress(OSError, client.ApiException):
                if ready():
                    return
            time.sleep(0.1)
        raise ControlPlaneError(f"{what} not ready after {timeout:.0f}s (logs in {self.workdir})")

    def _start_stack(self) -> None:
        stack = self.assets.require_stack(self._asset_parts())
        manifests = self.assets.manifests
        assert manifests is not None
        work = self.workdir
        kubeconfig = str(self.kubeconfig_path)
        pki = self.pki

        self._spawn("kube-controller-manager", [
            str(stack["kube-controller-manager"]), f"--kubeconfig={kubeconfig}",
            "--leader-elect=false", "--secure-port=0",
            f"--service-account-private-key-file={pki.sa_private_key}",
            f"--root-ca-file={pki.ca_cert}",
            "--use-service-account-credentials=false",
            # The namespace controller's resync: a deleted namespace goes within seconds.
            "--namespace-sync-period=10s",
        ])
        self._spawn("kube-scheduler", [
            str(stack["kube-scheduler"]), f"--kubeconfig={kubeconfig}",
            "--leader-elect=false", "--secure-port=0",
        ])
        with self.api_client() as api:
            for crd in KWOK_CRDS:
                install_crd(api, load_yaml_file(manifests / "kwok" / "crd" / crd))
        # The nodes' kubelet endpoint (kwok's node-initialize stage writes the port
        # into each node's status.daemonEndpoints), on loopback only.
        kwok_port = processes.free_port()
        kwok_config = work / "kwok.yaml"
        kwok_config.write_text(yaml.safe_dump_all([
            {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
             "options": {**KWOK_OPTIONS, "cidr": self.kwok_cidr, "nodePort": kwok_port,
                         "serverAddress": f"127.0.0.1:{kwok_port}"}},
            *kwok_stages(manifests / "kwok" / "stage", [RUNNER_NODE]),
        ], sort_keys=False))
        self._spawn("kwok", [str(stack["kwok"]), f"--kubeconfig={kubeconfig}",
                             f"--config={kwok_config}"])

        with self.api_client() as api:
            core = client.CoreV1Api(api)
            install_shipped_crds(api, manifests, self.flavour)
            self._create_nodes(core)
            jobset_port, jobset_ca = self._start_controllers(api, core, stack, manifests)
            self._wait("JobSet controller", lambda: _http_ok(self._jobset_probe))
            # Its pod webhooks refuse pods while it is down: registered once it serves.
            self._apply_webhooks(api, manifests / "jobset" / "webhook", jobset_port, jobset_ca,
                                 "jobset-")
            self._wait("Trainer controller", lambda: _http_ok(self._trainer_probe))
            if self.push:
                self._wait("Trainer status server", self._status_server_serves)
            self._apply_runtimes(api, trainer_manifests(manifests, self.flavour) / "runtimes")
            if self.kueue:
                self._start_kueue(api, core, manifests)
            self._wait(f"nodes {KWOK_NODE}, {RUNNER_NODE}", lambda: _nodes_ready(core))
            self._wait("ServiceAccount default/default",
                       lambda: bool(core.read_namespaced_service_account("default", "default")))
        self._spawn(POD_RUNNER, [
            sys.executable, "-m", "localdev.cluster.podrunner", f"--kubeconfig={kubeconfig}",
            f"--node={RUNNER_NODE}", f"--workdir={work / 'pods'}",
            # The Trainer's Service name, as in the URL it injects: its processes listen
            # on this machine's loopback (no Service, no cluster DNS here).
            f"--host-alias=127.0.0.1={trainer_service_host()}",
        ], env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._wait("pod runner", self._pod_runner_ready.exists)

    @property
    def _pod_runner_ready(self) -> Path:
        return self.workdir / "pods" / ".ready"

    def _create_nodes(self, core: client.CoreV1Api) -> None:
        for name, cidr, runner in ((KWOK_NODE, self.kwok_cidr, False),
                                   (RUNNER_NODE, self.runner_cidr, True)):
            labels = {KWOK_NODE_LABEL: KWOK_NODE_LABEL_VALUE, "kubernetes.io/hostname": name}
            spec: dict[str, Any] = {"podCIDR": cidr, "podCIDRs": [cidr]}
            if runner:
                labels[RUNNER_TAINT_KEY] = "true"
                spec["taints"] = [{"key": RUNNER_TAINT_KEY, "value": "true",
                                   "effect": "NoSchedule"}]
            with contextlib.suppress(client.ApiException):
                core.create_node({"apiVersion": "v1", "kind": "Node",
                                  "metadata": {"name": name, "labels": labels}, "spec": spec})
            # Before kwok's node-initialize, which keeps a capacity already set: the
            # shipped runtimes ask for GPUs (torchtune: nvidia.com/gpu 2).
            core.patch_node_status(name, {"status": {"capacity": NODE_CAPACITY,
                                                     "allocatable": NODE_CAPACITY}})

    def _start_controllers(self, api: client.ApiClient, core: client.CoreV1Api,
                           stack: dict[str, Path], manifests: Path) -> tuple[int, bytes]:
        """Start JobSet and Trainer; return JobSet's webhook port and its CA (PEM)."""
        work = self.workdir
        kubeconfig = str(self.kubeconfig_path)
        # JobSet: a dev CA signs its serving certificate; internal cert management off.
        jobset_certs = work / "jobset-certs"
        jobset_certs.mkdir(exist_ok=True)
        jobset_pki = serving_pki("jobset-webhook-ca", [], ["127.0.0.1"])
        (jobset_certs / "tls.crt").write_bytes(jobset_pki.cert)
        (jobset_certs / "tls.key").write_bytes(jobset_pki.key)
        jobset_port, jobset_probe = processes.free_port(), processes.free_port()
        self._jobset_probe = f"http://127.0.0.1:{jobset_probe}/readyz"
        config = work / "jobset-config.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": jobset_port, "certDir": str(jobset_certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{jobset_probe}"},
        }))
        self._spawn("jobset-controller-manager", [
            str(stack["jobset-controller-manager"]), f"--kubeconfig={kubeconfig}",
            f"--config={config}", "--zap-log-level=info"])

        # Trainer: its cert rotator checks the Secret; the webhook server reads the
        # compiled-in certificate directory, private to this process where possible.
        trainer_pki = serving_pki(
            TRAINER_CA_NAME, [trainer_service_host()],
            ["127.0.0.1"], validity_days=TRAINER_CERT_DAYS, rsa_pkcs1=True)
        self._trainer_ca = trainer_pki.ca_cert
        with contextlib.suppress(client.ApiException):
            core.create_namespace({"metadata": {"name": TRAINER_NAMESPACE}})
        core.create_namespaced_secret(TRAINER_NAMESPACE, {
            "metadata": {"name": TRAINER_WEBHOOK_SECRET},
            "data": {k: base64.b64encode(v).decode() for k, v in (
                ("ca.crt", trainer_pki.ca_cert), ("ca.key", trainer_pki.ca_key),
                ("tls.crt", trainer_pki.cert), ("tls.key", trainer_pki.key))},
        })
        # Ports the Trainer keeps across a restart (restart_trainer, a fault test).
        trainer_port, trainer_probe = processes.restartable_port(), processes.restartable_port()
        self._trainer_probe = f"http://127.0.0.1:{trainer_probe}/readyz"
        trainer_dir = trainer_manifests(manifests, self.flavour)
        # Registered before the controller starts: its rotator injects the CA into it.
        self._apply_webhooks(api, trainer_dir / "webhook", trainer_port, trainer_pki.ca_cert)
        binds: list[tuple[Path, Path]] = []
        if self.flavour == FLAVOUR_LEGACY:
            # v2.0.0 takes flags (no configuration file).
            args = [str(stack[LEGACY_TRAINER_BINARY]), f"--kubeconfig={kubeconfig}",
                    f"--webhook-server-port={trainer_port}", "--metrics-bind-address=0",
                    f"--health-probe-bind-address=127.0.0.1:{trainer_probe}",
                    "--leader-elect=false", "--zap-log-level=info"]
        else:
            self.status_server_port = processes.restartable_port()
            self._trainer_ports = (trainer_port, trainer_probe)
            config_file = work / "trainer-config.yaml"
            config_file.write_text(yaml.safe_dump(trainer_configuration(
                webhook_port=trainer_port, probe_port=trainer_probe,
                status_port=self.status_server_port, push=self.push), sort_keys=False))
            args = [str(stack["trainer-controller-manager"]), f"--kubeconfig={kubeconfig}",
                    f"--config={config_file}", "--zap-log-level=info"]
            # What the kubelet gives the controller's pod: its ServiceAccount's token and
            # namespace.  The status server reads the token's issuer (OIDC discovery).
            binds.append((self._service_account_files(), SERVICE_ACCOUNT_DIR))
        prefix = private_mount_prefix()
        if prefix is not None:
            private = Path(tempfile.mkdtemp(prefix="trainer-certs-", dir=work))
            certs = private / "k8s-webhook-server" / "serving-certs"
            binds.insert(0, (certs.parent, TRAINER_CERT_DIR.parent))
            args = with_bind_mounts(prefix, binds, args)
        elif self.push:
            raise ControlPlaneError(
                "push=True needs a private mount namespace for the Trainer controller (its "
                f"ServiceAccount files at {SERVICE_ACCOUNT_DIR}): unshare is missing or refused")
        else:
            # No mount namespace here: share the compiled-in directory.  Concurrent
            # clusters then serve whichever certificate was written last (and fail).
            certs = TRAINER_CERT_DIR
        certs.mkdir(parents=True, exist_ok=True)
        for name, data in (("tls.crt", trainer_pki.cert), ("tls.key", trainer_pki.key),
                           ("ca.crt", trainer_pki.ca_cert)):
            tmp = certs / f".{name}.tmp"
            tmp.write_bytes(data)
            tmp.replace(certs / name)
        self._spawn("trainer-controller-manager", args,
                    env={**os.environ, "TMPDIR": TRAINER_TMPDIR})
        return jobset_port, jobset_pki.ca_cert

    def _service_account_files(self) -> Path:
        """A directory with the Trainer ServiceAccount's ``token``, ``namespace`` and
        ``ca.crt``, as the kubelet projects them into the controller's pod."""
        token = self.service_account_token(TRAINER_NAMESPACE, TRAINER_SERVICE_ACCOUNT,
                                           expiration_seconds=CONTROLLER_TOKEN_SECONDS)
        directory = self.workdir / "trainer-serviceaccount"
        directory.mkdir(mode=0o700, exist_ok=True)
        for name, data in (("token", token.encode()), ("namespace", TRAINER_NAMESPACE.encode()),
                           ("ca.crt", self.ca_cert_path.read_bytes())):
            (directory / name).write_bytes(data)
        return directory

    def _status_server_serves(self) -> bool:
        """The status server answers TLS with the Trainer's certificate (any HTTP status:
        a GET of ``/`` is a 404 from its default handler)."""
        url = self.status_server_url
        assert url is not None
        context = ssl.create_default_context(cadata=self._trainer_ca.decode())
        request = urllib.request.Request(url + "/", method="GET")
        try:
            with urllib.request.urlopen(request, timeout=2, context=context):
                return True
        except urllib.error.HTTPError:
            return True
        except (OSError, ssl.SSLError):
            return False

    @property
    def status_server_url(self) -> str | None:
        """``https://127.0.0.1:<port>`` of the Trainer's status server, or None without push.

        Pods reach it at the URL the Trainer injects (``KUBEFLOW_TRAINER_SERVER_URL``,
        host :func:`trainer_service_host`, which the pod runner resolves to 127.0.0.1);
        its CA is :attr:`trainer_ca_cert` (the ``<trainjob>-tls-config`` ConfigMap).
        """
        if not self.push or self.status_server_port is None:
            return None
        return f"https://127.0.0.1:{self.status_server_port}"

    def _start_kueue(self, api: client.ApiClient, core: client.CoreV1Api,
                     manifests: Path) -> None:
        """Start Kueue as JobSet runs: a dev CA's certificate in its certDir, internal
        cert management off, the shipped webhooks registered once it serves."""
        binary = self.assets.directory / KUEUE_BINARY
        if not os.access(binary, os.X_OK):
            raise ControlPlaneError(f"{self.assets.directory} lacks {KUEUE_BINARY}: "
                                    "build the stack with scripts/stack-assets")
        for crd in sorted((manifests / "kueue" / "crd").glob("*.yaml")):
            install_crd(api, load_yaml_file(crd))
        with contextlib.suppress(client.ApiException):
            core.create_namespace({"metadata": {"name": KUEUE_NAMESPACE}})
        certs = self.workdir / "kueue-certs"
        certs.mkdir(exist_ok=True)
        pki = serving_pki("kueue-webhook-ca", [], ["127.0.0.1"])
        (certs / "tls.crt").write_bytes(pki.cert)
        (certs / "tls.key").write_bytes(pki.key)
        port, probe = processes.free_port(), processes.free_port()
        self._kueue_probe = f"http://127.0.0.1:{probe}/readyz"
        config = self.workdir / "kueue-config.yaml"
        config.write_text(yaml.safe_dump(kueue_configuration(
            webhook_port=port, probe_port=probe, cert_dir=certs), sort_keys=False))
        args = [str(binary), f"--kubeconfig={self.kubeconfig_path}", f"--config={config}",
                f"--feature-gates={KUEUE_FEATURE_GATES}", "--zap-log-level=2"]
        # With internal cert management off, Kueue reads a metrics certificate at a
        # compiled-in path (its metrics server stays off): given in a private mount
        # namespace, as the Trainer's certificate directory is.
        prefix = private_mount_prefix()
        if prefix is None:
            raise ControlPlaneError(
                f"kueue=True needs a private mount namespace for Kueue (its metrics "
                f"certificate at {KUEUE_METRICS_CERT_DIR}): unshare is missing or refused")
        self._spawn(KUEUE_BINARY, with_bind_mounts(prefix, [(certs, KUEUE_METRICS_CERT_DIR)], args))
        self._wait("Kueue controller", lambda: _http_ok(self._kueue_probe))
        self._apply_webhooks(api, manifests / "kueue" / "webhook", port, pki.ca_cert, "kueue-")

    @property
    def trainer_ca_cert(self) -> bytes:
        """PEM of the CA of the Trainer's webhook and status server certificate."""
        return self._trainer_ca

    def _apply_webhooks(self, api: client.ApiClient, kustomization: Path, port: int,
                        ca_bundle: bytes, name_prefix: str = "") -> None:
        rendered = self.kubectl("kustomize", str(kustomization)).stdout
        admission = client.AdmissionregistrationV1Api(api)
        for config in webhook_configurations(rendered, port, ca_bundle, name_prefix):
            if config["kind"] == "MutatingWebhookConfiguration":
                admission.create_mutating_webhook_configuration(config)
            else:
                admission.create_validating_webhook_configuration(config)

    def _apply_runtimes(self, api: client.ApiClient, runtimes: Path) -> None:
        rendered = self.kubectl("kustomize", str(runtimes)).stdout
        custom = client.CustomObjectsApi(api)
        docs = [d for d in yaml.safe_load_all(rendered) if d]
        for doc in docs:
            group, version = doc["apiVersion"].split("/")
            # The Trainer's webhook may refuse for a moment after readyz; retry.
            deadline = time.monotonic() + 30
            while True:
                try:
                    custom.create_cluster_custom_object(group, version,
                                                        "clustertrainingruntimes", doc)
                    break
                except client.ApiException as exc:
                    if exc.status == 409:
                        break
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

    # ----------------------------------------------------------------- flavours

    def install_flavour(self, flavour: str) -> None:
        """Replace the TrainJob CRD by that of ``flavour``; return once it is in effect.

        Raises:
            ValueError: unknown flavour.
            CrdError: the schema did not take effect in time.
        """
        manifests = self.assets.manifests
        assert manifests is not None
        with self.api_client() as api:
            install_crd(api, trainjob_crd(manifests, flavour))
            wait_trainer_status_schema(api, present=flavour != FLAVOUR_LEGACY,
                                       runtime="torch-distributed")
        self.flavour = flavour

    @property
    def stack_versions(self) -> dict[str, str]:
        """Versions of the stack's parts that run (``kubernetes``, ``kwok``, ``jobset``,
        ``trainer``; ``kueue`` only with ``kueue=True``)."""
        text = (self.assets.directory / "versions").read_text()
        versions = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        if not self.kueue:
            versions.pop("kueue", None)
        return versions


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _nodes_ready(core: client.CoreV1Api) -> bool:
    for name in (KWOK_NODE, RUNNER_NODE):
        node = core.read_node(name)
        conditions = {c.type: c.status for c in node.status.conditions or []}
        if conditions.get("Ready") != "True":
            return False
    return True


__all__ = ["FLAVOUR_CURRENT", "FLAVOUR_LEGACY", "Cluster", "runner_pod_overrides",
           "runner_runtime_patches"]
