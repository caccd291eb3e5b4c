"""The rule for other writers, time and stale writes against the real kube-apiserver
(docs/scraper.md, "Other writers and time"; issue 21, failing inputs 3, 4 and 5).

The other writer is a real client doing server-side apply as field manager
``trainer-status``, as upstream's push status server does.  Exporters are loopback
HTTP servers answering as exporters do (ETag JSON, plain JSON, Prometheus text); the
scraper runs as a real process (inputs 4 and 5) or as the real status writer in the
test's loop (input 3).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from exporter_lib.status import (
    API_GROUP,
    API_VERSION,
    TRAINJOB_PLURAL,
    TrainerStatus,
    format_time,
)
from localdev.cluster import objects
from scraper.shared.outcome import WriteOutcome
from scraper.shared.trainjobs import TrainJobRecord
from scraper.write.notices import REASON_CLOCK_SKEW
from tests.helpers.fault_proxy import FaultProxy
from tests.helpers.scraper import (
    FakeExporter,
    ScraperProcess,
    events,
    leaders,
    progress_of,
    status_json,
    trainer_status,
    wait_for,
)
from tests.helpers.stack import recording
from tests.helpers.writer import running_writer

pytestmark = [pytest.mark.usefixtures("trainjob_crd"), pytest.mark.timeout(120)]

PUSH_MANAGER = "trainer-status"


def _apply(kube_api: client.ApiClient, namespace: str, name: str, body: dict[str, Any], *,
           manager: str, subresource: str = "/status") -> dict[str, Any]:
    """One server-side apply of ``body`` (apiVersion, kind, name added), force=true."""
    full = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "TrainJob", **body}
    full["metadata"] = {"name": name, "namespace": namespace, **body.get("metadata", {})}
    result: dict[str, Any] = kube_api.call_api(
        f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{{namespace}}/{TRAINJOB_PLURAL}"
        "/{name}" + subresource, "PATCH",
        path_params={"namespace": namespace, "name": name},
        query_params=[("fieldManager", manager), ("force", "true")],
        header_params={"Content-Type": "application/apply-patch+yaml",
                       "Accept": "application/json"},
        body=full, response_type="object", auth_settings=["BearerToken"],
        _return_http_data_only=True)
    return result


def _push(kube_api: client.ApiClient, namespace: str, name: str,
          status: dict[str, Any]) -> dict[str, Any]:
    """The other writer: upstream's push status server's field manager, by SSA."""
    return objects.apply_trainjob_status(kube_api, namespace, name,
                                         {"trainerStatus": status}, field_manager=PUSH_MANAGER)


class _Skews:
    """Counts only the clock skews of the writer (scraper.shared.outcome.WriteCounts)."""

    def __init__(self, skews: list[str]) -> None:
        self.skews = skews

    def written(self, outcome: WriteOutcome) -> None:
        pass

    def request_took(self, seconds: float) -> None:
        pass

    def deferred(self, reason: str) -> None:
        pass

    def skewed(self, direction: str) -> None:
        self.skews.append(direction)


def _get(kube_api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, name)
    return obj


# ---------------------------------------------------------------- the precondition


@pytest.mark.parametrize("place", ["status", "annotation"])
def test_apply_carrying_a_stale_resource_version_is_refused_409(
        kube_api: client.ApiClient, namespace: str, place: str) -> None:
    """Rule 6 rests on this fact of kube-apiserver: a server-side apply whose body
    carries ``metadata.resourceVersion`` is a precondition, on the status subresource
    and on the main resource: 409 Conflict when the object changed since, and nothing
    is written."""
    objects.create_trainjob(kube_api, namespace, "rv")

    def body(progress: int, rv: str) -> tuple[dict[str, Any], str]:
        status = {"progressPercentage": progress, "lastUpdatedTime": "2026-01-01T00:00:00Z"}
        if place == "status":
            return {"metadata": {"resourceVersion": rv},
                    "status": {"trainerStatus": status}}, "/status"
        return {"metadata": {"resourceVersion": rv, "annotations": {
            "trainjob-progress.dev/trainer-status": json.dumps(status)}}}, ""

    first = _get(kube_api, namespace, "rv")["metadata"]["resourceVersion"]
    payload, sub = body(10, first)
    after = _apply(kube_api, namespace, "rv", payload, manager="trainjob-scraper",
                   subresource=sub)["metadata"]["resourceVersion"]
    assert int(after) > int(first)
    # The same precondition again: the object changed since (it is our own write).
    payload, sub = body(60, first)
    with pytest.raises(client.ApiException) as refused:
        _apply(kube_api, namespace, "rv", payload, manager="trainjob-scraper",
               subresource=sub)
    assert refused.value.status == 409, refused.value
    reason = json.loads(refused.value.body)
    assert reason["reason"] == "Conflict" and "modified" in reason["message"], reason
    # A resourceVersion the object never had (ahead of it) is no wildcard either.
    payload, sub = body(61, str(int(after) + 1000))
    with pytest.raises(client.ApiException) as ahead:
        _apply(kube_api, namespace, "rv", payload, manager="trainjob-scraper",
               subresource=sub)
    assert ahead.value.status == 409, ahead.value
    now = _get(kube_api, namespace, "rv")
    assert now["metadata"]["resourceVersion"] == after  # nothing was written
    # The current one is accepted.
    payload, sub = body(70, after)
    _apply(kube_api, namespace, "rv", payload, manager="trainjob-scraper", subresource=sub)


# ---------------------------------------------------------------- input 3: time


async def test_time_never_moves_back_silently(kube_api: client.ApiClient,
                                              namespace: str) -> None:
    """Issue 21, input 3: a report one hour older than the stored status, with changed
    values, is written with the scraper's arrival time, logged, counted and evented;
    then a foreign status from 10 minutes in the future is replaced (once its writer is
    quiet, by news) by an exporter status from an hour in the past: the arrival time
    again, the stored time named as in the future."""
    objects.create_trainjob(kube_api, namespace, "clock")
    skews: list[str] = []
    held_at = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    async with running_writer(kube_api, namespace, other_writer_grace=2.0,
                              counts=_Skews(skews)) as (writer, _):
        first = TrainerStatus(progress_percentage=10, last_updated_time=held_at)
        assert await writer.apply_and_wait(namespace, "clock", first) is WriteOutcome.WRITTEN
        back = TrainerStatus(progress_percentage=20,
                             last_updated_time=held_at - timedelta(hours=1))
        before = datetime.now(UTC).replace(microsecond=0)
        assert await writer.apply_and_wait(namespace, "clock", back) is WriteOutcome.WRITTEN
        stored = TrainerStatus.from_api(trainer_status(kube_api, namespace, "clock") or {})
        assert stored.progress_percentage == 20  # the values are kept
        assert before <= stored.last_updated_time <= datetime.now(UTC), stored
        assert skews == ["back"]
        await _until(lambda: [e for e in events(kube_api, namespace, "clock")
                              if e.reason == REASON_CLOCK_SKEW], 10, "the ClockSkew Event")

        future = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=10)
        _push(kube_api, namespace, "clock", {"progressPercentage": 30,
                                              "lastUpdatedTime": format_time(future)})
        await _until(lambda: _manager(writer.store.get(namespace, "clock")) == PUSH_MANAGER,
                     10, "the foreign write in the informer")
        old = TrainerStatus(progress_percentage=40,
                            last_updated_time=datetime.now(UTC) - timedelta(hours=1))
        # While the other writer is live (2 s here): deferred.
        assert await writer.apply(namespace, "clock", old) is WriteOutcome.DEFERRED
        await asyncio.sleep(2.2)
        newer = old.model_copy(update={"progress_percentage": 41})  # news: changed now
        arrival = datetime.now(UTC).replace(microsecond=0)
        assert await writer.apply_and_wait(namespace, "clock", newer) is WriteOutcome.WRITTEN
        stored = TrainerStatus.from_api(trainer_status(kube_api, namespace, "clock") or {})
        assert stored.progress_percentage == 41
        assert arrival <= stored.last_updated_time < future, stored
        assert skews == ["back", "back"]
    messages = [e.message for e in events(kube_api, namespace, "clock")
                if e.reason == REASON_CLOCK_SKEW]
    assert any("older than the stored" in m for m in messages), messages
    assert any("in the future" in m for m in messages), messages


def _manager(stored: TrainJobRecord | None) -> str:
    return stored.status_by.manager if stored is not None and stored.status_by else ""


async def _until(predicate: Callable[[], Any], seconds: float, what: str) -> None:
    """Poll in a thread: the writer under test runs on this event loop."""
    await asyncio.to_thread(wait_for, predicate, seconds, what)


# ---------------------------------------------------------------- input 4: other writer


@pytest.fixture
def three_exporters(kube_api: client.ApiClient, namespace: str,
                    exporter_factory: Callable[..., FakeExporter],
                    ) -> dict[str, FakeExporter]:
    """Three TrainJobs whose exporters answer ETag JSON, plain JSON (no ETag) and
    Prometheus text (no ETag), each at 50 %."""
    out = {
        "etag": exporter_factory(body=status_json(50)),
        "plain": exporter_factory(mode="garbage", body=status_json(50)),
        "text": exporter_factory(mode="text", body=_text(0.5)),
    }
    for name, exp in out.items():
        objects.create_trainjob(kube_api, namespace, name)
        objects.create_trainer_pod(kube_api, namespace, name, port=exp.port)
    return out


def _text(ratio: float, at: int = 1_700_000_000) -> str:
    return (f"trainjob_progress_ratio {ratio}\n"
            f"trainjob_metric{{name=\"loss\"}} 0.5\n"
            f"trainjob_last_update_timestamp_seconds {at}\n")


def test_newer_status_of_another_writer_kept_whatever_the_wire_format(
        kube_api: client.ApiClient, namespace: str,
        three_exporters: dict[str, FakeExporter],
        scraper_factory: Callable[..., ScraperProcess]) -> None:
    """Issue 21, input 4: another writer sets a status on three TrainJobs whose exporters
    do not change; none is overwritten (while it is live, nor after, since the exporters
    report nothing new), whether the exporter sends ETags, plain JSON or text.  A change
    at one exporter is news: that TrainJob gets it."""
    scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}",
                              "--other-writer-grace=3s")
    for name in three_exporters:
        wait_for(lambda n=name: progress_of(kube_api, namespace, n) == 50, 20, f"{name} 50")
    pushed_at = datetime.now(UTC).replace(microsecond=0)
    for name in three_exporters:
        _push(kube_api, namespace, name, {"progressPercentage": 55, "lastUpdatedTime":
                                          format_time(pushed_at)})
    # Past the grace (3 s) by many intervals: an answer with the same content is no news.
    time.sleep(8)
    for name in three_exporters:
        assert progress_of(kube_api, namespace, name) == 55, name
    # The answers without ETag come as 200s with the same content: deferred (live), then
    # not news.  The ETag exporter answers 304: nothing new to decide.
    log = scraper.log()
    for name in ("plain", "text"):
        assert f"TrainJob {namespace}/{name}: deferring to another writer" in log, name
    assert scraper.value("trainjob_scraper_status_writes_total", result="written") == 3
    deferred = {r: scraper.value("trainjob_scraper_status_writes_deferred_total", reason=r)
                for r in ("other_writer", "not_news")}
    assert deferred["other_writer"] > 0 and deferred["not_news"] > 0, deferred
    # News at one exporter (text, no ETag): written, the others still kept.
    three_exporters["text"].body = _text(0.7)
    wait_for(lambda: progress_of(kube_api, namespace, "text") == 70, 10, "text 70")
    assert progress_of(kube_api, namespace, "etag") == 55
    assert progress_of(kube_api, namespace, "plain") == 55
    assert f"TrainJob {namespace}/text: no longer deferring" in scraper.log()


def test_live_other_writer_keeps_the_field_and_a_final_is_still_delivered(
        kube_api: client.ApiClient, namespace: str,
        exporter_factory: Callable[..., FakeExporter],
        scraper_factory: Callable[..., ScraperProcess]) -> None:
    """Rules 2 and 4: while the other writer keeps writing, the exporter's changes are not
    written (push and pull never alternate); the pod's final status is, at once."""
    exp = exporter_factory(body=status_json(10))
    objects.create_trainjob(kube_api, namespace, "live")
    pod = objects.create_trainer_pod(kube_api, namespace, "live", port=exp.port)
    scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}",
                              "--other-writer-grace=5s")
    wait_for(lambda: progress_of(kube_api, namespace, "live") == 10, 20, "progress 10")
    with recording(kube_api, namespace, "live") as rec:
        for i in range(6):  # the other writer every second, the exporter changing too
            _push(kube_api, namespace, "live", {"progressPercentage": 20 + i,
                                                 "lastUpdatedTime": format_time(
                                                     datetime.now(UTC))})
            exp.body = status_json(60 + i)
            time.sleep(1.0)
        assert [s.progress_percentage for s in rec.statuses()] == [10, 20, 21, 22, 23, 24,
                                                                  25], rec.statuses()
        objects.terminate_pod(kube_api, namespace, pod.metadata.name,
                              '{"progressPercentage":100,"lastUpdatedTime":'
                              f'"{format_time(datetime.now(UTC))}"}}')
        rec.wait_for(lambda o: o.status is not None and o.status.progress_percentage == 100,
                     10, "the final status")
    assert scraper.value("trainjob_scraper_status_writes_deferred_total",
                         reason="other_writer") > 0


