"""A real Kubernetes control plane (etcd + kube-apiserver) on loopback.

Used by the tests and by ``python -m localdev.demo``.  On its own there is no
scheduler, controller manager or kubelet: objects are stored, validated,
admitted, authorised and watched exactly as in a cluster, but nothing
reconciles them.  Consequences: ServiceAccounts are created explicitly (no
"default" one), the ServiceAccount admission plugin is off (it wants that
controller's objects), namespaces never finish deleting, owner references do
not cascade, and pod status is written by the caller (see
:mod:`localdev.cluster.objects`).  :class:`localdev.cluster.stack.Cluster`
adds the controllers (``controllers=True`` turns that admission plugin back on).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from kubernetes import client

from localdev.cluster import processes
from localdev.cluster.assets import Assets, AssetsError, ensure_assets
from localdev.cluster.pki import PkiFiles, write_pki

#: Give up waiting for ``/readyz`` after this many seconds.
READY_TIMEOUT_SECONDS = 90.0
#: Audience of ServiceAccount tokens (``--api-audiences``), also accepted as an issuer.
#: The issuer tokens carry is the API server's own URL (:attr:`ControlPlane.server_url`):
#: OIDC discovery of it (``/.well-known/openid-configuration``) then reaches this API
#: server over loopback, as Trainer v2.3.0's status server does (``pkg/statusserver``).
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
#: Lines of a process log quoted in a start-up error.
LOG_TAIL_LINES = 40
#: Timeout of one kubectl invocation (seconds).
KUBECTL_TIMEOUT_SECONDS = 120.0
#: Verbs that change an object: the ones the audit policy logs.
AUDIT_WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")


def trainjob_status_writes(path: Path | str, offset: int,
                           namespace: str) -> Iterator[dict[str, Any]]:
    """The audit events (as :func:`audit_policy` logs them) of patches and updates of
    ``trainjobs/status`` in ``namespace``, from byte ``offset`` of the audit log on; a
    half-written last line is skipped."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        handle.seek(offset)
        for line in handle:
            if '"trainjobs"' not in line or '"status"' not in line:
                continue  # cheaper than parsing every write of the cluster
            try:
                event = json.loads(line)
            except ValueError:
                continue
            ref = event.get("objectRef") or {}
            if (ref.get("resource") == "trainjobs" and ref.get("subresource") == "status"
                    and ref.get("namespace") == namespace
                    and event.get("stage") == "ResponseComplete"
                    and event.get("verb") in ("patch", "update")):
                yield event


def audit_policy(status_level: str = "Metadata") -> dict[str, Any]:
    """The audit Policy of ``audit_log``: writes only, each event once (ResponseComplete).

    Writes to ``trainjobs/status`` (and ``trainjobs``) are logged at ``status_level``
    (``Metadata``, or ``Request`` to keep the request body); every other write at
    ``Metadata``; reads are not logged.  A Metadata event carries ``user``,
    ``userAgent``, ``verb``, ``objectRef`` and ``requestURI``, whose query names the
    ``fieldManager`` of a patch (audit.k8s.io/v1 Policy, Kubernetes' auditing docs).

    Raises:
        ValueError: ``status_level`` is neither ``Metadata`` nor ``Request``.
    """
    if status_level not in ("Metadata", "Request"):
        raise ValueError(f"status_level={status_level!r}: must be 'Metadata' or 'Request'")
    return {
        "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
        "omitStages": ["RequestReceived", "ResponseStarted", "Panic"],
        "rules": [
            {"level": status_level, "verbs": list(AUDIT_WRITE_VERBS),
             "resources": [{"group": "trainer.kubeflow.org",
                            "resources": ["trainjobs", "trainjobs/status"]}]},
            {"level": "Metadata", "verbs": list(AUDIT_WRITE_VERBS)},
            {"level": "None"},
        ],
    }


#: When set (non-empty), :meth:`ControlPlane.start` refuses to start: ``make check`` sets
#: it, so a test that starts a cluster but is not marked ``cluster`` fails there by name
#: instead of slowing the quick loop (also in child processes, which inherit it).
NO_CLUSTER_ENV = "TRAINJOB_PROGRESS_NO_CLUSTER"


