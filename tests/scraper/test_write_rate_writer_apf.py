"""The scraper's status writer at the adaptive rate, against a real kube-apiserver with API
Priority and Fairness on (tests/scraper/test_write_rate_apf.py shows the rule alone).

The StatusWriter (its TrainJob informer, write queue, worker tasks and apply request, as
the scraper builds them) runs as the scraper's ServiceAccount with ``--write-qps`` 5 and
``--write-qps-max`` 200, fed a new percentage for each of 40 TrainJobs as fast as the
write policy lets them be written:

1. under kube-apiserver's default FlowSchemas the rate rises;
2. a FlowSchema puts the ServiceAccount in a tiny priority level: the API server answers
   429 and the rate comes down for that reason;
3. a final status is still applied (429s are retried, never dropped).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from exporter_lib.status import TrainerStatus
from localdev.cluster import install_trainjob_crds, objects
from localdev.cluster.controlplane import ControlPlane
from scraper.kube.client import without_retries
from scraper.shared.outcome import WriteOutcome
from scraper.write.rate_rule import Change, Reason
from tests.helpers.apf import flow_schema, tiny_level
from tests.helpers.scraper import progress_of, scraper_service_account
from tests.helpers.writer import running_writer

pytestmark = pytest.mark.timeout(240)

JOBS, FLOOR, CEILING = 40, 5.0, 200.0
#: Bound of each phase (seconds): the test fails, not hangs, when one never ends.
PHASE_MAX_SECONDS = 40.0


@pytest.fixture(scope="module")
def apf_plane() -> Iterator[ControlPlane]:
    """A control plane with API Priority and Fairness on, for this module only."""
    with ControlPlane(priority_and_fairness=True) as plane, plane.api_client() as api:
        install_trainjob_crds(api)
        yield plane


def status(progress: int) -> TrainerStatus:
    return TrainerStatus.from_api({"progressPercentage": progress,
                                   "lastUpdatedTime": "2026-01-01T00:00:00Z"})


@pytest.mark.cluster  # starts a control plane of its own (APF on)
async def test_the_status_writer_rises_then_gives_way_when_apf_answers_429(
        apf_plane: ControlPlane) -> None:
    namespace = f"t-writer-rate-{secrets.token_hex(3)}"
    level, schema = f"t-tiny-{namespace}", f"t-scraper-{namespace}"
    changes: list[tuple[float, Change]] = []
    with apf_plane.api_client() as admin:
        flow = client.FlowcontrolApiserverV1Api(admin)
        client.CoreV1Api(admin).create_namespace({"metadata": {"name": namespace}})
        for i in range(JOBS):
            objects.create_trainjob(admin, namespace, f"j{i}")
        with scraper_service_account(admin, apf_plane, namespace) as token:
            api = without_retries(apf_plane.api_client_for_token(token))
            try:
                async with running_writer(
                        api, namespace, qps=FLOOR, burst=5, qps_max=CEILING,
                        on_rate_change=lambda c: changes.append((time.monotonic(), c)),
                ) as (writer, _):
                    n = 0

                    async def feed_until(done: Callable[[], bool]) -> None:
                        nonlocal n
                        for _ in range(int(PHASE_MAX_SECONDS / 0.1)):
                            if done():
                                return
                            n += 1
                            for i in range(JOBS):
                                await writer.apply(namespace, f"j{i}", status(n % 100))
                            await asyncio.sleep(0.1)

                    # 1. Room: the rate rises.
                    await feed_until(lambda: any(c.reason is Reason.WRITES_FAST
                                                 for _, c in changes))
                    rises = [c for _, c in changes if c.reason is Reason.WRITES_FAST]
                    assert rises, "the writer's rate never rose"
                    assert all(FLOOR < c.after <= CEILING for c in rises)

                    # 2. A tiny level: APF answers 429, the rate comes down.
                    flow.create_priority_level_configuration(tiny_level(level))
                    flow.create_flow_schema(flow_schema(schema, level, namespace, "scraper"))
                    at = time.monotonic()

                    def fell() -> bool:
                        return any(t >= at and c.reason is Reason.APF_REJECTED
                                   for t, c in changes)
                    await feed_until(fell)
                    assert fell(), "no APF 429 lowered the writer's rate"
                    for t, c in changes:
                        if t >= at and c.after < c.before:
                            assert c.after == max(FLOOR, c.before / 2), c

                    # 3. A final status is still applied.
                    outcome = await asyncio.wait_for(writer.apply_and_wait(
                        namespace, "j0", status(100), final=True), 60)
                    assert outcome is WriteOutcome.WRITTEN
            finally:
                api.close()
                for delete in (lambda: flow.delete_flow_schema(schema),
                               lambda: flow.delete_priority_level_configuration(level)):
                    try:
                        delete()
                    except client.ApiException as exc:
                        if exc.status != 404:
                            raise
    with apf_plane.api_client() as admin:
        assert progress_of(admin, namespace, "j0") == 100
