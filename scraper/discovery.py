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
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from scraper.config import ConfigError
from scraper.kube.calls import Backoff, call
from scraper.kube.client import REQUEST_TIMEOUT
from scraper.syntax import IntervalOutOfRange, parse_interval
from scraper.targets import Target

log = logging.getLogger(__name__)

LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"

ANNOTATION_PREFIX = "trainjob-progress.dev/"
ANNOTATION_SCRAPE = ANNOTATION_PREFIX + "scrape"
ANNOTATION_PORT = ANNOTATION_PREFIX + "port"
ANNOTATION_PATH = ANNOTATION_PREFIX + "path"
ANNOTATION_INTERVAL = ANNOTATION_PREFIX + "interval"
ANNOTATION_CONTAINER = ANNOTATION_PREFIX + "container"
PROMETHEUS_PORT = "prometheus.io/port"
PROMETHEUS_PATH = "prometheus.io/path"

#: Server-side watch timeout (seconds): bounds how long a stop request waits.
WATCH_TIMEOUT_SECONDS = 30
LIST_PAGE_SIZE = 500
#: Between two tries of a failed list or watch: 0.5 s doubling up to 30 s, +50 % jitter.
WATCH_BACKOFF = Backoff(initial=0.5, cap=30.0)


# ---------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Scrape:
    """The pod is Running with an IP: scrape ``target``."""

    target: Target


@dataclass(frozen=True)
class Final:
    """The pod has ended: its final status may be in a termination message.

    Attributes:
        messages: ``(container name, message)`` pairs to try in order; empty when
            no container left one.
        trainjob_uid: the TrainJob UID of the pod's owner chain, once verified.
    """

    namespace: str
    trainjob: str
    pod_name: str
    pod_uid: str
    messages: tuple[tuple[str, str], ...]
    trainjob_uid: str = ""


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
    pod: Mapping[str, Any], *, default_port: int, default_path: str, default_interval: float
) -> Decision:
    """Decide what a pod (API JSON dict) means for the scraper.

    Ports come from ``trainjob-progress.dev/port``, else ``prometheus.io/port``,
    else ``default_port``; paths likewise; the interval from
    ``trainjob-progress.dev/interval`` (``15s``, ``2m`` or seconds, 1s..1h), else
    ``default_interval`` (seconds).  A malformed annotation makes the pod
    :class:`Ignore` with a reason that names it.
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
    phase = status.get("phase", "")
    if phase in ("Succeeded", "Failed"):
        return Final(namespace, trainjob, name, uid, _termination_messages(pod))
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
    return Scrape(Target(namespace, trainjob, name, uid, url, interval))


def final_from_deleted(pod: Mapping[str, Any]) -> Final | None:
    """A deleted pod's :class:`Final`, when it carries a termination message."""
    meta = pod.get("metadata") or {}
    trainjob = (meta.get("labels") or {}).get(LABEL_JOBSET_NAME)
    messages = _termination_messages(pod)
    if not trainjob or not messages:
        return None
    return Final(meta.get("namespace", ""), trainjob, meta.get("name", ""),
                 meta.get("uid", ""), messages)


def _termination_messages(pod: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Termination messages of the pod's containers; the annotated container only if set."""
    wanted = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_CONTAINER)
    out = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
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


@dataclass(frozen=True)
class PodEvent:
    """One watch event for a pod (bookmarks are not forwarded)."""

    kind: Literal["ADDED", "MODIFIED", "DELETED"]
    pod: dict[str, Any]


WatchItem = Synced | PodEvent


