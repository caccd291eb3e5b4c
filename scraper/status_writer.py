"""Writing ``TrainJob.status.trainerStatus``: server-side apply, only on change.

* Writes are server-side apply patches on the ``status`` subresource with the
  field manager :data:`FIELD_MANAGER` and ``force=true``.  Force policy:
  ``status.trainerStatus`` belongs to the scraper by contract, so a conflict
  with another manager (an older push-mode exporter, a hand edit) is resolved
  by taking ownership; fields another manager owns outside ``trainerStatus``
  are never sent and so never touched.  Fields the scraper stops sending
  (e.g. ``estimatedRemainingSeconds`` going away) are removed, as SSA does for
  an owner.
* A write happens only when the new status differs from the one the TrainJob
  holds (:func:`already_holds`: progress, remaining seconds and metrics; a new
  ``lastUpdatedTime`` alone is not news).  "Holds" is the object as last read
  (:class:`scraper.trainjobs.TrainJobCache`).
* Writes share a client-side token bucket with Events (QPS, burst).  409, 429,
  5xx and connection errors are retried with capped exponential backoff and
  jitter, never sooner than ``Retry-After`` (:mod:`scraper.kube.calls`); 404
  means the TrainJob is gone (:class:`TrainJobGone`).
* A CRD without ``status.trainerStatus`` is detected from its schema
  (:class:`scraper.kube.crd.CrdSupport`) or from the apply's answer: the API
  server refuses to apply an undeclared field (500 "field not declared in
  schema"), and a response without the field means it was pruned; either way a
  Warning Event per TrainJob.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from collections.abc import Callable
from typing import Any, Self

import urllib3
from aiolimiter import AsyncLimiter
from kubernetes.client import ApiClient, ApiextensionsV1Api, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL, TrainerStatus
from scraper.kube.apply_body import APPLY_CONTENT_TYPE, encode_apply_body
from scraper.kube.calls import Retries, call, is_transient
from scraper.kube.client import REQUEST_TIMEOUT
from scraper.kube.crd import CRD_NAME, REASON_UNSUPPORTED, CrdSupport
from scraper.kube.events import EventRecorder
from scraper.trainjobs import TrainJobCache, TrainJobGone, TrainJobKey

__all__ = ["FIELD_MANAGER", "NotLeader", "StatusWriter", "TrainJobGone", "WriteOutcome",
           "already_holds"]

log = logging.getLogger(__name__)

FIELD_MANAGER = "trainjob-scraper"


class NotLeader(Exception):
    """The write fence closed: this replica may not write now."""


class WriteOutcome(enum.Enum):
    """Result of :meth:`StatusWriter.apply`; ``value`` is the metrics label."""

    WRITTEN = "written"
    UNCHANGED = "unchanged"
    NOT_STORED = "not_stored"  # the CRD has no trainerStatus: nothing can be written
    FAILED = "failed"
    NOT_LEADER = "not_leader"


def _not_in_schema(exc: BaseException) -> bool:
    """True for the API server's answer to applying a field the CRD does not declare.

    Server-side apply refuses such a patch with 500 "failed to create typed patch
    object ... field not declared in schema" instead of pruning the field.
    """
    return (isinstance(exc, ApiException) and exc.status == 500
            and "not declared in schema" in str(exc.body or ""))


def _retryable(exc: BaseException) -> bool:
    return is_transient(exc) and not _not_in_schema(exc)


def already_holds(held: TrainerStatus | None, new: TrainerStatus) -> bool:
    """True when applying ``new`` would not change what the TrainJob holds.

    ``lastUpdatedTime`` is ignored (a repeat of the same values is no news).  A
    field ``new`` leaves unset is ignored as well: the apply would not send it,
    so a value another manager set there stays either way.  (The exporter never
    unsets a field once reported, so this cannot hide a removal of our own.)
    """
    if held is None:
        return False
    return (
        new.metrics == held.metrics
        and new.progress_percentage in (None, held.progress_percentage)
        and new.estimated_remaining_seconds in (None, held.estimated_remaining_seconds)
    )


class StatusWriter:
    """Applies statuses to TrainJobs.

    Args:
        api_client: a configured Kubernetes client.
        cache: what each TrainJob holds.
        crd: what is known of the TrainJob CRD (shared with the CRD re-check).
        events: where "unsupported CRD" Events go.
        limiter: the token bucket shared with Events.
        attempts: tries per write (1 = no retry).
        may_write: the leader fence, checked before every write attempt.
        on_write: called with each :class:`WriteOutcome` (metrics).
    """

    def __init__(
        self,
        api_client: ApiClient,
        *,
        cache: TrainJobCache,
        crd: CrdSupport,
        events: EventRecorder,
        limiter: AsyncLimiter,
        attempts: int,
        may_write: Callable[[], bool] = lambda: True,
        on_write: Callable[[WriteOutcome], None] = lambda outcome: None,
    ) -> None:
        self._api = api_client
        self.cache = cache
        self.crd = crd
        self.events = events
        self._limiter = limiter
        self._retries = Retries(attempts=attempts, retryable=_retryable)
        self._may_write = may_write
        self._on_write = on_write
        self._locks: dict[TrainJobKey, asyncio.Lock] = {}
        self._unsupported_told: set[TrainJobKey] = set()
        self._inflight: set[asyncio.Task[Any]] = set()

    @classmethod
    def for_client(
        cls,
        api_client: ApiClient,
        *,
        identity: str,
        qps: float,
        burst: int,
        attempts: int,
        may_write: Callable[[], bool] = lambda: True,
        on_write: Callable[[WriteOutcome], None] = lambda outcome: None,
        cache: TrainJobCache | None = None,
    ) -> Self:
        """A writer with its own cache (unless given), CRD knowledge and Event recorder,
        the Events sharing the writes' token bucket (``qps`` sustained, ``burst`` at once)."""
        limiter = AsyncLimiter(burst, burst / qps)
        cache = cache or TrainJobCache(CustomObjectsApi(api_client))
        events = EventRecorder(CoreV1Api(api_client), identity=identity, limiter=limiter,
                               uid_of=cache.uid_of)
        crd = CrdSupport(ApiextensionsV1Api(api_client))
        writer = cls(api_client, cache=cache, crd=crd, events=events, limiter=limiter,
                     attempts=attempts, may_write=may_write, on_write=on_write)
        crd.on_supported = writer.supported_again
        return writer

    def supported_again(self) -> None:
        """The CRD stores trainerStatus again: announce a later loss anew."""
        self._unsupported_told.clear()

    def forget(self, namespace: str, name: str) -> None:
        """Drop what is kept about a TrainJob (it is gone)."""
        self.cache.forget(namespace, name)
        self._locks.pop((namespace, name), None)
        self._unsupported_told.discard((namespace, name))

    async def resync(self, namespaces: list[str]) -> set[TrainJobKey]:
        """Refresh the cache from a list; forget TrainJobs that are gone.

        Returns:
            ``(namespace, name)`` of every TrainJob that exists.
        """
        exists = await self.cache.resync(namespaces)
        for key in list(self._locks):
            if key not in exists:
                self.forget(*key)
        return exists

    async def apply(self, namespace: str, name: str, status: TrainerStatus) -> WriteOutcome:
        """Write ``status`` to the TrainJob unless it already holds the same report.

        Returns:
            The :class:`WriteOutcome` (also passed to ``on_write``).

        Raises:
            TrainJobGone: the TrainJob does not exist (the caller drops the target).
        """
        key = (namespace, name)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:  # one write per TrainJob at a time: the cache stays exact
            task = asyncio.current_task()
            if task is not None:
                self._inflight.add(task)
            try:
                outcome = await self._apply(namespace, name, status)
            finally:
                if task is not None:
                    self._inflight.discard(task)
        self._on_write(outcome)
        return outcome

    async def _apply(self, namespace: str, name: str, status: TrainerStatus) -> WriteOutcome:
        held = await self.cache.held(namespace, name)
        if already_holds(held.status, status):
            return WriteOutcome.UNCHANGED
        if self.crd.supported is False and not self.crd.recheck_due():
            await self._tell_unsupported(namespace, name, held.uid)
            return WriteOutcome.NOT_STORED
        try:
            obj = await call(self._ssa, namespace, name, status, limiter=self._limiter,
                             retries=self._retries, before_try=self._fence)
        except NotLeader:
            return WriteOutcome.NOT_LEADER
        except ApiException as exc:
            if exc.status == 404:
                self.forget(namespace, name)
                raise TrainJobGone(f"{namespace}/{name}") from None
            if _not_in_schema(exc):
                self.crd.mark_unsupported("server-side apply answered that "
                                          "status.trainerStatus is not declared in its schema")
                await self._tell_unsupported(namespace, name, held.uid)
                return WriteOutcome.NOT_STORED
            log.warning("status write to TrainJob %s/%s failed: HTTP %s %s",
                        namespace, name, exc.status, exc.reason)
            return WriteOutcome.FAILED
        except (urllib3.exceptions.HTTPError, ConnectionError) as exc:
            log.warning("status write to TrainJob %s/%s failed: %s", namespace, name, exc)
            return WriteOutcome.FAILED
        if not (obj.get("status") or {}).get("trainerStatus"):
            self.crd.mark_unsupported("an apply response came back without it (pruned)")
            await self._tell_unsupported(namespace, name, held.uid)
            return WriteOutcome.NOT_STORED
        if self.crd.supported is not True:
            self.crd.mark_supported()
        self.cache.store(namespace, name, obj)
        return WriteOutcome.WRITTEN

    def _fence(self) -> None:
        if not self._may_write():
            raise NotLeader()

    async def _tell_unsupported(self, namespace: str, name: str, uid: str) -> None:
        if (namespace, name) in self._unsupported_told:
            return
        self._unsupported_told.add((namespace, name))
        await self.events.event(
            namespace, name, REASON_UNSUPPORTED,
            f"The TrainJob CRD ({CRD_NAME}) has no status.trainerStatus, so progress "
            "cannot be stored; upgrade the Kubeflow Trainer CRDs.",
            uid=uid,
        )

    def _ssa(self, namespace: str, name: str, status: TrainerStatus) -> dict[str, Any]:
        """The apply request itself (blocking; runs in a worker thread)."""
        body = {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"trainerStatus": status.to_api()},
        }
        resp = self._api.call_api(
            "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/status",
            "PATCH",
            {"group": API_GROUP, "version": API_VERSION, "namespace": namespace,
             "plural": TRAINJOB_PLURAL, "name": name},
            [("fieldManager", FIELD_MANAGER), ("force", "true")],
            {"Content-Type": APPLY_CONTENT_TYPE, "Accept": "application/json"},
            body=encode_apply_body(body),
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,  # one json.loads here, no model deserialisation
            _request_timeout=REQUEST_TIMEOUT,
        )
        result: dict[str, Any] = json.loads(resp.data)
        return result

    async def drain(self, deadline: float) -> bool:
        """Wait up to ``deadline`` seconds for in-flight writes; True if all finished."""
        pending = {t for t in self._inflight if not t.done()}
        if not pending:
            return True
        _done, still = await asyncio.wait(pending, timeout=deadline)
        return not still
