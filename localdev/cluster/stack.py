"""The local cluster with its controllers: TrainJobs go through the real chain.

On top of :class:`~localdev.cluster.controlplane.ControlPlane` (etcd +
kube-apiserver), :class:`Cluster` starts, all built from Go modules by
``scripts/stack-assets``:

* kube-controller-manager (Job, garbage collector, namespace, ServiceAccount
  and token controllers, ...), kube-scheduler;
* kwok, which plays the kubelet of fake nodes (node status and lease, pod IPs
  from the node's loopback ``podCIDR``, pod start and end) using the Stage
  objects kwok ships;
* the JobSet controller and the Kubeflow Trainer controller, with the CRDs,
  admission webhooks and ClusterTrainingRuntimes their modules ship;
* the pod runner (:mod:`localdev.cluster.podrunner`), the container runtime of
  the runner node: it runs a pod's container command as a local process.

Nodes: ``kwok-node-0`` (pods are simulated end to end by kwok's stages) and
``runner-node-0`` (tainted :data:`RUNNER_TAINT_KEY`; kwok gives its pods their
IP and Running state, the pod runner runs them and owns their end).  A pod goes
to the runner node through the TrainJob's ``podSpecOverrides`` (node selector
and toleration, see :func:`runner_pod_overrides`).

Every process runs in its own process group with PDEATHSIG
(:mod:`localdev.cluster.processes`), so none outlives the caller.  The
controllers use the admin kubeconfig (the RBAC of their real deployments is
not exercised here).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from localdev.cluster import processes
from localdev.cluster.controlplane import ControlPlane, ControlPlaneError
from localdev.cluster.crds import (
    FLAVOUR_CURRENT,
    FLAVOUR_LEGACY,
    install_crd,
    install_shipped_crds,
    load_yaml_file,
    trainjob_crd,
    wait_trainer_status_schema,
)
from localdev.cluster.pki import serving_pki

#: Fake nodes.  Their pod CIDRs are loopback ranges: a process bound to a pod IP
#: is reached over ``lo`` like any 127.0.0.0/8 address.
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
#: Namespace and names the Trainer controller v2.0.0 hard-codes.
TRAINER_NAMESPACE = "kubeflow-system"
TRAINER_WEBHOOK_SECRET = "kubeflow-trainer-webhook-cert"
TRAINER_WEBHOOK_SERVICE = "kubeflow-trainer-controller-manager"
TRAINER_WEBHOOK_CONFIGURATION = "validator.trainer.kubeflow.org"
TRAINER_CA_NAME = "kubeflow-trainer-ca"
#: The serving-certificate directory compiled into Trainer v2.0.0
#: (``pkg/util/cert/cert.go``; not the system temporary directory setting).
TRAINER_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
#: cert-controller replaces certificates valid for less than 90 days.
TRAINER_CERT_DAYS = 730
#: Give up waiting for a controller to be ready after this many seconds.
READY_TIMEOUT_SECONDS = 120.0
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
}
#: kwok's shipped stages in use (under the bundle's ``manifests/kwok/stage``).
KWOK_NODE_STAGES = ("node/fast/node-initialize.yaml",
                    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml")
KWOK_POD_STAGES = ("pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml",
                   "pod/fast/pod-delete.yaml")
#: Pod stages that end a pod: the runner node's pods are excluded from them.
KWOK_ENDING_STAGES = ("pod-complete", "pod-delete")


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


@functools.cache
def private_mount_prefix() -> tuple[str, ...] | None:
    """The ``unshare`` words that give a process a private mount namespace, or None.

    As root ``unshare --mount``; otherwise through a user namespace where the
    kernel allows it.  Used so each Trainer controller sees its own
    :data:`TRAINER_CERT_DIR` (the path is compiled in).
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    for words in ((unshare, "--mount", "--propagation", "private"),
                  (unshare, "--user", "--map-root-user", "--mount", "--propagation", "private")):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if subprocess.run([*words, "true"], capture_output=True, timeout=10).returncode == 0:
                return words
    return None


