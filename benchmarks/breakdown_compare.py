"""A changing scrape's pieces, an older commit against the work tree, alternated.

``python -m benchmarks.breakdown_compare REV [--targets 200] [--reps 3]``

Exports ``REV`` with ``git archive`` into a temporary folder, puts today's
``benchmarks/breakdown.py`` into it (so both sides measure the same pieces the same
way), and runs :func:`benchmarks.breakdown.changing_pieces` in a child process per side,
``--reps`` times each, alternated, nginx pinned to core 0 and the child to core 1.
Prints one JSON line per run (CPU us per operation, with the load average) and the mean
per side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import asyncio, json, os, sys
from benchmarks.breakdown import changing_pieces
from benchmarks.farm import NginxFarm
n = int(sys.argv[1])
with NginxFarm(n) as farm:
    os.sched_setaffinity(farm.pid, {0})
    os.sched_setaffinity(0, {1})
    pieces = asyncio.run(changing_pieces(farm.urls(n), float(sys.argv[2])))
print(json.dumps({k: round(v, 1) for k, v in pieces.items()}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.breakdown_compare",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the older commit")
    parser.add_argument("--targets", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--window", type=float, default=4.0)
    args = parser.parse_args()
    old = Path(tempfile.mkdtemp(prefix="breakdown-before-"))
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.rev],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        shutil.copy(ROOT / "benchmarks" / "breakdown.py", old / "benchmarks" / "breakdown.py")
        runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for _ in range(args.reps):
            for side, root in (("before", old), ("after", ROOT)):
                done = subprocess.run(
                    [sys.executable, "-c", CHILD, str(args.targets), str(args.window)],
                    cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                    capture_output=True, text=True, timeout=300, check=True)
                run = json.loads(done.stdout.strip().splitlines()[-1])
                run["load1"] = os.getloadavg()[0]
                runs[side].append(run)
                print(json.dumps({"side": side, **run}), flush=True)
        for side, rs in runs.items():
            mean = {k: round(sum(r[k] for r in rs) / len(rs), 1) for k in rs[0]}
            print(json.dumps({"side": side, "mean": mean}))
    finally:
        shutil.rmtree(old, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
