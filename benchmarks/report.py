"""What the benchmarks' Markdown reports share: the load line, numbers, verdicts and
the files a run writes."""

from __future__ import annotations

import json
import os
import subprocess
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


def source_commit() -> str:
    """The commit the benchmark's code came from (``git rev-parse HEAD`` of the
    repository), with ``+changes`` when tracked files differ from it; ``"unknown"``
    outside a git checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, check=True,
                              capture_output=True, text=True, timeout=10).stdout.strip()
        clean = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=root,
                               timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head if clean else f"{head}+changes"


def write_report(res: dict[str, Any], out: Path, name: str,
                 table: Callable[[dict[str, Any]], str], started: float) -> Path:
    """Finish ``res`` (``seconds`` since the monotonic ``started``, ``loadavg_end``) and
    write it, with the commit (:func:`source_commit`), to ``out`` as
    ``name-YYYYmmdd-HHMMSS.json`` and ``.md`` (``table(res)``,
    also printed); returns the stem.  Raises OSError when ``out`` cannot be written."""
    res["seconds"] = time.monotonic() - started
    res["loadavg_end"] = loadavg()
    res.setdefault("commit", source_commit())
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    report = table(res)
    stem.with_suffix(".md").write_text(report + "\n")
    print(report)
    print(f"wrote {stem}.md and .json ({res['seconds']:.0f} s)", file=sys.stderr)
    return stem