class Cluster(ControlPlane):
    """A :class:`ControlPlane` plus the controllers, kwok and the pod runner.

    ``flavour`` picks the TrainJob CRD: :data:`~localdev.cluster.crds.FLAVOUR_CURRENT`
    ("v2.2-and-later": the shipped CRD with ``status.trainerStatus`` added) or
    :data:`~localdev.cluster.crds.FLAVOUR_LEGACY` ("before-v2.2": as shipped);
    :meth:`install_flavour` swaps it on a running cluster.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, assets_dir: str | Path | None = None,
                 workdir: str | Path | None = None, *, flavour: str = FLAVOUR_CURRENT,
                 audit_log: str | None = None) -> None:
        super().__init__(assets_dir, workdir, controllers=True, audit_log=audit_log)
        self.flavour = flavour
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._spawned: dict[str, tuple[list[str], dict[str, str] | None]] = {}
        self._jobset_probe = self._trainer_probe = ""
        self.stack_startup_seconds: float | None = None
        """Wall time from the API server ready to the whole stack ready (seconds)."""

    # ----------------------------------------------------------------- lifecycle

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

    def kill_process(self, name: str) -> None:
        """SIGKILL the stack's process ``name`` (a fault: no graceful shutdown).

        Raises:
            KeyError: no such process is running.
        """
        proc = self._children.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        processes.stop(proc, grace=5)

    def start_process(self, name: str) -> None:
        """Start ``name`` again after :meth:`kill_process`, with the same arguments and
        environment (its log is appended to); returns at once, without waiting for it."""
        args, env = self._spawned[name]
        self._children[name] = processes.spawn(args, self.workdir / f"{name}.log", env=env)

    def _check_children(self) -> None:
        for name, proc in self._children.items():
            if proc.poll() is not None:
                log = self.workdir / f"{name}.log"
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
                raise ControlPlaneError(f"{name} exited with code {proc.returncode} "
                                        f"(log {log}):\n{tail}")

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
        stack = self.assets.require_stack()
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
        kwok_config = work / "kwok.yaml"
        kwok_config.write_text(yaml.safe_dump_all([
            {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
             "options": KWOK_OPTIONS},
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
            self._apply_runtimes(api, manifests / "trainer" / "runtimes")
            self._wait(f"nodes {KWOK_NODE}, {RUNNER_NODE}", lambda: _nodes_ready(core))
            self._wait("ServiceAccount default/default",
                       lambda: bool(core.read_namespaced_service_account("default", "default")))
        self._spawn("pod-runner", [
            sys.executable, "-m", "localdev.cluster.podrunner", f"--kubeconfig={kubeconfig}",
            f"--node={RUNNER_NODE}", f"--workdir={work / 'pods'}",
        ], env={**os.environ, "PYTHONUNBUFFERED": "1"})
        ready_file = work / "pods" / ".ready"
        self._wait("pod runner", ready_file.exists)

    def _create_nodes(self, core: client.CoreV1Api) -> None:
        for name, cidr, runner in ((KWOK_NODE, KWOK_NODE_CIDR, False),
                                   (RUNNER_NODE, RUNNER_NODE_CIDR, True)):
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
            TRAINER_CA_NAME, [f"{TRAINER_WEBHOOK_SERVICE}.{TRAINER_NAMESPACE}.svc"],
            ["127.0.0.1"], validity_days=TRAINER_CERT_DAYS, rsa_pkcs1=True)
        with contextlib.suppress(client.ApiException):
            core.create_namespace({"metadata": {"name": TRAINER_NAMESPACE}})
        core.create_namespaced_secret(TRAINER_NAMESPACE, {
            "metadata": {"name": TRAINER_WEBHOOK_SECRET},
            "data": {k: base64.b64encode(v).decode() for k, v in (
                ("ca.crt", trainer_pki.ca_cert), ("ca.key", trainer_pki.ca_key),
                ("tls.crt", trainer_pki.cert), ("tls.key", trainer_pki.key))},
        })
        trainer_port, trainer_probe = processes.free_port(), processes.free_port()
        self._trainer_probe = f"http://127.0.0.1:{trainer_probe}/readyz"
        # Registered before the controller starts: its rotator injects the CA into it.
        self._apply_webhooks(api, manifests / "trainer" / "webhook", trainer_port,
                             trainer_pki.ca_cert)
        args = [str(stack["trainer-controller-manager"]), f"--kubeconfig={kubeconfig}",
                f"--webhook-server-port={trainer_port}", "--metrics-bind-address=0",
                f"--health-probe-bind-address=127.0.0.1:{trainer_probe}",
                "--leader-elect=false", "--zap-log-level=info"]
        prefix = private_mount_prefix()
        if prefix is not None:
            private = Path(tempfile.mkdtemp(prefix="trainer-certs-", dir=work))
            certs = private / "k8s-webhook-server" / "serving-certs"
            TRAINER_CERT_DIR.parent.mkdir(parents=True, exist_ok=True)
            mount_point = TRAINER_CERT_DIR.parent
            args = [*prefix, "sh", "-c", 'mount --bind "$0" "$1" && shift && exec "$@"',
                    str(certs.parent), str(mount_point), *args]
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
        self._spawn("trainer-controller-manager", args)
        return jobset_port, jobset_pki.ca_cert

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
        """Versions of the stack's parts (``kubernetes``, ``kwok``, ``jobset``, ``trainer``)."""
        text = (self.assets.directory / "versions").read_text()
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


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


__all__ = ["FLAVOUR_CURRENT", "FLAVOUR_LEGACY", "Cluster", "runner_pod_overrides"]
