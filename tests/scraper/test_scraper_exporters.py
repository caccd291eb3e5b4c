"""Misbehaving exporters: bounded, recorded as Events, nothing wrong written."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kubernetes import client

from localdev.cluster import objects
from tests.helpers.scraper import (
    FakeExporter,
    ScraperProcess,
    events,
    progress_of,
    status_json,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("trainjob_crd")


def _event_messages(kube_api: client.ApiClient, namespace: str, name: str,
                    reason: str) -> list[str]:
    return [e.message for e in events(kube_api, namespace, name) if e.reason == reason]


def test_garbage_oversized_slow_redirect(
    kube_api: client.ApiClient, namespace: str, exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    # One TrainJob per failure: Events are deduplicated per target and reason for 10
    # minutes (issue 13 input 7), so one target shows only its first failure's text.
    kinds = ["limits", "notjson", "huge", "slow", "redirect"]
    exps = {k: exporter_factory(body=status_json(30)) for k in kinds}
    for k in kinds:
        objects.create_trainjob(kube_api, namespace, f"job-{k}")
        objects.create_trainer_pod(kube_api, namespace, f"job-{k}", port=exps[k].port)
    scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}",
                              "--scrape-timeout=0.5s", "--max-body-bytes=65536")
    for k in kinds:
        wait_for(lambda k=k: progress_of(kube_api, namespace, f"job-{k}") == 30, 20,
                 f"progress 30 of job-{k}")

    # Values breaking the Trainer API limits: an Event naming field and value.
    exps["limits"].mode, exps["limits"].body = "garbage", {
        "progressPercentage": 150, "lastUpdatedTime": "2024-01-01T00:00:00Z"}
    msgs = wait_for(lambda: _event_messages(kube_api, namespace, "job-limits",
                                            "InvalidTrainerStatus"), 20, "invalid event")
    assert "progressPercentage=150" in msgs[0] and "previous status is kept" in msgs[0]
    exps["notjson"].mode, exps["notjson"].body = "garbage", b"<html>not json"
    wait_for(lambda: any("not valid JSON" in m for m in _event_messages(
        kube_api, namespace, "job-notjson", "InvalidTrainerStatus")), 20, "not-JSON event")
    assert progress_of(kube_api, namespace, "job-limits") == 30
    assert progress_of(kube_api, namespace, "job-notjson") == 30

    # Oversized: refused at the cap, not read whole.
    exps["huge"].mode = "huge"
    msgs = wait_for(lambda: _event_messages(kube_api, namespace, "job-huge",
                                            "TrainerStatusScrapeFailed"), 20, "size event")
    assert any("65536-byte cap" in m for m in msgs)

    # Slow: bounded by the scrape timeout.
    exps["slow"].mode, exps["slow"].delay = "slow", 30
    wait_for(lambda: any("within 0.5s" in m for m in _event_messages(
        kube_api, namespace, "job-slow", "TrainerStatusScrapeFailed")), 20, "timeout event")
    assert scraper.value("trainjob_scraper_scrapes_total", result="timeout") >= 1

    # Redirect: never followed.
    exp = exps["redirect"]
    exp.mode = "redirect"
    wait_for(lambda: any("redirect" in m for m in _event_messages(
        kube_api, namespace, "job-redirect", "TrainerStatusScrapeFailed")), 20,
        "redirect event")
    assert exp.elsewhere_hits == 0
    for k in kinds:
        assert progress_of(kube_api, namespace, f"job-{k}") == 30
    assert scraper.settled_value("trainjob_scraper_status_writes_total", len(kinds),
                                 result="written") == len(kinds)
    labels = {"namespace": namespace, "trainjob": "job-redirect"}
    assert scraper.value("trainjob_progress_ratio", **labels) == pytest.approx(0.3)
    up = [s for s in scraper.series("trainjob_scraper_target_up")
          if s["trainjob"] == "job-redirect"]
    assert up and scraper.value("trainjob_scraper_target_up", **up[0]) == 0
    # Repeats of one failure are one Event with a count, not a flood.
    time.sleep(2)  # a few more failing scrapes
    repeated = [e for e in events(kube_api, namespace, "job-redirect") if "redirect" in e.message]
    assert len(repeated) == 1

    # Recovery: a valid report is written again.
    exp.mode, exp.body = "json", status_json(45)
    wait_for(lambda: progress_of(kube_api, namespace, "job-redirect") == 45, 20, "progress 45")


def test_prometheus_text_exporter(
    kube_api: client.ApiClient, namespace: str, exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    text = ("trainjob_progress_ratio 0.5\ntrainjob_estimated_remaining_seconds 90\n"
            "trainjob_last_update_timestamp_seconds 1700000000\n"
            'trainjob_metric{name="loss"} 1.25\n')
    exp = exporter_factory(mode="text", body=text)
    objects.create_trainjob(kube_api, namespace, "job-p")
    objects.create_trainer_pod(kube_api, namespace, "job-p", port=exp.port)
    scraper_factory("--interval=1s", f"--namespaces={namespace}")
    wait_for(lambda: progress_of(kube_api, namespace, "job-p") == 50, 20, "text progress")


def test_refused_is_not_instrumented_and_backed_off(
    kube_api: client.ApiClient, namespace: str, exporter_factory: Callable[..., FakeExporter],
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    exp = exporter_factory(body=status_json(5))
    port = exp.port
    exp.stop()  # nothing listens there any more
    objects.create_trainjob(kube_api, namespace, "job-r")
    objects.create_trainer_pod(kube_api, namespace, "job-r", port=port)
    scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}", "--backoff-max=4s")
    time.sleep(10)
    refused = scraper.value("trainjob_scraper_scrapes_total", result="refused")
    # Without backoff ~10 attempts; with 1, 2, 4, 4... s at most 5.
    assert 1 <= refused <= 5
    assert events(kube_api, namespace, "job-r") == []
    assert scraper.log().count("not instrumented") == 1
