"""Unit rules of the client: the annotation's format, where a status is read from, durations.

No API server here: these are pure functions over TrainJob objects and statuses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter_lib.status import (
    METRIC_NAME_MAX_LENGTH,
    METRIC_VALUE_MAX_LENGTH,
    METRICS_MAX_ITEMS,
    REMAINING_SECONDS_MAX,
    StatusError,
    TrainerStatus,
)
from exporter_lib.status_annotation import (
    KUBERNETES_ANNOTATIONS_MAX_BYTES,
    largest_status_json_bytes,
)
from tests.helpers.client import REPO
from trainjob_client.annotation import (
    TRAINER_STATUS_ANNOTATION,
    TRAINER_STATUS_ANNOTATION_MAX_BYTES,
    decode_annotation,
    encode_annotation,
)
from trainjob_client.progress import SOURCE_ANNOTATION, SOURCE_STATUS, trainjob_progress
from trainjob_client.table import human_duration

_text = st.text(alphabet=st.characters(codec="ascii", categories=("L", "N", "P")),
                min_size=1, max_size=METRIC_NAME_MAX_LENGTH)
statuses = st.builds(
    lambda p, e, m, t: TrainerStatus.from_api({
        "progressPercentage": p, "estimatedRemainingSeconds": e,
        "metrics": [{"name": n, "value": v} for n, v in m],
        "lastUpdatedTime": t.isoformat()}),
    st.none() | st.integers(0, 100), st.none() | st.integers(0, REMAINING_SECONDS_MAX),
    st.lists(st.tuples(_text, _text.map(lambda s: s[:METRIC_VALUE_MAX_LENGTH])),
             max_size=METRICS_MAX_ITEMS),
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2200, 1, 1),
                 timezones=st.just(UTC)),
).map(lambda s: TrainerStatus.from_api({k: v for k, v in s.to_api().items()}))


@given(statuses)
def test_annotation_round_trips_every_ascii_status_within_the_api_limits(
        status: TrainerStatus) -> None:
    value = encode_annotation(status)
    assert len(value.encode()) <= TRAINER_STATUS_ANNOTATION_MAX_BYTES
    assert json.loads(value) == status.to_api(), "the value is status.trainerStatus' JSON"
    assert decode_annotation(value) == status


#: Any Unicode text (no lone surrogates: the status model refuses them), 1..64 characters.
_unicode = st.text(alphabet=st.characters(exclude_categories=("Cs",)), min_size=1,
                   max_size=METRIC_NAME_MAX_LENGTH)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(_unicode, _unicode), min_size=1, max_size=METRICS_MAX_ITEMS))
def test_every_valid_status_fits_the_annotation_bound_whatever_its_text(
        metrics: list[tuple[str, str]]) -> None:
    status = TrainerStatus.from_api({
        "progressPercentage": 100, "estimatedRemainingSeconds": REMAINING_SECONDS_MAX,
        "metrics": [{"name": n, "value": v} for n, v in metrics],
        "lastUpdatedTime": "2026-01-01T00:00:00Z"})
    value = encode_annotation(status)  # never refused: the bound is the largest status
    assert len(value.encode()) <= TRAINER_STATUS_ANNOTATION_MAX_BYTES
    assert decode_annotation(value) == status


def test_the_bound_is_the_largest_status_and_leaves_room_under_kubernetes_total() -> None:
    widest = "\x01" * METRIC_NAME_MAX_LENGTH  # six bytes each in JSON (\u0001)
    worst = TrainerStatus.from_api({
        "progressPercentage": 100, "estimatedRemainingSeconds": REMAINING_SECONDS_MAX,
        "metrics": [{"name": widest, "value": widest[:METRIC_VALUE_MAX_LENGTH]}]
        * METRICS_MAX_ITEMS, "lastUpdatedTime": "9999-12-31T23:59:59Z"})
    assert len(encode_annotation(worst).encode()) == TRAINER_STATUS_ANNOTATION_MAX_BYTES
    assert TRAINER_STATUS_ANNOTATION_MAX_BYTES == largest_status_json_bytes() == 202_614
    room = KUBERNETES_ANNOTATIONS_MAX_BYTES - TRAINER_STATUS_ANNOTATION_MAX_BYTES - len(
        TRAINER_STATUS_ANNOTATION)
    assert room > 58 * 1024, "the docs promise 58 KiB for the object's other annotations"


@given(st.integers(101, 10**6) | st.integers(-10**6, -1))
def test_annotation_out_of_range_progress_names_annotation_field_and_limit(bad: int) -> None:
    value = json.dumps({"progressPercentage": bad, "lastUpdatedTime": "2026-01-01T00:00:00Z"})
    with pytest.raises(StatusError) as caught:
        decode_annotation(value)
    message = str(caught.value)
    assert message.startswith(f"annotation {TRAINER_STATUS_ANNOTATION}: ")
    assert f"progressPercentage={bad}" in message and ("100" in message or "0" in message)


def test_annotation_larger_than_the_bound_is_refused_with_both_sizes() -> None:
    value = json.dumps({"lastUpdatedTime": "2026-01-01T00:00:00Z",
                        "pad": "x" * TRAINER_STATUS_ANNOTATION_MAX_BYTES})
    with pytest.raises(StatusError, match=rf"<{len(value)} bytes>: must be at most "
                                          rf"{TRAINER_STATUS_ANNOTATION_MAX_BYTES} bytes"):
        decode_annotation(value)


def _trainjob(status: TrainerStatus | None = None, annotation: TrainerStatus | None = None,
              conditions: tuple[tuple[str, str], ...] = ()) -> dict[str, object]:
    meta: dict[str, object] = {"name": "t", "namespace": "ns",
                               "creationTimestamp": "2026-01-01T00:00:00Z"}
    if annotation is not None:
        meta["annotations"] = {TRAINER_STATUS_ANNOTATION: encode_annotation(annotation)}
    body: dict[str, object] = {"conditions": [{"type": t, "status": s} for t, s in conditions]}
    if status is not None:
        body["trainerStatus"] = status.to_api()
    return {"metadata": meta, "status": body}


def _at(seconds: int, percent: int) -> TrainerStatus:
    when = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)
    return TrainerStatus.from_api({"progressPercentage": percent,
                                   "lastUpdatedTime": when.isoformat()})


def test_the_later_report_wins_when_status_and_annotation_both_hold_one() -> None:
    newer_annotation = trainjob_progress(_trainjob(_at(0, 10), _at(5, 20)))
    assert (newer_annotation.source, newer_annotation.status) == (SOURCE_ANNOTATION, _at(5, 20))
    newer_status = trainjob_progress(_trainjob(_at(9, 30), _at(5, 20)))
    assert (newer_status.source, newer_status.status) == (SOURCE_STATUS, _at(9, 30))
    assert trainjob_progress(_trainjob()).status is None


def test_a_true_terminal_condition_is_the_state_whatever_its_position() -> None:
    item = trainjob_progress(_trainjob(conditions=(("Failed", "True"), ("Suspended", "True"))))
    assert item.state == "Failed" and item.ended
    assert trainjob_progress(_trainjob(conditions=(("Complete", "False"),))).state == ""


@pytest.mark.parametrize(("seconds", "text"), [
    # Pairs from apimachinery's duration.HumanDuration (what kubectl's AGE shows).
    (-2, "<invalid>"), (0, "0s"), (119, "119s"), (120, "2m"), (310, "5m10s"),
    (600, "10m"), (3 * 3600 - 1, "179m"), (3 * 3600, "3h"), (7 * 3600 + 60, "7h1m"),
    (47 * 3600, "47h"), (48 * 3600, "2d"), (50 * 3600, "2d2h"), (8 * 86400, "8d"),
    (2 * 365 * 86400, "2y"), (2 * 365 * 86400 + 86400, "2y1d"), (8 * 365 * 86400, "8y"),
])
def test_durations_read_like_kubectl_ages(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text


def test_importing_the_package_loads_no_client_extra() -> None:
    # The annotation's definition is importable without tqdm, rich or the SDK.
    code = ("import sys, trainjob_client; "
            "print(sorted(m for m in ('tqdm', 'rich', 'kubeflow', 'kubeflow_trainer_api', "
            "'kubernetes') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True,
                            capture_output=True, text=True, timeout=60).stdout.strip()
    assert loaded == "[]"


def test_metric_columns_that_differ_only_in_case_keep_their_names() -> None:
    """A newcomer's find: ``--metrics loss,Loss`` had two columns both titled LOSS."""
    from trainjob_client.table import header

    assert header(["loss", "acc"])[-2:] == ["LOSS", "ACC"]
    assert header(["loss", "Loss"])[-2:] == ["loss", "Loss"]


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "soon"])
def test_watch_timeout_must_be_seconds_above_zero(
        bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    from trainjob_client.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["watch", "x", f"--timeout={bad}"])
    assert exited.value.code == 2
    assert f"argument --timeout: {bad!r} is not a number of seconds > 0" in capsys.readouterr().err


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": server}}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    return path


