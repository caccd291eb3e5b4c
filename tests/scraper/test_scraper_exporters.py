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
    exp = exporter_factory(body=status_json(30))
    objects.create_trainjob(kube_api, namespace, "job-g")
    objects.create_trainer_pod(kube_api, namespace, "job-g", port=exp.port)
    scraper = scraper_factory("--interval=1s", f"--namespaces={namespace}",
                              "--scrape-timeout=0.5s", "--max-body-bytes=65536")
    wait_for(lambda: progress_of(kube_api, namespace, "job-g") == 30, 20, "progress 30")

    # Values breaking the Trainer API limits: an Event naming field and value.
    exp.mode, exp.body = "garbage", {"progressPercentage": 150, "lastUpdatedTime":
                                     "2024-01-01T00:00:00Z"}
    msgs = wait_for(lambda: _event_messages(kube_api, namespace, "job-g",
                                            "InvalidTrainerStatus"), 20, "invalid event")
    assert "progressPercentage=150" in msgs[0] and "previous status is kept" in msgs[0]
    exp.body = b"<html>not json"
    wait_for(lambda: any("not valid JSON" in m for m in _event_messages(
        kube_api, namespace, "job-g", "InvalidTrainerStatus")), 20, "not-JSON event")
    assert progress_of(kube_api, namespace, "job-g") == 30

    # Oversized: refused at the cap, not read whole.
    exp.mode = "huge"
    msgs = wait_for(lambda: _event_messages(kube_api, namespace, "job-g",
                                            "TrainerStatusScrapeFailed"), 20, "size event")
    assert any("65536-byte cap" in m for m in msgs)

    # Slow: bounded by the scrape timeout.
    exp.mode, exp.delay = "slow", 30
    wait_for(lambda: any("within 0.5s" in m for m in _event_messages(
        kube_api, namespace, "job-g", "TrainerStatusScrapeFailed")), 20, "timeout event")
    assert scraper.value("trainjob_scraper_scrapes_total", result="timeout") >= 1

    # Redirect: never followed.
    exp.mode = "redirect"
    wait_for(lambda: any("redirect" in m for m in _event_messages(
        kube_api, namespace, "job-g", "TrainerStatusScrapeFailed")), 20, "redirect event")
    assert exp.elsewhere_hits == 0
    assert progress_of(kube_api, namespace, "job-g") == 30
    assert scraper.value("trainjob_scraper_status_writes_total", result="written") == 1
    labels = {"namespace": namespace, "trainjob": "job-g"}
    assert scraper.value("trainjob_progress_ratio", **labels) == pytest.approx(0.3)
    up = [s for s in scraper.series("trainjob_scraper_target_up") if s["trainjob"] == "job-g"]
    assert up and scraper.value("trainjob_scraper_target_up", **up[0]) == 0
    # Repeats of one failure are one Event with a count, not a flood.
    repeated = [e for e in events(kube_api, namespace, "job-g") if "redirect" in e.message]
    assert len(repeated) == 1

    # Recovery: a valid report is written again.
    exp.mode, exp.body = "json", status_json(45)
    wait_for(lambda: progress_of(kube_api, namespace, "job-g") == 45, 20, "progress 45")


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
