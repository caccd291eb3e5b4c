"""The list+watches of the owner chain's kinds: TrainJobs, JobSets and the Jobs of
JobSets, per scope, each feeding its store (:mod:`scraper.shared.trainjobs`,
:class:`scraper.discovery.identity.OwnerIndex`)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, Protocol

from kubernetes import client as k8s

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from scraper.discovery.identity import LABEL_JOBSET_NAME
from scraper.kube.health import ApiHealth
from scraper.kube.informer import ListWatch, slim
from scraper.shared.trainjobs import slim_trainjob

#: JobSet API (the owner chain Pod -> Job -> JobSet -> TrainJob).
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"


class Sink(Protocol):
    """A store fed by a list+watch."""

    def on_list(self, scope: str | None, items: list[dict[str, Any]]) -> None: ...

    def on_event(self, kind: str, obj: dict[str, Any]) -> None: ...


def owner_watches(api: k8s.ApiClient, scopes: list[str | None], *, trainjobs: Sink,
                  jobsets: Sink, jobs: Sink, loop: asyncio.AbstractEventLoop,
                  on_restart: Callable[[str], None], relist_interval: float,
                  health: ApiHealth | None) -> list[ListWatch]:
    """One list+watch per kind and scope (None: every namespace), not started."""
    custom = k8s.CustomObjectsApi(api)
    batch = k8s.BatchV1Api(api)
    watches = []
    for ns in scopes:
        kinds: list[tuple[str, Callable[..., Any], Sink]]
        if ns is None:
            kinds = [
                ("trainjobs", functools.partial(custom.list_cluster_custom_object, API_GROUP,
                                                API_VERSION, TRAINJOB_PLURAL), trainjobs),
                ("jobsets", functools.partial(custom.list_cluster_custom_object, JOBSET_GROUP,
                                              JOBSET_VERSION, "jobsets"), jobsets),
                ("jobs", functools.partial(batch.list_job_for_all_namespaces,
                                           label_selector=LABEL_JOBSET_NAME), jobs)]
        else:
            kinds = [
                ("trainjobs", functools.partial(custom.list_namespaced_custom_object,
                                                API_GROUP, API_VERSION, ns, TRAINJOB_PLURAL),
                 trainjobs),
                ("jobsets", functools.partial(custom.list_namespaced_custom_object,
                                              JOBSET_GROUP, JOBSET_VERSION, ns, "jobsets"),
                 jobsets),
                ("jobs", functools.partial(batch.list_namespaced_job, ns,
                                           label_selector=LABEL_JOBSET_NAME), jobs)]
        for kind, lister, sink in kinds:
            watches.append(ListWatch(
                lister, name=f"{kind}/{ns or 'all'}", loop=loop,
                on_list=functools.partial(sink.on_list, ns),
                on_event=sink.on_event, on_restart=on_restart,
                relist_interval=relist_interval, health=health,
                slim=slim_trainjob if kind == "trainjobs" else slim))
    return watches