def test_an_api_server_that_does_not_answer_is_an_error_line_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Against a loopback port where nothing listens (refused at once): exit 1 and one
    ``error:`` line naming the server, as documented, for each command."""
    from localdev.cluster.processes import free_port
    from trainjob_client.cli import main

    server = f"http://127.0.0.1:{free_port()}"
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", server)
    for argv, verb in ((["progress"], "list"), (["progress", "-A"], "list"),
                       (["watch", "x"], "get")):
        assert main([*argv, "--kubeconfig", str(kubeconfig)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: cannot {verb} trainjobs.trainer.kubeflow.org"), err
        assert f"the API server {server} did not answer" in err, err
        assert "Traceback" not in err and len(err.splitlines()) == 1, err


def test_a_kubeconfig_that_is_not_yaml_is_named_in_the_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainjob_client.cli import main

    bad = tmp_path / "bad.kubeconfig"
    bad.write_text("this: is: not: yaml: [\n")
    assert main(["progress", "--kubeconfig", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: kubeconfig {bad} is not valid YAML: "), err
    assert "Traceback" not in err


@pytest.mark.parametrize("content", [b"- a\n- b\n", b"just a string\n", b"\x00\xff\xfe"])
def test_a_file_that_is_no_kubeconfig_is_an_error_line(
        tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    """A YAML list, a scalar, bytes that are not UTF-8: one ``error:`` line each (they
    were TypeError and UnicodeDecodeError tracebacks)."""
    from trainjob_client.cli import main

    bad = tmp_path / "kubeconfig"
    bad.write_bytes(content)
    assert main(["progress", "--kubeconfig", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: kubeconfig {bad}"), err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err


def test_a_server_that_is_no_api_server_is_an_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A loopback HTTP server answering 200 text/plain to everything."""
    from tests.helpers.silent_server import PlainTextServer
    from trainjob_client.cli import main

    server = PlainTextServer()
    try:
        address = server.url
        kubeconfig = _kubeconfig(tmp_path / "kubeconfig", address)
        assert main(["progress", "--kubeconfig", str(kubeconfig)]) == 1
    finally:
        server.stop()
    err = capsys.readouterr().err
    assert err.startswith("error: cannot list trainjobs.trainer.kubeflow.org: the server "
                          f"{address} answered str, not a Kubernetes object"), err


