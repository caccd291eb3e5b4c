"""The priority boost on real Workloads, across a leader change.

Real API server (etcd + kube-apiserver) with the TrainJob CRD and Kueue v0.17.0's own
Workload CRD (from the stack's bundle, ``manifests/kueue/crd``): the real list and
annotation write (:mod:`scraper.boost.workload`) and :class:`BoostWatch`.  No Kueue
controller runs: the Workloads' admission is written to their status subresource as
Kueue would (what Kueue does with the boost is ``tests/e2e/test_kueue_boost.py``).  The
targets' statuses are given (what is tested is what each leader writes); the wall
clock is injected.
"""

from __future__ import annotations

import functools
from collections.abc import Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry, generate_latest

from exporter_lib.status import TrainerStatus
from localdev.cluster import objects
from localdev.cluster.assets import ensure_assets
from localdev.cluster.crds import install_crd, load_yaml_file
from scraper.boost.watch import BoostCollector, BoostWatch
from scraper.boost.workload import (
    KUEUE_GROUP,
    KUEUE_VERSION,
    PRIORITY_BOOST_ANNOTATION,
    WORKLOAD_PLURAL,
    list_workloads,
    write_boost,
)
from scraper.kube.client import load_client
from scraper.stall.watch import Observed
from tests.helpers.scraper import scraper_service_account

NOW = 1_780_000_000.0


@pytest.fixture(scope="module")
def workload_crd(kube_api: client.ApiClient) -> None:
    manifests = ensure_assets(parts=("kueue",)).manifests
    assert manifests is not None, "the stack's bundle has no manifests (scripts/stack-assets)"
    install_crd(kube_api, load_yaml_file(manifests / "kueue" / "crd" /
                                         "kueue.x-k8s.io_workloads.yaml"))


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _workload(api: client.ApiClient, namespace: str, trainjob: dict[str, Any], *,
              usage: dict[str, str] | None, admitted_ago: float = 0.0,
              boost: str | None = None) -> str:
    """A Workload owned by ``trainjob``; admitted ``admitted_ago`` seconds before
    :data:`NOW` with ``usage`` (the whole pod set's resources), or pending (None)."""
    meta = trainjob["metadata"]
    name = f"trainjob-{meta['name']}"
    body: dict[str, Any] = {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace,
                     "annotations": {} if boost is None else {PRIORITY_BOOST_ANNOTATION: boost},
                     "ownerReferences": [{"apiVersion": trainjob["apiVersion"],
                                          "kind": "TrainJob", "name": meta["name"],
                                          "uid": meta["uid"], "controller": True}]},
        "spec": {"queueName": "q", "podSets": [{
            "name": "node", "count": 2,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{
                "name": "node", "image": "trainer",
                "resources": {"requests": {}}}]}}}]},
    }
    custom = client.CustomObjectsApi(api)
    created = custom.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace,
                                                     WORKLOAD_PLURAL, body)
    if usage is not None:
        when = _stamp(NOW - admitted_ago)
        conditions = [{"type": t, "status": "True", "reason": t, "message": t,
                       "lastTransitionTime": when} for t in ("QuotaReserved", "Admitted")]
        created["status"] = {
            "admission": {"clusterQueue": "cq", "podSetAssignments": [{
                "name": "node", "count": 2, "flavors": {k: "default" for k in usage},
                "resourceUsage": usage}]},
            "conditions": conditions}
        custom.replace_namespaced_custom_object_status(KUEUE_GROUP, KUEUE_VERSION, namespace,
                                                       WORKLOAD_PLURAL, name, created)
    return name


def _boosts(api: client.ApiClient, namespace: str) -> dict[str, str | None]:
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, namespace, WORKLOAD_PLURAL)["items"]
    return {i["metadata"]["name"]: (i["metadata"].get("annotations") or {}).get(
        PRIORITY_BOOST_ANNOTATION) for i in items}


def _status(checkpoint_ago: float | None) -> TrainerStatus:
    return TrainerStatus(progress_percentage=10, last_updated_time=datetime.fromtimestamp(
        NOW, UTC), last_checkpoint_time=None if checkpoint_ago is None
        else datetime.fromtimestamp(NOW - checkpoint_ago, UTC))


class Leader:
    """One scraper term's boost watch, with the statuses its scrapes have seen."""

    def __init__(self, api: client.ApiClient, namespace: str, uids: dict[str, str]) -> None:
        self.statuses: dict[str, TrainerStatus | None] = {}
        self.uids = uids
        self.namespace = namespace
        self.now = NOW
        self.leading = True
        self.writes: list[tuple[str, int]] = []
        self.tasks: list[Coroutine[Any, Any, None]] = []
        real_write = functools.partial(write_boost, api)

        async def write(ns: str, name: str, uid: str, value: int) -> None:
            self.writes.append((name, value))
            await real_write(ns, name, uid, value)

        self.watch = BoostWatch(
            max_boost=10, signals=self.signals, uid_of=lambda ns, name: None,
            list_workloads=lambda: list_workloads(api, [namespace]), write_boost=write,
            leading=lambda: self.leading, ready=lambda: True, spawn=self.tasks.append,
            wall=lambda: self.now)

    def signals(self) -> list[Observed]:
        return [Observed((self.namespace, name), self.uids[name], f"{name}-node-0-0", "p",
                         1.0, status, True) for name, status in self.statuses.items()]

    async def check(self) -> None:
        await self.watch.check()
        while self.tasks:
            await self.tasks.pop(0)


