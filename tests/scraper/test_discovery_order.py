"""Discovery converges whatever order lists and watch events arrive in (issue 21, input 1).

The scraper talks to the real kube-apiserver through :mod:`tests.helpers.fault_proxy`,
which holds chosen list and watch requests back (a big cluster's slow TrainJob list, a
watch that connects late).  Nothing else is faked: the objects are real Pods, Jobs,
JobSets and TrainJobs in the API server, and a target is what the scraper itself
reports (``trainjob_scraper_target_up``, one series per scraped pod).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client

from localdev.cluster import objects
from tests.helpers.fault_proxy import FaultProxy
from tests.helpers.scraper import (
    FakeExporter,
    ScraperProcess,
    progress_of,
    status_json,
    wait_for,
)

pytestmark = [pytest.mark.usefixtures("trainjob_crd"), pytest.mark.timeout(600)]


def list_path(namespace: str, kind: str) -> str:
    """The regex of the list (and watch) path of ``kind`` in ``namespace``."""
    prefix = {"trainjobs": "/apis/trainer.kubeflow.org/v1alpha1",
              "jobsets": "/apis/jobset.x-k8s.io/v1alpha2",
              "jobs": "/apis/batch/v1", "pods": "/api/v1"}[kind]
    return f"^{prefix}/namespaces/{namespace}/{kind}$"


def targets(scraper: ScraperProcess, namespace: str) -> set[str]:
    """The pods the scraper scrapes in ``namespace`` (its target_up series)."""
    return {s["pod"] for s in scraper.series("trainjob_scraper_target_up")
            if s.get("namespace") == namespace}


def test_slow_trainjob_list_still_gives_a_target(
    kube_api: client.ApiClient, namespace: str, proxied: tuple[FaultProxy, Path],
    exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    """Input 1: the TrainJob list answers 2 s after the pod list; the pod must still be
    scraped (it used to wait for its owner chain forever)."""
    proxy, kubeconfig = proxied
    exp = exporter_factory(body=status_json(42))
    objects.create_trainjob(kube_api, namespace, "slow")
    pod = objects.create_trainer_pod(kube_api, namespace, "slow", port=exp.port)
    proxy.delay("GET", list_path(namespace, "trainjobs"), 2.0, watch=False)
    started = time.monotonic()
    scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}",
                              kubeconfig=kubeconfig)
    wait_for(lambda: progress_of(kube_api, namespace, "slow") == 42, 15,
             "the status written although the TrainJob list came last")
    print(f"status written {time.monotonic() - started:.1f}s after the scraper started "
          "(TrainJob list held 2 s)")
    held = proxy.requests("GET", list_path(namespace, "trainjobs"), watch=False)
    assert held and held[0].injected  # the delay did hold the TrainJob list
    assert targets(scraper, namespace) == {pod.metadata.name}


# ------------------------------------------------------------------ every order

KINDS = ("trainjobs", "jobsets", "jobs", "pods")
#: Seconds a list or the first watch request of a kind is held (0: not held).
DELAYS = st.sampled_from([0.0, 0.3, 1.0, 2.0])
#: How one TrainJob's objects reach the scraper.
#:
#: * ``valid``: a TrainJob with its JobSet, Job and rank-0 pod: must be a target;
#: * ``foreign``: the same, but the pod's jobset-name label names another TrainJob of
#:   the example (or one that does not exist): never a target;
#: * ``recreated``: a TrainJob with its chain exists before the scraper starts; then it
#:   is deleted with its chain (as the garbage collector would) and created again with a
#:   new chain and pod: the new pod must be a target, the old one is gone.
#:
#: ``listed``: created before the scraper starts (it arrives in the lists);
#: ``watched``: created ``offset`` seconds after the scraper's first request (it
#: arrives as watch events).  ``touch``: a label is added to the TrainJob afterwards.
CHAINS = st.fixed_dictionaries({
    "shape": st.sampled_from(["valid", "valid", "foreign", "recreated"]),
    "when": st.sampled_from(["listed", "watched"]),
    "offset": st.sampled_from([0.0, 0.5, 1.5]),
    "touch": st.booleans(),
})
EXAMPLES = 12


def _fresh_namespace(kube_api: client.ApiClient) -> str:
    name = f"t-order-{secrets.token_hex(4)}"
    client.CoreV1Api(kube_api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=name, labels={"trainjob-progress.dev/test": "true"})))
    return name


def _relabel(kube_api: client.ApiClient, namespace: str, pod: str, trainjob: str) -> None:
    client.CoreV1Api(kube_api).patch_namespaced_pod(
        pod, namespace, {"metadata": {"labels": {objects.LABEL_JOBSET_NAME: trainjob}}})


def _touch(kube_api: client.ApiClient, namespace: str, trainjob: str) -> None:
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", trainjob,
        {"metadata": {"labels": {"test/touched": "yes"}}})


class _Example:
    """One example's objects in its own namespace, and the pods that must be targets."""

    def __init__(self, kube_api: client.ApiClient, namespace: str, port: int,
                 chains: list[dict[str, Any]]) -> None:
        self.api, self.ns, self.port, self.chains = kube_api, namespace, port, chains
        self.expected: set[str] = set()
        self.names = [f"job-{i}" for i in range(len(chains))]

    def _pod(self, name: str) -> str:
        return str(objects.create_trainer_pod(self.api, self.ns, name,
                                              port=self.port).metadata.name)

    def _chain(self, i: int) -> None:
        """Create chain ``i`` (the part after the start, for ``recreated``)."""
        chain, name = self.chains[i], self.names[i]
        if chain["shape"] == "recreated":
            objects.delete_trainjob(self.api, self.ns, name, cascade=True)
        objects.create_trainjob(self.api, self.ns, name)
        pod = self._pod(name)
        if chain["shape"] == "foreign":
            others = [n for j, n in enumerate(self.names) if j != i]
            _relabel(self.api, self.ns, pod, others[0] if others else "ghost")
        else:
            self.expected.add(pod)

    def before_start(self) -> None:
        for i, chain in enumerate(self.chains):
            if chain["shape"] == "recreated":  # the first life, seen in the lists
                objects.create_trainjob(self.api, self.ns, self.names[i])
                self._pod(self.names[i])
            if chain["when"] == "listed":
                self._chain(i)
                if chain["touch"]:
                    _touch(self.api, self.ns, self.names[i])

    def after_start(self, began: float) -> None:
        watched = sorted((c["offset"], i) for i, c in enumerate(self.chains)
                         if c["when"] == "watched")
        for offset, i in watched:
            time.sleep(max(0.0, began + offset - time.monotonic()))
            self._chain(i)
        for i, chain in enumerate(self.chains):
            if chain["when"] == "watched" and chain["touch"]:
                _touch(self.api, self.ns, self.names[i])

    def clean(self) -> None:
        with contextlib.suppress(client.ApiException, OSError):
            for name in self.names:
                objects.delete_trainjob(self.api, self.ns, name, cascade=True)
            for pod in client.CoreV1Api(self.api).list_namespaced_pod(self.ns).items:
                objects.delete_pod(self.api, self.ns, pod.metadata.name)


