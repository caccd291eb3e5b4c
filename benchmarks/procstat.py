"""CPU seconds and resident memory of a process, read from ``/proc`` (Linux only)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | str = "self") -> float:
    """utime + stime of ``pid`` (fields 14 and 15 of ``/proc/<pid>/stat``), in seconds.

    Threads are included; children are not.
    """
    with open(f"/proc/{pid}/stat") as handle:
        text = handle.read()
    # The command name (field 2) may hold spaces; everything after its ')' is split safely.
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def cpu_seconds_of(pid: int | None) -> float | None:
    """:func:`cpu_seconds` of ``pid``; None when there is no pid or the process is gone."""
    if pid is None:
        return None
    with contextlib.suppress(OSError):
        return cpu_seconds(pid)
    return None


def cpu_used(before: Mapping[str, float | None],
             after: Mapping[str, float | None]) -> dict[str, float | None]:
    """CPU-seconds each named process used between two readings of
    :func:`cpu_seconds_of` (None where either reading is missing)."""
    out: dict[str, float | None] = {}
    for k, x in before.items():
        y = after.get(k)
        out[k] = None if x is None or y is None else y - x
    return out


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size (``VmRSS`` of ``/proc/<pid>/status``) in bytes; 0 when unknown."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
