"""Reads that overlap, repeat or are cut give the status one read of the whole log gives.

Issue 27, point 2: a tqdm bar redrawn with ``\\r`` only (``update(1)`` and a postfix per
step) lost its progress for seconds while it ran.  A read starts at ``sinceTime``
(whole seconds) or, after a read cut at ``limitBytes``, at a short tail, so it brings
again bytes applied before, often from inside the bar's line; applied twice, the
earlier redraws read as a lower count after a higher one ("a new bar started") and
progress was left out.  The kubelet writes a timestamp only where a line starts (the
16 KiB partial entries of the bar come joined behind one), so where a read begins is
found by its bytes (:mod:`scraper.logsource.cursor`).

The logs here are real runs' (``tests/trainings``, stored by the pod runner's CRI
writer) rendered as the kubelet renders them (:func:`tests.logsource.conftest.render`);
the reads go through the real parser and, below, the real
:class:`~scraper.logsource.reader.LogScraper` (its ``sinceTime``, its cut read and the
shorter tail after it).  What stands in: the pods/log endpoint, served from the
captured entries as the kubelet serves a CRI file
(:func:`tests.logsource.conftest.serve`); the real endpoint is read in
tests/e2e/test_log_source.py.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tqdm import tqdm

from exporter_lib.status import TrainerStatus
from scraper.logsource.cursor import ReadCursor
from scraper.logsource.progress import LogProgress
from scraper.logsource.reader import LogLimits, LogScraper
from scraper.logsource.segments import segments_of, split, strip
from scraper.shared.scrapes import Fresh
from scraper.shared.targets import Target
from tests.logsource.conftest import Captured, Entry, entry_time, render, serve

TARGET = Target("ns", "job", "job-node-0-0", "uid-1", "http://127.0.0.1:1/", 1.0,
                source="logs", log_container="node")

#: The session's captures, for the hypothesis tests (a fixture argument of theirs would be
#: printed whole with every falsifying example).
CAPTURES: dict[str, Captured] = {}


@pytest.fixture
def logs(captures: dict[str, Captured]) -> dict[str, Captured]:
    CAPTURES.update(captures)
    return CAPTURES


def state_of(progress: LogProgress) -> tuple[Any, ...]:
    """What a LogProgress knows of the run (not when: a read that starts inside a line
    has no timestamp for it, so ``lastUpdatedTime`` may be older, never newer)."""
    return (progress.fraction, progress.remaining, dict(progress.metrics), progress.plain,
            progress.repeating, progress.main_bar, progress.epoch)


def one_read(entries: list[Entry], *, ended: bool = False) -> LogProgress:
    progress = LogProgress()
    progress.read(render(entries), ended=ended, from_start=True)
    return progress


def without_time(status: TrainerStatus | None) -> TrainerStatus | None:
    return None if status is None else status.model_copy(update={"last_updated_time": None})


def check_progress(statuses: list[TrainerStatus | None]) -> list[int]:
    """Once given, progress is in every later status and never lower; returns it."""
    seen: list[int] = []
    for status in statuses:
        value = None if status is None else status.progress_percentage
        if seen:
            assert value is not None, (seen, status)
            assert value >= seen[-1], (seen, status)
        if value is not None:
            seen.append(value)
    return seen


def test_the_capture_is_a_bar_over_several_partial_entries(
        captures: dict[str, Captured]) -> None:
    """The capture is the issue's case: one line of redraws stored in partial entries,
    which the kubelet sends joined behind one timestamp."""
    entries = captures["tqdm_manual"].entries
    assert sum(partial for _, _, partial, _ in entries) >= 3, len(entries)
    # Two lines, each behind one timestamp: the bar's, and "done".
    assert len(strip(render(entries)).stamps) == 2


def test_the_same_read_twice_changes_nothing(captures: dict[str, Captured]) -> None:
    """The reproduction in-process: before the fix the second read of the same bytes made
    the bar "repeating" and its status had no progress."""
    entries = captures["tqdm_manual"].entries
    for upto in range(1, len(entries) + 1):
        once = one_read(entries[:upto])
        twice = one_read(entries[:upto])
        status = twice.status()
        assert twice.read(render(entries[:upto]), ended=False) == 0
        assert state_of(twice) == state_of(once)
        assert twice.status() == status
        assert status is None or status.progress_percentage is not None


def delimiter_entry(entries: list[Entry], start: int, end: int) -> int | None:
    """The last of ``entries[start:end]`` that holds a \\r or ends a line: the bytes a
    read of them applies end in it, so a read that overlaps them starts at or before it."""
    found = None
    for index in range(start, end):
        _, _, partial, content = entries[index]
        if b"\r" in content or not partial:
            found = index
    return found


@settings(max_examples=80, deadline=None)
@given(st.data())
@pytest.mark.usefixtures("logs")
def test_overlapping_reads_give_what_one_read_gives(data: st.DataObject) -> None:
    """Reads of a growing log, each starting anywhere at or before the end of what the
    read before applied (the tail's first entry with a timestamp, entries skipped as
    ``sinceTime`` skips them, so a read may begin inside a line without one), some
    repeated, in the kubelet's rendering or with a timestamp on every entry: the state
    is the one a single read of everything gives, and no status loses or lowers
    progress.  (Reads cut at ``limitBytes`` are the reader's, below: it reads a
    shorter tail after one.)"""
    name = data.draw(st.sampled_from(["tqdm_manual", "tqdm_auto", "keras1", "transformers",
                                      "tqdm_epochs", "lightning_rich", "tqdm"]))
    every_entry = data.draw(st.booleans())
    entries = CAPTURES[name].entries
    progress, statuses = LogProgress(), []
    tail, start, end, first = 0, 0, 0, True
    while end < len(entries):
        end = data.draw(st.integers(end + 1, min(len(entries), end + 4)))
        body = render(entries[tail:end], skip=start - tail, every_entry=every_entry)
        for _ in range(data.draw(st.integers(1, 2))):
            progress.read(body, ended=end == len(entries), from_start=first)
            statuses.append(progress.status())
        first = False
        last = delimiter_entry(entries, start, end)
        reach = start if last is None else last
        start = data.draw(st.integers(max(0, reach - 3), reach))
        tail = data.draw(st.integers(max(0, start - 2), start))
    once = one_read(entries, ended=True)
    assert state_of(progress) == state_of(once)
    check_progress(statuses)


def read_windows(content: bytes, cuts: list[tuple[int, int]]) -> tuple[list[str], int]:
    """Read ``content`` as windows that grow at the end and start anywhere before the
    end of what was applied (at least its last byte again, as a ``sinceTime`` read
    does); returns the texts of the segments applied and where the applied bytes end."""
    cursor, applied, done = ReadCursor(), [], 0
    for grow, back in sorted(cuts):
        stop = min(len(content), max(done, grow % (len(content) + 1)))
        begin = 0 if done == 0 else done - 1 - back % done
        window = content[begin:stop]
        at = cursor.new_from(window)
        assert (at is None) == (done == 0)
        segments, consumed = segments_of(strip(window), at or 0, ended=False,
                                         trust_first=True)
        cursor.advance(window, at, consumed)
        applied += [s.text for s in segments]
        done = begin + consumed
    return applied, done


def tqdm_stream(steps: list[tuple[int, str, int]], *, unique: bool) -> bytes:
    """Real tqdm redraws (``tqdm.format_meter``: counts that rise, stay, or start again
    as a new bar's) ended by ``\r``, and lines ended by ``\n``; ``unique``: each
    redraw's postfix names its index."""
    out, n = [], 0
    for index, (rise, end, width) in enumerate(steps):
        n = n + rise if rise else 0
        postfix = f"loss={1 / (n + 1):.4f}" + (f", i={index}" if unique else "")
        meter = tqdm.format_meter(n, 400, n * 0.01, postfix=postfix, prefix="train")
        out.append(("x" * width if end == "\n" else "") + meter + end)
    return "".join(out).encode()


STEPS = st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["\r", "\n"]),
                           st.integers(1, 9)), min_size=1, max_size=120)