# ---------------------------------------------------------------- input 5: late write


def test_dead_leaders_late_write_never_lands_after_the_final(
        kube_api: client.ApiClient, namespace: str, proxied: tuple[FaultProxy, Path],
        exporter_factory: Callable[..., FakeExporter],
        scraper_factory: Callable[..., ScraperProcess]) -> None:
    """Issue 21, input 5: the leader's progress write (60) is held on the wire, the
    leader is SIGKILLed, the pod ends with final 100 and the standby writes it.  The held
    request reaches the API server afterwards and is refused (409: its resourceVersion
    is stale); watchers never see the final replaced."""
    proxy, kubeconfig = proxied
    path = (f"^/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/"
            "late/status$")
    exp = exporter_factory(body=status_json(50))
    objects.create_trainjob(kube_api, namespace, "late")
    pod = objects.create_trainer_pod(kube_api, namespace, "late", port=exp.port)
    args = ["--interval=1s", f"--namespaces={namespace}", f"--lease-namespace={namespace}",
            "--leader-election", "--lease-duration=4s", "--renew-deadline=3s",
            "--retry-period=0.5s"]
    a = scraper_factory(*args, "--identity=replica-a", kubeconfig=kubeconfig)
    b = scraper_factory(*args, "--identity=replica-b", kubeconfig=kubeconfig)
    leader = wait_for(lambda: leaders([a, b]), 15, "a leader")[0]
    standby = b if leader is a else a
    wait_for(lambda: progress_of(kube_api, namespace, "late") == 50, 20, "progress 50")
    with recording(kube_api, namespace, "late") as rec:
        hold = 15.0
        proxy.delay("PATCH", path, hold)
        exp.body = status_json(60)
        held = wait_for(lambda: [s for s in proxy.requests("PATCH", path) if s.injected],
                        10, "the leader's write of 60, held")[0]
        assert b'"progressPercentage":60' in held.body
        leader.kill()
        objects.terminate_pod(kube_api, namespace, pod.metadata.name,
                              '{"progressPercentage":100,"lastUpdatedTime":'
                              '"2026-01-01T00:00:00Z"}')
        wait_for(lambda: leaders([standby]), 10, "the standby's takeover")
        final = rec.wait_for(lambda o: o.status is not None
                             and o.status.progress_percentage == 100, 10, "the final")
        assert time.monotonic() < held.started + hold, "the final came after the hold"
        wait_for(lambda: held.status is not None, hold + 5, "the held request's answer")
        assert held.status == 409, (held.status, held.answer[:300])
        time.sleep(1.5)  # any later version would show now
        after = [o.status.progress_percentage for o in rec.seen
                 if o.status is not None and int(o.resource_version) > int(
                     final.resource_version)]
        assert after == [], after
        assert [s.progress_percentage for s in rec.statuses()] == [50, 100]
    assert progress_of(kube_api, namespace, "late") == 100
    assert standby.value("trainjob_scraper_status_writes_total", result="written") == 1


