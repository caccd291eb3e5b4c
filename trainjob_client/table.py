"""The plugin's table: one row per TrainJob, laid out like ``kubectl get``.

Columns: ``NAMESPACE`` (with ``-A``), ``NAME``, ``STATE``, ``PROGRESS`` (bar and
percent), ``ETA``, ``UPDATED`` (age of ``lastUpdatedTime``) and one column per metric
asked for.  Missing values show as ``<none>``, as kubectl shows them.  The layout is
rich's table without borders; the bar is tqdm's.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import UTC, datetime

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from trainjob_client.progress import TrainJobProgress

NONE = "<none>"
#: Width of the progress bar in characters.
BAR_WIDTH = 20
#: Spaces between columns (kubectl's printers use 3).
COLUMN_GAP = 3


def human_duration(seconds: float) -> str:
    """A duration the way kubectl prints ages: ``42s``, ``5m10s``, ``3h``, ``2d4h``, ``3y``.

    The same steps as ``HumanDuration`` in ``k8s.io/apimachinery/pkg/util/duration``;
    negative durations (clock skew) below -1 s are ``<invalid>``.
    """
    if seconds < -1:
        return "<invalid>"
    total = max(0, int(seconds))
    if total < 120:
        return f"{total}s"
    minutes, hours = total // 60, total // 3600
    if minutes < 10:
        return f"{minutes}m" if total % 60 == 0 else f"{minutes}m{total % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d" if hours % 24 == 0 else f"{days}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    years = days // 365
    if hours < 24 * 365 * 8:
        return f"{years}y" if days % 365 == 0 else f"{years}y{days % 365}d"
    return f"{years}y"


def progress_bar(percent: int, *, ascii_only: bool = False) -> str:
    """``|########4           |  42%``: tqdm's bar over 0..100 and the percent."""
    bar = tqdm.format_meter(percent, 100, 0, bar_format=f"|{{bar:{BAR_WIDTH}}}|",
                            ascii=" #" if ascii_only else False)
    return f"{bar} {percent:3d}%"


def printable(text: str) -> str:
    """``text`` with every character that is not printable (a terminal's escape
    sequences, newlines, other control and format characters) written as its Python
    escape (``\\x1b``, ``\\n``): names and values come from whatever wrote the
    TrainJob's status, and must not move the cursor or recolour the operator's terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def row(item: TrainJobProgress, metrics: Sequence[str], *, now: datetime | None = None,
        all_namespaces: bool = False, ascii_only: bool = False) -> list[str]:
    """The cells of one TrainJob's row (see the module docstring for the columns)."""
    now = now or datetime.now(UTC)
    status = item.status
    cells = [item.namespace] if all_namespaces else []
    stalled = item.stalled_for(now)
    state = item.state or NONE
    cells += [item.name, f"{state} ({stalled})" if stalled else state]
    if status is None:
        cells += [NONE, NONE, NONE]
        cells += [NONE] * len(metrics)
        return [printable(c) for c in cells]
    percent = status.progress_percentage
    cells.append(NONE if percent is None else progress_bar(percent, ascii_only=ascii_only))
    eta = status.estimated_remaining_seconds
    cells.append(NONE if eta is None else human_duration(eta))
    cells.append(human_duration((now - status.last_updated_time).total_seconds()))
    values = status.metrics_dict()
    cells += [values.get(m, NONE) for m in metrics]
    return [printable(c) for c in cells]


def header(metrics: Sequence[str], *, all_namespaces: bool = False) -> list[str]:
    """Column titles, upper-case like kubectl's; metric columns too, unless two names
    differ only in case (``loss`` and ``Loss``): then every metric column keeps its name."""
    titles = ["NAMESPACE"] if all_namespaces else []
    upper = [m.upper() for m in metrics]
    named = upper if len(set(upper)) == len(upper) else list(metrics)
    return [*titles, "NAME", "STATE", "PROGRESS", "ETA", "UPDATED", *map(printable, named)]


def render(items: Sequence[TrainJobProgress], metrics: Sequence[str] = (), *,
           all_namespaces: bool = False, now: datetime | None = None,
           ascii_only: bool = False) -> str:
    """The whole table as text, one line per TrainJob after the header, no trailing spaces."""
    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, COLUMN_GAP, 0, 0),
                  header_style="", show_header=True)
    for title in header(metrics, all_namespaces=all_namespaces):
        table.add_column(title, no_wrap=True, overflow="ignore")
    for item in items:
        table.add_row(*row(item, metrics, now=now, all_namespaces=all_namespaces,
                           ascii_only=ascii_only))
    # A console as wide as any table gets: never wrap or cut a cell, like kubectl.
    console = Console(file=io.StringIO(), width=100_000, color_system=None,
                      force_terminal=False, highlight=False, emoji=False, markup=False)
    console.print(table)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


__all__ = ["header", "human_duration", "printable", "progress_bar", "render", "row"]