CUTS = st.lists(st.tuples(st.integers(0, 10 ** 6), st.integers(0, 10 ** 6)), min_size=1,
                max_size=40)


@settings(max_examples=200, deadline=None)
@given(steps=STEPS, cuts=CUTS)
# A two-byte answer ("\n" applied + "x" new) that also occurs earlier in the cursor's
# window was once taken as all applied: the new bytes were skipped.
@example(steps=[(1, "\r", 1), (1, "\r", 1), (3, "\r", 1), (1, "\n", 1), (0, "\n", 1),
                (0, "\n", 1), (0, "\n", 1), (0, "\n", 1), (1, "\n", 1), (1, "\n", 1),
                (1, "\n", 7), (2, "\n", 9), (1, "\n", 9)],
         cuts=[(640, 0), (685461, 0)])
def test_any_overlap_of_the_same_bytes_applies_each_segment_once(
        steps: list[tuple[int, str, int]], cuts: list[tuple[int, int]]) -> None:
    """The byte rule alone, over redraws that differ: whatever the windows, the
    segments applied are the stream's up to where the applied bytes end, each once,
    in order, and the applied bytes end where a segment ends."""
    content = tqdm_stream(steps, unique=True)
    applied, done = read_windows(content, cuts)
    assert done == 0 or content[done - 1:done] in (b"\r", b"\n")
    assert applied == [s.text for s in split(content[:done], ended=False, trust_first=True)]


