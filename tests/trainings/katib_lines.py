"""Metrics printed as Katib's StdOut collector reads them: ``name=value`` lines.

Environment: ``EPOCHS`` (default 5), ``SLEEP`` seconds per epoch (default 0.05).
"""

import math
import os
import time

epochs = int(os.environ.get("EPOCHS", "5"))
pause = float(os.environ.get("SLEEP", "0.05"))
for epoch in range(1, epochs + 1):
    time.sleep(pause)
    print(f"epoch {epoch}:")
    print(f"loss={math.exp(-epoch):.5f}")
    print(f"accuracy={1 - math.exp(-epoch) / 2:.4f}", flush=True)
print("done")
