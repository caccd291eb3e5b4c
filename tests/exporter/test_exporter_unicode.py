"""Every string the Trainer API accepts round-trips exactly from update() to the served JSON;
every other one is dropped alone, with a reason (issue 13, inputs 4 and 6).

The API stores metric names and values as strings of 1..64 code points (the CRD's
maxLength counts runes: kube-openapi ``validate.MaxLength`` uses ``utf8.RuneCount``), and
its JSON decoder turns a lone surrogate into U+FFFD; so the accepted set is Unicode text
of 1..64 code points without surrogates.  Property-based over the whole code space,
through the real HTTP server.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exporter_lib
from exporter_lib import api
from exporter_lib.state import State
from exporter_lib.status import StatusError, TrainerStatus

Fetch = Callable[..., Any]
JSON = {"Accept": "application/json"}

# Every code point, surrogates included (hypothesis leaves category Cs out by default).
ANY_CHAR = st.characters(exclude_categories=())
UNICODE_CHAR = st.characters(exclude_categories=("Cs",))  # every code point but surrogates
ACCEPTED = st.text(UNICODE_CHAR, min_size=1, max_size=64)
ANY_TEXT = st.text(ANY_CHAR, min_size=0, max_size=70)
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def accepted(text: str) -> bool:
    return 1 <= len(text) <= 64 and not any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def served(fetch: Fetch, url: str) -> dict[str, str]:
    resp = fetch(url, headers=JSON)
    assert resp.status == 200
    return {m["name"]: m["value"] for m in json.loads(resp.body)["metrics"]}


def restart() -> str:
    api._reset_for_tests()
    started = api.start(port=0, host="127.0.0.1", install_signal_handler=False)
    assert started.url is not None
    return f"{started.url}/metrics"


@pytest.fixture
def fresh(exporter: api.Exporter) -> Callable[[], str]:
    """A new process-wide exporter per example (metric names accumulate otherwise)."""
    return restart


@SETTINGS
@given(name=ACCEPTED, value=ACCEPTED)
def test_accepted_text_round_trips_exactly(fresh: Callable[[], str], fetch: Fetch,
                                           name: str, value: str) -> None:
    url = fresh()
    exporter_lib.update(progress_percentage=1, metrics={name: value, "loss": 0.5})
    metrics = served(fetch, url)
    assert metrics[name] == (value if name != "loss" else "0.5")
    assert metrics["loss"] == "0.5" or name == "loss"
    # The shared model (the scraper's check) reads the served body back equal.
    status = TrainerStatus.from_json(fetch(url, headers=JSON).body)
    assert status.metrics_dict() == metrics


@SETTINGS
@given(name=ANY_TEXT, value=ANY_TEXT)
def test_any_text_is_served_exactly_or_dropped_alone(fresh: Callable[[], str], fetch: Fetch,
                                                     name: str, value: str) -> None:
    url = fresh()
    exporter_lib.update(metrics={"loss": 0.5, name: value} if name != "loss" else {name: value})
    metrics = served(fetch, url)
    if accepted(name) and accepted(value):
        assert metrics.get(name) == value
    else:
        assert name not in metrics or name == "loss"
        state = api._state
        assert isinstance(state, State) and state.rejected.get("metrics", 0) == 1
    if name != "loss":
        assert metrics["loss"] == "0.5"  # one bad metric never takes the others with it


@settings(max_examples=300, deadline=None)
@given(name=ANY_TEXT, value=ANY_TEXT)
def test_shared_model_accepts_exactly_the_api_set(name: str, value: str) -> None:
    data = {"lastUpdatedTime": "2025-01-01T00:00:00Z", "metrics": [{"name": name,
                                                                     "value": value}]}
    if accepted(name) and accepted(value):
        status = TrainerStatus.from_api(data)
        assert TrainerStatus.from_json(status.to_json()) == status
        assert status.metrics_dict() == {name: value}
    else:
        with pytest.raises(StatusError) as err:
            TrainerStatus.from_api(data)
        bad = "name" if not accepted(name) else "value"
        assert f"metrics[0].{bad}=" in str(err.value)


def test_lone_surrogate_drops_only_that_metric(
        metrics_url: str, fetch: Fetch, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 13, input 6: served ``"metrics": []`` before."""
    with caplog.at_level(logging.WARNING, "exporter_lib"):
        exporter_lib.update(metrics={"loss": 0.5, "bad\ud800": 1, "ok": "v\udfff"})
    assert served(fetch, metrics_url) == {"loss": "0.5"}
    text = caplog.text
    assert "'bad\\ud800'" in text and "lone surrogate" in text and "metrics['ok']" in text


def test_safety_net_drops_one_metric_not_all() -> None:
    # Behind the inline checks: if one were missing, _build still drops only the bad one.
    state = State()
    status = state._build(None, None, [("loss", 0.5), ("x" * 65, "1"), ("b", "\ud800")], 0.0)
    assert status.metrics_dict() == {"loss": "0.5"}
    assert state.rejected["metrics"] == 2
