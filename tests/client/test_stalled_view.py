"""The clients' "stalled for N min" (trainjob_client.progress, table, bar) from the
scraper's ``trainjob-progress.dev/stalled-since`` annotation, in process over TrainJob
dicts as the API returns them (the annotation written by the real scraper and read back
from the real API server: ``tests/e2e/test_stall_stack.py``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from trainjob_client.bar import describe
from trainjob_client.progress import STALLED_SINCE_ANNOTATION, trainjob_progress
from trainjob_client.table import render

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _trainjob(annotations: dict[str, str], condition: str = "Created") -> dict[str, Any]:
    return {"metadata": {"name": "tj", "namespace": "ns", "annotations": annotations},
            "status": {"trainerStatus": {"progressPercentage": 37,
                                         "lastUpdatedTime": "2026-12-03T11:40:00Z"},
                       "conditions": [{"type": condition, "status": "True"}]}}


@given(minutes=st.integers(min_value=0, max_value=100_000))
def test_stalled_for_counts_minutes_from_the_last_change(minutes: int) -> None:
    since = NOW - timedelta(minutes=minutes, seconds=30)
    item = trainjob_progress(_trainjob({STALLED_SINCE_ANNOTATION:
                                        since.strftime("%Y-%m-%dT%H:%M:%SZ")}))
    assert item.stalled_for(NOW) == f"stalled for {minutes} min"
    assert f"Created (stalled for {minutes} min)" in render([item], now=NOW)
    assert item.to_dict()["stalledSince"] == since.replace(microsecond=0).isoformat()


def test_not_stalled_unreadable_or_ended_shows_nothing() -> None:
    for marks in ({}, {STALLED_SINCE_ANNOTATION: "yesterday"},
                  {STALLED_SINCE_ANNOTATION: "2026-12-03T11:00:00"}):
        item = trainjob_progress(_trainjob(marks))
        assert item.stalled_for(NOW) is None
        assert "stalled" not in render([item], now=NOW)
    ended = trainjob_progress(_trainjob({STALLED_SINCE_ANNOTATION: "2026-12-03T11:00:00Z"},
                                        condition="Complete"))
    assert ended.stalled_for(NOW) is None


def test_the_notebook_bar_says_stalled() -> None:
    item = trainjob_progress(_trainjob({STALLED_SINCE_ANNOTATION: "2000-01-01T00:00:00Z"}))
    assert describe(item, []).startswith("Created, stalled for ")
