"""The one home of the scraper's syntax rules: durations and the scrape interval's bounds.

Used by the settings (``--interval``, every duration option), by discovery (the
``trainjob-progress.dev/interval`` annotation) and by the local demo's ``--interval``.
"""

from __future__ import annotations

import re

INTERVAL_MIN_SECONDS = 1.0
INTERVAL_MAX_SECONDS = 3600.0

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_SCALE = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: object) -> float:
    """Parse ``15s``, ``2m``, ``1h30m``, ``250ms`` or a plain number of seconds.

    Returns:
        The duration in seconds (float).

    Raises:
        ValueError: empty, negative or not a duration.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = str(value).strip()
        try:
            seconds = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for match in _DURATION_PART.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _SCALE[match.group(2)]
                pos = match.end()
            if text.startswith("-") and _DURATION_PART.fullmatch(text[1:]):
                raise ValueError(f"not a duration: {value!r} (must be >= 0)") from None
            if pos != len(text) or not text:
                raise ValueError(
                    f"not a duration: {value!r} (use e.g. 30s, 2m, 1h or seconds)"
                ) from None
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError(f"not a duration: {value!r} (not a finite number)")
    if seconds < 0:
        raise ValueError(f"not a duration: {value!r} (must be >= 0)")
    return seconds


class IntervalOutOfRange(ValueError):
    """A well-formed duration outside 1s..1h."""


def check_interval(seconds: float) -> float:
    """``seconds`` when it is a valid scrape interval.

    Raises:
        IntervalOutOfRange: outside :data:`INTERVAL_MIN_SECONDS`..:data:`INTERVAL_MAX_SECONDS`.
    """
    if not INTERVAL_MIN_SECONDS <= seconds <= INTERVAL_MAX_SECONDS:
        raise IntervalOutOfRange("must be between 1s and 1h")
    return seconds


def parse_interval(value: object) -> float:
    """A scrape interval: :func:`parse_duration`, then :func:`check_interval`.

    Raises:
        ValueError: not a duration; :class:`IntervalOutOfRange` when outside 1s..1h.
    """
    return check_interval(parse_duration(value))
