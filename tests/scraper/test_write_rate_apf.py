"""The adaptive write rate against a real kube-apiserver's API Priority and Fairness.

A control plane of its own with APF on (kube-apiserver's default; the session's control
plane runs without it).  Writers authenticated as a test ServiceAccount apply ConfigMaps
through the scraper's apply request (:class:`scraper.kube.apply_request.ApplyClient`) at
the rate of :class:`scraper.write.rate.AdaptiveRate`:

1. the ServiceAccount's requests fall in the default FlowSchemas (``service-accounts``:
   workload-low): the writes succeed and the rate rises;
2. a FlowSchema maps the ServiceAccount to a tiny PriorityLevelConfiguration
   (``nominalConcurrencyShares: 0``, no lending or borrowing, ``Reject``): kube-apiserver
   v1.37.2 still runs one request of it at a time (measured: 45 to 90 writes/s pass, a
   second request at once is answered 429 with ``Retry-After``), so the API server
   answers 429 once the writes outgrow that, and the rate comes down (halved);
3. the FlowSchema is deleted: the rate rises again.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from localdev.cluster.controlplane import ControlPlane
from scraper.kube.apply_request import ApplyClient
from scraper.write.rate import AdaptiveRate, signal_of
from scraper.write.rate_rule import Change, Reason, Signal
from tests.helpers.apf import flow_schema, tiny_level

FLOOR, CEILING, BURST, WRITERS = 5.0, 200.0, 5, 8
#: Bounds of each phase (seconds): the test fails, not hangs, when a phase never ends.
PHASE_MAX_SECONDS = 30.0


@pytest.fixture(scope="module")
def apf_plane() -> Iterator[ControlPlane]:
    """A control plane with API Priority and Fairness on, for this module only."""
    with ControlPlane(priority_and_fairness=True) as plane:
        yield plane


class Writers:
    """``WRITERS`` tasks applying ConfigMaps as fast as the rate lets them."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.changes: list[tuple[float, Change]] = []
        self.rate = AdaptiveRate(FLOOR, CEILING, BURST,
                                 on_change=lambda c: self.changes.append((time.monotonic(), c)))
        self.signals: list[tuple[float, Signal]] = []
        self._apply = ApplyClient(api, connections=WRITERS)
        self._namespace = namespace
        self._n = 0

    async def _one(self, i: int) -> None:
        while True:
            async with self.rate:
                self._n += 1
                name = f"cm-{i}"
                body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"name": name},
                                   "data": {"n": str(self._n)}}).encode()
                began = time.monotonic()
                exc: BaseException | None = None
                try:
                    await self._apply.patch(
                        f"/api/v1/namespaces/{self._namespace}/configmaps/{name}",
                        [("fieldManager", "rate-test"), ("force", "true")], body,
                        request_timeout=(5.0, 5.0))
                except Exception as err:  # every answer is a signal for the rule
                    exc = err
                self.rate.observe(time.monotonic() - began, exc)
                self.signals.append((time.monotonic(), signal_of(exc)))

    async def run_until(self, done: Callable[[], bool]) -> float:
        """Write until ``done()`` is true (at most :data:`PHASE_MAX_SECONDS`); seconds."""
        began = time.monotonic()
        tasks = [asyncio.create_task(self._one(i)) for i in range(WRITERS)]
        try:
            for _ in range(int(PHASE_MAX_SECONDS / 0.1)):
                if done():
                    break
                await asyncio.sleep(0.1)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return time.monotonic() - began

    async def close(self) -> None:
        await self._apply.close()


@pytest.mark.cluster  # starts a control plane of its own (APF on)
async def test_rate_rises_then_falls_when_apf_answers_429_then_rises_again(
        apf_plane: ControlPlane) -> None:
    namespace, account = f"t-rate-{secrets.token_hex(3)}", "writer"
    suffix = secrets.token_hex(3)
    level, schema = f"t-tiny-{suffix}", f"t-writer-{suffix}"
    with apf_plane.api_client() as admin:
        core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
        flow = client.FlowcontrolApiserverV1Api(admin)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        rbac.create_namespaced_role(namespace, {
            "metadata": {"name": "configmaps"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                       "verbs": ["get", "create", "patch"]}]})
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": "configmaps"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "configmaps"},
            "subjects": [{"kind": "ServiceAccount", "name": account,
                          "namespace": namespace}]})
        token = apf_plane.service_account_token(namespace, account)
        with apf_plane.api_client_for_token(token) as api:
            writers = Writers(api, namespace)
            try:
                # 1. Room: the rate rises.
                up = await writers.run_until(lambda: writers.rate.rate >= FLOOR + 4 * (
                    (CEILING - FLOOR) / 20))
                peak = writers.rate.rate
                assert peak > FLOOR, f"the rate never rose in {up:.0f}s"
                assert not any(s is Signal.APF_REJECTED for _, s in writers.signals)

                # 2. A tiny level: APF answers 429 when the writes outgrow it; each
                # 429 halves the rate, which then climbs again (AIMD's saw-tooth).
                flow.create_priority_level_configuration(tiny_level(level))
                flow.create_flow_schema(flow_schema(schema, level, namespace, account))
                at = time.monotonic()

                def fell() -> bool:
                    return any(t >= at and c.reason is Reason.APF_REJECTED
                               for t, c in writers.changes)
                await writers.run_until(fell)
                after = [(t, c) for t, c in writers.changes if t >= at]
                falls = [c for _, c in after if c.after < c.before]
                assert falls, "the API server never answered 429 from APF"
                assert all(c.reason is Reason.APF_REJECTED for c in falls), falls
                assert all(c.after == max(FLOOR, c.before / 2) for c in falls), falls
                rejected = [t for t, s in writers.signals if s is Signal.APF_REJECTED]
                # Each rise comes from a window without a 429 in it.
                for t, c in after:
                    if c.after > c.before:
                        assert not any(t - 1.0 <= r <= t for r in rejected), (t, c)

                # 3. The FlowSchema gone: room again, the rate rises again.
                flow.delete_flow_schema(schema)
                flow.delete_priority_level_configuration(level)
                at = time.monotonic()

                def rose() -> bool:
                    return any(t >= at and c.reason is Reason.WRITES_FAST
                               for t, c in writers.changes)
                await writers.run_until(rose)
                assert rose(), "the rate did not rise again"
            finally:
                await writers.close()
                for delete in (lambda: flow.delete_flow_schema(schema),
                               lambda: flow.delete_priority_level_configuration(level)):
                    try:
                        delete()
                    except client.ApiException as exc:
                        if exc.status != 404:
                            raise
