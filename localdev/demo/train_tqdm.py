"""A training that knows nothing of progress reporting: numpy and a plain tqdm bar.

Imports nothing of this project.  It fits a small linear model with gradient
descent and shows a tqdm bar with the loss in its postfix, as countless training
scripts do; with ``make demo ARGS="--zero-code logs"`` the scraper reads that bar from
the pod's log and writes TrainJob ``status.trainerStatus``.

The bar redraws with ``\\r`` and reaches the log only in 16 KiB entries (the container
runtime's line limit) or at its end; ``--ncols`` and tqdm's ``mininterval`` decide
how often that is (docs/log-source.md, "Freshness").
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from tqdm import tqdm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8))
    w_true = rng.normal(size=8)
    y = x @ w_true + rng.normal(scale=0.1, size=512)
    w = np.zeros(8)
    bar = tqdm(range(args.steps), desc="train", mininterval=0.05)
    for _ in bar:
        grad = 2 * x.T @ (x @ w - y) / len(y)
        w -= 0.01 * grad
        loss = float(np.mean((x @ w - y) ** 2))
        bar.set_postfix(loss=f"{loss:.4f}")
        time.sleep(args.step_seconds)
    bar.close()
    print(f"final loss={loss:.4f}")


if __name__ == "__main__":
    main()
