"""Events on TrainJobs: one Event per (TrainJob UID, reason, message), repeats counted.

The Event's name is the TrainJob's name plus a hash of (UID, reason, message), so a
repeat of the same report is a 409 on create and becomes a patch of ``count`` and
``lastTimestamp``, as client-go's event recorder does.  The count is kept here: the
least-privilege role has no ``get`` on Events.

Events have a token bucket of their own (:data:`EVENT_QPS`, :data:`EVENT_BURST`),
never the status writes' one: a flood of failures must not delay a status write.
An Event that finds no token within :data:`EVENT_WAIT_SECONDS` is dropped (logged,
counted by the caller's rules as recorded): the scrape run that raised it must not
wait behind other targets' Events.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from aiolimiter import AsyncLimiter
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from exporter_lib.status import API_GROUP, API_VERSION
from scraper.kube.calls import call

log = logging.getLogger(__name__)

#: ``source.component`` and ``reportingComponent`` of every Event.
COMPONENT = "trainjob-scraper"
#: Longest message kept (characters); the API server refuses very long ones.
MESSAGE_MAX = 1024
#: Repeat counts kept at most; beyond, the table starts over (bounds memory on long runs).
COUNTS_MAX = 10_000
#: Events' own budget: sustained per second, and at once.
EVENT_QPS = 1.0
EVENT_BURST = 10
#: Longest wait for an Event token (seconds) before the Event is dropped.
EVENT_WAIT_SECONDS = 2.0
#: ``(connect, read)`` seconds of an Event call: a scrape run waits for its Event, so a
#: dead API server must not hold the run for the general request timeout.
EVENT_REQUEST_TIMEOUT = (2, 3)


class EventRecorder:
    """Records Events on TrainJobs.

    Args:
        core: the client's CoreV1Api.
        identity: this replica's name (``reportingInstance``, cut to 128 characters).
        limiter: the Events' token bucket (default: :data:`EVENT_QPS`, :data:`EVENT_BURST`);
            never the status writes' bucket.
        uid_of: the UID of a TrainJob ``(namespace, name)`` when known, else ``""``.
    """

    def __init__(self, core: CoreV1Api, *, identity: str, limiter: AsyncLimiter | None = None,
                 uid_of: Callable[[str, str], str] = lambda namespace, name: "") -> None:
        self._core = core
        self._identity = identity
        self._limiter = limiter or AsyncLimiter(EVENT_BURST, EVENT_BURST / EVENT_QPS)
        self._uid_of = uid_of
        self._counts: dict[str, int] = {}

    async def event(self, namespace: str, name: str, reason: str, message: str, *,
                    uid: str | None = None, event_type: str = "Warning") -> None:
        """Record an Event on TrainJob ``namespace/name``; a repeat bumps its count.

        Errors are logged, never raised: an Event is best effort.
        """
        if uid is None:
            uid = self._uid_of(namespace, name)
        message = message[:MESSAGE_MAX]
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
            async with asyncio.timeout(EVENT_WAIT_SECONDS):
                await self._limiter.acquire()  # one token for the create and its repeat patch
        except TimeoutError:
            log.warning("event %s on TrainJob %s/%s dropped: more than %g Events/s",
                        reason, namespace, name, EVENT_QPS)
            return
        try:
            try:
                await call(self._core.create_namespaced_event, namespace, body,
                           _request_timeout=EVENT_REQUEST_TIMEOUT)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                count = self._counts.get(event_name, 1) + 1
                await call(self._core.patch_namespaced_event, event_name, namespace,
                           {"count": count, "lastTimestamp": now},
                           _request_timeout=EVENT_REQUEST_TIMEOUT)
                if len(self._counts) > COUNTS_MAX:
                    self._counts.clear()
                self._counts[event_name] = count
            log.info("event %s on TrainJob %s/%s: %s", reason, namespace, name, message)
        except Exception as exc:
            log.warning("could not record event %s on TrainJob %s/%s: %s",
                        reason, namespace, name, exc)
