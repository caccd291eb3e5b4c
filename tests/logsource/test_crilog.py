"""The pod runner's CRI log writer splits output as containerd's CRI logger does."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localdev.cluster import crilog

MAX = 16


def entries(path: Path) -> list[tuple[str, str, bool, bytes]]:
    data = path.read_bytes()
    assert data.endswith(b"\n") or not data
    return [crilog.parse_entry(line) for line in data.split(b"\n")[:-1]]


def write(tmp_path: Path, chunks: list[tuple[str, bytes]]) -> list[tuple[str, str, bool, bytes]]:
    path = tmp_path / "c" / "0.log"
    path.unlink(missing_ok=True)
    writer = crilog.CriLogWriter(path, max_line_bytes=MAX)
    for stream, data in chunks:
        writer.feed(stream, data)
    writer.close()
    return entries(path)


def test_newline_ends_an_entry_carriage_return_stays(tmp_path: Path) -> None:
    got = write(tmp_path, [("stdout", b"a\rb\nc\r\n")])
    assert [(s, p, c) for _, s, p, c in got] == [("stdout", False, b"a\rb"),
                                                   ("stdout", False, b"c")]


def test_long_line_is_cut_into_partial_entries_of_the_maximum(tmp_path: Path) -> None:
    got = write(tmp_path, [("stdout", b"x" * (2 * MAX + 3) + b"\n" + b"y" * MAX + b"\n")])
    assert [(p, len(c)) for _, _, p, c in got] == [(True, MAX), (True, MAX), (False, 3),
                                                   (False, MAX)]


def test_output_ending_without_newline_is_a_partial_entry(tmp_path: Path) -> None:
    got = write(tmp_path, [("stderr", b"tail")])
    assert [(s, p, c) for _, s, p, c in got] == [("stderr", True, b"tail")]


def test_timestamps_are_go_rfc3339nano() -> None:
    assert crilog.timestamp(1_700_000_000_123_450_000) == "2023-11-14T22:13:20.12345Z"
    assert crilog.timestamp(1_700_000_000_000_000_000) == "2023-11-14T22:13:20Z"


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["stdout", "stderr"]),
                          st.binary(max_size=60) | st.sampled_from([b"\n", b"\r", b"\r\n"])),
                max_size=20))
def test_each_stream_reassembles_and_no_entry_exceeds_the_maximum(
        tmp_path: Path, chunks: list[tuple[str, bytes]]) -> None:
    got = write(tmp_path, chunks)
    for stream in ("stdout", "stderr"):
        sent = b"".join(d for s, d in chunks if s == stream)
        back = b"".join(c if p else c + b"\n" for _, s, p, c in got if s == stream)
        # "\r\n" ends a line as "\n" does: one "\r" before a "\n" goes.
        *lines, rest = sent.split(b"\n")
        assert back == b"".join(line.removesuffix(b"\r") + b"\n" for line in lines) + rest
        assert all(len(c) <= MAX for _, s, _, c in got if s == stream)
        # A partial entry is full-sized unless it is the stream's last.
        own = [(p, c) for _, s, p, c in got if s == stream]
        assert all(len(c) == MAX for p, c in own[:-1] if p)
