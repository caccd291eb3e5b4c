"""Number, duration and metric rules shared by the log parsers.

Every pattern here is bounded (fixed repetition limits) so a regex never
backtracks more than a constant per position.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from exporter_lib.status import METRIC_NAME_MAX_LENGTH, METRIC_VALUE_MAX_LENGTH

#: A decimal number as frameworks print one (``0.5``, ``-1e-05``, ``3``, ``.5``).
NUMBER = r"[-+]?(?:\d{1,30}(?:\.\d{0,30})?|\.\d{1,30})(?:[eE][-+]?\d{1,4})?"
_NUMBER = re.compile(NUMBER)
#: A metric name: a word with ``/``, ``.`` and ``-`` inside (``eval/loss``, ``val-acc``).
NAME = r"[A-Za-z_][A-Za-z0-9_./-]{0,63}"
_NAME = re.compile(NAME)
#: SI prefixes of tqdm's ``unit_scale`` (``tqdm.format_sizeof``).
_SCALE = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
          "Z": 1e21, "Y": 1e24}
_CLOCK = re.compile(r"(?:(\d{1,5})d ?)?(?:(\d{1,6}):)?(\d{1,6}):(\d{2})")
_KERAS = re.compile(r"(?:(\d{1,6}):)?(?:(\d{1,6}):)?(\d{1,9})s?")


def number(text: str) -> float | None:
    """``text`` as a finite float, or None when it is not a whole :data:`NUMBER`."""
    if len(text) > METRIC_VALUE_MAX_LENGTH or not _NUMBER.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def scaled(text: str) -> float | None:
    """A tqdm count with an optional SI suffix (``1.5k`` -> 1500.0), or None."""
    suffix = text[-1:] if text[-1:] in _SCALE and text[-1:] else ""
    value = number(text[:-1] if suffix else text)
    return None if value is None or value < 0 else value * _SCALE[suffix]


def clock_seconds(text: str) -> int | None:
    """tqdm's ``format_interval`` (``MM:SS``, ``H:MM:SS``, ``Nd H:MM:SS``) in seconds."""
    match = _CLOCK.fullmatch(text)
    if match is None:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    if seconds >= 60 or ((hours or days) and minutes >= 60):
        return None
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def keras_seconds(text: str) -> int | None:
    """Keras' ETA (``%ds``, ``%d:%02d``, ``%d:%02d:%02d``; keras/src/utils/progbar.py)."""
    if text.endswith("s"):
        return int(text[:-1]) if text[:-1].isdigit() and len(text) < 12 else None
    parts = text.split(":")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() and len(p) < 8 for p in parts):
        return None
    values = [int(p) for p in parts]
    if any(v >= 60 for v in values[1:]):
        return None
    total = 0
    for value in values:
        total = total * 60 + value
    return total


def per_step_seconds(value: str, unit: str) -> float | None:
    """Keras' ``%.0fms/step`` style time per step, in seconds."""
    parsed = number(value)
    factor = {"s": 1.0, "ms": 1e-3, "us": 1e-6}.get(unit)
    return None if parsed is None or factor is None or parsed < 0 else parsed * factor


def metric(name: str, value: str) -> tuple[str, str] | None:
    """``(name, value)`` when both fit the Trainer API and the value is a finite number."""
    name = name.strip()
    value = value.strip()
    if (len(name) > METRIC_NAME_MAX_LENGTH or not _NAME.fullmatch(name)
            or number(value) is None):
        return None
    return name, value


#: Lightning's experiment version, in the postfix of both its bars: not a training metric.
_NOT_METRICS = frozenset({"v_num"})


def bar_metrics(pairs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The ``(name, value)`` pairs a progress bar printed that :func:`metric` keeps,
    in their order, without Lightning's ``v_num``."""
    kept = (metric(name, value) for name, value in pairs)
    return tuple(p for p in kept if p is not None and p[0] not in _NOT_METRICS)
