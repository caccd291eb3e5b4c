"""Adversarial input for the log parsers: no crash, no wrong write, bounded cost.

"No wrong write" is checked as: garbage mixed into a real run's log never gives a
progress above what the run's own bar showed, never a status that breaks a Trainer
API limit (``TrainerStatus.from_api`` would raise), never an exception.  The cost
checks compare work on a megabyte with work on a tenth of it (a ratio, not a time
limit): a quadratic regex would show a ratio near 100, a linear one near 10.
"""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from scraper.logsource.progress import LogProgress
from scraper.logsource.segments import SEGMENT_MAX_CHARS, split
from tests.logsource.conftest import Captured

TS = b"2026-12-01T22:00:00.000000000Z "
#: Bytes the parsers' patterns care about, to make near-misses likely.
NEAR = st.sampled_from([b"%|", b"|", b"/", b" [", b"<", b":", b"]", b", ", b"=", b"\r", b"\n",
                        b"\x1b[A", b"\x1b[1m", b"\x1b[0m", b"\x08", b"Epoch 1/3", b" - loss: ",
                        b"{'loss': '", b"'}", b"ms/step", b"0", b"9", b"100", b"1e5", b"nan",
                        b"\xff", b"\xc3", b"\xe2\x94\x81", b" ", b"it/s"])
GARBAGE = st.lists(NEAR | st.binary(max_size=8), max_size=200).map(b"".join)


def feed(body: bytes, *, ended: bool = False) -> LogProgress:
    progress = LogProgress()
    progress.feed(split(body, ended=ended))
    progress.status()  # raises StatusError on a limit broken: the test fails
    return progress


@settings(max_examples=300, deadline=None)
@given(GARBAGE, st.booleans())
def test_garbage_never_raises(body: bytes, ended: bool) -> None:
    feed(body, ended=ended)
    feed(TS + body.replace(b"\n", b"\n" + TS), ended=ended)


@settings(max_examples=60, deadline=None)
@given(st.lists(GARBAGE, min_size=1, max_size=5), st.data())
def test_garbage_in_a_real_log_never_raises_progress_past_the_bar(
        captures: dict[str, Captured], junk: list[bytes], data: st.DataObject) -> None:
    captured = captures[data.draw(st.sampled_from(["tqdm", "keras1", "transformers"]))]
    upto = data.draw(st.integers(1, len(captured.entries)))
    clean = LogProgress()
    clean.feed(split(captured.pods_log(upto), ended=False))
    truth = clean.fraction
    lines = captured.pods_log(upto).split(b"\n")
    for piece in junk:
        # Never after the last line: that would end it, and a cut redraw would count.
        at = data.draw(st.integers(0, len(lines) - 1))
        # A whole garbage line, or garbage spliced into a line (ANSI, \r storms, bad bytes).
        lines.insert(at, TS + piece.replace(b"\n", b" "))
    mixed = feed(b"\n".join(lines))
    forged = any(m in p for p in junk for m in (b"%|", b"Epoch", b"ms/step"))
    # Only garbage that holds a bar's own markers could carry a reading of its own.
    assert mixed.fraction == truth or forged, (mixed.fraction, truth)


def test_a_megabyte_line_without_newline_is_bounded() -> None:
    line = TS + (b"\r 50%|#####     | 5/10 [00:01<00:01, 5.0it/s]" * 2 + b"x" * 1_000_000)
    progress = feed(line, ended=True)
    # The first bar counts; the second runs into the megabyte: one segment over the
    # limit, not read at all.
    assert progress.fraction == 0.5 and progress.readings == 1
    assert all(len(s.text) <= SEGMENT_MAX_CHARS for s in split(line, ended=True))


def _cost(body: bytes) -> float:
    started = time.process_time()
    feed(body, ended=True)
    return time.process_time() - started


def test_cost_is_linear_in_the_bytes_read() -> None:
    unit = (b"\r 9%|#| 9/1 [0:0<0:0, 9" + b"1/" * 40 + b"\x1b[1m" + b"=" * 30 + b"{'a': '"
            + b"Epoch 1/" + b" - a: 1" * 20 + b"\xff\r\r\r" + b"a=1 " * 30)
    small = TS + unit * (100_000 // len(unit))
    large = TS + unit * (1_000_000 // len(unit))
    ratios = []
    for _ in range(3):
        ratios.append(_cost(large) / max(_cost(small), 1e-6))
    print(f"cost ratio 1 MB / 100 kB: {min(ratios):.1f}")
    assert min(ratios) < 30


def test_carriage_return_storm_and_ansi_are_harmless() -> None:
    storm = TS + b"\r" * 200_000 + b"\x1b[2K\x1b[1A" * 10_000 + b"\n"
    assert feed(storm, ended=True).status() is None
