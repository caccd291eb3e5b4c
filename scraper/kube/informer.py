"""A list+watch of one kind in one scope, in a daemon thread: client-go's reflector.

One :class:`ListWatch` lists (paged), hands the whole list to ``on_list``, then watches
from the list's resourceVersion (with bookmarks) and hands every change to
``on_event``; both are called on the asyncio loop (``call_soon_threadsafe``), in order.
410 Gone relists at once; any other error backs off (:class:`~scraper.kube.calls.Backoff`)
and relists.  With an :class:`~scraper.kube.health.ApiHealth`, a watch that found the API
server unreachable relists as soon as it answers again (a probe or any call saw it),
whatever its backoff had grown to during the outage, and starts its backoff over.
``relist_interval`` > 0 relists that often besides (a safety net; the watch alone sees
every change).  Objects are plain dicts (the API's JSON) with
``metadata.managedFields`` dropped before anything keeps them.

Knows nothing of TrainJobs: the caller passes the list function (e.g.
``CustomObjectsApi.list_cluster_custom_object`` with its group, version and plural
bound by :func:`functools.partial`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from scraper.kube.calls import Backoff
from scraper.kube.client import REQUEST_TIMEOUT
from scraper.kube.health import ApiHealth, answering, unreachable

log = logging.getLogger(__name__)

#: Server-side timeout of one watch request (seconds): bounds how long a stop waits.
WATCH_TIMEOUT_SECONDS = 30
LIST_PAGE_SIZE = 500
#: Between two tries of a failed list or watch: 0.5 s doubling up to 30 s, +50 % jitter.
WATCH_BACKOFF = Backoff(initial=0.5, cap=30.0)

Obj = dict[str, Any]


class _Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): relist."""


