"""Keras 3 ``model.fit`` on random data; ``VERBOSE`` (1 or 2) picks the progress output.

Environment: ``EPOCHS`` (default 3), ``STEPS`` batches per epoch (default 8),
``SLEEP`` seconds per batch (default 0), ``KERAS_BACKEND`` (torch here), ``PRINT_LOG`` a
file that gets ``{"t": unix time, "progress": percent}`` at each epoch's end (the
freshness benchmark's reference; Keras prints the epoch's line then).
"""

import json
import os
import time

os.environ.setdefault("KERAS_BACKEND", "torch")
import keras
import numpy as np

epochs = int(os.environ.get("EPOCHS", "3"))
steps = int(os.environ.get("STEPS", "8"))
pause = float(os.environ.get("SLEEP", "0"))
verbose = int(os.environ.get("VERBOSE", "1"))


class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(pause)


class PrintLog(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        with open(os.environ["PRINT_LOG"], "a") as handle:
            handle.write(json.dumps({"t": time.time(),
                                     "progress": 100 * (epoch + 1) // epochs}) + "\n")


rng = np.random.default_rng(0)
x = rng.normal(size=(steps * 8, 4)).astype("float32")
y = (x.sum(axis=1) > 0).astype("float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
model.fit(x, y, batch_size=8, epochs=epochs, verbose=verbose, validation_split=0.0,
          callbacks=([Slow()] if pause else []) + ([PrintLog()] if "PRINT_LOG" in os.environ
                                                    else []))
print("done")
