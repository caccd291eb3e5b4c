"""Every malformed input at the exporter's boundaries ends in a typed outcome (issue 13, input 5).

Boundaries: the push body (a 4xx with a Kubernetes Status body, counted by reason), the
status file the sidecar reads (kept the last valid status, counted), the termination
message written at exit (always valid JSON within 4096 bytes).  Fuzzed with hypothesis
plus the shapes hypothesis rarely finds: deep nesting, size, encodings, slow senders.
Every loop is bounded in count and time.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exporter_lib
from exporter_lib import api, protocol, server
from exporter_lib.files import (
    TERMINATION_MESSAGE_MAX_BYTES,
    StatusFileSource,
    fit_termination_message,
)
from exporter_lib.push import MAX_BODY_BYTES
from exporter_lib.status import TrainerStatus

Fetch = Callable[..., Any]
FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
STAMP = "2025-01-01T00:00:00Z"


def _token() -> str:
    with open(os.environ["KUBEFLOW_TRAINER_SERVER_TOKEN"]) as handle:
        return handle.read().strip()


def raw_request(url: str, data: bytes, *, timeout: float = 15.0, pace: float = 0.0,
                chunk: int = 0) -> tuple[int, dict[str, Any] | None, bytes]:
    """Send ``data`` on a fresh connection (optionally ``chunk`` bytes every ``pace`` s);
    return (status code, parsed JSON body or None, raw answer).  0 means no answer."""
    host, port = url.split("/")[2].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        try:
            if chunk:
                for i in range(0, len(data), chunk):
                    sock.sendall(data[i:i + chunk])
                    time.sleep(pace)
            else:
                sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        try:
            while b"\r\n\r\n" not in answer or not _complete(answer):
                piece = sock.recv(65536)
                if not piece:
                    break
                answer += piece
        except (ConnectionResetError, TimeoutError):
            pass
    if not answer.startswith(b"HTTP/1.1 "):
        return 0, None, answer
    head, _, body = answer.partition(b"\r\n\r\n")
    code = int(head.split(b" ")[1])
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    return code, parsed, answer


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return True


def post(url: str, body: bytes, token: str, content_type: str = "application/json",
         **kwargs: Any) -> tuple[int, dict[str, Any] | None, bytes]:
    path = "/" + url.split("/", 3)[3]
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    return raw_request(url, head + body, **kwargs)


def assert_status(code: int, body: dict[str, Any] | None, expected: set[int]) -> None:
    assert code in expected, (code, body)
    assert body is not None and body["kind"] == "Status" and body["code"] == code
    assert body["status"] == "Failure" and body["message"] and body["reason"]


@pytest.fixture
def push_url(exporter: api.Exporter) -> str:
    url = exporter_lib.enable_push_compat(namespace="ns", name="job")
    assert url is not None
    return url


def test_deeply_nested_push_gets_a_400_status(push_url: str, fetch: Fetch,
                                              capfd: pytest.CaptureFixture[str]) -> None:
    """Issue 13, input 5: the connection closed with no answer and a traceback before."""
    for body in (b"[" * 100_000 + b"]" * 100_000,
                 b'{"trainerStatus":' * 20_000 + b"1" + b"}" * 20_000):
        code, parsed, _ = post(push_url, body, _token())
        assert_status(code, parsed, {400})
        assert parsed is not None and "nested deeper" in parsed["message"]
    assert "Traceback" not in capfd.readouterr().err
    assert exporter_lib.current_status() is None


@pytest.mark.parametrize(("body", "needle"), [
    ("\ufeff{}".encode(), "byte order mark"),
    (json.dumps({"trainerStatus": {"lastUpdatedTime": STAMP}}).encode("utf-16"), "not UTF-8"),
    (b'{"trainerStatus": {"lastUpdatedTime": "\xff"}}', "not UTF-8"),
    (b'{"trainerStatus": {"progressPercentage": NaN, "lastUpdatedTime": "x"}}', "NaN"),
    (b'{"trainerStatus": {"estimatedRemainingSeconds": ' + b"9" * 5000 + b"}}", "not valid JSON"),
])
def test_encodings_and_non_json_literals_get_a_400(push_url: str, body: bytes,
                                                   needle: str) -> None:
    code, parsed, _ = post(push_url, body, _token())
    assert_status(code, parsed, {400})
    assert parsed is not None and needle in parsed["message"]


def test_lone_surrogate_escape_in_a_push_is_a_422_naming_the_field(push_url: str) -> None:
    body = (b'{"trainerStatus": {"lastUpdatedTime": "' + STAMP.encode() +
            b'", "metrics": [{"name": "a\\ud800", "value": "1"}]}}')
    code, parsed, _ = post(push_url, body, _token())
    assert_status(code, parsed, {422})
    assert parsed is not None
    assert parsed["details"]["causes"][0]["field"] == "trainerStatus.metrics[0].name"
    assert "lone surrogate" in parsed["message"]


@FUZZ
@given(body=st.one_of(
    st.binary(max_size=2000),
    st.recursive(st.none() | st.booleans() | st.floats() | st.text(max_size=70)
                 | st.integers(), lambda inner: st.lists(inner, max_size=5)
                 | st.dictionaries(st.text(max_size=20), inner, max_size=5),
                 max_leaves=30).map(lambda v: json.dumps({"trainerStatus": v}).encode()),
    st.fixed_dictionaries({}, optional={
        "progressPercentage": st.integers(-5, 105) | st.floats() | st.text(max_size=3),
        "estimatedRemainingSeconds": st.integers(-1, 2**32),
        "lastUpdatedTime": st.just(STAMP) | st.text(max_size=30),
        "metrics": st.lists(st.fixed_dictionaries({
            "name": st.text(st.characters(exclude_categories=()), max_size=66),
            "value": st.text(st.characters(exclude_categories=()), max_size=66)}),
            max_size=3)}).map(
        lambda d: json.dumps({"trainerStatus": d}).encode())))
def test_fuzzed_push_bodies_get_200_or_a_status(push_url: str, body: bytes) -> None:
    code, parsed, _ = post(push_url, body, _token())
    if code == 200:
        assert parsed is not None
        served = exporter_lib.current_status()
        assert served is not None
        answered = TrainerStatus.from_api(parsed["trainerStatus"])
        assert answered.same_report(served)  # lastUpdatedTime: the time it arrived
    else:
        assert_status(code, parsed, {400, 422})


@FUZZ
@given(head=st.binary(min_size=1, max_size=300))
def test_fuzzed_request_heads_get_an_answer_or_a_close(metrics_url: str, head: bytes) -> None:
    code, parsed, answer = raw_request(metrics_url, head + b"\r\n\r\n", timeout=15)
    if code == 0:
        assert answer == b""  # closed without a word only when nothing was a request
    elif code >= 400:
        assert_status(code, parsed, set(range(400, 600)))
    assert raw_request(metrics_url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 200


def test_head_limits_and_versions(metrics_url: str) -> None:
    big = (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX: " + b"a" * (server.MAX_HEAD_BYTES + 10)
           + b"\r\n\r\n")
    assert raw_request(metrics_url, big)[0] == 431
    many = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 150 + b"\r\n"
    assert raw_request(metrics_url, many)[0] == 431
    assert raw_request(metrics_url, b"GET /metrics HTTP/2.0\r\n\r\n")[0] == 505
    assert raw_request(metrics_url, b"GET /metrics HTTP/1.1\r\n folded\r\n\r\n")[0] == 400
    assert raw_request(metrics_url, b"GET /metrics HTTP/1.1\r\nX : y\r\n\r\n")[0] == 400
    assert raw_request(metrics_url, b"DELETE /metrics HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 405
    chunked = (b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert raw_request(metrics_url, chunked)[0] == 411
    # bare LF line ends, as netcat users type them (RFC 9112 section 2.2 allows them)
    assert raw_request(metrics_url, b"GET /healthz HTTP/1.0\n\n")[0] == 200


@FUZZ
@given(version=st.sampled_from(["HTTP/1.0", "HTTP/1.1"]), hosts=st.integers(0, 3),
       spelling=st.sampled_from(["Host", "host", "HOST"]),
       value=st.sampled_from(["127.0.0.1:9", "example", ""]),
       path=st.sampled_from(["/metrics", "/healthz", "/nowhere"]))
def test_host_header_rules_of_rfc_9112(metrics_url: str, version: str, hosts: int,
                                       spelling: str, value: str, path: str) -> None:
    """RFC 9112 section 3.2 (issue 21, input 7): an HTTP/1.1 request without a Host
    field, or any request with more than one, gets 400 (before: 200); an HTTP/1.0
    request may leave it out.  The 400 names the count and the rule."""
    head = f"GET {path} {version}\r\n" + f"{spelling}: {value}\r\n" * hosts + "\r\n"
    code, parsed, _ = raw_request(metrics_url, head.encode())
    if hosts > 1 or (hosts == 0 and version == "HTTP/1.1"):
        assert code == 400
        assert parsed is not None and f"{hosts} Host header fields" in parsed["message"]
    else:
        assert code in (200, 204, 404)


def test_slow_senders_meet_a_whole_head_deadline(metrics_url: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: the 30 s idle timeout restarted on every byte, so a trickle never ended.
    monkeypatch.setattr(protocol, "HEADER_TIMEOUT_SECONDS", 1.0)
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
    start = time.monotonic()
    code, parsed, _ = raw_request(metrics_url, request, pace=0.05, chunk=1, timeout=20)
    assert_status(code, parsed, {408})
    assert time.monotonic() - start < 5


def test_slow_push_body_meets_the_body_deadline(push_url: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "BODY_TIMEOUT_SECONDS", 1.0)
    body = json.dumps({"trainerStatus": {"lastUpdatedTime": STAMP}}).encode()
    code, parsed, _ = post(push_url, body, _token(), pace=0.1, chunk=2, timeout=20)
    assert_status(code, parsed, {408})


def test_refusals_are_counted_by_reason(push_url: str, metrics_url: str, fetch: Fetch) -> None:
    post(push_url, b"{", _token())
    post(push_url, b"{}", "wrong")
    raw_request(metrics_url, b"GET /metrics HTTP/9.9\r\n\r\n")
    text = fetch(metrics_url).body.decode()
    for reason in ("BadRequest", "Unauthorized", "HTTPVersionNotSupported"):
        assert f'trainjob_exporter_http_refused_total{{reason="{reason}"}} 1.0' in text


def test_too_large_push_is_drained_and_answered(push_url: str) -> None:
    code, parsed, _ = post(push_url, b" " * (MAX_BODY_BYTES + 1), _token())
    assert_status(code, parsed, {413})


# -- the status file (sidecar) -------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(content=st.one_of(
    st.binary(max_size=500),
    st.text(st.characters(exclude_categories=()), max_size=200).map(
        lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),
    st.just(b"{" + b'"a":{' * 5000 + b"}" * 5001)))
def test_fuzzed_status_files_keep_the_last_valid_status(tmp_path_factory: pytest.TempPathFactory,
                                                        content: bytes) -> None:
    path = tmp_path_factory.mktemp("file") / "status.json"
    good = TrainerStatus.from_api({"lastUpdatedTime": STAMP, "progressPercentage": 7})
    path.write_bytes(good.to_json())
    source = StatusFileSource(str(path))
    assert source.status() == good
    path.write_bytes(content)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # a new stat key
    try:
        parsed: TrainerStatus | None = TrainerStatus.from_json(content)
    except ValueError:
        parsed = None
    result = source.status()
    if parsed is None:
        assert result == good and source.rejected["file"] == 1
    else:
        assert result == parsed


def test_oversized_status_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.write_bytes(b" " * (MAX_BODY_BYTES + 1))
    source = StatusFileSource(str(path))
    assert source.status() is None and source.rejected["file"] == 1


# -- the termination message ---------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(metrics=st.dictionaries(
    st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=64),
    st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=64),
    max_size=256))
def test_termination_message_is_valid_json_within_4096_bytes(metrics: dict[str, str]) -> None:
    status = TrainerStatus.from_api({"lastUpdatedTime": STAMP, "progressPercentage": 100,
                                     "metrics": [{"name": n, "value": v}
                                                 for n, v in metrics.items()]})
    message = fit_termination_message(status)
    assert len(message) <= TERMINATION_MESSAGE_MAX_BYTES
    back = TrainerStatus.from_json(message)
    assert back.progress_percentage == 100
    assert back.metrics == status.metrics[:len(back.metrics)]  # a prefix, never cut mid-way

