"""The writer reads the pod of a status that stated none right before sending it
(scraper/discovery/pod_confirm.py), on the real kube-apiserver: one read per write sent, none
for a status coalesced in the queue or one that states its pod; a status that arrived
before its pod ended is sent, one after the end or after the pod is gone is not.  The
scrape side of the same window (the pod watch held behind, the pods swapped at one
address) is tests/scraper/test_reused_pod_ip.py."""

from __future__ import annotations

import enum
from collections import Counter
from datetime import UTC, datetime

import pytest
from kubernetes import client

from exporter_lib.status import TrainerStatus
from localdev.cluster import objects
from scraper.discovery.pod_confirm import PodConfirmer
from scraper.shared.outcome import WriteOutcome
from scraper.shared.pod_check import PodCheck
from scraper.shared.targets import Target
from tests.helpers.scraper import progress_of
from tests.helpers.writer import running_writer

pytestmark = [pytest.mark.usefixtures("trainjob_crd"), pytest.mark.timeout(120)]

IP = "127.0.0.21"


def _status(percent: int) -> TrainerStatus:
    return TrainerStatus(progress_percentage=percent, last_updated_time=datetime.now(UTC))


class _Outcomes:
    """Counts each write outcome (scraper.shared.outcome.WriteCounts)."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    def written(self, outcome: enum.Enum) -> None:
        self.seen[outcome.value] += 1

    def request_took(self, seconds: float) -> None: ...

    def deferred(self, reason: str) -> None: ...

    def skewed(self, direction: str) -> None: ...


async def test_a_status_that_states_no_pod_is_sent_only_while_its_pod_is_the_targets(
        kube_api: client.ApiClient, namespace: str) -> None:
    trainjob = objects.create_trainjob(kube_api, namespace, "a")
    pod = objects.create_trainer_pod(kube_api, namespace, "a", port=28080, ip=IP,
                                     trainjob=trainjob)
    target = Target(namespace, "a", pod.metadata.name, pod.metadata.uid,
                    f"http://{IP}:28080/metrics", 30.0)
    real = PodConfirmer(client.CoreV1Api(kube_api))
    reads: list[str] = []
    checks: list[PodCheck] = []

    # Seconds added to each status's arrival: an answer that waited in the queue while its
    # pod ended (negative), or one that came after the end (positive).
    shift = [0.0]

    async def counted(of: Target, answered_at: float | None) -> PodCheck:
        reads.append(of.key)
        assert answered_at is not None
        return await real(of, answered_at + shift[0])

    outcomes = _Outcomes()
    async with running_writer(kube_api, namespace, confirm_pod=counted,
                              on_pod_check=lambda of, check: checks.append(check),
                              counts=outcomes) as (writer, _):
        # A status that stated its pod: sent without a read.
        assert await writer.apply(namespace, "a", _status(5)) \
            is WriteOutcome.QUEUED
        assert await writer.queue.wait_idle(20)
        assert progress_of(kube_api, namespace, "a") == 5
        assert reads == []

        # Twenty reports that state no pod, in one turn of the loop: coalesced in the
        # queue into one write, and one read for it.
        for percent in range(10, 30):
            await writer.apply(namespace, "a", _status(percent),
                               confirm=target)
        assert await writer.queue.wait_idle(20)
        assert progress_of(kube_api, namespace, "a") == 29
        assert outcomes.seen["written"] == 2, outcomes.seen
        assert reads == [target.key] and checks == [PodCheck.CONFIRMED]

        # The pod ends.  A status that arrived before its end (it waited in the queue)
        # is still its pod's: sent.  One that arrived after the end may be another
        # pod's at the address: not sent, not retried.
        objects.terminate_pod(kube_api, namespace, pod.metadata.name, message="")
        shift[0] = -10.0
        await writer.apply(namespace, "a", _status(40), confirm=target)
        assert await writer.queue.wait_idle(20)
        assert progress_of(kube_api, namespace, "a") == 40
        shift[0] = 10.0
        await writer.apply(namespace, "a", _status(50), confirm=target)
        assert await writer.queue.wait_idle(20)
        assert progress_of(kube_api, namespace, "a") == 40, "sent after its pod ended"
        assert checks[1:] == [PodCheck.CONFIRMED, PodCheck.ENDED]

        # The pod goes: nothing is sent, whenever the status arrived.
        objects.delete_pod(kube_api, namespace, pod.metadata.name)
        shift[0] = -10.0
        await writer.apply(namespace, "a", _status(77), confirm=target)
        assert await writer.queue.wait_idle(20)
        assert checks[3:] == [PodCheck.GONE]
        assert outcomes.seen["unconfirmed"] == 2 and outcomes.seen["written"] == 3
        assert writer.queue.unapplied() == 0, "an unconfirmed status is not retried"
        assert progress_of(kube_api, namespace, "a") == 40, "sent after its pod was gone"
        assert len(reads) == 4
