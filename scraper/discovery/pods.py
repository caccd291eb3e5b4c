"""Pod discovery: list+watch of trainer pods and what each pod means for the scraper.

This module knows Kubernetes labels, annotations and pod states; it knows
nothing of HTTP or of the exporter's format.  Pods are plain dicts (the API's
JSON), never client model objects: the watch skips deserialising them.

A :class:`PodWatcher` runs one list+watch per scope (all namespaces, or one
namespace) in a daemon thread and feeds :class:`Synced` and :class:`PodEvent`
items into an asyncio queue.  :func:`classify` turns one pod into a
:class:`Decision`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, Literal, cast

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from exporter_lib.pod import kubelet_hostname
from scraper.discovery.deletions import requested_at
from scraper.kube.calls import Backoff, call
from scraper.kube.client import REQUEST_TIMEOUT
from scraper.kube.health import ApiHealth
from scraper.kube.informer import WATCH_BACKOFF, ListWatch
from scraper.shared.errors import ConfigError
from scraper.shared.policy import overrides_of
from scraper.shared.targets import SOURCE_EXPORTER, SOURCES, Final, Target
from scraper.syntax import IntervalOutOfRange, parse_interval

log = logging.getLogger(__name__)

LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"

ANNOTATION_PREFIX = "trainjob-progress.dev/"
ANNOTATION_SCRAPE = ANNOTATION_PREFIX + "scrape"
ANNOTATION_PORT = ANNOTATION_PREFIX + "port"
ANNOTATION_PATH = ANNOTATION_PREFIX + "path"
ANNOTATION_SOURCE = ANNOTATION_PREFIX + "source"
#: The trainer container of the Kubeflow Trainer's runtimes (its log is read by default).
TRAINER_CONTAINER = "node"
ANNOTATION_INTERVAL = ANNOTATION_PREFIX + "interval"
ANNOTATION_CONTAINER = ANNOTATION_PREFIX + "container"
PROMETHEUS_PORT = "prometheus.io/port"
PROMETHEUS_PATH = "prometheus.io/path"



# ---------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Scrape:
    """The pod is Running with an IP: scrape ``target``."""

    target: Target


@dataclass(frozen=True)
class Wait:
    """Not scrapeable yet (pending, no IP); ``reason`` says why."""

    reason: str


@dataclass(frozen=True)
class Ignore:
    """Never scrape this pod (opted out, no TrainJob label, bad annotation).

    ``misconfigured`` marks a pod that asked to be scraped but whose annotations
    are wrong: its owner must hear of it, an opted-out pod is silence by choice.
    """

    reason: str
    misconfigured: bool = False


Decision = Scrape | Final | Wait | Ignore


def pod_key(pod: Mapping[str, Any]) -> str:
    """``namespace/name`` of a pod dict."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def classify(
    pod: Mapping[str, Any], *, default_port: int, default_path: str, default_interval: float,
    deletion_requested: float | None = None,
) -> Decision:
    """Decide what a pod (API JSON dict) means for the scraper.

    Ports come from ``trainjob-progress.dev/port``, else ``prometheus.io/port``,
    else ``default_port``; paths likewise; the interval from
    ``trainjob-progress.dev/interval`` (``15s``, ``2m`` or seconds, 1s..1h), else
    ``default_interval`` (seconds).  A malformed annotation makes the pod
    :class:`Ignore` with a reason that names it.  ``deletion_requested``: the earliest
    deletion request seen for the pod (:func:`killed_by_deletion`).
    """
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    namespace, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
    trainjob = labels.get(LABEL_JOBSET_NAME)
    if not trainjob:
        return Ignore(f"no {LABEL_JOBSET_NAME} label: no TrainJob to report to")
    if str(annotations.get(ANNOTATION_SCRAPE, "true")).lower() == "false":
        return Ignore(f"{ANNOTATION_SCRAPE}=false")
    source = str(annotations.get(ANNOTATION_SOURCE, SOURCE_EXPORTER)).lower()
    if source not in SOURCES:
        return Ignore(f"{ANNOTATION_SOURCE}={annotations[ANNOTATION_SOURCE]!r}: not one of "
                      f"{', '.join(SOURCES)}", misconfigured=True)
    container = log_container(pod)
    phase = status.get("phase", "")
    if phase in ("Succeeded", "Failed"):
        if killed_by_deletion(pod, deletion_requested):
            return Ignore(KILLED_REASON)
        return Final(namespace, trainjob, name, uid, _termination_messages(pod),
                     source=source, log_container=container,
                     finished_at=_finished_at(pod))
    if phase != "Running":
        return Wait(f"phase {phase or 'unknown'}")
    ip = status.get("podIP")
    if not ip:
        return Wait("no pod IP yet")

    port_text = annotations.get(ANNOTATION_PORT) or annotations.get(PROMETHEUS_PORT)
    try:
        port = int(port_text) if port_text else default_port
        if not 1 <= port <= 65535:
            raise ValueError
    except ValueError:
        return Ignore(f"port annotation {port_text!r} is not a port (1..65535)", misconfigured=True)
    path = annotations.get(ANNOTATION_PATH) or annotations.get(PROMETHEUS_PATH) or default_path
    if not path.startswith("/"):
        return Ignore(f"path annotation {path!r} must start with '/'", misconfigured=True)
    interval = default_interval
    if ANNOTATION_INTERVAL in annotations:
        try:
            interval = parse_interval(annotations[ANNOTATION_INTERVAL])
        except IntervalOutOfRange as exc:
            return Ignore(f"{ANNOTATION_INTERVAL}={annotations[ANNOTATION_INTERVAL]!r}: {exc}",
                          misconfigured=True)
        except ValueError as exc:
            return Ignore(f"{ANNOTATION_INTERVAL}: {exc}", misconfigured=True)
    host = f"[{ip}]" if ":" in ip else ip
    url = f"http://{host}:{port}{path}"
    spec = pod.get("spec") or {}
    # A hostNetwork pod's containers have the node's hostname (the kubelet sets a pod
    # hostname only for pods with their own network namespace), unknown here: not
    # compared; the exporter's other stated parts (name, namespace, UID) still are.
    hostname = "" if spec.get("hostNetwork") else kubelet_hostname(name, spec.get("hostname"))
    return Scrape(Target(namespace, trainjob, name, uid, url, interval, source=source,
                         log_container=container, hostname=hostname,
                         policy=overrides_of(annotations)))


