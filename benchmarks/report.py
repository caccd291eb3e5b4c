"""What the benchmarks' Markdown reports share: the load line, numbers and verdicts."""

from __future__ import annotations

import os


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages (``os.getloadavg``), e.g. ``"3.2 2.9 2.5"``."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def fmt(value: float | None, spec: str = ".0f", suffix: str = "") -> str:
    """``value`` formatted by ``spec`` then ``suffix``; ``"n/a"`` when not measured (None)."""
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def verdict(ok: bool | None) -> str:
    """``"met"``, ``"NOT met"``, or ``"n/a"`` when not measured (None)."""
    return "n/a" if ok is None else ("met" if ok else "NOT met")
