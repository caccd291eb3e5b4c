"""Every map kept per pod or TrainJob is bounded by the live objects (issue 27, deliverable 6).

Pods come and go through a whole in-process :class:`~scraper.app.ScraperApp`
(the real target manager, scrape loop, scheduler, exporter scraper, status writer and
write queue, TrainJob store, owner indexes and stall watch), fed the informers' items
as the watches deliver them.  Each pod runs (one real scrape of a real exporter on
loopback, its status written; three in ten), ends (its final written, for those), and
goes; every tenth pod
takes a path that once left an entry behind: a pod whose DELETED event was missed and
that only a relist drops, misconfigured and foreign pods that only a relist drops, a
TrainJob deleted under its ended pod.  Afterwards :meth:`ScraperApp.sizes` must be
back where it started, with every map having held entries on the way.

Size: two batches of 250 pods in ``make test`` (every path above 25 times per batch,
and a second batch that starts from what the first left); the run that found the
leaks used 10,000 (``TRAINJOB_MAP_BOUNDS_PODS=10000``, about 20 times as long).

The Kubernetes API server is the only stand-in (an aiohttp server on loopback that
answers the status applies and Events as kube-apiserver does, with the applied
object): creating thousands of TrainJobs in the local control plane would take most of the
suite's time; the writes to the real API server have their own tests.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client as k8s

from exporter_lib.pod import POD_HEADER
from scraper.app import ScraperApp
from scraper.config import ScraperSettings
from scraper.discovery.pods import Synced
from scraper.supervisor import Supervisor

pytestmark = pytest.mark.timeout(900)  # the bound of a scale run (10,000 pods)

NS = "churn"
BATCH = 250
#: Pods that come and go, a multiple of BATCH (the environment variable: a scale run).
PODS = int(os.environ.get("TRAINJOB_MAP_BOUNDS_PODS", 2 * BATCH))
#: Pods scraped (one real scrape each) and ending with a final (real writes): those
#: dropped only by a relist, those outlived by their TrainJob's deletion, and one in
#: ten of the others; the rest run, end without a final and go (no request).
FULL = (0, 3, 5)
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"


class _Servers:
    """The exporter (``/metrics/<pod>``, stating that pod) and the API stand-in."""

    def __init__(self) -> None:
        self.runners: list[web.AppRunner] = []
        self.rv = itertools.count(1000)
        self.uids: dict[str, str] = {}  # TrainJob name -> UID
        self.writes = 0

    async def _metrics(self, request: web.Request) -> web.Response:
        pod = request.match_info["pod"]
        body = {"progressPercentage": 50, "metrics": [{"name": "loss", "value": "0.5"}],
                "lastUpdatedTime": "2026-01-01T00:00:00Z"}
        return web.json_response(body, headers={POD_HEADER: f'name="{pod}"'})

    async def _apply(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        name = request.match_info["name"]
        self.writes += 1
        meta = {**body["metadata"], "uid": self.uids.get(name, ""),
                "resourceVersion": str(next(self.rv))}
        return web.json_response({**body, "metadata": meta})

    async def _event(self, request: web.Request) -> web.Response:
        return web.json_response(json.loads(await request.read()), status=201)

    async def _start(self, app: web.Application) -> int:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.runners.append(runner)
        return int(runner.addresses[0][1])

    async def start(self) -> tuple[int, int]:
        exporter = web.Application()
        exporter.router.add_get("/metrics/{pod}", self._metrics)
        api = web.Application()
        api.router.add_patch("/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/"
                             "{name}/status", self._apply)
        api.router.add_post("/api/v1/namespaces/{ns}/events", self._event)
        return await self._start(exporter), await self._start(api)

    async def stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()


@pytest.fixture
async def servers() -> AsyncIterator[tuple[_Servers, int, int]]:
    s = _Servers()
    exporter_port, api_port = await s.start()
    yield s, exporter_port, api_port
    await s.stop()


def _owner(kind: str, name: str, uid: str, api: str) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": True}


def _objects(i: int, exporter_port: int) -> tuple[dict[str, Any], ...]:
    """TrainJob, JobSet, Job and trainer pod (Pending) of training ``i``, as the API
    server would list them."""
    tj, rv = f"tj-{i}", str(i + 1)
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": tj, "namespace": NS, "uid": f"tj-uid-{i}",
                             "resourceVersion": rv}, "status": {}}
    jobset = {"metadata": {"name": tj, "namespace": NS, "uid": f"js-uid-{i}",
                           "ownerReferences": [_owner("TrainJob", tj, f"tj-uid-{i}",
                                                      "trainer.kubeflow.org/v1alpha1")]}}
    job = {"metadata": {"name": f"{tj}-node-0", "namespace": NS, "uid": f"job-uid-{i}",
                        "labels": {JOBSET_LABEL: tj},
                        "ownerReferences": [_owner("JobSet", tj, f"js-uid-{i}",
                                                   "jobset.x-k8s.io/v1alpha2")]}}
    name = f"{tj}-node-0-0-x{i}"
    annotations = {"trainjob-progress.dev/port": str(exporter_port),
                   "trainjob-progress.dev/path": f"/metrics/{name}"}
    labels = {JOBSET_LABEL: tj, "jobset.sigs.k8s.io/replicatedjob-name": "node",
              "jobset.sigs.k8s.io/job-index": "0",
              "batch.kubernetes.io/job-completion-index": "0"}
    if i % 10 == 1:  # misconfigured: warned once, never a target
        annotations["trainjob-progress.dev/port"] = "not-a-port"
    if i % 10 == 2:  # foreign: names another TrainJob than its owner chain leads to
        labels[JOBSET_LABEL] = f"tj-{i}-other"
    pod = {"metadata": {"name": name, "namespace": NS, "uid": f"pod-uid-{i}",
                        "resourceVersion": rv, "labels": labels, "annotations": annotations,
                        "ownerReferences": [_owner("Job", f"{tj}-node-0", f"job-uid-{i}",
                                                   "batch/v1")]},
           "spec": {"containers": [{"name": "node"}]},
           "status": {"phase": "Pending"}}
    return trainjob, jobset, job, pod


def _running(pod: dict[str, Any]) -> dict[str, Any]:
    return {**pod, "status": {
        "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
        "containerStatuses": [{"name": "node", "ready": True, "restartCount": 0,
                               "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}


def _ended(pod: dict[str, Any], final: bool) -> dict[str, Any]:
    message = json.dumps({"progressPercentage": 100, "metrics": [{"name": "loss",
                                                                   "value": "0.01"}],
                          "lastUpdatedTime": "2026-01-01T01:00:00Z"}) if final else ""
    return {**pod, "status": {
        "phase": "Succeeded", "podIP": "127.0.0.1",
        "containerStatuses": [{"name": "node", "ready": False, "restartCount": 0,
                               "state": {"terminated": {
                                   "exitCode": 0, "reason": "Completed", "message": message,
                                   "startedAt": "2026-01-01T00:00:00Z",
                                   "finishedAt": "2026-01-01T01:00:00Z"}}}]}}


async def _settle(app: ScraperApp, supervisor: Supervisor) -> None:
    """Until the finals' tasks ended and the write queue is empty (bounded)."""
    for _ in range(600):
        await asyncio.sleep(0.05)
        if not supervisor.background_count() and await app.writer.drain(0.0):
            return
    raise AssertionError(f"not settled: {supervisor.background_count()} final tasks, "
                         f"{app.writer.queue.unapplied()} writes pending")


