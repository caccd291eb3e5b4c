"""A plain PyTorch-style loop with a tqdm bar, loss in its postfix, and an eval bar.

Environment: ``STEPS`` (default 20), ``SLEEP`` seconds per step (default 0.05),
``TQDM_AUTO=1`` imports ``tqdm.auto`` instead of ``tqdm``, ``MININTERVAL`` is tqdm's
``mininterval`` (default tqdm's own, 0.1 s), ``PRINT_LOG`` a file that gets one JSON line
``{"t": unix time, "progress": percent}`` per step (the freshness benchmark's reference).
``EPOCHS`` (default 1): that many bars one after the other, each over ``STEPS`` with the
same description, as a loop that draws a bar per epoch and says nothing of their number.
``MANUAL=1`` (issue 27's bar): ``tqdm(total=STEPS, desc="train")``, then per step
``update(1)`` and ``set_postfix(loss=f"{1/(i+1):.4f}", refresh=False)``, then
``close()`` (one redraw per step, the postfix shown from the next redraw on).
"""

import json
import math
import os
import time

if os.environ.get("TQDM_AUTO") == "1":
    from tqdm.auto import tqdm
else:
    from tqdm import tqdm

steps = int(os.environ.get("STEPS", "20"))
pause = float(os.environ.get("SLEEP", "0.05"))
eval_every = int(os.environ.get("EVAL_EVERY", "0"))
kwargs = {"mininterval": float(os.environ["MININTERVAL"])} if "MININTERVAL" in os.environ else {}
print_log = open(os.environ["PRINT_LOG"], "a") if "PRINT_LOG" in os.environ else None  # noqa: SIM115
manual = os.environ.get("MANUAL") == "1"
if manual:
    hand = tqdm(total=steps, desc="train", **kwargs)
    for i in range(steps):
        time.sleep(pause)
        hand.update(1)
        hand.set_postfix(loss=f"{1 / (i + 1):.4f}", refresh=False)
    hand.close()
for _epoch in range(0 if manual else int(os.environ.get("EPOCHS", "1"))):
    bar = tqdm(range(steps), desc="train", **kwargs)
    for step in bar:
        time.sleep(pause)
        bar.set_postfix(loss=f"{math.exp(-step / 10):.4f}", lr=1e-3)
        if print_log is not None:  # set_postfix redrew the bar with this step's count
            print_log.write(json.dumps({"t": time.time(), "progress": 100 * step // steps})
                            + "\n")
            print_log.flush()
        if eval_every and (step + 1) % eval_every == 0:
            for _ in tqdm(range(5), desc="eval", leave=False):
                time.sleep(pause / 5)
    bar.close()
print("done")
