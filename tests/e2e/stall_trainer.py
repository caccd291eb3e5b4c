"""A training that pauses, run as a TrainJob's trainer command (the stall scenarios).

Reports through exporter_lib like real training code (progress and a ``step`` metric per
step).  ``--pause STEP:SECONDS`` (repeatable) blocks the loop after that step for that
long, as an evaluation phase or a hung collective would: the process and its exporter
stay alive and answer, the status does not change.  The pause is a wait on an Event
nobody sets, as a rank blocked in an all-reduce whose peer is gone.
"""

from __future__ import annotations

import argparse
import threading
import time

import exporter_lib


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-seconds", type=float, default=0.3)
    parser.add_argument("--pause", action="append", default=[],
                        help="STEP:SECONDS, a pause after that step")
    args = parser.parse_args()
    pauses = {int(s): float(d) for s, d in (p.split(":") for p in args.pause)}
    exporter_lib.start()
    never = threading.Event()
    for step in range(1, args.steps + 1):
        exporter_lib.update(progress_percentage=100 * step // args.steps,
                            metrics={"step": str(step)})
        print(f"step {step}", flush=True)
        if step in pauses:
            print(f"pausing {pauses[step]} s after step {step}", flush=True)
            never.wait(pauses[step])
        time.sleep(args.step_seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
