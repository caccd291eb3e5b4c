"""Keras ``Callback`` reporting into the exporter (Keras 3, any backend, or ``tf.keras``).

    from exporter_lib.callbacks.keras import ExporterCallback
    model.fit(x, y, epochs=3, callbacks=[ExporterCallback()])

* progress: batches done over ``epochs x steps`` (from the callback's ``params``)
  through a :class:`~exporter_lib.ProgressTracker`; ``fit(initial_epoch=k)`` counts
  the first ``k`` epochs as done; validation time is excluded from step durations;
* metrics: the batch logs every ``metrics_every_n_steps`` batches, and the epoch logs
  (``loss``, ``val_*``...) at each epoch end;
* checkpoints: Keras has no hook that tells other callbacks of a save, so with
  ``checkpoints=`` (a ``ModelCheckpoint``, or a path) the callback looks at the newest
  modification time in the checkpoint's directory after each epoch and every
  ``metrics_every_n_steps`` batches, and reports a newer one through
  :func:`exporter_lib.checkpoint_saved`.  List it after the ``ModelCheckpoint`` so a
  save at an epoch's end is seen at that epoch's end;
* on train end: 100 and 0 seconds remaining when all batches ran.

Without a known number of steps per epoch (a generator of unknown length) only
metrics are reported.  The rank rule of :func:`exporter_lib.start` applies.

Raises:
    ImportError: on import, when neither ``keras`` nor ``tensorflow`` is installed.
"""

from __future__ import annotations

import os
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
        metrics_every_n_steps: how often (batches) to report the batch logs (and to look
            for a new checkpoint).
        checkpoints: a ``ModelCheckpoint`` (its public ``filepath``) or a path: the file
            or directory the training saves checkpoints to; for a file path (which may be
            a ``{epoch}`` template) its directory is watched.  None: no checkpoints reported.
    """

    def __init__(self, *, start_server: bool = True, port: int | None = None,
                 metrics_every_n_steps: int = 50, checkpoints: object = None) -> None:
        super().__init__()
        self._checkpoints = CheckpointDirectory.of(checkpoints)
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
        every = (batch + 1) % self._every == 0
        metrics = scalar_metrics(logs) if every else None
        if every and self._checkpoints is not None:
            self._checkpoints.report_new()
        self.tracker.step(self._epoch * self._steps_per_epoch + batch + 1, metrics=metrics)

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.tracker is not None:
            self.tracker.pause()

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.tracker is not None:
            self.tracker.resume()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        api.update(metrics=scalar_metrics(logs))
        if self._checkpoints is not None:
            self._checkpoints.report_new()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        tracker = self.tracker
        if tracker is not None and tracker.step_count >= tracker.total_steps:
            api.update(progress_percentage=100, estimated_remaining_seconds=0,
                       metrics=scalar_metrics(logs))
        else:
            api.update(metrics=scalar_metrics(logs))


class CheckpointDirectory:
    """The directory a training saves checkpoints to; reports each newer save once.

    ``report_new()`` scans the directory's entries (``os.scandir``, one ``stat`` each) and
    calls :func:`exporter_lib.checkpoint_saved` with the newest modification time when it
    is newer than the last one reported.  A missing directory is no checkpoint yet.
    Files already there when training starts count: they are checkpoints the training
    can resume from.  Never raises.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._reported: float | None = None

    @classmethod
    def of(cls, checkpoints: object) -> CheckpointDirectory | None:
        """From a ``ModelCheckpoint`` (anything with a ``filepath``), a path or None.

        Raises:
            TypeError: ``checkpoints`` is none of these.
        """
        if checkpoints is None:
            return None
        path = getattr(checkpoints, "filepath", checkpoints)
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"checkpoints={checkpoints!r}: expected a ModelCheckpoint or a "
                            "path (str or os.PathLike)")
        text = os.fspath(path)
        text = text if isinstance(text, str) else os.fsdecode(text)
        directory = text if os.path.isdir(text) else os.path.dirname(text) or "."
        return cls(directory)

    def newest(self) -> float | None:
        """The newest modification time (unix seconds) in the directory, or None."""
        newest: float | None = None
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    try:
                        mtime = entry.stat().st_mtime
                    except OSError:  # removed while scanning (checkpoint rotation)
                        continue
                    newest = mtime if newest is None else max(newest, mtime)
        except OSError:
            return None
        return newest

    def report_new(self) -> None:
        """Report the newest save when it is newer than the last one reported."""
        newest = self.newest()
        if newest is not None and (self._reported is None or newest > self._reported):
            self._reported = newest
            api.checkpoint_saved(newest)
