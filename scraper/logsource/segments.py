"""A pods/log answer read with ``timestamps=true``, cut into timed text segments.

What the API server relays is the kubelet's rendering of the CRI log file.  The
kubelet's reader (``k8s.io/cri-client/pkg/logs``, which kwok's server uses too) puts an
entry's timestamp in front of it only when the entry starts a line: the 16 KiB partial
entries of a long line (a tqdm bar redrawn with ``\\r`` only) come joined, behind the
timestamp of the line's first entry, and an answer that ``sinceTime`` starts inside a
line begins with no timestamp at all (one cut by ``tailLines`` begins with its first
entry's).  Older kubelets put a timestamp in front of every entry; those inside a
line are removed here.  :func:`strip` turns an answer into its content (the bytes the
training printed, lines joined by ``\\n``) and the timestamps of the lines that had one.

A segment is what a terminal would show as one redraw: the text between two ``\\r``
or ``\\n``.  A segment is *complete* when a ``\\r`` or ``\\n`` follows it, or when it
is the last output of a container that has terminated; the last segment of a line the
runtime has not ended yet may be cut anywhere and is not complete.  A segment that ends
with a cursor-up code (``ESC[A``) is *nested*: tqdm draws a bar at ``position > 0`` that
way (an eval bar inside a training bar).

Bounds: a segment longer than :data:`SEGMENT_MAX_CHARS` is dropped before any pattern
runs on it, and every regex here is linear, so the cost of a read is linear in its
bytes whatever the training printed.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from datetime import UTC, datetime

#: Longest segment looked at (characters): a progress bar with its postfix is far shorter.
SEGMENT_MAX_CHARS = 4096
_TS = rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)"
_LEADING_TS = re.compile(rb"(" + _TS + rb") ")
_INNER_TS = re.compile(_TS + rb" ")
_TS_PARTS = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")
_END = re.compile(rb"[\r\n]")
#: CSI (``ESC [ ... final``) and two-byte escapes; backspaces (Keras erases with them).
_ANSI = re.compile(r"\x1b\[[0-9;?]{0,32}[ -/]{0,4}[@-~]|\x1b[@-Z\\-_]|[\x08\x00]")
_CURSOR_UP = "\x1b[A"


@dataclass(frozen=True)
class Segment:
    """One redraw or line: its text (cleaned), when it was printed, what follows it."""

    text: str
    timestamp: str  # RFC 3339 of its line as the kubelet wrote it ("" when it had none)
    complete: bool
    nested: bool
    line_end: bool  # a "\n" follows (else a "\r", or nothing yet)


@dataclass(frozen=True)
class Answer:
    """A pods/log answer without its timestamps.

    ``content``: the bytes the training printed, lines joined by ``\\n`` (the answer's
    first line may begin anywhere in a line); ``stamps``: ``(offset in content, RFC
    3339 timestamp)`` of each line start that carried one, in order.
    """

    content: bytes
    stamps: tuple[tuple[int, str], ...] = ()

    def stamp_at(self, line_start: int) -> str:
        """The timestamp of the line that starts at ``line_start``, or ""."""
        index = bisect.bisect_left(self.stamps, (line_start, ""))
        if index < len(self.stamps) and self.stamps[index][0] == line_start:
            return self.stamps[index][1]
        return ""


def parse_time(text: str) -> datetime | None:
    """A kubelet timestamp (RFC 3339, up to nanoseconds) as an aware UTC datetime, or None."""
    match = _TS_PARTS.fullmatch(text)
    if match is None:
        return None
    base, fraction, zone = match.groups()
    micro = (fraction or "").ljust(6, "0")[:6]
    try:
        return datetime.fromisoformat(f"{base}.{micro}{zone}").astimezone(UTC)
    except ValueError:
        return None


def clean(text: str) -> str:
    """``text`` without ANSI escape codes and backspaces, stripped of blanks."""
    return _ANSI.sub("", text).strip()


def strip(body: bytes) -> Answer:
    """``body`` (a pods/log answer with ``timestamps=true``) as its content and the
    timestamps of its lines (see the module docstring)."""
    lines = body.split(b"\n")
    out = bytearray()
    stamps: list[tuple[int, str]] = []
    for index, line in enumerate(lines):
        match = _LEADING_TS.match(line)
        if match is not None:
            stamps.append((len(out), match.group(1).decode()))
            line = line[match.end():]
        out += _INNER_TS.sub(b"", line)
        if index < len(lines) - 1:
            out += b"\n"
    return Answer(bytes(out), tuple(stamps))


def segments_of(answer: Answer, start: int, *, ended: bool,
                trust_first: bool) -> tuple[list[Segment], int]:
    """The segments of ``answer.content`` from offset ``start`` (a segment's start when
    ``trust_first``, else anywhere: the first one is then dropped when a ``\r`` ends
    it), oldest first, and the offset where the complete ones end (what a later read
    need not bring again).

    ``ended``: the container has terminated, so the content's last bytes are final.
    Bytes that are not UTF-8 become U+FFFD.
    """
    content = answer.content
    out: list[Segment] = []
    line_start = content.rfind(b"\n", 0, start) + 1
    position = consumed = start
    first = True
    while position < len(content):
        end_match = _END.search(content, position)
        end = end_match.start() if end_match is not None else len(content)
        if end_match is None and not ended:
            break  # the runtime may not have stored the rest of this redraw yet
        piece = content[position:end]
        line_end = end_match is not None and end_match.group() == b"\n"
        # An untrusted first piece that a \r ends may be the tail of a cut redraw.
        cut = first and not trust_first and end_match is not None and not line_end
        if not cut and len(piece) <= 4 * SEGMENT_MAX_CHARS:
            text = piece.decode("utf-8", errors="replace")
            cleaned = clean(text) if len(text) <= SEGMENT_MAX_CHARS else ""
            if cleaned:
                out.append(Segment(text=cleaned, timestamp=answer.stamp_at(line_start),
                                   complete=True,
                                   nested=text.rstrip().endswith(_CURSOR_UP),
                                   line_end=line_end))
        first = False
        position = consumed = end + 1 if end_match is not None else len(content)
        if line_end:
            line_start = position
    return out, consumed


def split(body: bytes, *, ended: bool, trust_first: bool = False) -> list[Segment]:
    """The complete segments of a pods/log answer, oldest first.

    ``ended``: the container has terminated, so the answer's last bytes are final.
    ``trust_first``: the answer begins at the start of a line (else its first
    segment, when a ``\r`` ends it, may be the tail of a cut redraw and is dropped).
    """
    return segments_of(strip(body), 0, ended=ended, trust_first=trust_first)[0]