def test_a_name_with_all_namespaces_is_a_bad_argument(capsys: pytest.CaptureFixture[str]) -> None:
    from trainjob_client.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["progress", "train", "-A"])
    assert exited.value.code == 2
    assert "a TrainJob NAME and -A/--all-namespaces exclude each other" in capsys.readouterr().err


def test_watch_gives_up_within_its_timeout_against_a_hung_api_server(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A server that accepts and never answers: ``watch --timeout 3`` took 21 s (the
    request's own 20 s read timeout) before each request was bounded by it."""
    import time

    from tests.helpers.silent_server import SilentServer
    from trainjob_client.cli import main

    server = SilentServer()
    try:
        kubeconfig = _kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{server.port}")
        started = time.monotonic()
        code = main(["watch", "x", "--timeout", "3", "--kubeconfig", str(kubeconfig)])
        took = time.monotonic() - started
    finally:
        server.stop()
    assert code == 1
    assert took < 3 + 2, took
    assert "did not answer" in capsys.readouterr().err


class _FakeApi:
    """A loopback HTTP server that answers a TrainJob GET with a minimal object and a
    watch with ``watch_body`` (then closes): not an API server, a stand-in for one
    behind a proxy that cuts long requests, or for a server that is no API server."""

    def __init__(self, watch_body: bytes) -> None:
        import http.server
        import threading

        fake = self
        self.watches = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if "watch=" in self.path:
                    fake.watches += 1
                    body, kind = watch_body, "text/plain"
                else:
                    body = json.dumps({"apiVersion": "trainer.kubeflow.org/v1alpha1",
                                       "kind": "TrainJob", "metadata": {
                                           "name": "x", "namespace": "default",
                                           "resourceVersion": "1"}}).encode()
                    kind = "application/json"
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _watch_three_seconds(tmp_path: Path, watch_body: bytes) -> tuple[int, int]:
    """``watch x --timeout 3`` against a :class:`_FakeApi`: (exit code, watch requests)."""
    from trainjob_client.cli import main

    fake = _FakeApi(watch_body)
    try:
        kubeconfig = _kubeconfig(tmp_path / "kubeconfig", fake.url)
        code = main(["watch", "x", "--timeout", "3", "--kubeconfig", str(kubeconfig)])
    finally:
        fake.stop()
    return code, fake.watches


def test_a_watch_cut_at_once_is_renewed_with_pauses_not_in_a_hot_loop(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A newcomer's find: a watch answered with an empty 200 was requested again at
    once, 2417 times in 3 s.  Now the pauses double from 0.5 s: at most a handful."""
    code, watches = _watch_three_seconds(tmp_path, b"")
    assert code == 1  # the TrainJob did not end within --timeout
    assert 1 <= watches <= 5, watches
    assert "did not end within --timeout=3s" in capsys.readouterr().err


def test_a_watch_answered_with_no_json_is_an_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = _watch_three_seconds(tmp_path, b"hello\n")
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith('error: cannot watch trainjobs.trainer.kubeflow.org "x" in namespace '
                          '"default": the server http://127.0.0.1:'), err
    assert "sent an event that is not a Kubernetes object" in err, err
    assert "Traceback" not in err


@given(st.text())
def test_printable_leaves_no_control_character_and_keeps_printable_text(text: str) -> None:
    from trainjob_client.table import printable

    shown = printable(text)
    assert shown.isprintable()
    if text.isprintable():
        assert shown == text


def test_a_metric_with_terminal_escapes_is_shown_escaped_in_the_table() -> None:
    # A status written by anyone reaches the operator's terminal: no escape sequence or
    # newline of it may act there.
    from trainjob_client.table import header, printable

    assert printable("\x1b[2J\x1b[31mHACKED") == "\\x1b[2J\\x1b[31mHACKED"
    assert header(["a\nb"])[-1] == "A\\nB"
