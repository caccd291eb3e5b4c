"""tqdm's default bar: ``desc: 45%|####   | 45/100 [00:04<00:05, 10.0it/s, loss=0.1]``.

The format is tqdm's ``format_meter`` with the default ``bar_format``
(``{l_bar}{bar}{r_bar}``: ``{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}
[{elapsed}<{remaining}, {rate_fmt}{postfix}]``).  ``tqdm.auto`` outside a notebook,
the Transformers Trainer and Lightning's TQDMProgressBar print this same bar.  A
reading is kept only when its percentage agrees with ``n/total`` (within rounding),
which refuses a bar cut at its front.  Lightning's description ``Epoch N`` gives the
epoch (0-based, no count); a description ``Epoch N/M`` gives both.
"""

from __future__ import annotations

import re

from scraper.logsource import numbers
from scraper.logsource.reading import Reading

_BAR = re.compile(
    r"(?P<pct>\d{1,3})%\|[^|]{0,400}\| {0,4}(?P<n>[\d.]{1,20}[kMGTPEZY]?)/"
    r"(?P<total>[\d.]{1,20}[kMGTPEZY]?) \[(?P<elapsed>[\d:d ]{1,20})<"
    r"(?P<remaining>[\d:d ]{1,20}|\?)(?P<tail>[^\]]{0,3000})\]")
_EPOCH = re.compile(r"Epoch (\d{1,9})(?:/(\d{1,9}))?")
_PAIR = re.compile(rf"({numbers.NAME})=([^,=]{{1,64}})")


def parse(text: str) -> Reading | None:
    """The tqdm bar in ``text`` (one cleaned segment), or None."""
    match = _BAR.search(text)
    if match is None:
        return None
    done, total = numbers.scaled(match["n"]), numbers.scaled(match["total"])
    if done is None or not total or done > total:
        return None
    if abs(int(match["pct"]) - 100.0 * done / total) > 1.0:
        return None
    desc = text[:match.start()].strip().removesuffix(":").strip()
    epoch = epochs = None
    epoch_match = _EPOCH.fullmatch(desc)
    if epoch_match is not None:
        epoch = int(epoch_match[1]) + 1  # Lightning counts epochs from 0
        epochs = int(epoch_match[2]) + 1 if epoch_match[2] else None
    # The postfix comes after the rate: ", 12.3it/s, loss=0.5, lr=0.001".
    metrics = numbers.bar_metrics(_PAIR.findall(match["tail"]))
    return Reading(bar=re.sub(r"\d+", "#", desc), done=done, total=total, epoch=epoch,
                   epochs=epochs, epoch_only=epoch_match is not None and epochs is None,
                   remaining=numbers.clock_seconds(match["remaining"]),
                   elapsed=numbers.clock_seconds(match["elapsed"]), metrics=metrics)
