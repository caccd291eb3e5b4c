"""A live progress bar for one TrainJob, drawn by tqdm (``tqdm.auto``: a widget in Jupyter).

The bar's position is the trainer's ``progressPercentage``; its ETA is the trainer's
own ``estimatedRemainingSeconds`` (not tqdm's rate estimate, which would only see
how often the status was read); the chosen metrics follow it.  Used by the notebook
callback (:mod:`trainjob_client.sdk`) and by ``kubectl trainjob watch`` on a terminal.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import IO, Any

from tqdm.auto import tqdm

from trainjob_client.progress import TrainJobProgress

#: Size used on a terminal that reports 0 x 0 (a fresh pty, some CI runners).
FALLBACK_COLUMNS = 80
FALLBACK_ROWS = 24
#: ``{desc}`` is the TrainJob's name; the postfix holds state, ETA and metrics.
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| [{elapsed}{postfix}]"


def describe(item: TrainJobProgress, metrics: Sequence[str]) -> str:
    """The bar's text after the time: ``Running, ETA 05:10, loss=0.173`` (tqdm's clock)."""
    parts = [item.state] if item.state else []
    stalled = item.stalled_for(datetime.now(UTC))
    if stalled:
        parts.append(stalled)
    status = item.status
    if status is None:
        parts.append(item.problem or "no trainer status yet")
        return ", ".join(parts)
    if status.estimated_remaining_seconds is not None:
        parts.append(f"ETA {tqdm.format_interval(status.estimated_remaining_seconds)}")
    values = status.metrics_dict()
    parts += [f"{m}={values[m]}" for m in metrics if m in values]
    return ", ".join(parts)


def _sizing(file: IO[str] | None) -> dict[str, Any]:
    # tqdm draws nothing on a terminal that reports 0 columns or 0 rows (it treats the
    # bar as outside the screen): give it a usual size there, else let it follow resizes.
    try:
        size = os.get_terminal_size(file.fileno())  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        return {"dynamic_ncols": True}
    if size.columns > 0 and size.lines > 0:
        return {"dynamic_ncols": True}
    return {"ncols": size.columns or FALLBACK_COLUMNS, "nrows": size.lines or FALLBACK_ROWS}


class TrainJobBar:
    """One tqdm bar over 0..100 percent for one TrainJob; call :meth:`show` on each read.

    ``file`` and ``leave`` go to tqdm (default: stderr, keep the bar after close).
    """

    def __init__(self, name: str, metrics: Sequence[str] = (), *, file: IO[str] | None = None,
                 leave: bool = True, **tqdm_options: Any) -> None:
        self.metrics = tuple(metrics)
        self._bar = tqdm(total=100, desc=name, bar_format=BAR_FORMAT, file=file, leave=leave,
                         **{**_sizing(file), **tqdm_options})
        self.closed = False

    @property
    def n(self) -> float:
        """The percent the bar shows."""
        return float(self._bar.n)

    @property
    def text(self) -> str:
        """The bar's postfix text (state, ETA, metrics) as last shown."""
        return str(self._bar.postfix or "")

    def show(self, item: TrainJobProgress) -> None:
        """Move the bar to ``item``'s progress and redraw.

        The bar shows the reported value, also when it goes down (a restarted trainer).
        """
        if self.closed:
            return
        percent = None if item.status is None else item.status.progress_percentage
        if percent is not None:
            self._bar.n = percent
        self._bar.set_postfix_str(describe(item, self.metrics), refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        """Draw the bar a last time and release it (idempotent)."""
        if not self.closed:
            self.closed = True
            self._bar.close()


__all__ = ["BAR_FORMAT", "TrainJobBar", "describe"]
