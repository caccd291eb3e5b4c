"""A failed pod watch item is never a silent gap (issue 27, deliverable 6).

The real pod watch (``PodWatcher`` on the local kube-apiserver) feeds the real consumer
(``scraper.discovery.feed.PodFeed``).  A bug in applying one pod cannot be produced on purpose, so
the manager's ``on_pod`` is wrapped to raise once for one pod (the only stand-in here);
the consumer must count it, log it, apply the other pods of the list, and relist the
pods at once (not after the watch's 30 s timeout), after which the pod is applied.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from kubernetes import client

from localdev.cluster import objects
from scraper.app import ScraperApp
from scraper.config import ScraperSettings
from scraper.discovery.pods import PodWatcher, WatchItem

pytestmark = pytest.mark.usefixtures("trainjob_crd")


async def test_a_failed_pod_item_is_counted_logged_and_relisted(
        kube_api: client.ApiClient, namespace: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    names = []
    for i in range(3):
        objects.create_trainjob(kube_api, namespace, f"job-{i}")
        names.append(objects.create_trainer_pod(kube_api, namespace, f"job-{i}",
                                                port=28080).metadata.name)
    app = ScraperApp(ScraperSettings(namespaces=[namespace], listen_port=0), kube_api)
    seen: list[str] = []
    again = asyncio.Event()  # the failed pod was applied again
    broken = [names[0]]
    real = app.pods.on_pod

    def on_pod(pod: dict[str, Any], *, deleted: bool) -> None:
        name = pod["metadata"]["name"]
        seen.append(name)
        if seen.count(names[0]) == 2:
            again.set()
        if name in broken:
            broken.remove(name)
            raise RuntimeError("a bug in applying this pod")
        real(pod, deleted=deleted)

    monkeypatch.setattr(app.pods, "on_pod", on_pod)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[WatchItem] = asyncio.Queue()
    watcher = PodWatcher(client.CoreV1Api(app.api), namespace=namespace,
                         selector=app.settings.selector, queue=queue, loop=loop,
                         on_restart=app._watch_restarted)
    consumer = asyncio.create_task(app.pod_feed.run(queue, [watcher]))
    started = time.monotonic()
    watcher.start()
    try:
        async with asyncio.timeout(20):
            await again.wait()
        await asyncio.sleep(0.5)  # the rest of the relist
        relisted = time.monotonic() - started
    finally:
        consumer.cancel()
        await asyncio.to_thread(watcher.stop, 1.0)
    registry = app.telemetry.registry
    assert registry.get_sample_value("trainjob_scraper_pod_apply_failures_total",
                                     {"item": "list"}) == 1
    assert registry.get_sample_value("trainjob_scraper_watch_restarts_total",
                                     {"reason": "relist"}) == 1
    # The first list applied the pods after the failed one, then the relist all of them.
    assert sorted(seen) == sorted(names * 2), seen
    assert relisted < 10, relisted  # at once, not at the watch's 30 s timeout
    assert "applying a pod watch list failed; relisting pods" in caplog.text
    assert "a bug in applying this pod" in caplog.text
