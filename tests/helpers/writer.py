"""A running status writer in the test's event loop: TrainJob informer + write queue."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Any

from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from scraper.decide.decision import decide
from scraper.kube.informer import ListWatch
from scraper.shared.policy import PROGRESS_FLOOR_MIN, WritePolicy
from scraper.shared.trainjobs import TrainJobStore, slim_trainjob
from scraper.write.annotation_target import StatusTarget
from scraper.write.rate import WriteBudget
from scraper.write.rules import WriterHooks, WriteRules
from scraper.write.writer import StatusWriter

#: Every change written as soon as the budget allows (the smallest floor, no staleness).
AT_ONCE = WritePolicy(progress_floor=PROGRESS_FLOOR_MIN, metrics_staleness=0.0)


@contextlib.asynccontextmanager
async def running_writer(api: client.ApiClient, namespace: str, *, qps: float = 50,
                         burst: int = 50, policy: WritePolicy = AT_ONCE,
                         target: StatusTarget = StatusTarget.STATUS, **options: Any,
                         ) -> AsyncIterator[tuple[StatusWriter, ListWatch]]:
    """A :class:`StatusWriter` whose store watches TrainJobs of ``namespace`` (synced);
    ``options``: ``qps_max`` and ``on_rate_change`` (the budget), ``other_writer_grace``
    (the rules), and the fields of :class:`scraper.write.rules.WriterHooks`.

    ``policy``: :data:`AT_ONCE` unless a test is about the write policy, so tests of
    other rules see each change written as soon as the budget allows."""
    store = TrainJobStore([namespace])  # the writer listens to its changes (drift)
    custom = client.CustomObjectsApi(api)
    watch = ListWatch(
        functools.partial(custom.list_namespaced_custom_object, API_GROUP, API_VERSION,
                          namespace, TRAINJOB_PLURAL),
        name=f"trainjobs/{namespace}", loop=asyncio.get_running_loop(),
        on_list=functools.partial(store.on_list, namespace), on_event=store.on_event,
        slim=slim_trainjob)
    budget = WriteBudget(qps, burst, options.pop("qps_max", None),
                         **({"on_rate_change": options.pop("on_rate_change")}
                            if "on_rate_change" in options else {}))
    rules = WriteRules(decide, policy, target=target,
                       other_writer_grace=options.pop("other_writer_grace", None))
    writer = StatusWriter.for_client(api, identity="test", budget=budget, store=store,
                                     rules=rules, hooks=WriterHooks(**options))
    watch.start()
    writer.start()
    try:
        await asyncio.wait_for(store.synced.wait(), 20)
        yield writer, watch
    finally:
        await writer.stop()
        await asyncio.to_thread(watch.stop, 1.0)
