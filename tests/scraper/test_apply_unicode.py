"""Every string the Trainer API accepts round-trips exactly from update() to the TrainJob.

Property test over the Unicode space (hypothesis): the real exporter's ``update()`` and
served JSON, the scraper's status model and status writer, the real kube-apiserver.
The apply body (:mod:`scraper.kube.apply_request`) must be read by the API server's YAML
decoder as exactly the strings the exporter served.  Bounded: 150 examples of one
update, one scrape, one apply and one GET each (seconds).  One more test runs the
scraper process on issue 13's input 4.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client

from exporter_lib.api import Exporter
from exporter_lib.state import State
from exporter_lib.status import (
    API_GROUP,
    API_VERSION,
    METRIC_NAME_MAX_LENGTH,
    METRIC_VALUE_MAX_LENGTH,
    TRAINJOB_PLURAL,
    StatusError,
    TrainerStatus,
)
from localdev.cluster import objects
from scraper.kube.apply_request import encode_apply_body
from scraper.shared.outcome import WriteOutcome
from tests.helpers.scraper import ScraperProcess, progress_of, trainer_status, wait_for
from tests.helpers.writer import running_writer

pytestmark = pytest.mark.usefixtures("trainjob_crd")

# Every code point but the surrogates (not Unicode text; refused by the status model).
UNICODE = st.characters(exclude_categories=["Cs"])
YAML_HOSTILE = "\U0001F680\x85\u2028\u2029\ufeff\ufffe\uffff\x00\x7f\x9f\t\n\r\"\\"


def test_encoded_body_escapes_no_astral_character() -> None:
    body = encode_apply_body({"s": "\U0001F680 launch", "t": "a\u2028b\x85c\ufffe"})
    assert "\U0001F680".encode() in body  # raw UTF-8, never a surrogate-pair escape
    assert b"\\ud83d" not in body
    assert b"\\u2028" in body and b"\\u0085" in body and b"\\ufffe" in body
    assert json.loads(body) == {"s": "\U0001F680 launch", "t": "a\u2028b\x85c\ufffe"}


def test_lone_surrogate_is_refused_by_the_status_model_first() -> None:
    with pytest.raises(StatusError, match="metrics"):
        TrainerStatus.from_api({"metrics": [{"name": "bad\ud800", "value": "1"}],
                                "lastUpdatedTime": "2026-01-01T00:00:00Z"})
    with pytest.raises(ValueError, match="lone surrogate"):
        encode_apply_body({"s": "\ud800"})


def _served(port: int) -> bytes:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        body: bytes = resp.read()
        return body


def test_every_unicode_name_and_value_round_trips(kube_api: client.ApiClient,
                                                  namespace: str) -> None:
    objects.create_trainjob(kube_api, namespace, "uni")
    state = State()
    exp = Exporter(state, state, host="127.0.0.1", port=0, status_file=None,
                   termination_message_path=None, serve=True)
    assert exp.port is not None
    custom = client.CustomObjectsApi(kube_api)
    loop = asyncio.new_event_loop()
    ctx = running_writer(kube_api, namespace, qps=1000, burst=1000)
    writer, _ = loop.run_until_complete(ctx.__aenter__())
    counter = iter(range(10**9))

    def roundtrip(name: str, value: str) -> None:
        # One name per example (metrics accumulate in the exporter up to 256), and a
        # progress that changes every example, so every example is a real write.
        state.replace(TrainerStatus.from_api({"lastUpdatedTime": datetime.now(UTC)}))
        state.update(progress_percentage=next(counter) % 101,
                     metrics={name: value, "fixed": YAML_HOSTILE})
        served = TrainerStatus.from_json(_served(exp.port))  # type: ignore[arg-type]
        assert {"name": name, "value": value} in served.to_api()["metrics"]
        outcome = loop.run_until_complete(writer.apply_and_wait(namespace, "uni", served))
        assert outcome is WriteOutcome.WRITTEN, outcome
        obj = custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace,
                                                  TRAINJOB_PLURAL, "uni")
        assert obj["status"]["trainerStatus"] == served.to_api()

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.text(UNICODE, min_size=1, max_size=METRIC_NAME_MAX_LENGTH),
           st.text(UNICODE, min_size=1, max_size=METRIC_VALUE_MAX_LENGTH))
    def check(name: str, value: str) -> None:
        roundtrip(name, value)

    try:
        roundtrip("stage", "\U0001F680 launch")  # issue 13 input 4, first and always
        check()
    finally:
        loop.run_until_complete(ctx.__aexit__(None, None, None))
        loop.close()
        exp.stop()


def test_astral_metric_value_lands_through_the_scraper(
    kube_api: client.ApiClient, namespace: str, scraper_factory: Callable[..., ScraperProcess],
) -> None:
    """Issue 13 input 4: before, every apply was refused (400 from the YAML decoder)."""
    state = State()
    exp = Exporter(state, state, host="127.0.0.1", port=0, status_file=None,
                   termination_message_path=None, serve=True)
    try:
        assert exp.port is not None
        objects.create_trainjob(kube_api, namespace, "rocket")
        objects.create_trainer_pod(kube_api, namespace, "rocket", port=exp.port)
        state.update(progress_percentage=30, metrics={"stage": "\U0001F680 launch",
                                                      "sep": "a\u2028b"})
        scraper_factory("--interval=1s", f"--namespaces={namespace}")
        wait_for(lambda: progress_of(kube_api, namespace, "rocket") == 30, 20,
                 "progress 30 written")
        got = trainer_status(kube_api, namespace, "rocket")
        assert got is not None
        assert {"name": "stage", "value": "\U0001F680 launch"} in got["metrics"]
        assert {"name": "sep", "value": "a\u2028b"} in got["metrics"]
    finally:
        exp.stop()
