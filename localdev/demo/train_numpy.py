"""The demo's training process: a real two-layer network trained with numpy.

Runs as its own process, like the training container of a TrainJob pod, and
reports through ``exporter_lib`` only (no Kubernetes access)::

    python -m localdev.demo.train_numpy --epochs 6 --log-file losses.jsonl

The data are synthetic (Gaussian clusters, one per class, made from a fixed
seed), so nothing is downloaded.  Each epoch ends with an evaluation on a
held-out split, which the progress tracker excludes from the step timing.
Every logged loss is also written to ``--log-file`` (one JSON object a line),
so a test can compare what the training logged with what the TrainJob shows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

import exporter_lib


def make_data(rng: np.random.Generator, samples: int, features: int, classes: int,
              ) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters: ``samples`` rows of ``features`` floats, labels in ``0..classes-1``."""
    centers = rng.standard_normal((classes, features), dtype=np.float32)
    labels = rng.integers(0, classes, size=samples)
    # float32 throughout: the default 72 000 x 784 rows stay near 230 MB.
    points = rng.standard_normal((samples, features), dtype=np.float32)
    points *= 5.0
    points += centers[labels]
    return points, labels


class Mlp:
    """Two dense layers with ReLU and softmax cross-entropy, trained by plain SGD."""

    def __init__(self, rng: np.random.Generator, features: int, hidden: int, classes: int):
        self.w1 = (rng.normal(0, 1, (features, hidden)) / np.sqrt(features)).astype(np.float32)
        self.b1 = np.zeros(hidden, np.float32)
        self.w2 = (rng.normal(0, 1, (hidden, classes)) / np.sqrt(hidden)).astype(np.float32)
        self.b2 = np.zeros(classes, np.float32)

    def logits(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = np.maximum(x @ self.w1 + self.b1, 0.0)
        return h, h @ self.w2 + self.b2

    def train_step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        h, z = self.logits(x)
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        n = len(y)
        loss = float(-np.log(p[np.arange(n), y] + 1e-12).mean())
        dz = p
        dz[np.arange(n), y] -= 1.0
        dz /= n
        dh = (dz @ self.w2.T) * (h > 0)
        self.w2 -= lr * (h.T @ dz)
        self.b2 -= lr * dz.sum(axis=0)
        self.w1 -= lr * (x.T @ dh)
        self.b1 -= lr * dh.sum(axis=0)
        return loss

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        return float((self.logits(x)[1].argmax(axis=1) == y).mean())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=4, help="passes over the data (default 4)")
    parser.add_argument("--samples", type=int, default=60_000, help="training rows (default 60000)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--features", type=int, default=784)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--log-every", type=int, default=25, help="steps between loss reports")
    parser.add_argument("--log-file", type=Path, help="append each logged loss here as JSON")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rng = np.random.default_rng(args.seed)
    x, y = make_data(rng, args.samples + args.samples // 5, args.features, args.classes)
    x_train, y_train = x[: args.samples], y[: args.samples]
    x_eval, y_eval = x[args.samples:], y[args.samples:]
    model = Mlp(rng, args.features, args.hidden, args.classes)

    steps_per_epoch = args.samples // args.batch_size
    total = steps_per_epoch * args.epochs
    exporter_lib.start()  # port and host from TRAINJOB_EXPORTER_PORT / _HOST
    tracker = exporter_lib.ProgressTracker(total_steps=total)
    log = args.log_file.open("a") if args.log_file else None

    def record(entry: dict[str, Any]) -> None:
        if log is not None:
            log.write(json.dumps(entry) + "\n")
            log.flush()

    step = 0
    running = 0.0
    tracker.start()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(args.samples)
        for batch in range(steps_per_epoch):
            idx = order[batch * args.batch_size:(batch + 1) * args.batch_size]
            loss = model.train_step(x_train[idx], y_train[idx], args.lr)
            running += loss
            step += 1
            metrics: dict[str, object] | None = None
            if step % args.log_every == 0:
                mean = round(running / args.log_every, 4)
                running = 0.0
                metrics = {"loss": mean, "epoch": epoch, "step": step}
                record({"step": step, "loss": mean})
            tracker.step(step, metrics=metrics)
        with tracker.paused():
            accuracy = round(model.accuracy(x_eval, y_eval), 4)
        record({"step": step, "eval_accuracy": accuracy})
        exporter_lib.update(metrics={"eval_accuracy": accuracy})
        print(f"epoch {epoch}/{args.epochs} step {step}/{total} "
              f"eval_accuracy {accuracy}", file=sys.stderr, flush=True)
    exporter_lib.update(progress_percentage=100, estimated_remaining_seconds=0)
    if log is not None:
        log.close()
    return 0  # the exporter writes the final status to the termination message at exit


if __name__ == "__main__":
    sys.exit(main())
