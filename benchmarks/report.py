"""What the benchmarks' Markdown reports share: the load line, numbers, verdicts and
the files a run writes."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages (``os.getloadavg``), e.g. ``"3.2 2.9 2.5"``."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def fmt(value: float | None, spec: str = ".0f", suffix: str = "") -> str:
    """``value`` formatted by ``spec`` then ``suffix``; ``"n/a"`` when not measured (None)."""
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def verdict(ok: bool | None) -> str:
    """``"met"``, ``"NOT met"``, or ``"n/a"`` when not measured (None)."""
    return "n/a" if ok is None else ("met" if ok else "NOT met")


def write_report(res: dict[str, Any], out: Path, name: str,
                 table: Callable[[dict[str, Any]], str], started: float) -> Path:
    """Finish ``res`` (``seconds`` since the monotonic ``started``, ``loadavg_end``) and
    write it to ``out`` as ``name-YYYYmmdd-HHMMSS.json`` and ``.md`` (``table(res)``,
    also printed); returns the stem.  Raises OSError when ``out`` cannot be written."""
    res["seconds"] = time.monotonic() - started
    res["loadavg_end"] = loadavg()
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    report = table(res)
    stem.with_suffix(".md").write_text(report + "\n")
    print(report)
    print(f"wrote {stem}.md and .json ({res['seconds']:.0f} s)", file=sys.stderr)
    return stem
