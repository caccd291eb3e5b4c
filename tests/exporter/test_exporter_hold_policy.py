"""Contract 3: a held scrape that states the scraper's write policy is answered only for a
change that will be written (exporter_lib/hold_policy.py), over real HTTP to a real
exporter; and the header's grammar (hypothesis)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

import exporter_lib
from exporter_lib.hold_policy import (
    WRITE_POLICY_HEADER,
    HoldPolicy,
    format_policy,
    parse_policy,
)
from exporter_lib.status import TrainerStatus

Fetch = Callable[..., Any]
JSON = {"Accept": "application/json"}


def _tag(metrics_url: str, fetch: Fetch) -> str:
    tag: str = fetch(metrics_url, headers=JSON).headers["ETag"]
    return tag


def _held(metrics_url: str, fetch: Fetch, tag: str, policy: str | None,
          wait: int = 5) -> tuple[Any, float]:
    headers = {**JSON, "If-None-Match": tag, "Prefer": f"wait={wait}"}
    if policy is not None:
        headers[WRITE_POLICY_HEADER] = policy
    start = time.monotonic()
    resp = fetch(metrics_url, headers=headers)
    return resp, time.monotonic() - start


def _later(seconds: float, **update: Any) -> threading.Timer:
    timer = threading.Timer(seconds, lambda: exporter_lib.update(**update))
    timer.start()
    return timer


def test_metric_changes_are_held_and_a_new_percentage_answers(metrics_url: str,
                                                              fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=10, metrics={"loss": 1.0})
    tag = _tag(metrics_url, fetch)
    timers = [_later(0.2 + 0.1 * i, metrics={"loss": 1.0 - i / 100}) for i in range(5)]
    timers.append(_later(1.2, progress_percentage=11))
    resp, waited = _held(metrics_url, fetch, tag,
                         format_policy(10, metrics_staleness=30, metrics_age=0))
    for timer in timers:
        timer.join()
    assert resp.status == 200
    assert b'"progressPercentage":11' in resp.body
    assert b'"value":"0.96"' in resp.body  # the newest metrics ride along
    assert 1.1 < waited < 3, waited  # not at the first metric change (0.2 s)


def test_metrics_fall_due_after_the_staleness_less_their_age(metrics_url: str,
                                                             fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=10, metrics={"loss": 1.0})
    tag = _tag(metrics_url, fetch)
    timer = _later(0.2, metrics={"loss": 0.5})
    # Staleness 3 s, the scraper's status is 1.5 s old: due 1.5 s into the hold.
    resp, waited = _held(metrics_url, fetch, tag,
                         format_policy(10, metrics_staleness=3, metrics_age=1.5))
    timer.join()
    assert resp.status == 200 and b'"value":"0.5"' in resp.body
    assert 1.3 < waited < 2.5, waited


def test_due_metrics_answer_the_first_change(metrics_url: str, fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=10, metrics={"loss": 1.0})
    tag = _tag(metrics_url, fetch)
    timer = _later(0.5, metrics={"loss": 0.5})
    resp, waited = _held(metrics_url, fetch, tag,
                         format_policy(10, metrics_staleness=3, metrics_age=5))
    timer.join()
    assert resp.status == 200 and 0.4 < waited < 1.5, waited


def test_unchanged_past_the_due_time_is_still_held(metrics_url: str, fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=10)
    tag = _tag(metrics_url, fetch)
    resp, waited = _held(metrics_url, fetch, tag,
                         format_policy(10, metrics_staleness=0.5, metrics_age=0), wait=2)
    assert resp.status == 304 and waited >= 1.9
    assert resp.headers["Preference-Applied"] == "wait=2"


def test_insignificant_change_already_there_is_held_until_the_wait_ends(
        metrics_url: str, fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=10, metrics={"loss": 1.0})
    tag = _tag(metrics_url, fetch)
    exporter_lib.update(metrics={"loss": 0.9}, estimated_remaining_seconds=50)
    resp, waited = _held(metrics_url, fetch, tag,
                         format_policy(10, metrics_staleness=60, metrics_age=0), wait=1)
    # The wait ends first: the change comes with that answer (the scraper's writer then
    # holds it by the same policy).
    assert resp.status == 200 and waited >= 0.9
    assert resp.headers["Preference-Applied"] == "wait=1"


def test_a_different_percentage_answers_at_once(metrics_url: str, fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=10)
    tag = _tag(metrics_url, fetch)
    exporter_lib.update(progress_percentage=12)
    resp, waited = _held(metrics_url, fetch, tag, format_policy(10, 30, 0))
    assert resp.status == 200 and waited < 0.5
    assert "Preference-Applied" not in resp.headers


def test_without_the_policy_any_change_answers_as_in_contract_2(metrics_url: str,
                                                                fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=10, metrics={"loss": 1.0})
    tag = _tag(metrics_url, fetch)
    timer = _later(0.3, metrics={"loss": 0.5})
    for policy in (None, "progress=abc; metrics-staleness=30"):  # absent, malformed
        resp, waited = _held(metrics_url, fetch, tag, policy)
        assert resp.status == 200 and waited < 1.5, (policy, waited)
    timer.join()


def test_without_an_etag_the_status_comes_at_once(metrics_url: str, fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=10)
    start = time.monotonic()
    resp = fetch(metrics_url, headers={**JSON, "Prefer": "wait=5",
                                       WRITE_POLICY_HEADER: format_policy(10, 30, 0)})
    assert resp.status == 200 and time.monotonic() - start < 0.5


def test_stopping_answers_a_held_insignificant_change(metrics_url: str, fetch: Fetch) -> None:
    """The training ends: its last status is the final one, answered at once."""
    exporter_lib.update(progress_percentage=10, metrics={"loss": 1.0})
    tag = _tag(metrics_url, fetch)
    exporter_lib.update(metrics={"loss": 0.1})
    stopper = threading.Timer(0.5, exporter_lib.stop)
    stopper.start()
    resp, waited = _held(metrics_url, fetch, tag, format_policy(10, 300, 0), wait=10)
    stopper.join()
    assert resp.status == 200 and b'"value":"0.1"' in resp.body and waited < 3


# ---------------------------------------------------------------- the grammar

_progress = st.none() | st.integers(0, 100)
_seconds = st.floats(0, 10_000, allow_nan=False)


@given(_progress, _seconds, _seconds)
def test_format_then_parse_round_trips(progress: int | None, staleness: float,
                                       age: float) -> None:
    parsed = parse_policy(format_policy(progress, staleness, age))
    assert parsed is not None
    assert parsed.progress == progress
    assert abs(parsed.metrics_staleness - staleness) <= 0.0005
    assert abs(parsed.metrics_age - min(age, staleness)) <= 0.0005


@given(st.text(max_size=80))
def test_parse_never_raises(text: str) -> None:
    parsed = parse_policy(text)
    assert parsed is None or isinstance(parsed, HoldPolicy)


def _status(progress: int | None) -> TrainerStatus:
    return TrainerStatus.from_api({"progressPercentage": progress,
                                   "lastUpdatedTime": "2026-01-01T00:00:00Z"})


@given(_progress, _progress, st.floats(0, 100), st.floats(0, 100), st.floats(0, 100))
def test_answers_exactly_for_a_new_percentage_or_due_metrics(
        held: int | None, now: int | None, staleness: float, age: float,
        held_for: float) -> None:
    policy = HoldPolicy(held, staleness, age)
    # A status without a percentage leaves the held one in place: not significant.
    expected = (now is not None and now != held) or age + held_for >= staleness
    assert policy.answers(_status(now), held_for) is expected
    assert policy.answers(None, held_for) is False  # no report: nothing to write


def test_malformed_headers_are_ignored() -> None:
    for header in ("progress=101; metrics-staleness=1", "progress=1.5; metrics-staleness=1",
                   "progress=1", "metrics-staleness=-1", "metrics-staleness=1e9",
                   "metrics-staleness=1; x", "a" * 300, ""):
        assert parse_policy(header) is None, header
    assert parse_policy("metrics-staleness=30; future=1") == HoldPolicy(None, 30.0, 0.0)
