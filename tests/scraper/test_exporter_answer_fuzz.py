"""Fuzz of the exporter-answer boundary: every answer ends in a typed outcome.

The real :class:`~scraper.scrape.exporter.ExporterScraper` scrapes a fake exporter on
127.0.0.1 that writes whatever raw HTTP answer the test chose (status line,
headers, body bytes, optionally trickled); the real :class:`~scraper.scrape.loop.ScrapeLoop`
turns the result into counts and Events, with in-process fakes for the status
writer and the Event recorder (their real ones talk to the API server and are
tested elsewhere).  Rules checked (issue 13, inputs 5, 7 and 9):

* a scrape returns a typed result and raises nothing (no traceback reaches the
  scheduler, no ERROR log line);
* every run counts exactly one scrape result;
* a failure makes at most one Event per target and reason per window, whatever
  the answer's text, and an Event message is short printable ASCII.

Bounded: hypothesis examples are capped, every scrape has a 1 s timeout, the fake
exporter closes each connection after one answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter_lib.status import TrainerStatus
from scraper.scrape.exporter import ExporterScraper, ScrapeLimits
from scraper.scrape.loop import DETAIL_MAX, ScrapeLoop
from scraper.scrape.target_state import TargetState
from scraper.shared.outcome import WriteOutcome
from scraper.shared.scrapes import Failure, FailureKind, Fresh, NothingYet, NotModified
from scraper.shared.targets import Target
from scraper.telemetry import JobView
from tests.scraper.test_loop import Counted

MAX_BODY = 64 * 1024
TIMEOUT = 1.0


@dataclass
class Answer:
    """One raw HTTP answer; ``trickle`` seconds between single bytes (0: at once)."""

    raw: bytes
    trickle: float = 0.0


class FakeExporter:
    """A loopback TCP server writing :attr:`answer` to every request, then closing."""

    def __init__(self) -> None:
        self.answer = Answer(b"HTTP/1.1 204 No Content\r\n\r\n")
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        answer = self.answer
        conn.settimeout(5)
        try:
            data = b""
            deadline = time.monotonic() + 5
            while b"\r\n\r\n" not in data and time.monotonic() < deadline:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            if answer.trickle:
                for i in range(len(answer.raw)):
                    if self._stop.is_set():
                        return
                    conn.sendall(answer.raw[i:i + 1])
                    time.sleep(answer.trickle)
            else:
                conn.sendall(answer.raw)
        except OSError:
            pass  # the scraper gave up (timeout, too large): not this side's business
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()


@pytest.fixture(scope="module")
def exporter() -> Iterator[FakeExporter]:
    server = FakeExporter()
    yield server
    server.close()


@dataclass
class Events:
    recorded: list[tuple[str, str]] = field(default_factory=list)

    async def event(self, namespace: str, name: str, reason: str, message: str) -> None:
        self.recorded.append((reason, message))


class Writer:
    async def apply(self, namespace: str, name: str, status: TrainerStatus, *,
                    final: bool = False, uid: str = "", seen: float | None = None,
                    finished_at: float | None = None,
                    confirm: Target | None = None) -> WriteOutcome:
        return WriteOutcome.WRITTEN


def _http(status: int, body: bytes, headers: dict[str, str] | None = None,
          content_length: bool = True) -> bytes:
    lines = [f"HTTP/1.1 {status} X"]
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    if content_length:
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _run(exporter: FakeExporter, answers: list[Answer]) -> tuple[list[object], list[str],
                                                                  Events]:
    """Scrape the fake exporter once per answer through the real scraper and loop."""

    async def go() -> tuple[list[object], list[str], Events]:
        scraper = ExporterScraper(ScrapeLimits(TIMEOUT, MAX_BODY, 4))
        events, counted = Events(), []
        results: list[object] = []

        class Recording:
            async def scrape(self, target: Target, etag: str | None = None) -> object:
                result = await scraper.scrape(target, etag)
                results.append(result)
                return result

        loop = ScrapeLoop(Recording(), Writer(), events, backoff_max=1.0,  # type: ignore[arg-type]
                          counts=Counted(counted), clock=lambda: 1000.0)
        target = Target("ns", "tj", "tj-node-0-0", "uid",
                        f"http://127.0.0.1:{exporter.port}/metrics", 15.0)
        state = TargetState(JobView("ns", "tj", "tj-node-0-0"), target=target, uid="uid")
        try:
            for answer in answers:
                exporter.answer = answer
                state.retry_at = 0.0  # a refusal's backoff would skip the next answer
                await loop.run(state)
        finally:
            await scraper.close()
        return results, counted, events

    return asyncio.run(go())


def _check(results: list[object], counted: list[str], events: Events, runs: int) -> None:
    assert len(results) == runs and len(counted) == runs
    for r in results:
        assert isinstance(r, Fresh | NotModified | NothingYet | Failure), r
    reasons = [reason for reason, _ in events.recorded]
    assert len(reasons) == len(set(reasons)), reasons  # once per target and reason
    for _, message in events.recorded:
        assert all(" " <= c <= "~" for c in message), message
        assert len(message) < DETAIL_MAX + 200


CONTENT_TYPES = ["application/json", "application/json; charset=utf-16", "text/plain",
                 "text/plain; version=0.0.4", "text/html", "application/octet-stream", ""]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _encode(text: str, encoding: str) -> bytes:
    """``text`` in ``encoding``; lone surrogates kept where the codec can, else replaced."""
    try:
        return text.encode(encoding, "surrogatepass")
    except (UnicodeEncodeError, LookupError):
        return text.encode(encoding, "replace")


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "text", "json", "status", "prom"]))
    encoding = draw(st.sampled_from(["utf-8", "utf-16", "utf-32", "latin-1", "utf-8-sig"]))
    if kind == "bytes":
        return draw(st.binary(max_size=2048))
    if kind == "text":
        return _encode(draw(st.text(max_size=512)), encoding)
    if kind == "json":
        return _encode(json.dumps(draw(json_values)), encoding)
    if kind == "status":
        obj = {"progressPercentage": draw(st.integers() | st.floats() | st.text(max_size=5)),
               "lastUpdatedTime": draw(st.text(max_size=30) | st.just("2025-01-01T00:00:00Z")),
               "metrics": draw(st.lists(st.fixed_dictionaries(
                   {"name": st.text(max_size=20), "value": st.text(max_size=20)}), max_size=3))}
        return _encode(json.dumps(obj, ensure_ascii=draw(st.booleans())), encoding)
    name = draw(st.sampled_from(["trainjob_progress_ratio", "trainjob_metric",
                                 "trainjob_last_update_timestamp_seconds", "x"]))
    labels = draw(st.text(max_size=30))
    value = draw(st.sampled_from(["1", "0.5", "NaN", "+Inf", "-1e400", "abc", ""]))
    return _encode(f"{name}{{{labels}}} {value}\n", encoding)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(status=st.sampled_from([200, 200, 200, 204, 304, 301, 404, 500]),
       ctype=st.sampled_from(CONTENT_TYPES), body=bodies(), etag=st.booleans())
def test_any_answer_is_a_typed_outcome(exporter: FakeExporter, caplog: pytest.LogCaptureFixture,
                                       status: int, ctype: str, body: bytes,
                                       etag: bool) -> None:
    headers = {"Content-Type": ctype} if ctype else {}
    if etag:
        headers["ETag"] = '"e1"'
    if status == 301:
        headers["Location"] = "http://\u00e9vil/" + "x" * 500
    raw = _http(status, body, {k: v.encode("utf-8").decode("latin-1")
                               for k, v in headers.items()})
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        results, counted, events = _run(exporter, [Answer(raw)] * 2)
    _check(results, counted, events, 2)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


EDGE_CASES = {
    "nested arrays 100000 as json": _http(200, _deep(100_000)[:MAX_BODY // 2],
                                          {"Content-Type": "application/json"}),
    "nested arrays 20000 as json": _http(200, _deep(20_000),
                                         {"Content-Type": "application/json"}),
    "nested objects as json": _http(200, b'{"a":' * 5000 + b"1" + b"}" * 5000,
                                    {"Content-Type": "application/json"}),
    "nested arrays as text": _http(200, _deep(20_000), {"Content-Type": "text/plain"}),
    "html page": _http(200, b"<html><!-- req 1 --><body>\x00\xff" + b"x" * 3000,
                       {"Content-Type": "text/html"}),
    "body over the cap, declared": _http(200, b"{" + b" " * (MAX_BODY + 10) + b"}",
                                         {"Content-Type": "application/json"}),
    "body over the cap, undeclared": _http(200, b"a" * (MAX_BODY * 2),
                                           {"Content-Type": "text/plain"},
                                           content_length=False),
    "invalid utf-8 json": _http(200, b'{"progressPercentage": "\xff\xfe"}',
                                {"Content-Type": "application/json"}),
    "utf-16 json with bom": _http(200, '{"progressPercentage": 5}'.encode("utf-16"),
                                  {"Content-Type": "application/json"}),
    "utf-8 bom json": _http(200, b'\xef\xbb\xbf{"progressPercentage": 5}',
                            {"Content-Type": "application/json"}),
    "NaN json": _http(200, b'{"progressPercentage": NaN}',
                      {"Content-Type": "application/json"}),
    "huge number json": _http(200, b'{"progressPercentage": 1' + b"0" * 5000 + b"}",
                              {"Content-Type": "application/json"}),
    "garbage status line": b"HTTP/9 OOPS\r\n\r\n",
    "not http at all": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" * 10,
    "header without colon": b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\n",
    "short body": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{",
    "bad chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "gzip claimed": _http(200, b"\x1f\x8b" + b"\x00" * 50,
                          {"Content-Type": "application/json", "Content-Encoding": "gzip"}),
    "immediate close": b"",
}


@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_malformed_answer_is_a_typed_outcome(exporter: FakeExporter,
                                             caplog: pytest.LogCaptureFixture,
                                             name: str) -> None:
    with caplog.at_level(logging.WARNING):
        results, counted, events = _run(exporter, [Answer(EDGE_CASES[name])] * 3)
    _check(results, counted, events, 3)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    if name.startswith("nested"):
        assert all(isinstance(r, Failure) and r.kind is FailureKind.INVALID for r in results)
        assert [reason for reason, _ in events.recorded] == ["InvalidTrainerStatus"] or \
            name == "nested arrays as text"


def test_slow_sender_times_out_once_per_window(exporter: FakeExporter) -> None:
    raw = _http(200, b'{"progressPercentage": 5, "lastUpdatedTime": "2025-01-01T00:00:00Z"}',
                {"Content-Type": "application/json"})
    started = time.monotonic()
    results, counted, events = _run(exporter, [Answer(raw, trickle=0.05)] * 2)
    took = time.monotonic() - started
    _check(results, counted, events, 2)
    assert all(isinstance(r, Failure) and r.kind is FailureKind.TIMEOUT for r in results)
    assert counted == ["timeout", "timeout"]
    assert [reason for reason, _ in events.recorded] == ["TrainerStatusScrapeFailed"]
    assert took < 2 * TIMEOUT + 2  # the timeout bounds a trickling answer
