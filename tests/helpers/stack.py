"""Helpers of the tests on the real stack (:class:`localdev.cluster.stack.Cluster`).

Nothing here creates a Pod, Job or JobSet or writes pod status: TrainJobs are
created through the API on shipped runtimes, the controllers do the rest.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
from kubernetes import client, watch

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL, TrainerStatus
from localdev.cluster.assets import AssetsError
from localdev.cluster.controlplane import ControlPlaneError
from localdev.cluster.crds import CrdError
from localdev.cluster.processes import free_port
from localdev.cluster.stack import Cluster
from localdev.demo.processes import Child, start_scraper, wait_http_ok


class Startable(Protocol):
    """What :func:`started` runs: a :class:`~localdev.cluster.stack.Cluster` or a
    :class:`~localdev.cluster.controlplane.ControlPlane`."""

    def start(self) -> object: ...

    def stop(self) -> object: ...


_T = TypeVar("_T", bound=Startable)


def started(pytestconfig: pytest.Config, thing: _T, what: str,
            errors: tuple[type[BaseException], ...]) -> Iterator[_T]:
    """Start ``thing`` (its first build's progress shown live), yield it, stop it.

    A start failure of a type in ``errors`` fails the test with ``what`` and the
    reason (never a skip); ``thing`` is stopped either way.
    """
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    live = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
    try:
        with live:
            thing.start()
    except errors as exc:
        thing.stop()
        pytest.fail(f"{what} could not start: {exc}", pytrace=False)
    try:
        yield thing
    finally:
        thing.stop()


def started_cluster(pytestconfig: pytest.Config, cluster: Cluster) -> Iterator[Cluster]:
    """:func:`started` for a local cluster (its start errors: assets, control plane,
    CRDs, OS, API)."""
    return started(pytestconfig, cluster, "local cluster",
                   (AssetsError, ControlPlaneError, CrdError, OSError, client.ApiException))


def python_command(module: str, *args: str) -> list[str]:
    """A trainer command that runs ``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


@dataclass
class Observation:
    """One version of a TrainJob seen by :class:`TrainJobRecorder`."""

    uid: str
    resource_version: str
    status: TrainerStatus | None
    raw: dict[str, Any]
    event: str
    seen_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    """When the watch delivered this version (this machine's clock)."""


@dataclass
class TrainJobRecorder:
    """Watches one TrainJob by name and keeps every version (no poll can miss one).

    Versions of a re-created TrainJob of the same name have another ``uid``.
    """

    api: client.ApiClient
    namespace: str
    name: str
    seen: list[Observation] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        custom = client.CustomObjectsApi(self.api)
        version = ""
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                for event in watch.Watch().stream(
                        custom.list_namespaced_custom_object, API_GROUP, API_VERSION,
                        self.namespace, TRAINJOB_PLURAL,
                        field_selector=f"metadata.name={self.name}",
                        resource_version=version or None, timeout_seconds=5):
                    obj = event["object"]
                    version = obj["metadata"]["resourceVersion"]
                    raw = (obj.get("status") or {}).get("trainerStatus")
                    with self._lock:
                        self.seen.append(Observation(
                            obj["metadata"]["uid"], version,
                            TrainerStatus.from_api(raw) if raw else None, obj, event["type"]))
                    if self._stop.is_set():
                        return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def statuses(self, uid: str | None = None) -> list[TrainerStatus]:
        """The distinct trainerStatus values in order (of TrainJob ``uid`` when given)."""
        with self._lock:
            items = [o for o in self.seen if uid is None or o.uid == uid]
        result: list[TrainerStatus] = []
        for o in items:
            if o.status is not None and (not result or o.status != result[-1]):
                result.append(o.status)
        return result

    def statuses_through(self, final: TrainerStatus, uid: str, timeout: float,
                         what: str) -> list[TrainerStatus]:
        """Wait until the TrainJob stores ``final``; the distinct statuses of ``uid`` up to
        and including it (:meth:`statuses`).

        Raises:
            AssertionError: ``final`` not seen within ``timeout`` seconds.
        """
        self.wait_for(lambda o: o.status == final, timeout, what)
        seen = self.statuses(uid)
        return seen[:seen.index(final) + 1]

    def wait_for(self, predicate: Any, timeout: float, what: str) -> Observation:
        """Wait until an observation satisfies ``predicate``; return it.

        Raises:
            AssertionError: none within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for o in self.seen:
                    if predicate(o):
                        return o
            time.sleep(0.1)
        raise AssertionError(f"{what}: not seen within {timeout:.0f}s; last: "
                             f"{self.seen[-1].status if self.seen else None}")


@contextlib.contextmanager
def recording(api: client.ApiClient, namespace: str, name: str) -> Iterator[TrainJobRecorder]:
    recorder = TrainJobRecorder(api, namespace, name)
    try:
        yield recorder
    finally:
        recorder.stop()


#: Starts of a scraper tried when another process took its free port between
#: ``free_port()`` and the scraper's bind ("address already in use", exit code 1: seen in
#: a CI run with two workers; tests/helpers/scraper.py's ScraperProcess does the same).
SCRAPER_PORT_TRIES = 3


@contextlib.contextmanager
def scraper(cluster: Cluster, namespace: str, workdir: Path,
            options: Sequence[str] = (), kubeconfig: Path | None = None,
            env: dict[str, str] | None = None) -> Iterator[Child]:
    """``trainjob-scraper run`` against the local cluster, for ``namespace`` (through
    ``kubeconfig`` when given, e.g. a fault proxy's; else the cluster's admin one;
    ``env`` added to its environment)."""
    for attempt in range(1, SCRAPER_PORT_TRIES + 1):
        child = start_scraper(workdir, kubeconfig=kubeconfig or cluster.kubeconfig_path,
                              port=free_port(),
                              options=["--interval", "1s", "--namespaces", namespace,
                                       *options],
                              env=env)
        try:
            wait_http_ok(child.extra["base_url"] + "/readyz", child)
            break
        except RuntimeError:
            lost_port = not child.running() and "ddress already in use" in child.log_tail()
            child.stop()
            if not lost_port or attempt == SCRAPER_PORT_TRIES:
                raise
    try:
        yield child
    finally:
        child.stop()


def scraper_metric(child: Child, name: str) -> str:
    """The scraper's ``/metrics`` lines of series ``name``."""
    import urllib.request

    with urllib.request.urlopen(child.extra["metrics_url"], timeout=5) as response:
        text = response.read().decode()
    return "\n".join(line for line in text.splitlines() if line.startswith(name))