async def test_a_write_first_seen_in_a_list_is_aged_by_its_managed_fields_time(
        kube_api: client.ApiClient, namespace: str) -> None:
    """Rule 2 for a change first seen in a list (a scraper that starts after the other
    writer wrote): its age is its managedFields time against the scraper's clock.  A
    final with an old lastUpdatedTime (rule 5 at the termination-message entry) gets
    the arrival time."""
    objects.create_trainjob(kube_api, namespace, "listed")
    objects.create_trainjob(kube_api, namespace, "fresh")
    _push(kube_api, namespace, "listed", {"progressPercentage": 30,
                                          "lastUpdatedTime": format_time(datetime.now(UTC))})
    await asyncio.sleep(3.2)  # older than the grace below when the writer lists it
    _push(kube_api, namespace, "fresh", {"progressPercentage": 30,
                                         "lastUpdatedTime": format_time(datetime.now(UTC))})
    skews: list[str] = []
    async with running_writer(kube_api, namespace, other_writer_grace=2.5,
                              counts=_Skews(skews)) as (writer, _):
        record = writer.store.get(namespace, "listed")
        assert record is not None and record.status_by is not None
        assert record.status_by.manager == PUSH_MANAGER
        assert writer.store.clock() - record.status_by.seen >= 3.0  # aged, not "seen now"
        report = TrainerStatus(progress_percentage=40, last_updated_time=datetime.now(UTC))
        # "fresh" is live; "listed" is quiet, and a report of unknown age is no news.
        assert await writer.apply(namespace, "fresh", report) is WriteOutcome.DEFERRED
        assert await writer.apply(namespace, "listed", report,
                                  seen=float("-inf")) is WriteOutcome.DEFERRED
        assert await writer.apply_and_wait(namespace, "listed", report) is WriteOutcome.WRITTEN
        assert progress_of(kube_api, namespace, "listed") == 40
        # A final is never deferred by a live writer, and its old time is not written.
        final = TrainerStatus(progress_percentage=100,
                              last_updated_time=datetime(2020, 1, 1, tzinfo=UTC))
        arrival = datetime.now(UTC).replace(microsecond=0)
        assert await writer.apply_and_wait(namespace, "fresh", final,
                                           final=True) is WriteOutcome.WRITTEN
        written = TrainerStatus.from_api(trainer_status(kube_api, namespace, "fresh") or {})
        assert written.progress_percentage == 100 and written.last_updated_time >= arrival
        assert skews == ["back"]
