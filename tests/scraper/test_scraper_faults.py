"""The scraper against API-server faults: retried writes, shutdown mid-write, watch restarts.

The scraper talks to the real kube-apiserver through :mod:`tests.helpers.fault_proxy`, which
injects only what a healthy API server never shows (429/5xx/409 answers, slow
answers, an expired watch, a cut watch connection) and records every request,
so each test asserts the exact requests made.  The scraper authenticates with
the bearer token of a ServiceAccount bound to the chart's least-privilege rules.
"""

from __future__ import annotations

import itertools
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from localdev.cluster import objects
from tests.helpers.fault_proxy import FaultProxy, Seen
from tests.helpers.scraper import (
    FakeExporter,
    ScraperProcess,
    progress_of,
    status_json,
    wait_for,
)

pytestmark = [pytest.mark.usefixtures("trainjob_crd"), pytest.mark.timeout(60)]

FINAL = '{"progressPercentage":100,"lastUpdatedTime":"2025-01-01T00:00:00Z"}'


def _status_path(namespace: str, trainjob: str) -> str:
    return (f"^/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/"
            f"{trainjob}/status$")


def _statuses(seen: list[Seen]) -> list[int | None]:
    return [s.status for s in seen]


def _answered(proxy: FaultProxy, path: str) -> list[int | None]:
    """The statuses of the PATCHes to ``path`` once the proxy has recorded each answer.

    The API server commits a write before its answer reaches the proxy, so a test that
    saw the write land may find the proxy's record still in flight (``None``) while the
    proxy's thread waits for the CPU.  The wait takes milliseconds on an idle machine;
    its 20 s bound is slack for a loaded one (it bounds a wait, it measures nothing).
    """
    return _statuses(wait_for(
        lambda: (seen := proxy.requests("PATCH", path))
        and all(s.status is not None for s in seen) and seen,
        20, f"the proxy's record of each PATCH {path} answered"))


def _gaps(seen: list[Seen]) -> list[float]:
    return [b.started - a.started for a, b in itertools.pairwise(seen)]


def _instrumented_job(kube_api: client.ApiClient, namespace: str, name: str, progress: int,
                      exporter_factory: Callable[..., FakeExporter],
                      ) -> tuple[FakeExporter, Any]:
    """An exporter reporting ``progress``, its TrainJob and its rank-0 pod."""
    exp = exporter_factory(body=status_json(progress))
    objects.create_trainjob(kube_api, namespace, name)
    pod = objects.create_trainer_pod(kube_api, namespace, name, port=exp.port)
    return exp, pod


def _scraper_through(proxied: tuple[FaultProxy, Path], namespace: str,
                     scraper_factory: Callable[..., ScraperProcess], *flags: str,
                     ) -> ScraperProcess:
    """The scraper at a 1 s interval on ``namespace``, talking through the fault proxy."""
    return scraper_factory("--interval=1s", f"--namespaces={namespace}", *flags,
                           kubeconfig=proxied[1])


