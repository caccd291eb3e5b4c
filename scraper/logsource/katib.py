"""Katib's StdOut metrics format: ``name=value`` (Katib's default filter
``([\\w|-]+)\\s*=\\s*([+-]?\\d*(\\.\\d+)?([Ee][+-]?\\d+)?)``).

Katib's collector takes such a pair anywhere in a line; here a line counts only when
it holds nothing but pairs (``loss=0.31``, ``epoch=2 accuracy=0.9``, separated by
blanks, commas or semicolons), so a log sentence that happens to contain ``=``
(``Using world_size=2 for ...``) is not read as metrics.
"""

from __future__ import annotations

import re

from scraper.logsource import numbers
from scraper.logsource.reading import Reading

_PAIR = rf"({numbers.NAME}) ?= ?({numbers.NUMBER})"
_LINE = re.compile(rf"{_PAIR}(?:[ ,;]{{1,4}}{_PAIR}){{0,63}}[ ,;]?")
_PAIRS = re.compile(_PAIR)


def parse(text: str) -> Reading | None:
    """The metrics of ``text`` (one cleaned line) when it is only ``name=value`` pairs."""
    if _LINE.fullmatch(text) is None:
        return None
    pairs = (numbers.metric(n, v) for n, v in _PAIRS.findall(text))
    metrics = tuple(p for p in pairs if p is not None)
    return Reading(metrics=metrics) if metrics else None
