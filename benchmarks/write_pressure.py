"""The adaptive write rate's figures for ``benchmarks/cluster_scale.py``.

* :func:`bench_account`: a ServiceAccount bound to ``cluster-admin`` and a kubeconfig of
  its token.  The scraper runs as it, as in a cluster: the admin certificate of the
  local control plane is in ``system:masters``, which API Priority and Fairness (APF)
  exempts, so a scraper run as admin never meets APF.
* :func:`shared_level`: one PriorityLevelConfiguration and a FlowSchema per account, all
  in that level: the scraper and the pressure client compete for the same seats, and
  kube-apiserver's own counters (``apiserver_flowcontrol_dispatched_requests_total``,
  ``apiserver_flowcontrol_rejected_requests_total``, by ``flow_schema``) give each its
  share of 429s (:func:`flowcontrol_counts`).
* :class:`PressureClient`: a second client applying ConfigMaps at a fixed rate, open
  loop (a slow answer does not slow the next request), in a process of its own,
  recording each latency.
* :func:`freshness`: from a change to its first showing (:func:`freshness_of` for
  several windows of one :func:`first_showings`).
* :func:`percent_errors`: |reported - shown| in percentage points, sampled every second
  for every TrainJob: the exporter's percentage is a function of time (one point per
  change, :func:`stamp`), the shown one the last status the watch saw.
* :func:`writes_per_second` and :func:`plot_writes`: writes/s over time, and a picture.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import math
import multiprocessing
import multiprocessing.process
import os
import signal
import ssl
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from localdev.cluster import ControlPlane

#: Token lifetime of the benchmark's accounts (a 10,000-TrainJob run takes about 40 min).
TOKEN_SECONDS = 4 * 3600


def phase(port: int, period: float) -> float:
    """Seconds by which the exporter on ``port`` is ahead of the common clock (its
    changes are spread over the period)."""
    return (port * 7919 % 1000) / 1000 * period


def stamp(port: int, period: float, at: float) -> int:
    """The exporter's change count at epoch ``at`` (its percentage is this mod 100)."""
    return int((at + phase(port, period)) // period)


def percent_errors(seen: Iterable[tuple[str, float, float]], port_of: Mapping[str, int],
                   period: float, start: float, end: float, step: float = 1.0) -> list[float]:
    """|reported - shown| (percentage points) of every TrainJob in ``port_of`` every
    ``step`` s in ``[start, end)``.

    ``seen``: ``(job, stamp shown, epoch seen)`` of each status write the watch saw.  A
    TrainJob not shown a changing status yet at a sample is not sampled: its first
    status is scenario a's static one, stamp 0, which counts no change (compared with
    the change count since the epoch it would be an error of about 10^8 points).
    """
    shown: dict[str, tuple[list[float], list[float]]] = {}
    for job, value, at in sorted(seen, key=lambda s: s[2]):
        if value <= 0:
            continue  # the static status of scenario a
        times, values = shown.setdefault(job, ([], []))
        times.append(at)
        values.append(value)
    errors: list[float] = []
    samples = max(0, int((end - start) / step))
    for job, port in port_of.items():
        times, values = shown.get(job, ([], []))
        for k in range(samples):
            t = start + k * step
            i = bisect.bisect_right(times, t)
            if i:
                errors.append(abs(stamp(port, period, t) - values[i - 1]))
    return errors


def freshness(seen: Iterable[tuple[str, float, float]], port_of: Mapping[str, int],
              period: float, start: float, end: float) -> tuple[list[float], int]:
    """Progress freshness of the changes the exporters of ``port_of`` made in ``(start,
    end]``: for each change the watch showed, seconds from the change (the moment the
    port's stamp became that value, :func:`stamp`) to the first watch event showing it
    (a later write of the same value, or its showing before the change was made, is no
    showing of it); and how many changes were made (so ``made - len(freshness)`` were
    superseded before shown, or not shown by the last event in ``seen``).

    ``seen``: as :func:`percent_errors`.
    Returns:
        ``(seconds per shown change, changes made)``.
    """
    return freshness_of(first_showings(seen), port_of, period, start, end)


def first_showings(seen: Iterable[tuple[str, float, float]]) -> dict[tuple[str, int], float]:
    """When the watch first showed each ``(job, stamp)`` of ``seen`` (as
    :func:`percent_errors`): one pass, for several windows of :func:`freshness_of`."""
    first: dict[tuple[str, int], float] = {}
    for job, value, at in seen:
        key = (job, int(value))
        if at < first.get(key, math.inf):
            first[key] = at
    return first


def freshness_of(first: Mapping[tuple[str, int], float], port_of: Mapping[str, int],
                 period: float, start: float, end: float) -> tuple[list[float], int]:
    """:func:`freshness` from the :func:`first_showings` of the watch's events."""
    ages: list[float] = []
    made = 0
    for job, port in port_of.items():
        for n in range(stamp(port, period, start) + 1, stamp(port, period, end) + 1):
            made += 1
            changed = n * period - phase(port, period)
            at = first.get((job, n))
            if at is not None and at >= changed:
                ages.append(at - changed)
    return ages, made


def writes_per_second(seen: Iterable[tuple[str, float, float]], start: float,
                      end: float) -> list[int]:
    """Status writes the watch saw in each second of ``[start, end)``."""
    counts = [0] * max(0, int(end - start))
    for _, _, at in seen:
        k = int(at - start)
        if 0 <= k < len(counts):
            counts[k] += 1
    return counts


def plot_writes(series: Mapping[str, list[int]], path: Path, title: str) -> Path:
    """A line per series of writes/s over seconds, saved as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    for label, counts in series.items():
        ax.plot(range(len(counts)), counts, label=label, linewidth=1)
    ax.set_xlabel("seconds")
    ax.set_ylabel("status writes/s (seen by the watch)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def bench_account(plane: ControlPlane, api: client.ApiClient, namespace: str,
                  name: str) -> Path:
    """ServiceAccount ``namespace/name`` bound to ``cluster-admin``; a kubeconfig of its
    token in the control plane's workdir."""
    rbac = client.RbacAuthorizationV1Api(api)
    binding = f"bench-{namespace}-{name}"
    try:
        rbac.create_cluster_role_binding({
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    token = plane.service_account_token(namespace, name, expiration_seconds=TOKEN_SECONDS)
    return plane.kubeconfig_for_token(token, plane.workdir / f"kubeconfig-{name}")


def shared_level(api: client.ApiClient, level: str, accounts: Mapping[str, tuple[str, str]],
                 shares: int, queues: int = 8, queue_length: int = 50) -> None:
    """PriorityLevelConfiguration ``level`` (``shares`` nominal concurrency shares, no
    lending, queuing) and a FlowSchema named after each key of ``accounts``
    (``(namespace, name)`` of a ServiceAccount) putting all its requests in it."""
    flow = client.FlowcontrolApiserverV1Api(api)
    flow.create_priority_level_configuration({
        "metadata": {"name": level},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": shares, "lendablePercent": 0,
            "borrowingLimitPercent": 0,
            "limitResponse": {"type": "Queue", "queuing": {
                "queues": queues, "queueLengthLimit": queue_length, "handSize": 4}}}}})
    for schema, (namespace, name) in accounts.items():
        flow.create_flow_schema({
            "metadata": {"name": schema},
            "spec": {"priorityLevelConfiguration": {"name": level},
                     "matchingPrecedence": 500,
                     "distinguisherMethod": {"type": "ByUser"},
                     "rules": [{"subjects": [{"kind": "ServiceAccount", "serviceAccount": {
                         "namespace": namespace, "name": name}}],
                         "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"],
                                            "resources": ["*"], "namespaces": ["*"],
                                            "clusterScope": True}]}]}})


