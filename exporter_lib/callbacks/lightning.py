"""PyTorch Lightning ``Callback`` reporting into the exporter.

    from exporter_lib.callbacks.lightning import ExporterCallback
    trainer = L.Trainer(..., callbacks=[ExporterCallback()])

* progress: ``trainer.global_step`` (optimizer steps) over
  ``trainer.estimated_stepping_batches`` through a :class:`~exporter_lib.ProgressTracker`;
  a resumed fit starts at the checkpoint's ``global_step``;
* metrics: the scalars of ``trainer.callback_metrics`` (what ``self.log`` recorded),
  read every ``metrics_every_n_steps`` steps (reading a GPU tensor synchronises
  the device, so not every batch), after validation and at epoch end;
* checkpoints: each save (``on_save_checkpoint``, which Lightning calls as it builds
  the checkpoint it then writes) is reported through :func:`exporter_lib.checkpoint_saved`;
* on train end: 100 and 0 seconds remaining when all steps ran.

Needs the ``lightning`` package (``lightning.pytorch``, 2.x).
Only global rank zero reports (``trainer.is_global_zero``).

Raises:
    ImportError: on import, when ``lightning`` is not installed.
"""

from __future__ import annotations

import math
from typing import Any

from exporter_lib import api
from exporter_lib.callbacks._common import scalar_metrics
from exporter_lib.tracker import ProgressTracker

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("exporter_lib.callbacks.lightning needs the 'lightning' package "
                      "(lightning.pytorch, Lightning 2.x)") from exc


class ExporterCallback(Callback):
    """Reports a Lightning ``Trainer``'s progress and logged metrics.

    Args:
        start_server: call :func:`exporter_lib.start` when training starts (idempotent).
        port: port for that start.
        metrics_every_n_steps: how often (optimizer steps) to read ``callback_metrics``.
    """

    def __init__(self, *, start_server: bool = True, port: int | None = None,
                 metrics_every_n_steps: int = 50) -> None:
        self._start_server = start_server
        self._port = port
        self._every = max(1, metrics_every_n_steps)
        self.tracker: ProgressTracker | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        if self._start_server:
            api.start(port=self._port)
        total = trainer.estimated_stepping_batches
        steps = int(total) if isinstance(total, int | float) and math.isfinite(total) else 0
        self.tracker = ProgressTracker(steps, initial_step=trainer.global_step, report=api.update)
        self.tracker.start()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if self.tracker is None or not trainer.is_global_zero:
            return
        step = trainer.global_step
        metrics = None
        if step % self._every == 0 and step != self.tracker.step_count:
            metrics = scalar_metrics(trainer.callback_metrics)
        self.tracker.step(step, metrics=metrics)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.tracker is not None:
            self.tracker.pause()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.tracker is not None:
            self.tracker.resume()
        if trainer.is_global_zero and not trainer.sanity_checking:
            api.update(metrics=scalar_metrics(trainer.callback_metrics))

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero:
            api.update(metrics=scalar_metrics(trainer.callback_metrics))

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        if trainer.is_global_zero:
            api.checkpoint_saved()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.is_global_zero or self.tracker is None:
            return
        metrics = scalar_metrics(trainer.callback_metrics)
        total = self.tracker.total_steps
        if total and trainer.global_step >= total:
            api.update(progress_percentage=100, estimated_remaining_seconds=0, metrics=metrics)
        else:
            api.update(metrics=metrics)
