"""Real framework output for the log parsers' tests.

Each training in ``tests/trainings`` runs as a child process with its stdout and
stderr stored by the pod runner's own CRI writer (:mod:`localdev.cluster.crilog`, the
runtime's split), then rendered as the kubelet renders a CRI file for
``pods/log?timestamps=true`` (``k8s.io/cri-client/pkg/logs``, which kwok serves too:
an entry's content, a ``\\n`` after a full entry only, and the entry's timestamp and a
space in front only where a line starts, i.e. for the first entry sent and after a
full one; ``sinceTime`` skips older entries, but a skipped partial entry still means
the next one continues its line).  Nothing here is typed by hand: the bytes are what
tqdm, Keras, Lightning and Transformers printed.
"""

from __future__ import annotations

import calendar
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from localdev.cluster import crilog

REPO = Path(__file__).resolve().parents[2]
TRAININGS = REPO / "tests" / "trainings"


Entry = tuple[str, str, bool, bytes]


@dataclass(frozen=True)
class Captured:
    """One real run: its raw output, its CRI entries ``(time, stream, partial, content)``."""

    raw: bytes
    entries: list[Entry]

    def pods_log(self, upto: int | None = None) -> bytes:
        """The kubelet's ``timestamps=true`` rendering of the first ``upto`` entries."""
        return render(self.entries[:upto])


def render(entries: list[Entry], *, since: str | None = None, skip: int = 0,
           every_entry: bool = False) -> bytes:
    """The kubelet's ``timestamps=true`` answer for ``entries`` (the tail it starts at),
    with ``sinceTime`` ``since`` (or the first ``skip`` entries skipped as it skips
    them); ``every_entry``: a timestamp in front of every entry, as older kubelets
    wrote."""
    floor = None if since is None else since_floor(since)
    out = bytearray()
    new_line = True
    for index, (stamp, _, partial, content) in enumerate(entries):
        if index >= skip and (floor is None or entry_time(stamp) >= floor):
            if new_line or every_entry:
                # The kubelet writes RFC3339Nano with a fixed 9-digit fraction.
                head, _, frac = stamp.removesuffix("Z").partition(".")
                out += f"{head}.{frac.ljust(9, '0')}Z ".encode()
            out += content + (b"" if partial else b"\n")
        new_line = not partial
    return bytes(out)


def entry_time(stamp: str) -> int:
    """A CRI entry's timestamp in nanoseconds since the epoch."""
    head, _, frac = stamp.removesuffix("Z").partition(".")
    seconds = calendar.timegm(time.strptime(head, "%Y-%m-%dT%H:%M:%S"))
    return seconds * 1_000_000_000 + int(frac.ljust(9, "0") or 0)


def since_floor(since: str) -> int:
    """``sinceTime`` (RFC 3339, whole seconds: ``metav1.Time``) in nanoseconds."""
    assert since.endswith("Z") and "." not in since, since
    return entry_time(since)


def serve(entries: list[Entry], *, since: str | None, tail: int, limit_bytes: int) -> bytes:
    """What the kubelet answers ``pods/log?timestamps=true&tailLines=..&limitBytes=..
    &sinceTime=..`` with when ``entries`` are stored: the last ``tail`` entries, those
    before ``since`` skipped, the answer cut at ``limit_bytes`` from its start."""
    return render(entries[-tail:] if tail else [], since=since)[:limit_bytes]


def capture(script: str, tmp: Path, **env: str) -> Captured:
    """Run ``tests/trainings/<script>`` and store its output as the pod runner does."""
    cri = Path(tempfile.mkdtemp(dir=tmp)) / "0.log"
    writer = crilog.CriLogWriter(cri)
    proc = subprocess.Popen(
        [sys.executable, str(TRAININGS / script)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, cwd=tmp,
        env={**os.environ, "KERAS_BACKEND": "torch", "PYTHONUNBUFFERED": "1", **env})
    raw = bytearray()
    lock = threading.Lock()

    def pump(fd: int, stream: str) -> None:
        while data := os.read(fd, 65536):
            with lock:
                raw.extend(data)
            writer.feed(stream, data)
        writer.close_stream(stream)

    assert proc.stdout is not None and proc.stderr is not None
    threads = [threading.Thread(target=pump, args=(proc.stdout.fileno(), crilog.STDOUT)),
               threading.Thread(target=pump, args=(proc.stderr.fileno(), crilog.STDERR))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert proc.wait(timeout=300) == 0, bytes(raw)[-3000:].decode(errors="replace")
    writer.close()
    entries = [crilog.parse_entry(line) for line in cri.read_bytes().split(b"\n")[:-1]]
    return Captured(bytes(raw), entries)


@pytest.fixture(scope="session")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Captured]:
    """Every training's real output, run once per test session (tiny models, few steps)."""
    tmp = tmp_path_factory.mktemp("captures")
    return {
        "tqdm": capture("tqdm_loop.py", tmp, STEPS="30", SLEEP="0.01", EVAL_EVERY="10"),
        "tqdm_auto": capture("tqdm_loop.py", tmp, STEPS="400", SLEEP="0.001", TQDM_AUTO="1",
                             MININTERVAL="0"),  # a \r bar over 16 KiB: partial entries
        "keras1": capture("keras_fit.py", tmp, VERBOSE="1", EPOCHS="3", STEPS="6",
                          SLEEP="0.02"),
        "keras2": capture("keras_fit.py", tmp, VERBOSE="2", EPOCHS="3", STEPS="6"),
        "transformers": capture("transformers_trainer.py", tmp, STEPS="12", EVAL_STEPS="4",
                                OUTPUT_DIR=str(tmp / "hf")),
        "lightning_rich": capture("lightning_bar.py", tmp, EPOCHS="3", STEPS="5"),
        "lightning_tqdm": capture("lightning_bar.py", tmp, EPOCHS="3", STEPS="5",
                                  LIGHTNING_BAR="tqdm"),
        "katib": capture("katib_lines.py", tmp, EPOCHS="4", SLEEP="0"),
        "tqdm_epochs": capture("tqdm_loop.py", tmp, STEPS="10", SLEEP="0.01", EPOCHS="3"),
        # Issue 27's bar: update(1) and a postfix per step, redrawn only with \r, over
        # several 16 KiB partial entries.
        "tqdm_manual": capture("tqdm_loop.py", tmp, STEPS="900", SLEEP="0.002",
                               MANUAL="1", MININTERVAL="0"),
    }
