"""Live view of TrainJob progress as the Kubernetes API holds it (rich).

Everything shown is read back from ``TrainJob.status.trainerStatus``, the
field the scraper writes, never from the training process itself, so the view
proves the whole path.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.progress_bar import ProgressBar
from rich.table import Table

from exporter_lib.status import StatusError, TrainerStatus

#: Metrics shown as columns when present, in this order; others are not shown.
SHOWN_METRICS = ("loss", "eval_loss", "eval_accuracy", "epoch")


def trainer_status(trainjob: dict[str, Any]) -> TrainerStatus | None:
    """The validated ``status.trainerStatus`` of a TrainJob object, or ``None``."""
    raw = (trainjob.get("status") or {}).get("trainerStatus")
    if not raw:
        return None
    try:
        return TrainerStatus.from_api(raw)
    except StatusError:
        return None


def format_eta(seconds: int | None) -> str:
    """``1h02m``, ``3m05s``, ``42s`` or ``-`` for unknown."""
    if seconds is None:
        return "-"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def summary_line(name: str, status: TrainerStatus | None) -> str:
    """One plain-text line for logs and non-terminal output."""
    if status is None:
        return f"{name}: no trainerStatus yet"
    metrics = status.metrics_dict()
    shown = " ".join(f"{k}={metrics[k]}" for k in SHOWN_METRICS if k in metrics)
    percent = status.progress_percentage
    return (f"{name}: {percent if percent is not None else '-'}%"
            f" eta {format_eta(status.estimated_remaining_seconds)} {shown}".rstrip())


def render(trainjobs: list[dict[str, Any]], *, now: datetime | None = None) -> Table:
    """A table like ``kubectl get trainjob`` with a progress bar and the shown metrics."""
    now = now or datetime.now(UTC)
    table = Table(title="TrainJob status.trainerStatus (read from the Kubernetes API)",
                  title_justify="left", expand=False)
    table.add_column("NAMESPACE")
    table.add_column("NAME")
    table.add_column("PROGRESS", min_width=32)
    table.add_column("ETA", justify="right")
    for metric in SHOWN_METRICS:
        table.add_column(metric.upper(), justify="right")
    table.add_column("UPDATED", justify="right")
    for trainjob in trainjobs:
        meta = trainjob.get("metadata", {})
        status = trainer_status(trainjob)
        if status is None:
            table.add_row(meta.get("namespace", ""), meta.get("name", ""),
                          "waiting for the scraper", "-", *["-"] * len(SHOWN_METRICS), "-")
            continue
        percent = status.progress_percentage
        bar = Table.grid(padding=(0, 1))
        bar.add_row(ProgressBar(total=100, completed=percent or 0, width=24),
                    f"{percent if percent is not None else '-':>3}%")
        metrics = status.metrics_dict()
        age = max(0, int((now - status.last_updated_time).total_seconds()))
        table.add_row(meta.get("namespace", ""), meta.get("name", ""), bar,
                      format_eta(status.estimated_remaining_seconds),
                      *[metrics.get(m, "-") for m in SHOWN_METRICS], f"{age}s ago")
    return table