async def test_boosts_are_written_recomputed_by_a_new_leader_and_never_reset(
        kube_api: client.ApiClient, trainjob_crd: None, workload_crd: None,
        namespace: str) -> None:
    jobs = {name: objects.create_trainjob(kube_api, namespace, name)
            for name in ("gpus", "cpus", "silent", "evicted")}
    uids = {name: job["metadata"]["uid"] for name, job in jobs.items()}
    _workload(kube_api, namespace, jobs["gpus"], usage={"cpu": "16", "nvidia.com/gpu": "8"},
              admitted_ago=3600)
    _workload(kube_api, namespace, jobs["cpus"], usage={"cpu": "2"}, admitted_ago=600)
    _workload(kube_api, namespace, jobs["silent"], usage={"cpu": "4"}, admitted_ago=3600)
    _workload(kube_api, namespace, jobs["evicted"], usage=None, boost="5")

    first = Leader(kube_api, namespace, uids)
    # gpus: a checkpoint 20 min ago, 8 accelerators: 9600 s -> floor(log2(161)) = 7.
    # cpus: no checkpoint, admitted 10 min ago, 2 CPUs: 1200 s -> floor(log2(21)) = 4.
    # silent: no status (no progress signal): untouched.
    first.statuses = {"gpus": _status(1200), "cpus": _status(None), "silent": None}
    await first.check()
    assert _boosts(kube_api, namespace) == {
        "trainjob-gpus": "7", "trainjob-cpus": "4", "trainjob-silent": None,
        "trainjob-evicted": "0"}  # not admitted: nothing at risk
    assert sorted(first.writes) == [("trainjob-cpus", 4), ("trainjob-evicted", 0),
                                    ("trainjob-gpus", 7)]
    registry = CollectorRegistry()
    registry.register(BoostCollector(first.watch))
    text = generate_latest(registry).decode()
    assert (f'trainjob_priority_boost{{namespace="{namespace}",trainjob="gpus"}} 7.0'
            in text)
    assert (f'trainjob_work_at_risk_resource_seconds{{namespace="{namespace}",'
            f'resource="accelerator",trainjob="gpus"}} 9600.0' in text)
    assert 'trainjob="silent"' not in text
    first.leading = False  # the term ends: nothing kept, nothing shown
    await first.check()
    assert "trainjob_priority_boost{" not in generate_latest(registry).decode()

    # A new leader (the first one SIGKILLed): nothing written before its own scrapes
    # answered, then the same values from the same facts: no write at all.
    second = Leader(kube_api, namespace, uids)
    second.now = NOW + 5
    second.statuses = {"gpus": None, "cpus": None}
    await second.check()
    second.statuses = {"gpus": _status(1205), "cpus": _status(None)}
    await second.check()
    assert second.writes == []
    assert _boosts(kube_api, namespace)["trainjob-gpus"] == "7"
    # A checkpoint now: nothing at risk, the boost goes to 0.
    second.statuses["gpus"] = _status(-5)
    await second.check()
    assert second.writes == [("trainjob-gpus", 0)]
    assert _boosts(kube_api, namespace)["trainjob-gpus"] == "0"


BOOST_RULES = (Path(__file__).resolve().parents[2] / "charts" / "trainjob-scraper" / "files"
               / "boost-rules.yaml")


@pytest.mark.parametrize("granted", [True, False], ids=["boost-rules", "default-rules"])
async def test_the_charts_rules_allow_the_boost_only_when_granted(
        kube_api: client.ApiClient, control_plane: Any, trainjob_crd: None,
        workload_crd: None, namespace: str, tmp_path: Path, granted: bool) -> None:
    """The scraper's identity with the chart's rules (files/clusterrole-rules.yaml, plus
    files/boost-rules.yaml when config.priorityBoost.max > 0) lists the Workloads and
    writes the boost; without the extra rules the API server refuses (403)."""
    job = objects.create_trainjob(kube_api, namespace, "rbac")
    name = _workload(kube_api, namespace, job, usage={"cpu": "1"}, admitted_ago=60)
    with scraper_service_account(kube_api, control_plane, namespace,
                                 extra_rules=BOOST_RULES if granted else None) as token:
        api = load_client(Path(control_plane.kubeconfig_for_token(
            token, tmp_path / "sa.kubeconfig")))
        if granted:
            views = await list_workloads(api, [namespace])
            assert [(v.name, v.owner_uid) for v in views] == [(name, job["metadata"]["uid"])]
            await write_boost(api, namespace, name, views[0].uid, 2)
            assert _boosts(kube_api, namespace)[name] == "2"
        else:
            with pytest.raises(client.ApiException) as refused:
                await list_workloads(api, [namespace])
            assert refused.value.status == 403
