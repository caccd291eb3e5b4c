"""A stall found by its annotation after a leader change ends like any other.

Real API server (etcd + kube-apiserver, the TrainJob CRD): the real annotation writer
(:func:`scraper.stall.marker.write_stall_marker`), the real Event recorder and the real
TrainJob store, fed by lists of the API server as the informer would be.  Leader A sees
a training stop and records the stall; A is gone (a SIGKILLed process keeps nothing);
leader B starts from what the API server holds.  The target's status is given (no
exporter process: what is tested is what each leader records), the clocks are injected.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL, TrainerStatus
from localdev.cluster import objects
from scraper.kube.events import EventRecorder
from scraper.shared.trainjobs import TrainJobStore
from scraper.stall.marker import write_stall_marker
from scraper.stall.rule import STALLED_SINCE_ANNOTATION
from scraper.stall.watch import REASON_RESUMED, REASON_STALLED, Observed, StallWatch

NAME = "stalls"


def _status(progress: int) -> TrainerStatus:
    return TrainerStatus(progress_percentage=progress,
                         last_updated_time=datetime(2026, 6, 1, tzinfo=UTC))


class Leader:
    """One scraper term: its own store (listed from the API server), clocks and tasks."""

    def __init__(self, api: client.ApiClient, namespace: str, uid: str, identity: str,
                 start: float) -> None:
        self.api, self.namespace, self.uid = api, namespace, uid
        self.now = start
        self.status: TrainerStatus | None = None
        self.tasks: list[Coroutine[Any, Any, None]] = []
        self.store = TrainJobStore([namespace])
        self.relist()
        core = client.CoreV1Api(api)
        self.watch = StallWatch(
            targets=self.targets, store=self.store,
            events=EventRecorder(core, identity=identity),
            write_marker=functools.partial(write_stall_marker, api), given=5.0,
            leading=lambda: True, ready=lambda: True, spawn=self.tasks.append,
            clock=lambda: self.now, wall=lambda: self.now)

    def relist(self) -> None:
        items = client.CustomObjectsApi(self.api).list_namespaced_custom_object(
            API_GROUP, API_VERSION, self.namespace, TRAINJOB_PLURAL)["items"]
        self.store.on_list(self.namespace, items)

    def targets(self) -> list[Observed]:
        return [Observed((self.namespace, NAME), self.uid, "stalls-node-0-0", "pod-1", 1.0,
                         self.status, True)]

    async def step(self, seconds: int, status: TrainerStatus | None = None) -> None:
        if status is not None:
            self.status = status
        for _ in range(seconds):
            self.now += 1.0
            self.watch.check()
            while self.tasks:
                await self.tasks.pop(0)
            self.relist()  # what the informer's watch would bring


def _annotation(api: client.ApiClient, namespace: str) -> str | None:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, NAME)
    value: str | None = (obj["metadata"].get("annotations") or {}).get(STALLED_SINCE_ANNOTATION)
    return value


def _reasons(api: client.ApiClient, namespace: str) -> list[str]:
    """The reasons of the Events about the TrainJob, sorted (their times have whole
    seconds; the order is asserted step by step instead)."""
    events = client.CoreV1Api(api).list_namespaced_event(namespace).items
    return sorted(e.reason for e in events if e.involved_object.name == NAME)


async def test_new_leader_ends_the_stall_it_found_with_training_resumed(
        kube_api: client.ApiClient, trainjob_crd: None, namespace: str) -> None:
    uid = objects.create_trainjob(kube_api, namespace, NAME)["metadata"]["uid"]
    first = Leader(kube_api, namespace, uid, "scraper-a", start=1_780_000_000.0)
    await first.step(10, _status(30))
    assert _reasons(kube_api, namespace) == [REASON_STALLED]
    since = _annotation(kube_api, namespace)
    assert since is not None
    del first  # SIGKILLed: nothing of it survives but what the API server holds

    second = Leader(kube_api, namespace, uid, "scraper-b", start=1_780_000_100.0)
    await second.step(5, _status(30))  # still stalled as far as it can tell
    assert _annotation(kube_api, namespace) == since
    assert _reasons(kube_api, namespace) == [REASON_STALLED]
    await second.step(1, _status(31))  # the training moves again
    assert _annotation(kube_api, namespace) is None
    assert _reasons(kube_api, namespace) == sorted([REASON_STALLED, REASON_RESUMED])
    resumed = [e for e in client.CoreV1Api(kube_api).list_namespaced_event(namespace).items
               if e.reason == REASON_RESUMED]
    assert resumed[0].type == "Normal" and since in resumed[0].message
    assert resumed[0].involved_object.uid == uid
    await second.step(3, _status(32))
    assert _reasons(kube_api, namespace) == sorted([REASON_STALLED, REASON_RESUMED])
    await asyncio.sleep(0)
