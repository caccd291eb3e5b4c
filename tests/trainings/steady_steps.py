"""A training loop that reports through exporter_lib on every step: its loss and
remaining time change with every step, its percentage only every few seconds.

Environment: ``STEPS`` (default 400), ``SLEEP`` seconds per step (default 0.1),
``PERCENT_STEP`` (default 5): the reported percentage moves in steps of that many
points; ``PROGRESS_LOG``: a file that gets one JSON line ``{"t": unix time, "progress":
percent}`` whenever the percentage changes (the test's reference for freshness).
"""

import json
import math
import os
import time

import exporter_lib

steps = int(os.environ.get("STEPS", "400"))
pause = float(os.environ.get("SLEEP", "0.1"))
percent_step = int(os.environ.get("PERCENT_STEP", "5"))
log = open(os.environ["PROGRESS_LOG"], "a") if "PROGRESS_LOG" in os.environ else None  # noqa: SIM115

exporter_lib.start()  # port and host from TRAINJOB_EXPORTER_PORT / _HOST
reported = None
for step in range(steps):
    time.sleep(pause)
    percent = (100 * step // steps) // percent_step * percent_step
    exporter_lib.update(progress_percentage=percent,
                        estimated_remaining_seconds=(steps - step) * pause,
                        metrics={"loss": round(math.exp(-step / 100), 6), "step": step})
    if percent != reported and log is not None:
        log.write(json.dumps({"t": time.time(), "progress": percent}) + "\n")
        log.flush()
    reported = percent
exporter_lib.update(progress_percentage=100, estimated_remaining_seconds=0)
if log is not None:
    log.write(json.dumps({"t": time.time(), "progress": 100}) + "\n")
    log.flush()
print("done")
