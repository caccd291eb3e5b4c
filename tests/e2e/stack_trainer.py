"""A small training loop for the scenario tests, run as a TrainJob's trainer command.

Reports through exporter_lib like real training code: progress per step and a
metric ``run`` naming the run (``$RUN_ID``), ``rank`` (``$PET_NODE_RANK``) and
``attempt`` (the JobSet restart attempt read from ``$RESTART_ATTEMPT``).
Options for the scenarios:

* ``--checkpoint PATH``: resume from the step stored there, store each step
  (a JobSet restart resumes instead of starting over), and report each store as a
  checkpoint (``exporter_lib.checkpoint_saved``);
* ``--checkpoint-age SECONDS``: report once, at the start, a checkpoint saved that long
  ago (a training far past its last checkpoint, without waiting for it);
* ``--fail-at STEP --fail-marker PATH``: exit 3 at that step unless the
  marker exists (created first), so only the first attempt fails;
* ``--linger SECONDS``: on SIGTERM keep serving that long before exiting
  (a terminating pod that still answers).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import exporter_lib


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-seconds", type=float, default=0.3)
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--fail-at", type=int)
    parser.add_argument("--fail-marker", type=Path)
    parser.add_argument("--linger", type=float, default=0.0)
    parser.add_argument("--checkpoint-age", type=float)
    args = parser.parse_args()
    labels = {"run": os.environ.get("RUN_ID", "run"),
              "rank": os.environ.get("PET_NODE_RANK", "?"),
              "attempt": os.environ.get("RESTART_ATTEMPT", "0") or "0"}
    exporter_lib.start(install_signal_handler=args.linger <= 0)
    if args.linger > 0:
        def on_sigterm(signum: int, frame: object) -> None:
            time.sleep(args.linger)
            sys.exit(143)
        signal.signal(signal.SIGTERM, on_sigterm)
    if args.checkpoint_age is not None:
        exporter_lib.checkpoint_saved(time.time() - args.checkpoint_age)
    step = 0
    if args.checkpoint is not None and args.checkpoint.exists():
        step = int(args.checkpoint.read_text() or 0)
    while step < args.steps:
        step += 1
        if args.fail_at is not None and step == args.fail_at and args.fail_marker is not None \
                and not args.fail_marker.exists():
            args.fail_marker.write_text("failed once\n")
            print(f"failing at step {step}", flush=True)
            return 3
        remaining = int((args.steps - step) * args.step_seconds)
        exporter_lib.update(progress_percentage=100 * step // args.steps,
                            estimated_remaining_seconds=remaining,
                            metrics={**labels, "step": str(step)})
        if args.checkpoint is not None:
            # Atomic: a SIGTERM between truncate and write (a preemption) would leave
            # an empty checkpoint and the next run would start over.
            tmp = args.checkpoint.with_name(args.checkpoint.name + ".tmp")
            tmp.write_text(str(step))
            tmp.replace(args.checkpoint)
            exporter_lib.checkpoint_saved()
        time.sleep(args.step_seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
