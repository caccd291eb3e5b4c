"""Lightning's RichProgressBar (the default bar when ``rich`` is installed).

Its training row is ``Epoch e/E <bar> n/total H:MM:SS • H:MM:SS rate it/s name: value
...`` (``lightning/pytorch/callbacks/progress/rich_progress.py``: the description is
``Epoch {current_epoch}/{max_epochs - 1}``, then the elapsed and remaining columns);
metrics that do not fit go on the next line, which holds only ``name: value`` pairs.
Outside a terminal, rich prints the rows once, when the progress display stops.
Lightning's "`Trainer.fit` stopped: ..." line ends a run.
"""

from __future__ import annotations

import re

from scraper.logsource import numbers
from scraper.logsource.reading import Reading

_ROW = re.compile(
    r"Epoch (?P<epoch>\d{1,9})/(?P<last>\d{1,9}) {1,40}[━╸╺╺ -]{0,400}? ?"
    r"(?P<n>\d{1,12})/(?P<total>\d{1,12}) (?P<elapsed>\d{1,6}:\d\d:\d\d) • "
    r"(?P<remaining>\d{1,6}:\d\d:\d\d|-:--:--) ?(?:[\d.]{1,20}it/s)?(?P<metrics>.{0,3000})")
_METRIC = re.compile(rf"({numbers.NAME}): ({numbers.NUMBER})(?= |$)")
_ONLY_METRICS = re.compile(rf"(?:{numbers.NAME}: {numbers.NUMBER} {{0,8}}){{1,64}}")
_STOPPED = re.compile(r"`Trainer\.fit` stopped: .{0,200}")


def _metrics(text: str) -> tuple[tuple[str, str], ...]:
    return numbers.bar_metrics(_METRIC.findall(text))


def parse(text: str) -> Reading | None:
    """The Rich training row in ``text`` (one cleaned segment), or None."""
    if _STOPPED.fullmatch(text):
        return Reading(bar="lightning", finished=True)
    match = _ROW.fullmatch(text)
    if match is None:
        return None
    done, total = int(match["n"]), int(match["total"])
    epoch, last = int(match["epoch"]), int(match["last"])
    if total == 0 or done > total or epoch > last:
        return None
    return Reading(bar="lightning", done=float(done), total=float(total), epoch=epoch + 1,
                   epochs=last + 1, remaining=numbers.clock_seconds(match["remaining"]),
                   elapsed=numbers.clock_seconds(match["elapsed"]),
                   metrics=_metrics(match["metrics"]), continues_metrics=True)


def parse_continuation(text: str) -> Reading | None:
    """A line of only ``name: value`` pairs (the rest of a Rich row's metrics), or None."""
    if not _ONLY_METRICS.fullmatch(text):
        return None
    return Reading(metrics=_metrics(text))
