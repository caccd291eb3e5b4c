"""A real Keras 3 fit (torch backend) with the exporter callback."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")  # before keras is imported: no TensorFlow here

import keras
import numpy as np

import exporter_lib
from exporter_lib import api
from exporter_lib.callbacks.keras import ExporterCallback


def test_keras_fit_reports(exporter: api.Exporter) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(x, y, batch_size=8, epochs=2, validation_split=0.25, verbose=0,
                        callbacks=[ExporterCallback(metrics_every_n_steps=2)])
    status = exporter_lib.current_status()
    assert status is not None
    assert status.progress_percentage == 100 and status.estimated_remaining_seconds == 0
    metrics = status.metrics_dict()
    assert float(metrics["val_loss"]) == history.history["val_loss"][-1]
    assert "loss" in metrics


def test_keras_model_checkpoint_saves_are_reported(exporter: api.Exporter, tmp_path: object,
                                                   capsys: object) -> None:
    """``checkpoints=ModelCheckpoint(...)``: each epoch's save is reported with the file's
    modification time; the line ``verbose=1`` prints is one the log source recognises."""
    from pathlib import Path

    from exporter_lib.callbacks.keras import CheckpointDirectory
    from scraper.logsource.checkpoint_lines import is_save

    directory = Path(str(tmp_path)) / "ckpt"
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    saving = keras.callbacks.ModelCheckpoint(str(directory / "e{epoch:02d}.keras"), verbose=1)
    seen: list[float | None] = []

    class Look(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            status = exporter_lib.current_status()
            seen.append(None if status is None or status.last_checkpoint_time is None
                        else status.last_checkpoint_time.timestamp())

    model.fit(x, y, batch_size=8, epochs=2, verbose=0,
              callbacks=[saving, ExporterCallback(metrics_every_n_steps=2, checkpoints=saving),
                         Look()])
    files = sorted(directory.glob("*.keras"))
    assert [f.name for f in files] == ["e01.keras", "e02.keras"]
    # Reported at each epoch's end, as the file's time in whole seconds.
    assert seen == [float(int(f.stat().st_mtime)) for f in files]
    out = capsys.readouterr()  # type: ignore[attr-defined]
    lines = [line for line in (out.out + out.err).splitlines() if "saving model" in line]
    assert lines and all(is_save(line) for line in lines), lines
    try:
        CheckpointDirectory.of(42)
    except TypeError as exc:
        assert "checkpoints=42" in str(exc)
    else:
        raise AssertionError("a number was taken as a checkpoint path")
