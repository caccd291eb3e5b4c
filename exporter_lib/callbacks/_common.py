"""Helpers shared by the framework callbacks (no framework imports here)."""

from __future__ import annotations

import numbers
from collections.abc import Mapping


def scalar_metrics(logs: Mapping[str, object] | None) -> dict[str, object]:
    """Keep the entries of a framework's log dict that are reportable scalars.

    Strings, bools and real numbers pass as they are; one-element tensors and
    arrays (anything with ``numel()``/``size`` of 1 and ``.item()``) become their
    Python number.  Everything else (lists, dicts, larger tensors) is skipped
    silently: frameworks put such things in their logs routinely, they are not
    user mistakes worth a warning.
    """
    out: dict[str, object] = {}
    if not logs:
        return out
    for name, value in logs.items():
        if isinstance(value, str | bool | numbers.Real):
            out[str(name)] = value
            continue
        item = getattr(value, "item", None)
        if not callable(item) or _size(value) != 1:
            continue
        try:
            inner = item()
        except Exception:  # a framework object whose item() needs arguments
            continue
        if isinstance(inner, bool | numbers.Real):
            out[str(name)] = inner
    return out


def _size(value: object) -> int | None:
    numel = getattr(value, "numel", None)
    if callable(numel):
        try:
            result = numel()
        except Exception:
            return None
        return result if isinstance(result, int) else None
    size = getattr(value, "size", None)
    return size if isinstance(size, int) else None