class _Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): relist."""


class PodWatcher:
    """List+watch of the pods matching a selector, in one daemon thread.

    Each list is forwarded as :class:`Synced`, then every change as
    :class:`PodEvent`.  The watch resumes from the last resourceVersion (kept
    fresh by bookmarks), relists on 410 Gone and backs off exponentially (with
    jitter, :data:`WATCH_BACKOFF`) on other errors.  ``on_restart`` is called
    (from the thread) every time the watch has to start over.
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
    ) -> None:
        self._core = core
        self._namespace = namespace
        self._selector = selector
        self._queue = queue
        self._loop = loop
        self._on_restart = on_restart
        self._backoff = backoff
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"pod-watch-{namespace or 'all'}", daemon=True
        )

    def start(self) -> None:
        """Start the thread (returns at once)."""
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Ask the thread to stop; wait at most ``timeout`` seconds for it.

        A blocked read ends at the latest with the server-side watch timeout
        (:data:`WATCH_TIMEOUT_SECONDS`); the thread is a daemon, so it never
        holds up interpreter exit.
        """
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- thread side

    def _put(self, item: WatchItem) -> None:
        # Backpressure: wait for room in the queue, but keep noticing stop().
        future = asyncio.run_coroutine_threadsafe(self._queue.put(item), self._loop)
        while not self._stop.is_set():
            try:
                future.result(timeout=0.5)
                return
            except TimeoutError:
                continue
        future.cancel()

    def _list(self) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        cont: str | None = None
        while True:
            kwargs: dict[str, Any] = {
                "label_selector": self._selector,
                "limit": LIST_PAGE_SIZE,
                "_preload_content": False,
                "_request_timeout": REQUEST_TIMEOUT,
            }
            if cont:
                kwargs["_continue"] = cont
            if self._namespace:
                resp = self._core.list_namespaced_pod(self._namespace, **kwargs)
            else:
                resp = self._core.list_pod_for_all_namespaces(**kwargs)
            body = json.loads(resp.data)
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                return items, meta.get("resourceVersion", "")

    def _watch_from(self, resource_version: str) -> str:
        """Watch until the server closes the stream; return the last resourceVersion.

        The stream is read here, not through ``kubernetes.watch.Watch.stream``: with
        ``deserialize=False`` that method fails with ``KeyError('raw_object')`` on
        the ERROR event by which the API server reports an expired resourceVersion
        (HTTP 200, a Status of code 410), so a 410 never reached the relist below.
        """
        func = (
            self._core.list_namespaced_pod if self._namespace else
            self._core.list_pod_for_all_namespaces
        )
        args = (self._namespace,) if self._namespace else ()
        resp = func(
            *args,
            label_selector=self._selector,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            watch=True,
            timeout_seconds=WATCH_TIMEOUT_SECONDS,
            # Between two bytes the server is silent at most until its own timeout
            # (bookmarks and events come sooner): a dead server is noticed 10 s later.
            _request_timeout=(REQUEST_TIMEOUT[0], WATCH_TIMEOUT_SECONDS + 10),
            _preload_content=False,
        )
        try:
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                resource_version = (obj.get("metadata") or {}).get(
                    "resourceVersion", resource_version
                )
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._put(PodEvent(kind, obj))
        except ApiException as exc:
            if exc.status == 410:
                raise _Gone() from None
            raise
        finally:
            resp.close()
            resp.release_conn()
        return resource_version

    def _run(self) -> None:
        failures = 0  # in a row, since the last good list
        while not self._stop.is_set():
            try:
                pods, resource_version = self._list()
                self._put(Synced(self._namespace, tuple(pods)))
                failures = 0
                while not self._stop.is_set():
                    resource_version = self._watch_from(resource_version)
            except _Gone:
                log.info("pod watch (%s): resourceVersion expired, relisting",
                         self._namespace or "all namespaces")
                self._on_restart("gone")
            except Exception as exc:
                self._on_restart("error")
                delay = self._backoff.delay(failures)
                failures += 1
                log.warning("pod watch (%s) failed: %s; retrying in %.1fs",
                            self._namespace or "all namespaces", _short(exc), delay)
                self._stop.wait(delay)


def _short(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    text = str(exc)
    return f"{type(exc).__name__}: {text[:200]}"


async def probe_selector(core: CoreV1Api, selector: str, namespace: str | None) -> None:
    """Ask the API server whether ``selector`` is a valid label selector.

    One pod list with ``limit=1`` in ``namespace`` (None: all namespaces): the API
    server's own grammar decides, so every selector it accepts works (``gpu>1``,
    ``!canary``), and a wrong one is a configuration error at start, not a watch that
    fails forever.  Answers other than 400 (no access yet, API server down) are left to
    the watch, which reports and retries them.

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
            return
        raise ConfigError([f"selector={selector!r}: {_status_message(exc)}"]) from None
    except Exception as exc:
        log.debug("selector probe failed (left to the watch): %s", _short(exc))


def _status_message(exc: ApiException) -> str:
    """The ``message`` of the API server's Status body, else the HTTP reason."""
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or f"HTTP {exc.status} {exc.reason}")
