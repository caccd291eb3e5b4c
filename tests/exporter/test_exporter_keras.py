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