def log_container(pod: Mapping[str, Any]) -> str:
    """The container whose log is the status source: ``trainjob-progress.dev/container``,
    else the Trainer's ``node`` container, else the first container (``""``: none)."""
    meta = pod.get("metadata") or {}
    wanted = (meta.get("annotations") or {}).get(ANNOTATION_CONTAINER)
    if wanted:
        return str(wanted)
    names = [c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or []]
    return TRAINER_CONTAINER if TRAINER_CONTAINER in names else (names[0] if names else "")


KILLED_REASON = ("its containers ended after its deletion began (preemption, suspension, "
                 "a restart, an eviction): not the training's end, no final status")


def killed_by_deletion(pod: Mapping[str, Any], requested: float | None = None) -> bool:
    """True when the pod's containers ended because the pod was deleted, not on their own.

    A Kueue preemption or a suspended TrainJob (its Jobs' pods deleted), a JobSet
    restart, an eviction: the containers get SIGTERM and end, the training did not, so
    a termination message written then is not a final status.  Read from the pod: it
    has a ``deletionTimestamp``, and every terminated container's ``finishedAt`` is at
    or after the deletion request (``deletionTimestamp`` minus
    ``deletionGracePeriodSeconds``; both have 1 s resolution, so a container that
    ended on its own in the very second of the request counts as killed).  A pod that
    ended before it was deleted (a finished training cleaned up) is not.

    ``requested``: the earliest deletion request seen for this pod (epoch seconds,
    :class:`scraper.discovery.deletions.DeletionRequests`); the pod's own fields lose it once the
    kubelet's grace-0 confirmation shortened them.
    """
    shown = requested_at(pod)
    if shown is None and requested is None:
        return False
    earliest = min(t for t in (shown, requested) if t is not None)
    finished = [at for _, at in _finished_at(pod)]
    return bool(finished) and min(finished) >= earliest


def final_from_deleted(pod: Mapping[str, Any], requested: float | None = None) -> Final | None:
    """A deleted pod's :class:`Final`, when it carries a termination message and its
    containers ended on their own (:func:`killed_by_deletion`, ``requested`` as there)."""
    meta = pod.get("metadata") or {}
    trainjob = (meta.get("labels") or {}).get(LABEL_JOBSET_NAME)
    messages = _termination_messages(pod)
    if not trainjob or not messages or killed_by_deletion(pod, requested):
        return None
    return Final(meta.get("namespace", ""), trainjob, meta.get("name", ""),
                 meta.get("uid", ""), messages, finished_at=_finished_at(pod))


def _finished_at(pod: Mapping[str, Any]) -> tuple[tuple[str, float], ...]:
    """``(container, finishedAt epoch seconds)`` of every terminated container (regular
    and init) whose ``finishedAt`` reads as RFC 3339."""
    status = pod.get("status") or {}
    out = []
    for cs in [*(status.get("initContainerStatuses") or []),
               *(status.get("containerStatuses") or [])]:
        stamp = ((cs.get("state") or {}).get("terminated") or {}).get("finishedAt")
        if not isinstance(stamp, str):
            continue
        try:
            at = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
        out.append((str(cs.get("name", "")), at))
    return tuple(out)


