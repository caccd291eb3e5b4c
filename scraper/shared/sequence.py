"""The exporter's own order of its answers: ``<n>; start=<id>`` in
:data:`SEQUENCE_HEADER`.

An exporter numbers its status changes (``n`` only grows within one process, ``start``
names the process's start), so a late answer of the same process is recognised whatever
the clocks say (docs/scraper.md, "Other writers and time"; the scrape loop drops it,
:mod:`scraper.scrape.loop`).  Pure parsing and comparison; no Kubernetes, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter_lib.server import SEQUENCE_HEADER as EXPORTER_SEQUENCE_HEADER

#: The exporter's sequence header, ``<n>; start=<id>`` (defined with the exporter).
SEQUENCE_HEADER = EXPORTER_SEQUENCE_HEADER
_SEQUENCE = re.compile(r"^\s*(\d{1,19})\s*;\s*start\s*=\s*([0-9A-Za-z_-]{1,64})\s*$")


@dataclass(frozen=True)
class Sequence:
    """An exporter answer's place in its process's order: ``start`` names the process
    start, ``n`` counts its status changes."""

    start: str
    n: int


def sequence_of(header: str | None) -> Sequence | None:
    """The :data:`SEQUENCE_HEADER` value ``<n>; start=<id>``; None when absent or
    malformed (the answer is then not ordered by sequence)."""
    match = _SEQUENCE.match(header or "")
    if match is None:
        return None
    return Sequence(match.group(2), int(match.group(1)))


def is_late(last: Sequence | None, new: Sequence | None) -> bool:
    """True when ``new`` is an answer of the same exporter process older than ``last``
    (a late answer must not replace a newer one, whatever the clocks say)."""
    return (last is not None and new is not None and new.start == last.start
            and new.n < last.n)
