"""Waiting scrapes (contract version 2): ``Prefer: wait=N`` with ``If-None-Match`` (issue 14).

Version 3 (the scraper's write policy) is tested in test_exporter_hold_policy.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import exporter_lib
from exporter_lib import server, waiting

Fetch = Callable[..., Any]
JSON = {"Accept": "application/json"}


def test_every_answer_advertises_the_contract(metrics_url: str, fetch: Fetch) -> None:
    for url in (metrics_url, metrics_url.replace("/metrics", "/healthz"),
                metrics_url.replace("/metrics", "/nothing")):
        assert fetch(url).headers["Trainjob-Exporter-Contract"] == (
            f"{server.CONTRACT_VERSION};max-wait={server.MAX_WAIT_SECONDS}")


def test_held_until_the_status_changes(metrics_url: str, fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=1)
    tag = fetch(metrics_url, headers=JSON).headers["ETag"]
    timer = threading.Timer(0.6, lambda: exporter_lib.update(progress_percentage=2))
    timer.start()
    start = time.monotonic()
    resp = fetch(metrics_url, headers={**JSON, "If-None-Match": tag, "Prefer": "wait=5"})
    waited = time.monotonic() - start
    timer.join()
    assert resp.status == 200 and b'"progressPercentage":2' in resp.body
    assert resp.headers["Preference-Applied"] == "wait=5"
    assert 0.5 < waited < 4


def test_a_new_percentage_wakes_a_held_scrape_a_metric_waits_for_the_poll(
        metrics_url: str, fetch: Fetch, monkeypatch: pytest.MonkeyPatch) -> None:
    """update() with a new integer percentage answers the held scrape at once; a report
    of metrics alone is seen by the poll, set here beyond the wait, so only the wait's
    end answers it."""
    monkeypatch.setattr(waiting, "WAIT_POLL_SECONDS", 60.0)
    exporter_lib.update(progress_percentage=1)
    tag = fetch(metrics_url, headers=JSON).headers["ETag"]
    held = {**JSON, "If-None-Match": tag, "Prefer": "wait=3"}
    timer = threading.Timer(0.3, lambda: exporter_lib.update(metrics={"loss": 0.5}))
    timer.start()
    start = time.monotonic()
    resp = fetch(metrics_url, headers=held)
    timer.join()
    assert resp.status == 200 and b'"loss"' in resp.body
    assert time.monotonic() - start >= 2.9, "a metrics-only report woke the held scrape"
    tag = resp.headers["ETag"]
    timer = threading.Timer(0.3, lambda: exporter_lib.update(progress_percentage=1.7))
    timer.start()  # the same integer percentage (1.7 -> 1): not a change that wakes
    start = time.monotonic()
    resp = fetch(metrics_url, headers={**held, "If-None-Match": tag})
    timer.join()
    assert time.monotonic() - start >= 2.9, "an unchanged percentage woke the held scrape"
    tag = resp.headers["ETag"]
    timer = threading.Timer(0.3, lambda: exporter_lib.update(progress_percentage=2))
    timer.start()
    start = time.monotonic()
    resp = fetch(metrics_url, headers={**JSON, "If-None-Match": tag, "Prefer": "wait=30"})
    timer.join()
    assert resp.status == 200 and b'"progressPercentage":2' in resp.body
    assert time.monotonic() - start < 10, "a new percentage waited for the poll"


def test_held_until_the_wait_ends_then_304(metrics_url: str, fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=1)
    tag = fetch(metrics_url, headers=JSON).headers["ETag"]
    start = time.monotonic()
    resp = fetch(metrics_url, headers={**JSON, "If-None-Match": tag, "Prefer": "wait=1"})
    assert resp.status == 304 and resp.headers["Preference-Applied"] == "wait=1"
    assert time.monotonic() - start >= 0.9


def test_first_report_releases_a_held_204(metrics_url: str, fetch: Fetch) -> None:
    timer = threading.Timer(0.4, lambda: exporter_lib.update(progress_percentage=3))
    timer.start()
    resp = fetch(metrics_url, headers={**JSON, "Prefer": "wait=5"})
    timer.join()
    assert resp.status == 200 and b'"progressPercentage":3' in resp.body


def test_changed_status_and_no_hint_answer_at_once(metrics_url: str, fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=1)
    start = time.monotonic()
    resp = fetch(metrics_url, headers={**JSON, "If-None-Match": '"old"', "Prefer": "wait=5"})
    assert resp.status == 200 and "Preference-Applied" not in resp.headers
    tag = resp.headers["ETag"]
    assert fetch(metrics_url, headers={**JSON, "If-None-Match": tag}).status == 304
    assert time.monotonic() - start < 2


def test_held_requests_are_capped(metrics_url: str, fetch: Fetch,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "MAX_HELD", 2)
    exporter_lib.update(progress_percentage=1)
    tag = fetch(metrics_url, headers=JSON).headers["ETag"]
    headers = {**JSON, "If-None-Match": tag, "Prefer": "wait=3"}
    results: list[Any] = []
    held = [threading.Thread(target=lambda: results.append(fetch(metrics_url, headers=headers)))
            for _ in range(2)]
    for thread in held:
        thread.start()
    time.sleep(0.5)
    start = time.monotonic()
    over = fetch(metrics_url, headers=headers)
    assert over.status == 304 and "Preference-Applied" not in over.headers
    assert time.monotonic() - start < 1.5
    for thread in held:
        thread.join(timeout=10)
    assert [r.headers.get("Preference-Applied") for r in results] == ["wait=3", "wait=3"]


@pytest.mark.parametrize(("prefer", "expected"), [
    ("wait=10", 10), ("respond-async, wait=7", 7), ('wait="3"', 3), ("WAIT = 4", 4),
    ("wait=10;x=1", 10), ("wait=abc", None), ("wait=-1", None), ("", None), (None, None),
    ("handling=lenient", None)])
def test_prefer_parsing(prefer: str | None, expected: int | None) -> None:
    assert server.requested_wait(prefer) == expected


def test_the_wake_never_fails_a_report(caplog: pytest.LogCaptureFixture) -> None:
    """A listener that raises is logged once; update() and replace() still take the
    report, and only a change of the integer percentage calls it."""
    from exporter_lib.state import State

    state = State()
    calls: list[int] = []

    def broken() -> None:
        calls.append(1)
        raise RuntimeError("loop closed")

    state.on_progress = broken
    state.update(progress_percentage=5)
    state.update(progress_percentage=5.9, metrics={"loss": 1.0})  # still 5: no call
    state.update(progress_percentage=6)
    status = state.status()
    assert status is not None and status.progress_percentage == 6
    assert len(calls) == 2
    assert sum("waking the waiting scrapes failed" in r.message for r in caplog.records) == 1
    state.replace(status.model_copy(update={"progress_percentage": 7}))
    assert len(calls) == 3 and state.status().progress_percentage == 7  # type: ignore[union-attr]


def test_a_report_between_the_render_and_the_hold_is_not_missed(
        metrics_url: str, fetch: Fetch, monkeypatch: pytest.MonkeyPatch) -> None:
    """A report that lands after the server rendered the answer and before the scrape
    is held answers it at once, not at the hold's end (nothing woke it: the scrape was
    not waiting yet, and the watcher starts after the report)."""
    exporter_lib.update(progress_percentage=1)
    tag = fetch(metrics_url, headers=JSON).headers["ETag"]
    first = waiting.WaitingScrapes.due
    calls: list[int] = []

    def due_then_report(self: waiting.WaitingScrapes, *args: Any) -> bool:
        answer = first(self, *args)
        if not calls:  # the server's look before it holds the scrape
            calls.append(1)
            report = threading.Thread(target=exporter_lib.update,
                                      kwargs={"progress_percentage": 60})
            report.start()
            report.join()
        return answer

    monkeypatch.setattr(waiting.WaitingScrapes, "due", due_then_report)
    start = time.monotonic()
    resp = fetch(metrics_url, headers={**JSON, "If-None-Match": tag, "Prefer": "wait=8"})
    assert resp.status == 200 and b'"progressPercentage":60' in resp.body
    assert time.monotonic() - start < 4, "the report was seen only at the hold's end"