def _termination_messages(pod: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Termination messages of the pod's containers, in the order they are tried.

    Native sidecars (``initContainers`` with ``restartPolicy: Always``, whose statuses
    are in ``initContainerStatuses``) come first, then the regular containers: a
    sidecar is stopped only after every regular container has exited, so what it
    holds is the newest status (the zero-code sidecar holds the last push; see
    docs/exporter-setup.md).  With ``trainjob-progress.dev/container`` set, only the
    container of that name counts, sidecar or not.  Ordinary init containers ran
    before training and are never read.
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    wanted = (meta.get("annotations") or {}).get(ANNOTATION_CONTAINER)
    sidecars = {c.get("name") for c in spec.get("initContainers") or []
                if c.get("restartPolicy") == "Always"}
    statuses = [cs for cs in status.get("initContainerStatuses") or []
                if cs.get("name") in sidecars]
    statuses += status.get("containerStatuses") or []
    out = []
    for cs in statuses:
        if wanted and cs.get("name") != wanted:
            continue
        terminated = (cs.get("state") or {}).get("terminated") or {}
        message = terminated.get("message")
        if message:
            out.append((cs.get("name", ""), message))
    return tuple(out)


# ---------------------------------------------------------------- list + watch


@dataclass(frozen=True)
class Synced:
    """A full list of the pods in ``scope`` (a namespace, or None for all)."""

    scope: str | None
    pods: tuple[dict[str, Any], ...]


#: The kinds of watch event forwarded (bookmarks are not).
EventKind = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True)
class PodEvent:
    """One watch event for a pod (bookmarks are not forwarded)."""

    kind: EventKind
    pod: dict[str, Any]


WatchItem = Synced | PodEvent


class PodWatcher:
    """List+watch of the pods matching a selector (a :class:`~scraper.kube.informer.ListWatch`).

    Each list is forwarded to ``queue`` as :class:`Synced`, then every change as
    :class:`PodEvent`; a full queue holds the watch thread back (backpressure) until
    there is room or :meth:`stop` is called.  Relists on 410 Gone, backs off with
    jitter (:data:`WATCH_BACKOFF`) on other errors, or until ``health`` sees the API server
    answer again after it was unreachable; ``on_restart`` is called (from the thread)
    every time the watch has to start over.
    """

    def __init__(
        self,
        core: CoreV1Api,
        *,
        namespace: str | None,
        selector: str,
        queue: asyncio.Queue[WatchItem],
        loop: asyncio.AbstractEventLoop,
        on_restart: Callable[[str], None] = lambda reason: None,
        backoff: Backoff = WATCH_BACKOFF,
        health: ApiHealth | None = None,
    ) -> None:
        self._queue = queue
        self._loop = loop
        lister = (partial(core.list_namespaced_pod, namespace, label_selector=selector)
                  if namespace else
                  partial(core.list_pod_for_all_namespaces, label_selector=selector))
        self._watch = ListWatch(
            lister, name=f"pods/{namespace or 'all'}", loop=loop,
            on_list=lambda pods: self._put(Synced(namespace, tuple(pods))),
            on_event=lambda kind, pod: self._put(PodEvent(cast(EventKind, kind), pod)),
            on_restart=on_restart, backoff=backoff, health=health,
            handoff=lambda func, args: func(*args))  # on the thread: _put blocks there

    def start(self) -> None:
        """Start the watch thread (returns at once)."""
        self._watch.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Ask the watch thread to stop; wait at most ``timeout`` seconds for it."""
        self._watch.stop(timeout)

    def relist(self) -> None:
        """List again at once (:meth:`scraper.kube.informer.ListWatch.relist`)."""
        self._watch.relist()

    def _put(self, item: WatchItem) -> None:
        # Backpressure: wait for room in the queue, but keep noticing stop().
        future = asyncio.run_coroutine_threadsafe(self._queue.put(item), self._loop)
        while not self._watch.stopping:
            try:
                future.result(timeout=0.5)
                return
            except TimeoutError:
                continue
        future.cancel()


def _short(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    text = str(exc)
    return f"{type(exc).__name__}: {text[:200]}"


async def probe_selector(core: CoreV1Api, selector: str, namespace: str | None) -> bool:
    """Ask the API server whether ``selector`` is a valid label selector.

    One pod list with ``limit=1`` in ``namespace`` (None: all namespaces): the API
    server's own grammar decides, so every selector it accepts works (``gpu>1``,
    ``!canary``), and a wrong one is a configuration error at start, not a watch that
    fails forever.  Answers other than 400 (no access yet, API server down) are left to
    the watch, which reports and retries them.

    Returns:
        True when the API server answered the list (it accepts the selector); False
        when it could not be asked (any answer but 400, or no answer): left to the watch.

    Raises:
        ConfigError: ``selector='...': <the API server's reason>`` on HTTP 400.
    """
    func = core.list_namespaced_pod if namespace else core.list_pod_for_all_namespaces
    args = (namespace,) if namespace else ()
    try:
        # The answer is read whole (at most one pod): a pooled connection given back
        # with an unread body would break the watch's first list on it.
        await call(func, *args, label_selector=selector, limit=1,
                   _request_timeout=REQUEST_TIMEOUT)
    except ApiException as exc:
        if exc.status != 400:
            log.debug("selector probe: HTTP %s (left to the watch)", exc.status)
            return False
        raise ConfigError([f"selector={selector!r}: {_status_message(exc)}"]) from None
    except Exception as exc:
        log.debug("selector probe failed (left to the watch): %s", _short(exc))
        return False
    return True


def _status_message(exc: ApiException) -> str:
    """The ``message`` of the API server's Status body, else the HTTP reason."""
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or f"HTTP {exc.status} {exc.reason}")
