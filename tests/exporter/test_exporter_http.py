"""The exporter's HTTP server, for real: negotiation, ETag/304, concurrency, promtool."""

from __future__ import annotations

import json
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

import exporter_lib
from exporter_lib import api
from exporter_lib.status import TrainerStatus

Fetch = Callable[..., Any]


def test_204_before_first_update_then_json(metrics_url: str, fetch: Fetch) -> None:
    assert fetch(metrics_url, headers={"Accept": "application/json"}).status == 204
    exporter_lib.update(progress_percentage=40, estimated_remaining_seconds=12,
                        metrics={"loss": 0.125, "phase": "warm up", "lr": 1e-05})
    resp = fetch(metrics_url, headers={"Accept": "application/json"})
    assert resp.status == 200 and resp.headers["Content-Type"] == "application/json"
    assert resp.body == exporter_lib.current_status().to_json()  # type: ignore[union-attr]
    parsed = TrainerStatus.from_json(resp.body)
    assert parsed.metrics_dict() == {"loss": "0.125", "phase": "warm up", "lr": "1e-05"}
    assert parsed.progress_percentage == 40 and parsed.estimated_remaining_seconds == 12


def test_prometheus_text_series(metrics_url: str, fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=25, estimated_remaining_seconds=90,
                        metrics={"loss": "0.5", "phase": "eval", 'odd "name"\n': "a\\b"})
    resp = fetch(metrics_url)
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in parse_text(resp.body.decode()) for s in f.samples}
    assert samples[("trainjob_progress_ratio", ())] == 0.25
    assert samples[("trainjob_estimated_remaining_seconds", ())] == 90
    assert samples[("trainjob_metric", (("name", "loss"),))] == 0.5
    assert samples[("trainjob_metric_info", (("name", "phase"), ("value", "eval")))] == 1
    assert samples[("trainjob_metric_info", (("name", 'odd "name"\n'), ("value", "a\\b")))] == 1
    stamp = exporter_lib.current_status().last_updated_time.timestamp()  # type: ignore[union-attr]
    assert samples[("trainjob_last_update_timestamp_seconds", ())] == stamp


def test_openmetrics_by_negotiation(metrics_url: str, fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=5, metrics={"loss": 1.5, "tag": "x"})
    resp = fetch(metrics_url, headers={
        "Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"})
    assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
    families = {f.name: f for f in parse_om(resp.body.decode())}
    assert families["trainjob_progress_ratio"].samples[0].value == 0.05
    assert resp.body.endswith(b"# EOF\n")


def test_etags_per_representation_and_304(metrics_url: str, fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=1)
    kinds = {"json": {"Accept": "application/json"}, "text": {},
             "om": {"Accept": "application/openmetrics-text; version=1.0.0"}}
    tags = {k: fetch(metrics_url, headers=h).headers["ETag"] for k, h in kinds.items()}
    assert len(set(tags.values())) == 3 and all(t.startswith('"') for t in tags.values())
    for kind, headers in kinds.items():
        tag = tags[kind]
        for inm in (tag, f'"nope", {tag}', "*", f"W/{tag}"):
            resp = fetch(metrics_url, headers={**headers, "If-None-Match": inm})
            assert resp.status == 304 and resp.body == b"" and resp.headers["ETag"] == tag
        assert fetch(metrics_url, headers={**headers, "If-None-Match": '"other"'}).status == 200
    time.sleep(1.05)  # lastUpdatedTime has whole seconds: make the next status differ
    exporter_lib.update(progress_percentage=2)
    for kind, headers in kinds.items():
        resp = fetch(metrics_url, headers={**headers, "If-None-Match": tags[kind]})
        assert resp.status == 200 and resp.headers["ETag"] != tags[kind]


def test_healthz_head_and_404(exporter: api.Exporter, fetch: Fetch) -> None:
    assert fetch(f"{exporter.url}/healthz").body == b"ok\n"
    head = fetch(f"{exporter.url}/healthz", method="HEAD")
    assert head.status == 200 and head.body == b""
    assert fetch(f"{exporter.url}/nothing").status == 404


