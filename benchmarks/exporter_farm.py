"""Child process of :class:`benchmarks.farm.ExporterFarm`: real exporters, updated in a loop.

Bounded: exits by itself after ``--duration`` seconds, or on SIGTERM; either way it
writes ``{port: [stamps]}`` to ``--log``.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import FrameType

from benchmarks.payload import report
from exporter_lib.api import Exporter
from exporter_lib.state import State


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ports", required=True)
    parser.add_argument("--period", type=float, required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--jitter", action="store_true",
                        help="spread each exporter's updates randomly over the period")
    args = parser.parse_args()
    done = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_term)
    ports = [int(p) for p in args.ports.split(",")]
    states = [State() for _ in ports]
    exporters = [Exporter(s, s, host="127.0.0.1", port=p, status_file=None,
                          termination_message_path=None, serve=True)
                 for s, p in zip(states, ports, strict=True)]
    stamps: dict[int, list[float]] = {p: [] for p in ports}
    step = 0
    rng = random.Random(ports[0])
    # Next update time per exporter; with --jitter each has its own phase.
    due = [time.time() + (rng.random() * args.period if args.jitter else 0.0) for _ in ports]
    for state, port in zip(states, ports, strict=True):
        now = time.time()
        report(state, step, {"stamp": now})
        stamps[port].append(now)
    end = time.monotonic() + args.duration
    try:
        while not done.is_set() and time.monotonic() < end:
            step += 1
            now = time.time()
            for i, (state, port) in enumerate(zip(states, ports, strict=True)):
                if now >= due[i]:
                    stamp = time.time()
                    report(state, step, {"stamp": stamp})
                    stamps[port].append(stamp)
                    due[i] = now + args.period * (0.8 + 0.4 * rng.random() if args.jitter
                                                  else 1.0)
            next_due = min(due) - time.time()
            done.wait(min(max(next_due, 0.001), 0.5))
    finally:
        # The log first: each stop() waits up to the server's 0.5 s poll, so stopping
        # 125 exporters one by one outlasts the parent's SIGKILL grace period.
        with open(args.log, "w") as handle:
            json.dump(stamps, handle)
        with ThreadPoolExecutor(max_workers=32) as pool:
            list(pool.map(lambda exporter: exporter.stop(), exporters))


if __name__ == "__main__":
    main()
