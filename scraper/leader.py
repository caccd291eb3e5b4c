"""Leader election on a ``coordination.k8s.io/v1`` Lease.

The installed ``kubernetes`` client's ``kubernetes.leaderelection`` only ships a
ConfigMap lock, and its loop blocks in ``time.sleep`` with no way to stop or to
release the lock.  So this module runs the same algorithm as client-go's
``leaderelection`` on a Lease, as an asyncio task, through the client's typed
``CoordinationV1Api``:

* A candidate reads the Lease every ``retry_period`` seconds.  It takes the
  Lease when nobody holds it, or when the holder's record has not changed for
  ``lease_duration`` seconds *as measured on the candidate's own clock* (so
  clock skew between replicas does not matter).
* Updates are optimistic: a replace carries the resourceVersion read, so of two
  candidates racing for an expired Lease exactly one wins (the other gets 409).
* The leader renews every ``retry_period``; if it has not renewed successfully
  for ``renew_deadline`` seconds it stops leading.  Because
  ``renew_deadline < lease_duration``, it stops before any standby may take
  over: :meth:`LeaseElector.may_write` is the fence every write checks.
* On shutdown the leader releases the Lease (empty holder, 1 s duration) so a
  standby takes over at its next poll instead of after ``lease_duration``.
* Every step has a deadline (as client-go's ``RenewDeadline`` context): a leader's
  step may last only until ``renew_deadline`` after its last renew, a candidate's
  ``renew_deadline``; each API call within it has that much time, urllib3 does not
  retry (:func:`scraper.kube.client.without_retries`).  So with the API server or
  etcd dead, the leader stops leading (and ``on_change(False)`` runs) at
  ``renew_deadline`` after its last renew, not when a blocked call returns.
  The calls run on two threads of the elector's own, so they never queue behind
  other calls (writes, lists) blocked on the same dead server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubernetes.client import ApiClient, CoordinationV1Api
from kubernetes.client.exceptions import ApiException

from scraper.kube.calls import call

#: Shortest time given to one step (seconds), so a step right at the deadline still tries.
MIN_STEP_SECONDS = 0.2

log = logging.getLogger(__name__)


def _micro_time(value: datetime | None = None) -> str:
    """``metav1.MicroTime`` text (RFC 3339 with microseconds, UTC)."""
    return (value or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Campaigns for a Lease and reports leadership changes.

    Args:
        api_client: Kubernetes client.
        namespace, name: the Lease.
        identity: this candidate's holder identity (unique per replica).
        lease_duration, renew_deadline, retry_period: seconds, with
            ``retry_period < renew_deadline < lease_duration``.
        on_change: called with True when this replica starts leading and with
            False when it stops (from the event loop).  An exception it raises
            ends :meth:`run` (the caller supervises it).
    """

    def __init__(
        self,
        api_client: ApiClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float,
        renew_deadline: float,
        retry_period: float,
        on_change: Callable[[bool], None],
    ) -> None:
        self._api = CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self._duration = lease_duration
        self._deadline = renew_deadline
        self._period = retry_period
        self._on_change = on_change
        self._leading = False
        self._last_renew = 0.0  # monotonic time of the last successful acquire/renew
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="lease")
        self._step_deadline = renew_deadline  # seconds the running step may take

    def _step_budget(self) -> float:
        """Seconds the next step may take: until the renew deadline while leading."""
        if self._leading:
            left = self._last_renew + self._deadline - time.monotonic()
            return max(MIN_STEP_SECONDS, left)
        return self._deadline

    async def _call(self, func: Any, *args: Any) -> Any:
        """``func(*args)`` on the elector's threads, within the running step's deadline."""
        limit = self._step_deadline
        return await call(func, *args, executor=self._executor, deadline=limit,
                          _request_timeout=(min(5.0, limit), limit))

    def may_write(self) -> bool:
        """The write fence: leading and renewed within ``renew_deadline`` seconds."""
        return self._leading and time.monotonic() - self._last_renew < self._deadline

    async def run(self) -> None:
        """Campaign and renew until cancelled (then release the Lease if held)."""
        try:
            while True:
                if self._leading and time.monotonic() - self._last_renew >= self._deadline:
                    self._step_down()
                started = time.monotonic()
                self._step_deadline = budget = self._step_budget()
                try:
                    async with asyncio.timeout(budget):
                        ok = await self._try_acquire_or_renew()
                except TimeoutError:
                    log.warning("Lease %s/%s: no answer within %.1fs", self.namespace,
                                self.name, budget)
                    ok = False
                if ok:
                    # From the step's start: the renewTime sent was taken then.
                    self._last_renew = started
                    if not self._leading:
                        self._leading = True
                        log.info("became leader (Lease %s/%s, identity %s)",
                                 self.namespace, self.name, self.identity)
                        self._on_change(True)
                elif self._leading and time.monotonic() - self._last_renew >= self._deadline:
                    self._step_down()
                await asyncio.sleep(self._pause())
        finally:
            if self._leading:
                self._leading = False
                try:
                    self._on_change(False)
                finally:  # the Lease is released even when the callback fails
                    await asyncio.shield(self.release())
            self._executor.shutdown(wait=False)

    def _step_down(self) -> None:
        self._leading = False
        log.warning("lost leadership: Lease %s/%s not renewed for %.1fs",
                    self.namespace, self.name, self._deadline)
        self._on_change(False)

    def _pause(self) -> float:
        """Seconds to the next step: ``retry_period``, but a leader whose renews fail
        wakes at its renew deadline to step down on time."""
        if not self._leading:
            return self._period
        left = self._last_renew + self._deadline - time.monotonic()
        return min(self._period, max(0.0, left))

    def _body(self, *, holder: str, duration: int, acquired: datetime, renewed: datetime,
              transitions: int,
              resource_version: str | None = None) -> dict[str, Any]:
        """A whole Lease object; with ``resource_version`` a replace is optimistic."""
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration,
                     "acquireTime": _micro_time(acquired), "renewTime": _micro_time(renewed),
                     "leaseTransitions": transitions},
        }

    async def release(self) -> None:
        """Give the Lease up if this replica holds it (best effort, within ``renew_deadline``)."""
        self._step_deadline = self._deadline
        try:
            lease = await self._call(self._api.read_namespaced_lease, self.name, self.namespace)
            if lease.spec.holder_identity != self.identity:
                return
            now = datetime.now(UTC)
            body = self._body(holder="", duration=1, acquired=now, renewed=now,
                              transitions=lease.spec.lease_transitions or 0,
                              resource_version=lease.metadata.resource_version)
            await self._call(self._api.replace_namespaced_lease, self.name, self.namespace, body)
            log.info("released Lease %s/%s", self.namespace, self.name)
        except Exception as exc:
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, exc)

    async def _try_acquire_or_renew(self) -> bool:
        try:
            return await self._try_once()
        except ApiException as exc:
            if exc.status != 409:  # 409: another candidate won the race; not news
                log.warning("Lease %s/%s: HTTP %s %s", self.namespace, self.name,
                            exc.status, exc.reason)
            return False
        except Exception as exc:
            log.warning("Lease %s/%s: %s", self.namespace, self.name, exc)
            return False

    async def _try_once(self) -> bool:
        """One client-go style acquire-or-renew step.

        Not retried inside: the next step comes ``retry_period`` seconds later anyway.
        """
        now = datetime.now(UTC)
        duration = max(1, round(self._duration))
        try:
            lease = await self._call(self._api.read_namespaced_lease, self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = self._body(holder=self.identity, duration=duration, acquired=now,
                              renewed=now, transitions=0)
            await self._call(self._api.create_namespaced_lease, self.namespace, body)
            return True
        spec = lease.spec
        holder = spec.holder_identity or ""
        record = (holder, spec.renew_time, spec.lease_duration_seconds, spec.acquire_time)
        if record != self._observed:
            self._observed = record
            self._observed_at = time.monotonic()
        held_for = spec.lease_duration_seconds or duration
        if holder and holder != self.identity and (
            time.monotonic() - self._observed_at < held_for
        ):
            return False  # someone else holds an unexpired lease
        ours = holder == self.identity
        transitions = (spec.lease_transitions or 0) + (0 if ours else 1)
        acquired = spec.acquire_time if ours and spec.acquire_time else now
        body = self._body(holder=self.identity, duration=duration, acquired=acquired,
                          renewed=now, transitions=transitions,
                          resource_version=lease.metadata.resource_version)
        await self._call(self._api.replace_namespaced_lease, self.name, self.namespace, body)
        return True

