"""What one parser read from one segment."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reading:
    """One segment's facts; every field optional.

    ``bar``: the bar's identity (its description with digits replaced by ``#``, or a
    format name) used to keep to one bar.  ``done``/``total``: steps of that bar.
    ``epoch``/``epochs``: 1-based epoch of how many, when the bar or an ``Epoch e/E``
    line says so.  ``remaining``: seconds the bar itself estimates for its own rest.
    ``elapsed``: seconds the bar has run.  ``per_step``: seconds per step (Keras).
    ``metrics``: ``(name, value)`` pairs within the Trainer API limits.
    ``finished``: the framework said the run is over (e.g. Lightning's
    "`Trainer.fit` stopped").  ``continues_metrics``: a Rich bar whose metrics may go
    on in the next line.
    """

    bar: str | None = None
    done: float | None = None
    total: float | None = None
    epoch: int | None = None
    epochs: int | None = None
    remaining: int | None = None
    elapsed: int | None = None
    per_step: float | None = None
    metrics: tuple[tuple[str, str], ...] = ()
    finished: bool = False
    epoch_only: bool = False
    continues_metrics: bool = False