class ControlPlaneError(RuntimeError):
    """The control plane failed to start, or an operation on it failed."""


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class ControlPlane:
    """etcd and kube-apiserver on free loopback ports, torn down on :meth:`stop`.

    ``assets_dir`` is a directory with kube-apiserver, etcd, kubectl (and
    helm); by default the binaries are found or built by
    ``scripts/controlplane-assets``.  ``workdir`` holds certificates, data,
    logs and kubeconfigs; by default a temporary directory removed on stop
    (kept when start-up fails, so the logs can be read).

    Authorisation is RBAC only.  The admin identity is a client certificate in
    group ``system:masters``; restricted identities are ServiceAccounts whose
    tokens come from the TokenRequest API (:meth:`service_account_token`).

    ``audit_log`` (``Metadata`` or ``Request``, default off) turns the API server's
    audit log on with :func:`audit_policy` at that level for TrainJob writes; the
    events (JSON lines) go to :attr:`audit_log_path`.

    ``priority_and_fairness`` turns API Priority and Fairness on (kube-apiserver's
    default; off here unless asked: it costs about a second of start-up, and a test
    that is not about fairness has nothing for it to protect).  With it on, a
    FlowSchema and PriorityLevelConfiguration make the real API server answer 429.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, assets_dir: str | Path | None = None,
                 workdir: str | Path | None = None, *, controllers: bool = False,
                 audit_log: str | None = None, priority_and_fairness: bool = False) -> None:
        if audit_log is not None:
            audit_policy(audit_log)  # refuses an unknown level before anything starts
        self._audit_log = audit_log
        self._controllers = controllers
        self._priority_and_fairness = priority_and_fairness
        self._assets_dir = None if assets_dir is None else str(assets_dir)
        self._own_workdir = workdir is None
        self._workdir = None if workdir is None else Path(workdir)
        self._assets: Assets | None = None
        self._pki: PkiFiles | None = None
        self._etcd: subprocess.Popen[bytes] | None = None
        self._etcd_args: list[str] = []
        self._apiserver: subprocess.Popen[bytes] | None = None
        self._apiserver_args: list[str] = []
        self._port = 0
        self.startup_seconds: float | None = None
        """Wall time of the last successful :meth:`start` (seconds)."""

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _asset_parts(self) -> tuple[str, ...]:
        """The optional parts of the stack this cluster runs (none for a control plane;
        keys of :data:`localdev.cluster.assets.OPTIONAL_PARTS`)."""
        return ()

    def start(self) -> None:
        """Start etcd and kube-apiserver and wait until ``/readyz`` answers ok.

        Building the binaries on first use can take many minutes (progress on
        stderr); a start with cached binaries takes a few seconds.

        Raises:
            AssetsError: the binaries cannot be found or built.
            ControlPlaneError: a process exited or ``/readyz`` did not turn ok
                within :data:`READY_TIMEOUT_SECONDS` (the message quotes the
                tail of the process logs); or :data:`NO_CLUSTER_ENV` is set.
        """
        if self._apiserver is not None:
            raise ControlPlaneError("control plane already started")
        if os.environ.get(NO_CLUSTER_ENV):
            raise ControlPlaneError(
                f"{NO_CLUSTER_ENV} is set (make check runs the tests that need no cluster): "
                "this test starts a control plane, so mark it `cluster` "
                "(@pytest.mark.cluster; tests/conftest.py marks those on cluster fixtures)")
        self._assets = ensure_assets(self._assets_dir, self._asset_parts())
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="trainjob-devcluster-"))
            # Removed also when the process exits or is signalled without stop().
            processes.on_kill_all(id(self), functools.partial(
                shutil.rmtree, self._workdir, ignore_errors=True))
        self._workdir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        # A port picked free can be taken before the server binds it; retry then.
        for attempt in range(3):
            try:
                self._start_once()
                break
            except ControlPlaneError as exc:
                self._stop_processes()
                if "address already in use" not in str(exc) or attempt == 2:
                    # Keep the workdir: the error names it for the full logs.
                    processes.on_kill_all(id(self), None)
                    raise
        self.startup_seconds = time.monotonic() - started

    def _start_once(self) -> None:
        assert self._assets is not None and self._workdir is not None
        work = self._workdir
        self._pki = write_pki(work / "pki", service_ip=SERVICE_CLUSTER_IP_RANGE[:-4] + "1")
        etcd_port, peer_port, self._port = (processes.free_port() for _ in range(3))
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        data_dir = work / f"etcd-data-{etcd_port}"
        self._etcd_args = [
            str(self._assets.etcd),
            f"--data-dir={data_dir}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            # Throw-away data: skipping fsync makes start-up and writes much faster.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]
        self._etcd = processes.spawn(self._etcd_args, work / "etcd.log")
        pki = self._pki
        self._apiserver_args = [
            str(self._assets.kube_apiserver),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self._port}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            # The first issuer signs; the second is still accepted.
            f"--service-account-issuer={self.server_url}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-jwks-uri={self.server_url}/openid/v1/jwks",
            f"--service-account-key-file={pki.sa_public_key}",
            f"--service-account-signing-key-file={pki.sa_private_key}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--authorization-mode=RBAC",
            # The "kubernetes" Service endpoints may not point at loopback (the API
            # server's own validation refuses 127.0.0.0/8), and nothing in-cluster needs them.
            "--endpoint-reconciler-type=none",
            # Without a controller manager no ServiceAccount "default" is ever created,
            # and that admission plugin would refuse every pod.
            *([] if self._controllers else ["--disable-admission-plugins=ServiceAccount"]),
            # Off saves a second of start-up where fairness has nothing to protect.
            f"--enable-priority-and-fairness={str(self._priority_and_fairness).lower()}",
            # A fake node's Hostname address resolves nowhere; its InternalIP is loopback
            # (kwok's server, reached for pods/log).
            "--kubelet-preferred-address-types=InternalIP",
            f"--cert-dir={work / 'pki'}",
        ]
        if self._audit_log is not None:
            policy = work / "audit-policy.yaml"
            policy.write_text(yaml.safe_dump(audit_policy(self._audit_log), sort_keys=False))
            self._apiserver_args += [f"--audit-policy-file={policy}",
                                     f"--audit-log-path={work / 'audit.log'}",
                                     # One file however long the run: no rotation.
                                     "--audit-log-maxsize=0", "--audit-log-format=json"]
        self._apiserver = processes.spawn(self._apiserver_args, work / "kube-apiserver.log")
        self._wait_ready()
        self._write_kubeconfig(self.kubeconfig_path, self._admin_user())

    def _wait_ready(self) -> None:
        assert self._pki is not None
        ctx = ssl.create_default_context(cafile=str(self._pki.ca_cert))
        ctx.load_cert_chain(str(self._pki.admin_cert), str(self._pki.admin_key))
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        last = "no answer yet"
        while time.monotonic() < deadline:
            for name, proc in (("etcd", self._etcd), ("kube-apiserver", self._apiserver)):
                if proc is not None and proc.poll() is not None:
                    raise self._start_error(f"{name} exited with code {proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.server_url}/readyz", context=ctx,
                                            timeout=2) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (OSError, ssl.SSLError) as exc:
                last = str(exc)
            time.sleep(0.1)
        raise self._start_error(
            f"/readyz not ok after {READY_TIMEOUT_SECONDS:.0f}s (last: {last})")

    def _start_error(self, what: str) -> ControlPlaneError:
        assert self._workdir is not None
        parts = [f"control plane failed to start: {what} (logs in {self._workdir})"]
        for log in ("etcd.log", "kube-apiserver.log"):
            parts.append(f"--- tail of {log} ---\n{_tail(self._workdir / log)}")
        return ControlPlaneError("\n".join(parts))

    def _stop_processes(self) -> None:
        # The API server first, so it does not log a storm of etcd errors.
        for proc in (self._apiserver, self._etcd):
            if proc is not None:
                processes.stop(proc)
        self._apiserver = self._etcd = None

    def stop(self) -> None:
        """Stop both processes (with their process groups) and remove an own workdir.

        Idempotent; never raises for processes that are already gone.
        """
        was_running = self._apiserver is not None
        self._stop_processes()
        if was_running and self._own_workdir and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
            processes.on_kill_all(id(self), None)

    def kill_etcd(self) -> None:
        """SIGKILL etcd (a fault test); the API server keeps running without storage."""
        if self._etcd is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._etcd.pid, signal.SIGKILL)  # no SIGTERM: no clean exit
            processes.stop(self._etcd, grace=5)  # reaps it, forgets its pid
            self._etcd = None

    def start_etcd(self) -> None:
        """Start etcd again after :meth:`kill_etcd`: same port and data, then wait until
        the API server's ``/readyz`` is ok."""
        assert self._workdir is not None
        if self._etcd is None:
            self._etcd = processes.spawn(self._etcd_args, self._workdir / "etcd.log")
        self._wait_ready()

    def restart_apiserver(self, down_seconds: float) -> None:
        """SIGKILL kube-apiserver, wait ``down_seconds``, start it again on the same port
        and etcd; return once ``/readyz`` is ok (an outage test's real API server).

        Raises:
            ControlPlaneError: not started, or the new process does not get ready.
        """
        if self._apiserver is None or self._workdir is None:
            raise ControlPlaneError("control plane not started")
        with contextlib.suppress(ProcessLookupError):  # SIGKILL, no graceful shutdown
            os.killpg(self._apiserver.pid, signal.SIGKILL)
        processes.stop(self._apiserver)  # reaps it and forgets its process group
        time.sleep(down_seconds)
        self._apiserver = processes.spawn(self._apiserver_args,
                                          self._workdir / "kube-apiserver.log")
        self._wait_ready()

    @property
    def running(self) -> bool:
        """True between a successful :meth:`start` and :meth:`stop`."""
        return self._apiserver is not None and self._apiserver.poll() is None

    @property
    def pids(self) -> list[int]:
        """Process ids of etcd and kube-apiserver (each leads its own process group)."""
        return [p.pid for p in (self._etcd, self._apiserver) if p is not None]

    @property
    def etcd_pid(self) -> int | None:
        """Process id of etcd (None before :meth:`start`)."""
        return None if self._etcd is None else self._etcd.pid

    @property
    def apiserver_pid(self) -> int | None:
        """Process id of kube-apiserver (None before :meth:`start`)."""
        return None if self._apiserver is None else self._apiserver.pid

    # ----------------------------------------------------------------- access

    def _require(self) -> tuple[Path, PkiFiles, Assets]:
        if self._apiserver is None or self._workdir is None or self._pki is None:
            raise ControlPlaneError("control plane is not running; call start() first")
        assert self._assets is not None
        return self._workdir, self._pki, self._assets

    @property
    def workdir(self) -> Path:
        """Directory with certificates, etcd data, logs and kubeconfigs."""
        return self._require()[0]

    @property
    def pki(self) -> PkiFiles:
        """The PEM files of this control plane's CA, serving, admin and ServiceAccount keys."""
        return self._require()[1]

    @property
    def assets(self) -> Assets:
        """The binaries (and, from ``scripts/stack-assets``, manifests) this plane runs."""
        return self._require()[2]

    @property
    def server_url(self) -> str:
        """``https://127.0.0.1:<port>`` of the API server."""
        return f"https://127.0.0.1:{self._port}"

    @property
    def ca_cert_path(self) -> Path:
        """PEM of the CA that signed the API server's serving certificate."""
        return self._require()[1].ca_cert

    @property
    def audit_log_path(self) -> Path:
        """The audit log (JSON lines, ``audit.k8s.io/v1`` Events) when ``audit_log`` is on.

        Raises:
            ControlPlaneError: not started, or started without ``audit_log``.
        """
        if self._audit_log is None:
            raise ControlPlaneError("audit log is off: pass audit_log='Metadata' or 'Request'")
        return self._require()[0] / "audit.log"

    @property
    def kubeconfig_path(self) -> Path:
        """Admin kubeconfig (client certificate in group ``system:masters``)."""
        return self._require()[0] / "kubeconfig"

    @property
    def kubectl_path(self) -> Path:
        """The kubectl binary built from the pinned Kubernetes release."""
        return self._require()[2].kubectl


    def _configuration(self) -> client.Configuration:
        config = client.Configuration()
        config.host = self.server_url
        config.ssl_ca_cert = str(self.ca_cert_path)
        config.verify_ssl = True
        return config

    def api_client(self) -> client.ApiClient:
        """A new admin :class:`kubernetes.client.ApiClient`; the caller closes it."""
        _, pki, _ = self._require()
        config = self._configuration()
        config.cert_file = str(pki.admin_cert)
        config.key_file = str(pki.admin_key)
        return client.ApiClient(config)

    def api_client_for_token(self, token: str) -> client.ApiClient:
        """A new ApiClient that authenticates with bearer ``token`` only."""
        config = self._configuration()
        config.api_key = {"authorization": token}
        config.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(config)

    def service_account_token(self, namespace: str, name: str,
                              expiration_seconds: int = 3600) -> str:
        """A TokenRequest token for ServiceAccount ``namespace/name``, creating it if missing.

        ``expiration_seconds`` is the token lifetime (the API server's minimum is 600).

        Raises:
            kubernetes.client.ApiException: the namespace does not exist, or the API refused.
        """
        with self.api_client() as api:
            core = client.CoreV1Api(api)
            try:
                core.create_namespaced_service_account(
                    namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name)))
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
            request = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[SERVICE_ACCOUNT_ISSUER],
                                               expiration_seconds=expiration_seconds))
            result = core.create_namespaced_service_account_token(name, namespace, request)
            return str(result.status.token)

    def _admin_user(self) -> dict[str, Any]:
        _, pki, _ = self._require()
        return {"client-certificate": str(pki.admin_cert), "client-key": str(pki.admin_key)}

    def _write_kubeconfig(self, path: Path, user: dict[str, Any]) -> Path:
        # File paths into the work directory rather than *-data: the Python client
        # writes *-data out to temporary files that it deletes only at a clean exit,
        # so every client killed by a test would leave the admin key in /tmp.
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "devcluster", "cluster": {
                "server": self.server_url, "certificate-authority": str(self.ca_cert_path)}}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "devcluster", "context": {
                "cluster": "devcluster", "user": "user"}}],
            "current-context": "devcluster",
        }
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
        tmp.chmod(0o600)
        tmp.replace(path)
        return path

    def kubeconfig_for_token(self, token: str, path: str | Path) -> Path:
        """Write a kubeconfig at ``path`` that authenticates with ``token`` only; return path.

        Useful to run the scraper (or kubectl) as a restricted ServiceAccount.
        """
        self._require()
        return self._write_kubeconfig(Path(path), {"token": token})

    def kubectl(self, *args: str, token: str | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this control plane; return its captured text output.

        As admin, or as the identity of bearer ``token`` when given.

        Raises:
            subprocess.CalledProcessError: ``check`` and kubectl exited non-zero
                (its ``stderr`` attribute holds kubectl's message).
            subprocess.TimeoutExpired: it ran over :data:`KUBECTL_TIMEOUT_SECONDS`.
        """
        work, _, assets = self._require()
        kubeconfig = self.kubeconfig_path
        if token is not None:
            # A separate kubeconfig: with the admin certificate present the API
            # server would authenticate the certificate and ignore the token.
            with tempfile.NamedTemporaryFile(dir=work, prefix="kubeconfig-token-",
                                             delete=False) as handle:
                kubeconfig = Path(handle.name)
            self.kubeconfig_for_token(token, kubeconfig)
        try:
            return subprocess.run(
                [str(assets.kubectl), f"--kubeconfig={kubeconfig}", *args],
                capture_output=True, text=True, check=check,
                timeout=KUBECTL_TIMEOUT_SECONDS,
            )
        finally:
            if token is not None:
                with contextlib.suppress(OSError):
                    kubeconfig.unlink()


__all__ = ["AssetsError", "ControlPlane", "ControlPlaneError"]