async def test_maps_return_to_their_size_after_pods_come_and_go(
        servers: tuple[_Servers, int, int]) -> None:
    s, exporter_port, api_port = servers
    settings = ScraperSettings(namespaces=[NS], listen_port=0, write_qps=1000,
                               write_burst=1000, interval=600)
    api = k8s.ApiClient(k8s.Configuration(host=f"http://127.0.0.1:{api_port}"))
    app = ScraperApp(settings, api)
    app.supervisor = supervisor = Supervisor()
    for index in (app.trainjobs, app.jobs, app.jobsets):
        index.on_list(NS, [])
    app.pods.on_synced(Synced(NS, []))
    app.scheduler.start()
    app.writer.start()
    before = app.sizes()
    peak = dict(before)
    try:
        for start in range(0, PODS, BATCH):
            batch = [_objects(i, exporter_port) for i in range(start, start + BATCH)]
            for trainjob, jobset, job, pod in batch:
                s.uids[trainjob["metadata"]["name"]] = trainjob["metadata"]["uid"]
                app.trainjobs.on_event("ADDED", trainjob)
                app.jobsets.on_event("ADDED", jobset)
                app.jobs.on_event("ADDED", job)
                app.pods.on_pod(pod, deleted=False)
                app.pods.on_pod(_running(pod), deleted=False)
            keys = [f"{NS}/{pod['metadata']['name']}"
                    for i, (*_, pod) in zip(range(start, start + BATCH), batch, strict=True)
                    if i % 10 in FULL]
            await asyncio.gather(*(app.manager.run(key) for key in keys))  # one scrape each
            await _settle(app, supervisor)
            app.stalls.check()
            peak = {k: max(v, peak.get(k, 0)) for k, v in app.sizes().items()}
            for i, (trainjob, _, _, pod) in zip(range(start, start + BATCH), batch,
                                                strict=True):
                app.pods.on_pod(_ended(pod, i % 10 in FULL), deleted=False)
                if i % 10 == 3:  # the TrainJob goes first, its ended pod after
                    app.trainjobs.on_event("DELETED", trainjob)
            await _settle(app, supervisor)
            peak = {k: max(v, peak.get(k, 0)) for k, v in app.sizes().items()}
            for i, (trainjob, jobset, job, pod) in zip(range(start, start + BATCH), batch,
                                                       strict=True):
                if i % 10 not in (0, 1, 2):  # those: the DELETED event is missed
                    app.pods.on_pod(_ended(pod, i % 10 in FULL), deleted=True)
                app.jobs.on_event("DELETED", job)
                app.jobsets.on_event("DELETED", jobset)
                if i % 10 != 3:
                    app.trainjobs.on_event("DELETED", trainjob)
            app.pods.on_synced(Synced(NS, []))  # the relist after a watch restart
            app.stalls.check()
            await _settle(app, supervisor)
        after = app.sizes()
    finally:
        await supervisor.cancel_background()
        app.scheduler.shutdown()
        await app.writer.stop()
        await app.scraper.close()
    print(f"{PODS} pods, {s.writes} status writes; peak sizes "
          f"{ {k: v for k, v in peak.items() if v} }")
    assert after == before, {k: (before[k], v) for k, v in after.items() if v != before[k]}
    # The run went through every map that holds pods or TrainJobs.
    for name in ("manager.states", "manager.ranks", "manager.chosen", "pods.warned_pods",
                 "pods.foreign", "pods.unverified.pods", "writer.ours",
                 "writer.queue.written", "scheduler.scheduled", "informers.trainjobs"):
        assert peak[name] > 0, (name, peak)
    assert s.writes >= PODS * 2 // 10  # statuses and finals of the scraped pods