@settings(max_examples=200, deadline=None)
@given(steps=STEPS, cuts=CUTS)
def test_repeated_text_is_skipped_never_applied_twice(
        steps: list[tuple[int, str, int]], cuts: list[tuple[int, int]]) -> None:
    """Redraws that repeat exactly (the same count and postfix again): a window found
    later than where it truly is skips segments; none is applied twice or out of
    order (the applied ones are an ordered selection of the stream's)."""
    content = tqdm_stream(steps, unique=False)
    applied, _ = read_windows(content, cuts)
    stream = iter(s.text for s in split(content, ended=False, trust_first=True))
    assert all(text in stream for text in applied)  # consumes: in order, each once


class ServedLog(LogScraper):
    """The real LogScraper; its one request answered from captured CRI entries."""

    def __init__(self, entries: list[Entry], limits: LogLimits) -> None:
        super().__init__(None, limits)  # type: ignore[arg-type]  # no API: _get is served
        self.entries = entries
        self.visible = 0  # entries the runtime has stored so far

    async def _get(self, namespace: str, pod: str, container: str, since: str | None,
                   tail: int) -> bytes:
        return serve(self.entries[:self.visible], since=since, tail=tail,
                     limit_bytes=self.limits.limit_bytes)


def stretched(entries: list[Entry], factor: int) -> list[Entry]:
    """``entries`` with the time between them ``factor`` times longer (a run whose
    output spans many seconds, so ``sinceTime`` lands inside it)."""
    base = entry_time(entries[0][0])
    out = []
    for stamp, stream, partial, content in entries:
        ns = base + (entry_time(stamp) - base) * factor
        seconds, fraction = divmod(ns, 1_000_000_000)
        head = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        out.append((f"{head}.{fraction:09d}Z", stream, partial, content))
    return out


def follow(entries: list[Entry], reads: list[int], limits: LogLimits,
           ) -> tuple[list[TrainerStatus | None], TrainerStatus | None]:
    """Scrape the log after each count of stored entries in ``reads``, then read the
    final status once the container ended (the reading of the scrapes continued)."""
    served = ServedLog(entries, limits)

    async def run() -> tuple[list[TrainerStatus | None], TrainerStatus | None]:
        out: list[TrainerStatus | None] = []
        for visible in reads:
            served.visible = visible
            result = await served.scrape(TARGET)
            out.append(result.status if isinstance(result, Fresh) else None)
        served.visible = len(entries)
        return out, await served.final("ns", "job-node-0-0", "uid-1", "node")

    return asyncio.run(run())


def last_loss(captured: Captured) -> str:
    return re.findall(r"loss=([\d.]+)", captured.raw.decode())[-1]


@settings(max_examples=30, deadline=None)
@given(st.data())
@pytest.mark.usefixtures("logs")
def test_the_reader_at_any_moments_never_drops_or_lowers_progress(
        data: st.DataObject) -> None:
    """The real reader at any moments (repeated ones too), the run's output spread over
    up to minutes, and read bounds that never cut or cut often (then a three-entry
    tail): with bounds that never cut every live status is the one a single read of
    everything stored gives; with cutting bounds progress is never above it.  Either
    way it never disappears or goes back, and the final status has 100 % and the last
    loss."""
    captured = CAPTURES["tqdm_manual"]
    entries = stretched(captured.entries, data.draw(st.integers(1, 200)))
    count = len(entries)
    reads = sorted(data.draw(st.lists(st.integers(1, count), min_size=1, max_size=30)))
    small = data.draw(st.booleans())
    # Small: a read over three entries is cut, then read again with a three-entry tail.
    limits = LogLimits(limit_bytes=50_000) if small else LogLimits(limit_bytes=1 << 22)
    live, final = follow(entries, reads, limits)
    check_progress(live)
    for visible, status in zip(reads, live, strict=True):
        truth = one_read(entries[:visible]).status()
        if not small:
            assert without_time(status) == without_time(truth)
        elif status is not None and truth is not None:
            assert (status.progress_percentage or 0) <= (truth.progress_percentage or 0)
    assert final is not None and final.progress_percentage == 100
    assert final.metrics_dict()["loss"] == last_loss(captured)


def test_reads_of_every_entry_twice_keep_progress(captures: dict[str, Captured]) -> None:
    """The scrape of issue 27 at its worst: every stored entry read by two scrapes."""
    captured = captures["tqdm_manual"]
    entries = stretched(captured.entries, 50)
    reads = [n for n in range(1, len(entries) + 1) for _ in (0, 1)]
    live, final = follow(entries, reads, LogLimits())
    seen = check_progress(live)
    assert len(set(seen)) >= 3 and seen[-1] >= 99, seen  # read while it ran
    assert final is not None and final.progress_percentage == 100
