"""The stall threshold as a setting (``--stall-after`` and the TrainJob annotation
``trainjob-progress.dev/stall-after``): its grammar and bounds, shared by the
configuration and the stall stage (:mod:`scraper.stall.rule`).
"""

from __future__ import annotations

import math

from scraper.syntax import parse_duration

#: ``auto``: the threshold is never below this (seconds).
STALL_FLOOR_SECONDS = 300.0
#: ``auto``: the threshold is this many times the longest gap seen.
STALL_GAP_FACTOR = 3.0
#: A given threshold is never below this many scrape intervals.
STALL_INTERVALS_MIN = 2.0
#: Bounds of a given threshold (seconds; ``0`` is off and always valid).
STALL_AFTER_MIN_SECONDS = 5.0
STALL_AFTER_MAX_SECONDS = 30 * 86400.0

AUTO = "auto"


class StallSettingError(ValueError):
    """A threshold that is not ``auto``, ``0`` or a duration within the bounds; the
    message names the field, the value and the limit."""


def parse_stall_after(value: object, field_name: str) -> float | None:
    """A threshold setting: None for ``auto``, ``0.0`` for off, else seconds.

    Args:
        value: ``auto``, ``0``, a duration (``90s``, ``10m``, ``1h30m``) or a number of
            seconds.
        field_name: named in the error (the flag or the annotation).

    Raises:
        StallSettingError: e.g. ``trainjob-progress.dev/stall-after='2s': must be 0 (off),
        auto, or between 5s and 30 days``.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() == AUTO):
        return None
    limit = (f"must be 0 (off), {AUTO}, or between {STALL_AFTER_MIN_SECONDS:g}s and "
             f"{STALL_AFTER_MAX_SECONDS / 86400:g} days")
    try:
        seconds = parse_duration(value)
        if not math.isfinite(seconds):
            raise ValueError(value)
    except ValueError:
        raise StallSettingError(f"{field_name}={value!r}: not a duration; {limit}") from None
    if seconds == 0:
        return 0.0
    if not STALL_AFTER_MIN_SECONDS <= seconds <= STALL_AFTER_MAX_SECONDS:
        raise StallSettingError(f"{field_name}={value!r}: {limit}")
    return seconds