def flowcontrol_counts(plane: ControlPlane) -> dict[str, dict[str, float]]:
    """kube-apiserver's APF counters by FlowSchema: ``{"dispatched": {schema: n},
    "rejected": {schema: n}}`` (its /metrics, read as admin)."""
    ctx = ssl.create_default_context(cafile=str(plane.ca_cert_path))
    ctx.load_cert_chain(str(plane.pki.admin_cert), str(plane.pki.admin_key))
    with urllib.request.urlopen(f"{plane.server_url}/metrics", context=ctx,
                                timeout=30) as resp:
        text = resp.read().decode()
    out: dict[str, dict[str, float]] = {"dispatched": {}, "rejected": {}}
    names = {"apiserver_flowcontrol_dispatched_requests": "dispatched",
             "apiserver_flowcontrol_rejected_requests": "rejected"}
    for family in text_string_to_metric_families(text):
        key = names.get(family.name)
        if key is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                schema = sample.labels.get("flow_schema", "")
                out[key][schema] = out[key].get(schema, 0.0) + sample.value
    return out


def rejected_share(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]],
                   schema: str) -> dict[str, float | None]:
    """Requests of ``schema`` between two :func:`flowcontrol_counts`: dispatched,
    rejected (429) and the rejected share (None without requests)."""
    def delta(key: str) -> float:
        return after[key].get(schema, 0.0) - before[key].get(schema, 0.0)

    dispatched, rejected = delta("dispatched"), delta("rejected")
    total = dispatched + rejected
    return {"dispatched": dispatched, "rejected": rejected,
            "rejected_share": rejected / total if total else None}


