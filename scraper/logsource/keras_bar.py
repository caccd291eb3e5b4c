"""Keras 3's progress bar (``keras/src/utils/progbar.py``) and its ``Epoch e/E`` lines.

``verbose=1`` redraws with ``\\b`` and ``\\r``:
``3/8 ━━━━━━━━━━━━━━━━━━━━ 0s 12ms/step - accuracy: 0.5000 - loss: 0.6931``, where
the time before the per-step time is the epoch's ETA while ``current < target``
(``%ds``, ``%d:%02d`` or ``%d:%02d:%02d``) and the elapsed time at the end; an
older Keras writes ``ETA: 0s``.  ``verbose=2`` prints one line per epoch:
``8/8 - 0s - 12ms/step - accuracy: 0.5000 - loss: 0.6931``.
"""

from __future__ import annotations

import re

from scraper.logsource import numbers
from scraper.logsource.reading import Reading

_EPOCH = re.compile(r"Epoch (\d{1,9})/(\d{1,9})")
_VERBOSE1 = re.compile(
    r"(?P<n>\d{1,12})/(?P<total>\d{1,12}) [━─=>.\[\] ]{0,200}? ?(?:ETA: )?"
    r"(?P<time>\d{1,6}(?::\d\d){1,2}|\d{1,9}s) (?P<step>[\d.]{1,12})(?P<unit>s|ms|us)/step"
    r"(?P<metrics>(?: - [^:\s]{1,64}: [^\s]{1,64}){0,256})")
_VERBOSE2 = re.compile(
    r"(?P<n>\d{1,12})/(?P<total>\d{1,12}) - (?P<time>\d{1,9})s - "
    r"(?P<step>[\d.]{1,12})(?P<unit>s|ms|us)/step"
    r"(?P<metrics>(?: - [^:\s]{1,64}: [^\s]{1,64}){0,256})")
_METRIC = re.compile(r" - ([^:\s]{1,64}): ([^\s]{1,64})")


def parse(text: str) -> Reading | None:
    """The Keras bar or ``Epoch e/E`` line that ``text`` (one cleaned segment) is, or None."""
    epoch = _EPOCH.fullmatch(text)
    if epoch is not None:
        current, count = int(epoch[1]), int(epoch[2])
        if not 1 <= current <= count:
            return None
        return Reading(bar="keras", epoch=current, epochs=count)
    match = _VERBOSE2.fullmatch(text)
    verbose2 = match is not None
    if match is None:
        match = _VERBOSE1.fullmatch(text)
    if match is None:
        return None
    done, total = int(match["n"]), int(match["total"])
    if total == 0 or done > total:
        return None
    seconds = (int(match["time"]) if verbose2 else numbers.keras_seconds(match["time"]))
    metrics = []
    for name, value in _METRIC.findall(match["metrics"]):
        pair = numbers.metric(name, value)
        if pair is not None:
            metrics.append(pair)
    running = done < total and not verbose2
    return Reading(bar="keras", done=float(done), total=float(total),
                   remaining=seconds if running else 0,
                   elapsed=None if running else seconds,
                   per_step=numbers.per_step_seconds(match["step"], match["unit"]),
                   metrics=tuple(metrics))
