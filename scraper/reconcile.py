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
  ``lastUpdatedTime`` alone is not news).  "Holds" is the
  object as last read (GET on first sight, the periodic list, or the apply
  response).
* Writes and Events share a client-side token bucket (QPS, burst).  409, 429,
  5xx and connection errors are retried with capped exponential backoff and
  jitter; 404 means the TrainJob is gone (:class:`TrainJobGone`).
* A CRD without ``status.trainerStatus`` is detected from its schema (if the
  scraper may read CRDs) or from the apply's answer: the API server refuses to
  apply an undeclared field (500 "field not declared in schema"), and a response
  without the field means it was pruned;
  either way one actionable ERROR log line and a Warning Event per TrainJob.

Every Kubernetes call runs in a worker thread (the client is blocking).
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import urllib3
from aiolimiter import AsyncLimiter
from kubernetes.client import ApiClient, ApiextensionsV1Api, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from exporter_lib.status import (
    API_GROUP,
    API_VERSION,
    TRAINJOB_PLURAL,
    StatusError,
    TrainerStatus,
)

log = logging.getLogger(__name__)

FIELD_MANAGER = "trainjob-scraper"
COMPONENT = "trainjob-scraper"
CRD_NAME = f"{TRAINJOB_PLURAL}.{API_GROUP}"
REQUEST_TIMEOUT = (5, 20)  # (connect, read) seconds for one API call
#: After a pruned write with an unreadable CRD, how long before writes are tried again.
UNSUPPORTED_RECHECK_SECONDS = 300.0

REASON_INVALID = "InvalidTrainerStatus"
REASON_SCRAPE_FAILED = "TrainerStatusScrapeFailed"
REASON_UNSUPPORTED = "TrainerStatusUnsupported"
REASON_FINAL_INVALID = "InvalidFinalTrainerStatus"


class TrainJobGone(Exception):
    """The TrainJob does not exist (HTTP 404)."""


class NotLeader(Exception):
    """The write fence closed: this replica may not write now."""


class WriteOutcome(enum.Enum):
    """Result of :meth:`Reconciler.apply`; ``value`` is the metrics label."""

    WRITTEN = "written"
    UNCHANGED = "unchanged"
    NOT_STORED = "not_stored"  # the CRD has no trainerStatus: nothing can be written
    FAILED = "failed"
    NOT_LEADER = "not_leader"


@dataclass
class Held:
    """What a TrainJob holds, as last read: its UID and trainerStatus (or None)."""

    uid: str
    status: TrainerStatus | None


def _not_in_schema(exc: ApiException) -> bool:
    """True for the API server's answer to applying a field the CRD does not declare.

    Server-side apply refuses such a patch with 500 "failed to create typed patch
    object ... field not declared in schema" instead of pruning the field.
    """
    return exc.status == 500 and "not declared in schema" in str(exc.body or "")


#: Backoff between tries of one write: 0.2 s doubling to 5 s, plus up to 0.2 s jitter.
_BACKOFF = wait_exponential(multiplier=0.2, max=5.0) + wait_random(0, 0.2)
#: Longest ``Retry-After`` honoured (seconds); a longer one is capped so a stop stays prompt.
RETRY_AFTER_MAX_SECONDS = 30.0


def _wait(retry_state: RetryCallState) -> float:
    """Seconds before the next try: the backoff, but never sooner than ``Retry-After``.

    The API server sends ``Retry-After`` with 429 (API Priority and Fairness) and
    some 5xx; retrying sooner only adds to the load that caused them.
    """
    backoff = float(_BACKOFF(retry_state))
    exc = retry_state.outcome.exception() if retry_state.outcome else None
    if isinstance(exc, ApiException) and exc.headers:
        try:
            asked = float(exc.headers.get("Retry-After", ""))
        except ValueError:
            return backoff
        return max(backoff, min(asked, RETRY_AFTER_MAX_SECONDS))
    return backoff


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        if _not_in_schema(exc):
            return False
        return exc.status in (409, 429) or (exc.status or 0) >= 500
    return isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError)


