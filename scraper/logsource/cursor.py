"""Where the bytes of a pods/log answer that were not applied yet begin.

Reads of one log overlap: a read starts at ``sinceTime``, which has whole seconds, or,
after a read cut at ``limitBytes``, at a short tail; either may begin anywhere inside
what an earlier read applied, even inside a line.  Timestamps cannot say where: the
kubelet writes one only where a line starts (the 16 KiB partial entries of a tqdm bar
redrawn with ``\\r`` come joined behind the line's first timestamp, and a ``sinceTime``
read that starts inside a line has none, see :mod:`.segments`).  The bytes can: the
cursor keeps the last :data:`WINDOW_BYTES` bytes applied, which end where a complete
segment ends, and finds them in the next answer's content:

* the whole window is in the answer: the new bytes begin after its last occurrence;
* the answer is the window's end (the log has not grown): it has nothing new.  Every
  answer reaches the log's end, at or after the end of what was applied, so old bytes
  found elsewhere in the window are a repeat of short text, not this answer;
* the answer begins inside the window (a suffix of the window is a prefix of the
  answer): the new bytes begin after that prefix;
* neither: the answer begins after everything applied (output came faster than the
  reads) and its first segment may be cut.

So a read applied twice, or any overlap of reads of the same bytes, applies each
segment once.  Text that repeats exactly over more than the window (the same
lines printed again and again) can make an occurrence later than the true one:
segments are then skipped, never applied twice (a skipped redraw is followed by a
newer one).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bytes of applied content kept to find in the next answer: many tqdm redraws with
#: their postfix, so the window is unique in a real log.
WINDOW_BYTES = 4096


@dataclass
class ReadCursor:
    """The end of what was applied of one log (see the module docstring)."""

    applied: bytes = b""  # the last WINDOW_BYTES bytes applied (content, no timestamps)

    def new_from(self, content: bytes) -> int | None:
        """The offset in ``content`` where bytes not applied yet begin, or None when
        ``content`` shares none with what was applied (or nothing was)."""
        window = self.applied
        if not window:
            return None
        at = content.rfind(window)
        if at >= 0:
            return at + len(window)
        if window.endswith(content):
            return len(content)  # nothing newer than what was applied
        return self._overlap(content) or None

    def _overlap(self, content: bytes) -> int:
        """The longest prefix of ``content`` that is a suffix of the window (0: none)."""
        window = self.applied
        if not content:
            return 0
        lead = content[:1]
        # The smallest start in the window gives the longest overlap: stop at the first.
        at = window.find(lead, 1)
        while at >= 0:
            length = len(window) - at
            if length <= len(content) and content.startswith(window[at:]):
                return length
            at = window.find(lead, at + 1)
        return 0

    def advance(self, content: bytes, start: int | None, end: int) -> None:
        """Mark ``content[:end]`` applied; ``start``: what :meth:`new_from` returned."""
        if start is None:
            if end > 0:  # else keep the window: nothing complete was in this answer
                self.applied = content[max(0, end - WINDOW_BYTES):end]
        elif end > start:
            self.applied = (self.applied + content[start:end])[-WINDOW_BYTES:]