def test_targets_converge_whatever_the_order_of_lists_and_events(
    kube_api: client.ApiClient, proxied: tuple[FaultProxy, Path],
    exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    """Deliver 1 of issue 21: whatever order the four kinds' lists and watch events
    arrive in, and whatever their delays, every pod with a valid owner chain ends a
    target and no other pod does."""
    proxy, kubeconfig = proxied
    exp = exporter_factory(body=status_json(5))

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow])
    @given(list_delays=st.tuples(*[DELAYS] * len(KINDS)),
           watch_delays=st.tuples(*[DELAYS] * len(KINDS)),
           chains=st.lists(CHAINS, min_size=1, max_size=3))
    def one(list_delays: tuple[float, ...], watch_delays: tuple[float, ...],
            chains: list[dict[str, Any]]) -> None:
        ns = _fresh_namespace(kube_api)
        example = _Example(kube_api, ns, exp.port, chains)
        scraper = None
        try:
            example.before_start()
            for kind, listed, watched in zip(KINDS, list_delays, watch_delays, strict=True):
                if listed:
                    proxy.delay("GET", list_path(ns, kind), listed, watch=False,
                                query="limit=500")
                if watched:
                    proxy.delay("GET", list_path(ns, kind), watched, watch=True)
            scraper = scraper_factory("--interval=1s", f"--namespaces={ns}",
                                      kubeconfig=kubeconfig, ready=False)
            first = wait_for(lambda: [s for s in proxy.requests() if ns in s.path], 30,
                             "the scraper's first request")
            example.after_start(first[0].started)
            wait_for(lambda: targets(scraper, ns) == example.expected, 20,
                     f"targets {sorted(example.expected)} "
                     f"(lists held {list_delays}, watches held {watch_delays}, {chains})")
            time.sleep(1.5)  # no other pod becomes a target afterwards
            assert targets(scraper, ns) == example.expected, (list_delays, watch_delays,
                                                               chains)
        finally:
            if scraper is not None:
                scraper.terminate()
            example.clean()

    one()