def held_from_object(obj: dict[str, Any]) -> Held:
    """The :class:`Held` of a TrainJob dict (an unreadable trainerStatus counts as None)."""
    raw = (obj.get("status") or {}).get("trainerStatus")
    status = None
    if raw:
        try:
            status = TrainerStatus.from_api(raw)
        except StatusError:
            status = None
    return Held((obj.get("metadata") or {}).get("uid", ""), status)


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


def schema_has_trainer_status(crd: dict[str, Any]) -> bool:
    """True when the CRD's served v1alpha1 schema keeps ``status.trainerStatus``."""
    for version in (crd.get("spec") or {}).get("versions") or []:
        if version.get("name") != API_VERSION:
            continue
        schema = ((version.get("schema") or {}).get("openAPIV3Schema")) or {}
        status = (schema.get("properties") or {}).get("status") or {}
        if status.get("x-kubernetes-preserve-unknown-fields"):
            return True
        return "trainerStatus" in (status.get("properties") or {})
    return False


class Reconciler:
    """Applies statuses to TrainJobs and records Events about them.

    Args:
        api_client: a configured Kubernetes client.
        identity: this replica's name (Event ``reportingInstance``).
        qps, burst: the client-side token bucket for writes and Events.
        attempts: tries per write (1 = no retry).
        may_write: the leader fence, checked before every write attempt.
        on_write: called with each :class:`WriteOutcome` (metrics).
    """

    def __init__(
        self,
        api_client: ApiClient,
        *,
        identity: str,
        qps: float,
        burst: int,
        attempts: int,
        may_write: Callable[[], bool] = lambda: True,
        on_write: Callable[[WriteOutcome], None] = lambda outcome: None,
    ) -> None:
        self._api = api_client
        self._custom = CustomObjectsApi(api_client)
        self._core = CoreV1Api(api_client)
        self._ext = ApiextensionsV1Api(api_client)
        self._identity = identity
        self._limiter = AsyncLimiter(burst, burst / qps)
        self._attempts = attempts
        self._may_write = may_write
        self._on_write = on_write
        self._held: dict[tuple[str, str], Held] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        #: None: unknown; False: the CRD prunes trainerStatus.
        self.supported: bool | None = None
        self._unsupported_since = 0.0
        self._unsupported_told: set[tuple[str, str]] = set()
        self._inflight: set[asyncio.Task[Any]] = set()
        self._event_counts: dict[str, int] = {}

    # ------------------------------------------------------------ CRD detection

    async def check_crd(self) -> bool | None:
        """Read the TrainJob CRD; set and return :attr:`supported` (None if unreadable)."""
        try:
            resp = await asyncio.to_thread(
                self._ext.read_custom_resource_definition, CRD_NAME,
                _preload_content=False, _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as exc:
            if exc.status == 404:
                log.error("CRD %s not found: install Kubeflow Trainer (TrainJob CRD); "
                          "no status can be written until it exists", CRD_NAME)
                self.supported = False
                self._unsupported_since = time.monotonic()
                return False
            log.info("cannot read CRD %s (HTTP %s); will detect a missing trainerStatus "
                     "from apply responses", CRD_NAME, exc.status)
            return None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("cannot read CRD %s (%s); will retry", CRD_NAME, exc)
            return None
        ok = schema_has_trainer_status(json.loads(resp.data))
        if not ok:
            self._mark_unsupported("its openAPIV3Schema has no status.trainerStatus")
        elif self.supported is False:
            log.info("CRD %s now has status.trainerStatus: writing statuses again", CRD_NAME)
        if ok:
            self.supported = True
            self._unsupported_told.clear()
        return ok

    def _mark_unsupported(self, evidence: str) -> None:
        if self.supported is not False:
            log.error(
                "TrainJob CRD %s (%s) cannot store status.trainerStatus: %s, so the API "
                "server prunes every write. Upgrade the Kubeflow Trainer CRDs to a release "
                "whose TrainJob status has trainerStatus; until then no status is written "
                "(a Warning Event %s is recorded on each TrainJob).",
                CRD_NAME, API_VERSION, evidence, REASON_UNSUPPORTED,
            )
        self.supported = False
        self._unsupported_since = time.monotonic()

    # ------------------------------------------------------------ reads

    def forget(self, namespace: str, name: str) -> None:
        """Drop what is cached about a TrainJob."""
        self._held.pop((namespace, name), None)
        self._locks.pop((namespace, name), None)
        self._unsupported_told.discard((namespace, name))

    def cached(self, namespace: str, name: str) -> Held | None:
        """The cached :class:`Held` of a TrainJob, without a request."""
        return self._held.get((namespace, name))

    async def held(self, namespace: str, name: str) -> Held:
        """What the TrainJob holds (GET on first use, then cached).

        Raises:
            TrainJobGone: the TrainJob does not exist.
            ApiException: any other API error.
        """
        key = (namespace, name)
        if key not in self._held:
            try:
                obj = await asyncio.to_thread(
                    self._custom.get_namespaced_custom_object, API_GROUP, API_VERSION,
                    namespace, TRAINJOB_PLURAL, name, _request_timeout=REQUEST_TIMEOUT,
                )
            except ApiException as exc:
                if exc.status == 404:
                    raise TrainJobGone(f"{namespace}/{name}") from None
                raise
            self._held[key] = held_from_object(obj)
        return self._held[key]

    async def resync(self, namespaces: list[str]) -> set[tuple[str, str]]:
        """List TrainJobs (all namespaces, or each given one) and refresh the cache.

        Returns:
            ``(namespace, name)`` of every TrainJob that exists.
        """
        items: list[dict[str, Any]] = []
        if namespaces:
            for ns in namespaces:
                body = await asyncio.to_thread(
                    self._custom.list_namespaced_custom_object, API_GROUP, API_VERSION, ns,
                    TRAINJOB_PLURAL, _request_timeout=REQUEST_TIMEOUT,
                )
                items.extend(body.get("items") or [])
        else:
            body = await asyncio.to_thread(
                self._custom.list_cluster_custom_object, API_GROUP, API_VERSION,
                TRAINJOB_PLURAL, _request_timeout=REQUEST_TIMEOUT,
            )
            items = body.get("items") or []
        exists = set()
        for obj in items:
            meta = obj.get("metadata") or {}
            key = (meta.get("namespace", ""), meta.get("name", ""))
            exists.add(key)
            if key in self._held:
                self._held[key] = held_from_object(obj)
        for key in list(self._held):
            if key not in exists:
                self.forget(*key)
        return exists

    # ------------------------------------------------------------ writes

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
        held = await self.held(namespace, name)
        if already_holds(held.status, status):
            return WriteOutcome.UNCHANGED
        if self.supported is False:
            recheck = time.monotonic() - self._unsupported_since > UNSUPPORTED_RECHECK_SECONDS
            if not recheck:
                await self._tell_unsupported(namespace, name, held.uid)
                return WriteOutcome.NOT_STORED
        try:
            obj = await self._with_retries(self._ssa, namespace, name, status)
        except NotLeader:
            return WriteOutcome.NOT_LEADER
        except ApiException as exc:
            if exc.status == 404:
                self.forget(namespace, name)
                raise TrainJobGone(f"{namespace}/{name}") from None
            if _not_in_schema(exc):
                self._mark_unsupported("server-side apply answered that status.trainerStatus "
                                       "is not declared in its schema")
                await self._tell_unsupported(namespace, name, held.uid)
                return WriteOutcome.NOT_STORED
            log.warning("status write to TrainJob %s/%s failed: HTTP %s %s",
                        namespace, name, exc.status, exc.reason)
            return WriteOutcome.FAILED
        except (urllib3.exceptions.HTTPError, ConnectionError) as exc:
            log.warning("status write to TrainJob %s/%s failed: %s", namespace, name, exc)
            return WriteOutcome.FAILED
        if not (obj.get("status") or {}).get("trainerStatus"):
            self._mark_unsupported("an apply response came back without it (pruned)")
            await self._tell_unsupported(namespace, name, held.uid)
            return WriteOutcome.NOT_STORED
        if self.supported is not True:
            self.supported = True
            self._unsupported_told.clear()
        self._held[(namespace, name)] = held_from_object(obj)
        return WriteOutcome.WRITTEN

    async def _tell_unsupported(self, namespace: str, name: str, uid: str) -> None:
        if (namespace, name) in self._unsupported_told:
            return
        self._unsupported_told.add((namespace, name))
        await self.event(
            namespace, name, REASON_UNSUPPORTED,
            f"The TrainJob CRD ({CRD_NAME}) has no status.trainerStatus, so progress "
            "cannot be stored; upgrade the Kubeflow Trainer CRDs.",
            uid=uid,
        )

    async def _with_retries(self, func: Callable[..., Any], *args: Any) -> Any:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_retryable),
            stop=stop_after_attempt(self._attempts),
            wait=_wait,
            reraise=True,
        ):
            with attempt:
                async with self._limiter:
                    if not self._may_write():
                        raise NotLeader()
                    return await asyncio.to_thread(func, *args)
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    def _ssa(self, namespace: str, name: str, status: TrainerStatus) -> dict[str, Any]:
        body = {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"trainerStatus": status.to_api()},
        }
        result: dict[str, Any] = self._api.call_api(
            "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/status",
            "PATCH",
            {"group": API_GROUP, "version": API_VERSION, "namespace": namespace,
             "plural": TRAINJOB_PLURAL, "name": name},
            [("fieldManager", FIELD_MANAGER), ("force", "true")],
            {"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
            body=body,
            response_type="object",
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _request_timeout=REQUEST_TIMEOUT,
        )
        return result

    async def drain(self, deadline: float) -> bool:
        """Wait up to ``deadline`` seconds for in-flight writes; True if all finished."""
        pending = {t for t in self._inflight if not t.done()}
        if not pending:
            return True
        _done, still = await asyncio.wait(pending, timeout=deadline)
        return not still

    # ------------------------------------------------------------ events

    async def event(
        self, namespace: str, name: str, reason: str, message: str, *, uid: str | None = None,
        event_type: str = "Warning",
    ) -> None:
        """Record an Event on the TrainJob; a repeat of the same one bumps its count.

        Errors are logged, never raised: an Event is best effort.
        """
        if uid is None:
            cached = self._held.get((namespace, name))
            uid = cached.uid if cached else ""
        message = message[:1024]
        digest = hashlib.sha256(f"{uid}\n{reason}\n{message}".encode()).hexdigest()[:16]
        event_name = f"{name}.{digest}"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name, "namespace": namespace},
            "involvedObject": {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "TrainJob",
                               "name": name, "namespace": namespace, "uid": uid},
            "reason": reason,
            "message": message,
            "type": event_type,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._identity[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            async with self._limiter:
                try:
                    await asyncio.to_thread(self._core.create_namespaced_event, namespace, body,
                                            _request_timeout=REQUEST_TIMEOUT)
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                    # Counted locally: the least-privilege role has no events get.
                    count = self._event_counts.get(event_name, 1) + 1
                    await asyncio.to_thread(
                        self._core.patch_namespaced_event, event_name, namespace,
                        {"count": count, "lastTimestamp": now},
                        _request_timeout=REQUEST_TIMEOUT,
                    )
                    if len(self._event_counts) > 10_000:  # bound memory on long runs
                        self._event_counts.clear()
                    self._event_counts[event_name] = count
            log.info("event %s on TrainJob %s/%s: %s", reason, namespace, name, message)
        except Exception as exc:
            log.warning("could not record event %s on TrainJob %s/%s: %s",
                        reason, namespace, name, exc)
