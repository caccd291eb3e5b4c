"""A pods/log answer read with ``timestamps=true``, cut into timed text segments.

What the API server relays is the kubelet's rendering of the CRI log file: each entry
is ``<RFC3339Nano timestamp> <content>``; a full entry ends with ``\\n``, a partial one
(a line over the runtime's 16 KiB) runs straight into the next entry's timestamp.  So
one line of the answer is one line the training printed, with a timestamp in front and
one more at each 16 KiB cut.

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

import re
from dataclasses import dataclass
from datetime import UTC, datetime

#: Longest segment looked at (characters): a progress bar with its postfix is far shorter.
SEGMENT_MAX_CHARS = 4096
_TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)"
_LEADING_TS = re.compile(rf"({_TS}) ")
_INNER_TS = re.compile(rf"{_TS} ")
_TS_PARTS = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")
#: CSI (``ESC [ ... final``) and two-byte escapes; backspaces (Keras erases with them).
_ANSI = re.compile(r"\x1b\[[0-9;?]{0,32}[ -/]{0,4}[@-~]|\x1b[@-Z\\-_]|[\x08\x00]")
_CURSOR_UP = "\x1b[A"


@dataclass(frozen=True)
class Segment:
    """One redraw or line: its text (cleaned), when it was printed, what follows it."""

    text: str
    timestamp: str  # RFC 3339 as the kubelet wrote it ("" when the answer had none)
    complete: bool
    nested: bool
    line_end: bool  # a "\n" follows (else a "\r", or nothing yet)
    #: The timestamp of the newest entry of its line, when the line has ended ("" while
    #: the runtime has not ended it): a line is read once (see LogProgress.feed).
    line_done_at: str = ""


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


def split(body: bytes, *, ended: bool, trust_first: bool = False) -> list[Segment]:
    """The segments of a pods/log answer, oldest first.

    ``ended``: the container has terminated, so the answer's last bytes are final.
    ``trust_first``: the answer begins at the start of a line (else its first
    segment may be the tail of a cut redraw and is dropped).  Bytes that are not
    UTF-8 become U+FFFD.
    """
    text = body.decode("utf-8", errors="replace")
    lines = text.split("\n")
    out: list[Segment] = []
    last = len(lines) - 1
    for index, line in enumerate(lines):
        if index == last and not line:
            break
        match = _LEADING_TS.match(line)
        stamp = match.group(1) if match else ""
        content = line[match.end():] if match else line
        # The timestamps of the partial entries after the first (16 KiB cuts).
        inner = _INNER_TS.findall(content)
        newest = inner[-1].strip() if inner else stamp
        content = _INNER_TS.sub("", content)
        terminated = index < last
        done_at = newest if terminated else ""
        pieces = content.split("\r")
        for number, piece in enumerate(pieces):
            final_piece = number == len(pieces) - 1
            if index == 0 and number == 0 and not trust_first and len(pieces) > 1:
                continue
            if len(piece) > SEGMENT_MAX_CHARS:
                continue
            complete = not final_piece or terminated or ended
            cleaned = clean(piece)
            if not cleaned:
                continue
            out.append(Segment(text=cleaned, timestamp=stamp, complete=complete,
                               nested=piece.rstrip().endswith(_CURSOR_UP),
                               line_end=final_piece and terminated, line_done_at=done_at))
    return out