def test_status_write_retried_on_503_and_429_then_lands_once(
    kube_api: client.ApiClient, namespace: str, proxied: tuple[FaultProxy, Path],
    exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    proxy = proxied[0]
    path = _status_path(namespace, "retry")
    proxy.fail("PATCH", path, 503, times=2)
    exp, _ = _instrumented_job(kube_api, namespace, "retry", 10, exporter_factory)
    scraper = _scraper_through(proxied, namespace, scraper_factory)
    wait_for(lambda: progress_of(kube_api, namespace, "retry") == 10, 20, "progress 10")
    assert _answered(proxy, path) == [503, 503, 200]
    patches = proxy.requests("PATCH", path)
    assert [p.injected for p in patches] == [True, True, False]
    # Exponential backoff with jitter: 0.2 s then 0.4 s (+ up to 0.2 s each).
    gaps = _gaps(patches)
    assert 0.2 <= gaps[0] < 1.0 and 0.4 <= gaps[1] < 1.5, gaps

    proxy.fail("PATCH", path, 429, times=2)
    exp.body = status_json(20)
    wait_for(lambda: progress_of(kube_api, namespace, "retry") == 20, 20, "progress 20")
    time.sleep(2.5)  # a few more scrapes of the same report: no more writes
    patches = proxy.requests("PATCH", path)
    assert _statuses(patches) == [503, 503, 200, 429, 429, 200]
    # The proxy's 429s carry Retry-After: 1, as the API server's do: honoured over the
    # shorter backoff.
    assert all(1.0 <= gap < 2.0 for gap in _gaps(patches[3:])), _gaps(patches[3:])
    assert scraper.settled_value("trainjob_scraper_status_writes_total", 2,
                                 result="written") == 2
    assert scraper.value("trainjob_scraper_status_writes_total", result="failed") == 0
    assert proxy.pending_faults() == 0


def test_conflict_retried_and_final_status_lands_after_transient_5xx(
    kube_api: client.ApiClient, namespace: str, proxied: tuple[FaultProxy, Path],
    exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    proxy = proxied[0]
    path = _status_path(namespace, "final")
    proxy.fail("PATCH", path, 409, times=1)
    _, pod = _instrumented_job(kube_api, namespace, "final", 40, exporter_factory)
    scraper = _scraper_through(proxied, namespace, scraper_factory)
    wait_for(lambda: progress_of(kube_api, namespace, "final") == 40, 20, "progress 40")
    assert _answered(proxy, path) == [409, 200]

    # The pod ends; its termination message holds the final report.  The API
    # server answers the write 500, then 504, then accepts it.
    proxy.fail("PATCH", path, 500, times=1)
    proxy.fail("PATCH", path, 504, times=1)
    objects.terminate_pod(kube_api, namespace, pod.metadata.name, FINAL)
    wait_for(lambda: progress_of(kube_api, namespace, "final") == 100, 20, "final status")
    time.sleep(2)  # no scrape, no second final write
    assert _answered(proxy, path) == [409, 200, 500, 504, 200]
    assert scraper.value("trainjob_scraper_status_writes_total", result="written") == 2
    assert scraper.value("trainjob_scraper_status_writes_total", result="failed") == 0
    assert "final status of TrainJob" in scraper.log()


def test_sigterm_during_a_write_waits_for_it_then_releases_the_lease(
    kube_api: client.ApiClient, namespace: str, proxied: tuple[FaultProxy, Path],
    exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    proxy = proxied[0]
    path = _status_path(namespace, "slow")
    lease_path = f"^/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/"
    _instrumented_job(kube_api, namespace, "slow", 30, exporter_factory)
    proxy.delay("PATCH", path, 2.0)  # the API server is slow to answer this write
    scraper = _scraper_through(
        proxied, namespace, scraper_factory, f"--lease-namespace={namespace}",
        "--leader-election", "--lease-duration=4s", "--renew-deadline=3s",
        "--retry-period=0.5s", "--shutdown-timeout=10s")
    write = wait_for(lambda: proxy.requests("PATCH", path), 20, "the write in flight")[0]
    assert write.status is None  # still held by the proxy
    scraper.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    assert scraper.proc.wait(15) == 0
    assert time.monotonic() - signalled < 10  # within --shutdown-timeout
    # The write finished (once), and only then was the Lease released.
    patches = proxy.requests("PATCH", path)
    assert _statuses(patches) == [200]
    assert write.finished is not None
    assert progress_of(kube_api, namespace, "slow") == 30
    # The leader keeps renewing while it waits; the release is the PUT without a holder.
    releases = [r for r in proxy.requests("PUT", lease_path)
                if json.loads(r.body)["spec"].get("holderIdentity") in (None, "")]
    assert len(releases) == 1 and releases[0].started >= write.finished
    log = scraper.log()
    assert "did not finish" not in log
    assert log.index("stopping: no new scrapes") < log.index("released Lease") < log.index(
        "stopped")


def _pods_path(namespace: str) -> str:
    return f"^/api/v1/namespaces/{namespace}/pods$"


def _watch_lists(proxy: FaultProxy, pods: str) -> list[Seen]:
    """The pod watch's lists (not the one ``limit=1`` selector probe made at start)."""
    return [r for r in proxy.requests("GET", pods, watch=False) if r.query.get("limit") != "1"]


def test_expired_watch_relists_at_once(
    kube_api: client.ApiClient, namespace: str, proxied: tuple[FaultProxy, Path],
    exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    proxy = proxied[0]
    pods = _pods_path(namespace)
    _instrumented_job(kube_api, namespace, "before", 5, exporter_factory)
    scraper = _scraper_through(proxied, namespace, scraper_factory)
    wait_for(lambda: progress_of(kube_api, namespace, "before") == 5, 20, "progress 5")
    probes = [r for r in proxy.requests("GET", pods, watch=False) if r.query.get("limit") == "1"]
    assert len(probes) == 1  # the selector probe at start, before the first list
    assert len(_watch_lists(proxy, pods)) == 1  # one list so far
    assert probes[0].started < _watch_lists(proxy, pods)[0].started

    # The next watch starts from a resourceVersion the API server has compacted away;
    # the current one ends as a server-side timeout ends it.
    proxy.expire_next_watch(pods)
    assert proxy.end_watches(abort=False, path=pods) == 1
    expired = wait_for(lambda: [w for w in proxy.requests("GET", pods, watch=True)
                                if w.injected and w.finished], 10, "the expired watch")[0]
    # What the real API server answers: 200 and one ERROR event with a 410 Status.
    assert expired.status == 200
    assert [e.get("code") for e in expired.watch_errors] == [410]
    relist = wait_for(lambda: _watch_lists(proxy, pods)[1:], 10, "relist")[0]
    assert relist.started - expired.finished < 0.45  # no backoff (at least 0.5 s)
    wait_for(lambda: scraper.value("trainjob_scraper_watch_restarts_total", reason="gone")
             == 1, 10, "restart counted as gone")
    assert scraper.value("trainjob_scraper_watch_restarts_total", reason="error") == 0

    # Watching again: a pod created now is discovered and written.
    _instrumented_job(kube_api, namespace, "after", 6, exporter_factory)
    wait_for(lambda: progress_of(kube_api, namespace, "after") == 6, 20, "progress 6")
    assert len(_watch_lists(proxy, pods)) == 2


def test_broken_watch_backs_off_and_discovers_a_pod_created_meanwhile(
    kube_api: client.ApiClient, namespace: str, proxied: tuple[FaultProxy, Path],
    exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    proxy = proxied[0]
    pods = _pods_path(namespace)
    scraper = _scraper_through(proxied, namespace, scraper_factory)
    wait_for(lambda: proxy.requests("GET", pods, watch=True), 10, "the watch")
    # The connection breaks, and the API server fails the next three lists.
    proxy.fail("GET", pods, 503, times=3, watch=False)
    broken = time.monotonic()
    assert proxy.end_watches(abort=True, path=pods) == 1
    _instrumented_job(kube_api, namespace, "meanwhile", 55, exporter_factory)
    wait_for(lambda: progress_of(kube_api, namespace, "meanwhile") == 55, 30, "progress 55")

    lists = [r for r in proxy.requests("GET", pods, watch=False) if r.started > broken]
    assert _statuses(lists) == [503, 503, 503, 200]
    # The broken connection made the API server look unreachable: the readiness probe
    # found it answering, so the first relist came at once (issue 21, input 6), not
    # after a backoff.  The 503s are answers, not an outage: exponential backoff with
    # jitter, started over after the recovery: 0.5, 1, 2 s (each up to +50 %).
    delays = [lists[0].started - broken, *_gaps(lists)]
    assert delays[0] <= 1.0, delays
    assert [r for r in proxy.requests("GET", "^/readyz$") if r.started > broken]
    for delay, base in zip(delays[1:], (0.5, 1.0, 2.0), strict=True):
        assert base * 0.9 <= delay <= base * 1.5 + 0.5, delays
    assert scraper.value("trainjob_scraper_watch_restarts_total", reason="error") == 4
    assert scraper.value("trainjob_scraper_watch_restarts_total", reason="gone") == 0
    # Watching again after the relist.
    assert [w for w in proxy.requests("GET", pods, watch=True) if w.started > lists[-1].started]
    assert scraper.proc.poll() is None
