"""The Transformers Trainer's logged metric dicts (``Trainer.log`` -> ``ProgressCallback``).

``{'loss': '0.5834', 'grad_norm': '0.8669', 'learning_rate': '5e-05', 'epoch': '0.0625'}``
(Transformers 5 prints the values as strings; older versions print numbers).  Only
a segment that is such a dict as a whole counts; non-numeric values are skipped.
"""

from __future__ import annotations

import re

from scraper.logsource import numbers
from scraper.logsource.reading import Reading

_ITEM = rf"'({numbers.NAME})': '?({numbers.NUMBER}|[^',{{}}]{{0,64}})'?"
_DICT = re.compile(rf"\{{{_ITEM}(?:, {_ITEM}){{0,255}}\}}")
_ITEMS = re.compile(_ITEM)


def parse(text: str) -> Reading | None:
    """The metrics of the logged dict ``text`` (one cleaned segment) is, or None."""
    if not text.startswith("{'") or _DICT.fullmatch(text) is None:
        return None
    pairs = (numbers.metric(n, v) for n, v in _ITEMS.findall(text))
    metrics = tuple(p for p in pairs if p is not None)
    return Reading(metrics=metrics) if metrics else None