def test_many_threads_updating_while_scraped(metrics_url: str, fetch: Fetch) -> None:
    """Each update sets progress p and metric step=p; every scrape must agree with itself."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(offset: int) -> None:
        try:
            for i in range(3000):
                if stop.is_set():
                    return
                p = (i + offset) % 101
                exporter_lib.update(progress_percentage=p, estimated_remaining_seconds=p,
                                    metrics={"step": p, "text": f"s{p}", f"w{offset}": i})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    writers = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for thread in writers:
        thread.start()
    checked = 0
    try:
        for i in range(150):
            if i % 2:
                resp = fetch(metrics_url, headers={"Accept": "application/json"})
                if resp.status == 204:
                    continue
                s = TrainerStatus.from_json(resp.body)
                assert s.metrics_dict()["step"] == str(s.progress_percentage)
                assert s.estimated_remaining_seconds == s.progress_percentage
                assert s.metrics_dict()["text"] == f"s{s.progress_percentage}"
            else:
                resp = fetch(metrics_url)
                families = {f.name: f for f in parse_text(resp.body.decode())}
                if "trainjob_progress_ratio" not in families:
                    continue
                ratio = families["trainjob_progress_ratio"].samples[0].value
                steps = {s.labels["name"]: s.value for s in families["trainjob_metric"].samples}
                assert round(ratio * 100) == steps["step"]
                info = families["trainjob_metric_info"].samples[0].labels
                assert info["value"] == f"s{round(ratio * 100)}"
            checked += 1
    finally:
        stop.set()
        for thread in writers:
            thread.join(timeout=30)
    assert not errors
    assert checked > 100


def test_promtool_check_metrics_clean(metrics_url: str, fetch: Fetch) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian package 'prometheus') is required for this test"
    exporter_lib.update(progress_percentage=60, estimated_remaining_seconds=30, metrics={
        "loss": 0.25, "eval/accuracy": "0.9", "phase": "training", "nan": float("nan"),
        "inf": float("-inf"), "flag": False, "quote\"d": "back\\slash\nnewline"})
    # promtool reads the Prometheus text format (it would read OpenMetrics' counter
    # family names as samples without help); OpenMetrics is checked by the strict parser.
    body = fetch(metrics_url).body
    result = subprocess.run([promtool, "check", "metrics"], input=body,
                            capture_output=True, timeout=60, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr).decode()
    assert result.stdout + result.stderr == b"", (result.stdout + result.stderr).decode()
    om = fetch(metrics_url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    names = {f.name for f in parse_om(om.body.decode())}
    assert {"trainjob_metric", "trainjob_metric_info", "trainjob_exporter_updates"} <= names


def test_port_in_use_warns_once_and_training_goes_on(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    api._reset_for_tests()
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    try:
        port = blocker.getsockname()[1]
        started = api.start(port=port, host="127.0.0.1", install_signal_handler=False)
        assert not started.serving and started.port is None
        assert sum("port already in use" in r.getMessage() for r in caplog.records) == 1
        exporter_lib.update(progress_percentage=3)
        assert exporter_lib.current_status().progress_percentage == 3  # type: ignore[union-attr]
        assert api.start() is started  # idempotent: no second attempt, no second warning
    finally:
        blocker.close()
        api._reset_for_tests()


@pytest.mark.parametrize("port", [65536, 99999, -1])
def test_a_port_out_of_range_warns_and_training_goes_on(
        port: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """bind() raises OverflowError, not OSError, for these: it must not reach the caller."""
    for var in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    api._reset_for_tests()
    try:
        started = api.start(port=port, host="127.0.0.1", install_signal_handler=False)
        assert not started.serving
        assert any(f"cannot serve on 127.0.0.1:{port}" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
        exporter_lib.update(progress_percentage=4)
        assert exporter_lib.current_status().progress_percentage == 4  # type: ignore[union-attr]
    finally:
        api._reset_for_tests()


def test_non_reporting_rank_is_a_cheap_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    api._reset_for_tests()
    monkeypatch.setenv("RANK", "3")
    try:
        started = api.start(port=0, install_signal_handler=False)
        assert not started.serving
        exporter_lib.update(progress_percentage=50, metrics={"loss": 1})
        assert exporter_lib.current_status() is None
    finally:
        api._reset_for_tests()


def test_json_accept_variants(metrics_url: str, fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=9)
    for accept in ("application/json", "text/html, application/json;q=0.9",
                   "APPLICATION/JSON; charset=utf-8"):
        resp = fetch(metrics_url, headers={"Accept": accept})
        assert resp.headers["Content-Type"] == "application/json"
        assert json.loads(resp.body)["progressPercentage"] == 9
    assert fetch(metrics_url, headers={"Accept": "application/json;q=0"}).headers[
        "Content-Type"].startswith("text/plain")


def test_text_exposition_round_trips_tricky_values(exporter: api.Exporter, fetch: Fetch) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    exporter_lib.update(progress_percentage=33, estimated_remaining_seconds=7, metrics={
        "loss": 0.1, "big": 1e300, "tiny": 5e-324, "inf": float("inf"), "neg": "-inf",
        "z": -0.0, "e": "1e-5", "text": 'q"uo\\te\nline', 'n"a\\me\n': "v"})
    body = fetch(f"{exporter.url}/metrics").body.decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(body) for s in family.samples}
    assert samples[("trainjob_progress_ratio", ())] == 0.33
    assert samples[("trainjob_estimated_remaining_seconds", ())] == 7
    for name, value in {"loss": 0.1, "big": 1e300, "tiny": 5e-324, "inf": float("inf"),
                        "neg": float("-inf"), "z": -0.0, "e": 1e-5}.items():
        assert samples[("trainjob_metric", (("name", name),))] == value
    assert samples[("trainjob_metric_info", (("name", "text"), ("value", 'q"uo\\te\nline')))] == 1
    assert samples[("trainjob_metric_info", (("name", 'n"a\\me\n'), ("value", "v")))] == 1


def test_peer_resets_leave_no_traceback_in_the_training_log(
        metrics_url: str, fetch: Fetch, capfd: pytest.CaptureFixture[str]) -> None:
    host, port = metrics_url.split("/")[2].split(":")
    exporter_lib.update(progress_percentage=5)
    for partial in (b"", b"GET /metrics HTTP/1.1\r\nHost: x\r\n"):
        for _ in range(5):
            sock = socket.create_connection((host, int(port)), timeout=5)
            if partial:
                sock.sendall(partial)
            # SO_LINGER 0: close() sends RST, as a scraper killed mid-request would.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            time.sleep(0.05)  # let the handler thread block in recv first
            sock.close()
    time.sleep(0.3)
    assert fetch(metrics_url, headers={"Accept": "application/json"}).status == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err, err
