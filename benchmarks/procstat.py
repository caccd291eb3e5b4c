"""CPU seconds and resident memory of a process, read from ``/proc`` (Linux only)."""

from __future__ import annotations

import os

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


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size (``VmRSS`` of ``/proc/<pid>/status``) in bytes; 0 when unknown."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
