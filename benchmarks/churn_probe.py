"""``python -m benchmarks.churn_probe REPORT_PATH -- SCRAPER_ARGS...``: the scraper with a probe.

Runs ``trainjob-scraper`` (:func:`scraper.cli.main`) unchanged in this process and, on
``SIGUSR1``, writes one JSON report to ``REPORT_PATH`` (then renames it into place):
RSS and ``/proc/self/smaps_rollup``, the glibc heap (``mallinfo2``), threads, the
count of live objects by type (``gc.get_objects``), the tracemalloc total and, when
tracing (``PYTHONTRACEMALLOC=25``), the top 15 allocation sites grown since the
previous report.  With ``TRAINJOB_CHURN_TRIM=1`` it then calls glibc's
``malloc_trim(0)`` and adds the RSS after it: memory that comes back there was free
heap glibc kept, not live objects.

Benchmark-only: the product never imports it.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import json
import os
import signal
import sys
import tempfile
import threading
import tracemalloc
from types import FrameType
from typing import Any


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


_LIBC = ctypes.CDLL("libc.so.6")
_LIBC.mallinfo2.restype = _Mallinfo2
_previous: tracemalloc.Snapshot | None = None


def _kib(path: str, prefix: str = "") -> dict[str, int]:
    out: dict[str, int] = {}
    with open(path) as handle:
        for line in handle:
            parts = line.split()
            if len(parts) >= 3 and parts[-1] == "kB" and line.startswith(prefix):
                out[parts[0].rstrip(":")] = int(parts[-2])
    return out


def _pymalloc() -> dict[str, int]:
    """pymalloc's own figures (``sys._debugmallocstats``, which writes to fd 2): its
    arenas are mmapped by CPython, outside glibc's heap and ``mallinfo2``."""
    wanted = {"# arenas allocated current": "arenas_current",
              "# arenas highwater mark": "arenas_highwater",
              "# bytes in allocated blocks": "allocated_bytes",
              "# bytes in available blocks": "available_bytes",
              "Total": "total_bytes"}
    saved = os.dup(2)
    with tempfile.TemporaryFile("w+") as out:
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        found: dict[str, int] = {}
        for line in out:
            head, _, value = line.rpartition("=")
            key = wanted.get(head.strip())
            if key and key not in found and value.strip().replace(",", "").isdigit():
                found[key] = int(value.strip().replace(",", ""))
    return found


def _connectors(objects: list[object]) -> list[dict[str, int]]:
    """Idle (pooled) and acquired connections of every aiohttp connector and every
    scrape pool (:class:`scraper.scrape.http_exchange.ConnectionPool`) alive (their private
    tables: this is a probe, not product code)."""
    import aiohttp

    from scraper.scrape.http_exchange import ConnectionPool
    out = []
    for obj in objects:
        if isinstance(obj, ConnectionPool):
            out.append({"idle": obj.idle_count(), "hosts": len(obj._idle),
                        "acquired": len(obj._in_use)})
        elif isinstance(obj, aiohttp.TCPConnector):
            conns = getattr(obj, "_conns", {})
            out.append({"idle": sum(len(v) for v in conns.values()), "hosts": len(conns),
                        "acquired": len(getattr(obj, "_acquired", ()))})
    return out


def report() -> dict[str, Any]:
    """The probe's figures now (module doc)."""
    global _previous
    gc.collect()
    objects = gc.get_objects()
    by_type = collections.Counter(type(o).__name__ for o in objects)
    connectors = _connectors(objects)
    del objects
    info = _LIBC.mallinfo2()
    out: dict[str, Any] = {
        "rss_kib": _kib("/proc/self/status", "VmRSS")["VmRSS"],
        "smaps_rollup_kib": _kib("/proc/self/smaps_rollup"),
        "malloc": {"arena_kib": info.arena // 1024, "in_use_kib": info.uordblks // 1024,
                   "free_kib": info.fordblks // 1024, "mmapped_kib": info.hblkhd // 1024,
                   "top_pad_kib": info.keepcost // 1024},
        "threads": threading.active_count(),
        "gc_objects": sum(by_type.values()),
        "pymalloc": _pymalloc(),
        "connectors": connectors,
        "by_type": dict(by_type.most_common(25)),
    }
    if tracemalloc.is_tracing():
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)])
        out["tracemalloc_kib"] = tracemalloc.get_traced_memory()[0] // 1024
        if _previous is not None:
            out["grown"] = [str(s) for s in snapshot.compare_to(_previous, "lineno")[:15]]
        _previous = snapshot
    if os.environ.get("TRAINJOB_CHURN_TRIM") == "1":
        _LIBC.malloc_trim(0)
        out["rss_after_trim_kib"] = _kib("/proc/self/status", "VmRSS")["VmRSS"]
    return out


def _on_signal(path: str) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        tmp = path + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(report(), handle)
        os.replace(tmp, path)
    signal.signal(signal.SIGUSR1, handler)


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    _on_signal(sys.argv[1])
    from scraper.cli import main as scraper_main
    return scraper_main(sys.argv[3:])


if __name__ == "__main__":
    sys.exit(main())
