"""Keras ``Callback`` reporting into the exporter (Keras 3, any backend, or ``tf.keras``).

    from exporter_lib.callbacks.keras import ExporterCallback
    model.fit(x, y, epochs=3, callbacks=[ExporterCallback()])

* progress: batches done over ``epochs x steps`` (from the callback's ``params``)
  through a :class:`~exporter_lib.ProgressTracker`; ``fit(initial_epoch=k)`` counts
  the first ``k`` epochs as done; validation time is excluded from step durations;
* metrics: the batch logs every ``metrics_every_n_steps`` batches, and the epoch logs
  (``loss``, ``val_*``...) at each epoch end;
* on train end: 100 and 0 seconds remaining when all batches ran.

Without a known number of steps per epoch (a generator of unknown length) only
metrics are reported.  The rank rule of :func:`exporter_lib.start` applies.

Raises:
    ImportError: on import, when neither ``keras`` nor ``tensorflow`` is installed.
"""

from __future__ import annotations

from typing import Any

from exporter_lib import api
from exporter_lib.callbacks._common import scalar_metrics
from exporter_lib.tracker import ProgressTracker

try:
    from keras.callbacks import Callback
except ImportError:  # pragma: no cover - depends on the environment
    try:
        from tensorflow.keras.callbacks import Callback
    except ImportError as exc:
        raise ImportError("exporter_lib.callbacks.keras needs 'keras' or 'tensorflow'") from exc


class ExporterCallback(Callback):
    """Reports a Keras ``fit``'s progress and logged metrics.

    Args:
        start_server: call :func:`exporter_lib.start` at train begin (idempotent).
        port: port for that start.
        metrics_every_n_steps: how often (batches) to report the batch logs.
    """

    def __init__(self, *, start_server: bool = True, port: int | None = None,
                 metrics_every_n_steps: int = 50) -> None:
        super().__init__()
        self._start_server = start_server
        self._port = port
        self._every = max(1, metrics_every_n_steps)
        self._steps_per_epoch = 0
        self._epoch = 0
        self.tracker: ProgressTracker | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._start_server:
            api.start(port=self._port)
        params = self.params or {}
        self._steps_per_epoch = int(params.get("steps") or 0)
        epochs = int(params.get("epochs") or 0)
        self.tracker = None
        if self._steps_per_epoch and epochs:
            self.tracker = ProgressTracker(self._steps_per_epoch * epochs, report=api.update)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        tracker = self.tracker
        if tracker is not None and tracker.step_count == 0 and epoch > 0:
            tracker.step_count = epoch * self._steps_per_epoch  # fit(initial_epoch=...)
        if tracker is not None:
            tracker.start()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.tracker is None:
            return
        metrics = scalar_metrics(logs) if (batch + 1) % self._every == 0 else None
        self.tracker.step(self._epoch * self._steps_per_epoch + batch + 1, metrics=metrics)

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.tracker is not None:
            self.tracker.pause()

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.tracker is not None:
            self.tracker.resume()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        api.update(metrics=scalar_metrics(logs))

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        tracker = self.tracker
        if tracker is not None and tracker.step_count >= tracker.total_steps:
            api.update(progress_percentage=100, estimated_remaining_seconds=0,
                       metrics=scalar_metrics(logs))
        else:
            api.update(metrics=scalar_metrics(logs))