def slim(obj: Obj) -> Obj:
    """``obj`` without ``metadata.managedFields`` (most of an object's bytes; unused)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


class ScopesListed:
    """Which scopes (namespaces; None: the cluster) have had their first full list.

    Args:
        scopes: every scope one kind is listed in; :attr:`event` is set once each was.
    """

    def __init__(self, scopes: Iterable[str | None]) -> None:
        self._waiting = set(scopes)
        self.event = asyncio.Event()

    def listed(self, scope: str | None) -> None:
        """A full list of ``scope`` arrived."""
        self._waiting.discard(scope)
        if not self._waiting:
            self.event.set()


class ListWatch:
    """List+watch with ``lister`` (a Kubernetes client list function; see module doc).

    Args:
        lister: called with the list/watch keyword arguments (``watch``,
            ``resource_version``, ``limit``, ``_continue``, ...).
        name: for logs and the thread name, e.g. ``trainjobs/all``.
        loop: the asyncio loop the callbacks run on.
        on_list: the full list of objects (after every (re)list).
        on_event: ``(type, object)`` for ADDED, MODIFIED, DELETED.
        on_restart: ``"gone"``, ``"error"`` or ``"relist"`` (:meth:`relist`); called from
            the thread, must be thread-safe.
        relist_interval: seconds between two relists besides the watch (0: never).
        handoff: how the thread hands a callback and its arguments over; default: run it
            on ``loop`` (``call_soon_threadsafe``).  A handoff may block the thread
            (backpressure); it should give up once :attr:`stopping` is set.
        health: told of unreachable and answering API servers; a retry after an
            unreachable one waits for its recovery, at most the backoff (module doc).
        slim: applied to every object before it is handed over (default :func:`slim`).
    """

    def __init__(
        self,
        lister: Callable[..., Any],
        *,
        name: str,
        loop: asyncio.AbstractEventLoop,
        on_list: Callable[[list[Obj]], None],
        on_event: Callable[[str, Obj], None],
        on_restart: Callable[[str], None] = lambda reason: None,
        relist_interval: float = 0.0,
        backoff: Backoff = WATCH_BACKOFF,
        handoff: Callable[[Callable[..., None], tuple[Any, ...]], None] | None = None,
        health: ApiHealth | None = None,
        slim: Callable[[Obj], Obj] = slim,
    ) -> None:
        self._slim = slim
        self._lister = lister
        self._health = health
        self._handoff = handoff
        self.name = name
        self._loop = loop
        self._on_list = on_list
        self._on_event = on_event
        self._on_restart = on_restart
        self._relist_interval = relist_interval
        self._backoff = backoff
        self._stop = threading.Event()
        self._relist = threading.Event()  # relist() asked for a new list
        self._resp: Any = None  # the watch answer being read (relist() shuts it down)
        self.lists = 0  # how many lists ran (for tests and benchmarks)
        self._thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)

    def start(self) -> None:
        """Start the thread (returns at once)."""
        self._thread.start()

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stop.is_set()

    def stop(self, timeout: float = 1.0) -> None:
        """Ask the thread to stop; wait at most ``timeout`` s (it is a daemon).

        A blocked read ends at the latest with the server-side watch timeout
        (:data:`WATCH_TIMEOUT_SECONDS`).
        """
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def relist(self) -> None:
        """Start over with a new list at once (thread-safe): the caller failed to apply
        something this watch delivered, so its picture may have a gap.  A blocked watch
        read is shut down (urllib3's ``HTTPResponse.shutdown``, meant for this)."""
        self._relist.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):  # already closed or released
                resp.shutdown()

    # -- thread side

    def _deliver(self, func: Callable[..., None], *args: Any) -> None:
        if self._stop.is_set():
            return
        if self._handoff is not None:
            self._handoff(func, args)
        else:
            self._loop.call_soon_threadsafe(func, *args)

    def _list(self) -> tuple[list[Obj], str]:
        items: list[Obj] = []
        cont: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": LIST_PAGE_SIZE, "_preload_content": False,
                                      "_request_timeout": REQUEST_TIMEOUT}
            if cont:
                kwargs["_continue"] = cont
            resp = self._lister(**kwargs)
            body = json.loads(resp.data)
            items.extend(self._slim(o) for o in body.get("items") or [])
            meta = body.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                return items, meta.get("resourceVersion", "")

    def _watch_from(self, resource_version: str, until: float) -> str:
        timeout = WATCH_TIMEOUT_SECONDS
        if until:
            timeout = max(1, min(timeout, int(until - time.monotonic()) + 1))
        resp = self._lister(watch=True, resource_version=resource_version,
                            allow_watch_bookmarks=True, timeout_seconds=timeout,
                            # Between two bytes the server is silent at most until its own
                            # timeout (bookmarks come sooner): a dead server is noticed
                            # 10 s later.
                            _request_timeout=(REQUEST_TIMEOUT[0], timeout + 10),
                            _preload_content=False)
        self._resp = resp
        try:
            for line in iter_resp_lines(resp):
                if self._stop.is_set() or self._relist.is_set():
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
                    "resourceVersion", resource_version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._deliver(self._on_event, kind, self._slim(obj))
        except ApiException as exc:
            if exc.status == 410:
                raise _Gone() from None
            raise
        finally:
            self._resp = None
            resp.close()
            resp.release_conn()
        return resource_version

    def _relisting(self) -> None:
        self._relist.clear()
        log.info("watch %s: relisting (asked to)", self.name)
        self._on_restart("relist")

    def _run(self) -> None:
        failures = 0
        was_unreachable = False  # the last failure's kind: each kind has its own backoff
        while not self._stop.is_set():
            try:
                items, resource_version = self._list()
                if self._health is not None:
                    self._health.answered()
                self.lists += 1
                self._deliver(self._on_list, items)
                failures = 0
                until = (time.monotonic() + self._relist_interval
                         if self._relist_interval > 0 else 0.0)
                while (not self._stop.is_set() and not self._relist.is_set()
                       and (not until or time.monotonic() < until)):
                    resource_version = self._watch_from(resource_version, until)
                if self._relist.is_set():
                    self._relisting()
            except _Gone:
                log.info("watch %s: resourceVersion expired, relisting", self.name)
                self._on_restart("gone")
            except Exception as exc:
                if self._relist.is_set():  # the shut-down read of relist(): no backoff
                    self._relisting()
                    continue
                self._on_restart("error")
                lost = self._health is not None and unreachable(exc)
                if was_unreachable and not lost:
                    # The first answer after an outage (e.g. 403 while the restarted API
                    # server's authorizer warms up): not the outage's grown backoff.
                    failures = 0
                was_unreachable = lost
                delay = self._backoff.delay(failures)
                failures += 1
                detail = (f"HTTP {exc.status} {exc.reason}" if isinstance(exc, ApiException)
                          else f"{type(exc).__name__}: {str(exc)[:200]}")
                if self._health is not None and answering(exc):
                    self._health.answered()  # a refusal: the server is back
                if self._health is None or not lost:
                    log.warning("watch %s failed: %s; retrying in %.1fs", self.name, detail,
                                delay)
                    self._stop.wait(delay)
                    continue
                since = self._health.lost()
                log.warning("watch %s failed: %s; retrying in %.1fs, or once the API server "
                            "answers again", self.name, detail, delay)
                if self._health.wait_recovered(since, delay, self._stop):
                    failures = 0  # a new start: the backoff of the outage is over