class PressureClient:
    """ConfigMap applies at ``qps`` per second as ``kubeconfig``'s identity, open loop,
    in a process of its own (:meth:`start`, :meth:`stop`); each request's send time,
    latency and HTTP status are kept (:attr:`results`).

    Its own process, as another client of the API server is: in a thread of the
    benchmark, its latencies would include waits for the GIL held by the TrainJob
    watch, whose work grows with the scraper's writes/s.
    """

    def __init__(self, kubeconfig: Path, namespace: str, qps: float,
                 objects: int = 50) -> None:
        self.kubeconfig, self.namespace, self.qps, self.objects = (
            kubeconfig, namespace, qps, objects)
        handle, name = tempfile.mkstemp(prefix="pressure-", suffix=".log")
        os.close(handle)
        self._log = Path(name)
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._stopped: list[tuple[float, float, int]] | None = None

    def start(self) -> None:
        self._log.write_text("")
        self._stopped = None
        self._proc = multiprocessing.get_context("spawn").Process(
            target=_pressure_process, name="pressure", daemon=True,
            args=(str(self.kubeconfig), self.namespace, self.qps, self.objects,
                  str(self._log), os.getpid()))
        self._proc.start()

    def stop(self) -> None:
        """SIGTERM: the child sends no more, waits up to 30 s for its requests, exits;
        its results are kept and its log removed."""
        if self._proc is None:
            return
        self._proc.terminate()
        self._proc.join(60)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._stopped = self.results
        self._log.unlink(missing_ok=True)

    @property
    def results(self) -> list[tuple[float, float, int]]:
        """``(epoch sent, seconds, status)`` of each request answered so far (status 0:
        no answer)."""
        if self._stopped is not None:
            return self._stopped
        rows: list[tuple[float, float, int]] = []
        for line in self._log.read_text().splitlines(keepends=True):
            if line.endswith("\n"):  # a line the child is still writing is skipped
                sent, seconds, status = line.split()
                rows.append((float(sent), float(seconds), int(status)))
        return rows

    def summary(self, start: float, end: float) -> dict[str, Any]:
        """Requests sent in ``[start, end)``: count, p50/p99 latency (s), 429s.

        Raises:
            RuntimeError: the child ended before :meth:`stop` (its exit code named).
        """
        from benchmarks.cp import percentile

        if self._stopped is None and self._proc is not None and not self._proc.is_alive():
            raise RuntimeError(f"pressure client: its process ended with exit code "
                               f"{self._proc.exitcode} before it was stopped")
        rows = [r for r in self.results if start <= r[0] < end]
        lat = [s for _, s, _ in rows]
        return {"qps": self.qps, "requests": len(rows),
                "p50_s": percentile(lat, 0.5), "p99_s": percentile(lat, 0.99),
                "rejected": sum(1 for *_, code in rows if code == 429),
                "failed": sum(1 for *_, code in rows if code not in (200, 201, 429))}


def _pressure_process(kubeconfig: str, namespace: str, qps: float, objects: int,
                      log: str, parent: int) -> None:
    """The pressure child: applies until SIGTERM or until ``parent`` is gone, one line
    per answer to ``log``."""
    with open(log, "a", buffering=1) as out:  # a line per answer, readable at once
        asyncio.run(_pressure(kubeconfig, namespace, qps, objects, out, parent))


async def _pressure(kubeconfig: str, namespace: str, qps: float, objects: int,
                    out: IO[str], parent: int) -> None:
    from kubernetes import config as k8s_config

    from scraper.kube.apply_request import ApplyClient

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    api = k8s_config.new_client_from_config(kubeconfig)
    apply = ApplyClient(api, connections=64)
    tasks: set[asyncio.Task[None]] = set()
    began, n = time.monotonic(), 0
    try:
        while not stop.is_set() and os.getppid() == parent:  # an orphan stops
            delay = began + n / qps - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                continue
            task = asyncio.create_task(_apply_one(apply, namespace, objects, n, out))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
        if tasks:
            await asyncio.wait(tasks, timeout=30)
    finally:
        await apply.close()
        api.close()


async def _apply_one(apply: Any, namespace: str, objects: int, n: int, out: IO[str]) -> None:
    from kubernetes.client.exceptions import ApiException

    name = f"pressure-{n % objects}"
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": name}, "data": {"n": str(n)}}).encode()
    sent, t0, code = time.time(), time.monotonic(), 200
    try:
        await apply.patch(f"/api/v1/namespaces/{namespace}/configmaps/{name}",
                          [("fieldManager", "pressure"), ("force", "true")], body,
                          request_timeout=(10.0, 30.0))
    except ApiException as exc:
        code = exc.status or 0
    except (OSError, TimeoutError):
        code = 0
    out.write(f"{sent:.6f} {time.monotonic() - t0:.6f} {code}\n")
