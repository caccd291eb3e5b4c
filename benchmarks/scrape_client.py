"""The scrape's HTTP client at the defaults: two trees of the scraper, same harness.

``python -m benchmarks.scrape_client --tree own=/path/a --tree aiohttp=/path/b
[--targets 1000 10000] [--warmup 75] [--window 120] [--rounds 2]``

``python -m benchmarks.scrape_client --tree own=/path/a --aiohttp-of aiohttp=/path/a ...``
measures one tree against itself with aiohttp's client: ``--aiohttp-of LABEL=PATH``
(``LABEL=`` may be left out: ``aiohttp``) copies PATH's tracked files (``git -C PATH
ls-files``, as they are in the working tree) into a temporary directory, puts
``benchmarks/aiohttp_exchange.py`` of the tree running this harness in place of the
copy's ``scraper/scrape/http_exchange.py`` (or ``scraper/http_exchange.py`` in older
trees) and measures the copy as one more side; the copy is removed at the end.
``--tree`` and ``--aiohttp-of`` may be given several times, in any mix; the sides run in
the order given.

Issue 28, deliverable 3: CPU of the scrape with the scraper's own HTTP/1.1 client
(``scraper/scrape/http_exchange.py``) against aiohttp's client, at the defaults (interval 30 s,
waiting scrapes, write budget QPS 20 / burst 30), at N TrainJobs.  Each ``--tree`` is a
checkout whose ``scraper`` package is measured: the child
``python -m benchmarks.our_scraper`` runs with ``PYTHONPATH`` and the working directory
set to it, so the scheduler, scrape loop, scraper, write queue and token bucket are that
tree's and the harness is the same file in both.

For each N one set of exporter children (:class:`benchmarks.cluster_scale._Exporters`:
an aiohttp server on N loopback ports offering waiting scrapes, contract 2, max-wait 60 s)
changes every target's status once per interval, at a per-port phase: every held
request is answered once per interval, the most scrapes the defaults allow.  The trees
run in turn, ``--rounds`` times, so a change of the machine's load hits both.  Each run:
CPU seconds (utime+stime from ``/proc/self/stat``) of the scraper process over the
window, scrapes done in it, CPU per scrape and the share of one core.

Left out (every row built on this says so): discovery (no pod or TrainJob watch), the
Kubernetes API (the writer holds statuses in memory: no write request is sent), TLS,
other pods' traffic; the exporters share the machine (not pinned).  Prints one JSON
object per run and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cluster_scale import _Exporters

INTERVAL = 30.0
#: The aiohttp variant of the scrape's exchange (same interface as the own client).
AIOHTTP_EXCHANGE = Path(__file__).with_name("aiohttp_exchange.py")
#: Where a tree's own exchange is (newest layout first).
EXCHANGE_PATHS = ("scraper/scrape/http_exchange.py", "scraper/http_exchange.py")


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run_tree(tree: Path, urls_file: Path, warmup: float, window: float) -> dict[str, Any]:
    """One run of ``benchmarks.our_scraper`` from ``tree`` at the defaults."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "benchmarks.our_scraper", "--urls-file", str(urls_file),
           "--interval", str(INTERVAL), "--warmup", str(warmup), "--window", str(window),
           "--default-budget"]
    before = load()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=env,
                          timeout=warmup + window + 300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"our_scraper from {tree} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(
        [line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    result["load_before"], result["load_after"] = before, load()
    return result


def aiohttp_copy(tree: Path, into: Path) -> Path:
    """A copy of ``tree``'s tracked files in ``into`` with its exchange replaced by
    :data:`AIOHTTP_EXCHANGE`."""
    listed = subprocess.run(["git", "-C", str(tree), "ls-files", "-z"], capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src, dst = tree / name, into / name
        if src.is_symlink() or src.is_file():  # a file deleted in the work tree is left out
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst, follow_symlinks=False)
    exchange = next((into / p for p in EXCHANGE_PATHS if (into / p).is_file()), None)
    if exchange is None:
        raise SystemExit(f"{tree}: none of {', '.join(EXCHANGE_PATHS)} to replace")
    exchange.write_bytes(AIOHTTP_EXCHANGE.read_bytes())
    return into


def _side(text: str, aiohttp: bool) -> tuple[str, Path, bool]:
    label, eq, path = text.partition("=")
    if not eq:
        if not aiohttp:
            raise argparse.ArgumentTypeError(f"{text!r}: LABEL=PATH")
        label, path = "aiohttp", text
    return label, Path(path).resolve(), aiohttp


def summary(label: str, r: dict[str, Any]) -> dict[str, Any]:
    scrapes = float(r["scrapes"])
    return {
        "client": label, "targets": r["targets"], "window_s": round(r["window"], 1),
        "cpu_s": round(r["cpu_seconds"], 2), "scrapes": int(scrapes),
        "scrapes_per_s": round(scrapes / r["window"], 1),
        "expected_per_s": round(r["targets"] / INTERVAL, 1),
        "us_per_scrape": round(1e6 * r["cpu_seconds"] / scrapes, 1) if scrapes else None,
        "core_pct": round(100 * r["cpu_seconds"] / r["window"], 2),
        "skipped": int(r["skipped"]), "held_at_end": r["held"],
        "rss_mib": round(r["rss_after"] / 2**20), "results": r["results"],
        "load_before": r["load_before"], "load_after": r["load_after"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", dest="sides",
                        type=lambda t: _side(t, aiohttp=False),
                        help="LABEL=PATH of a checkout whose scraper is measured")
    parser.add_argument("--aiohttp-of", action="append", dest="sides",
                        type=lambda t: _side(t, aiohttp=True), metavar="[LABEL=]PATH",
                        help="a checkout measured with benchmarks/aiohttp_exchange.py in "
                             "place of its scrape exchange (label: aiohttp)")
    parser.add_argument("--targets", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--warmup", type=float, default=75.0)
    parser.add_argument("--window", type=float, default=120.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not args.sides:
        parser.error("give at least one --tree or --aiohttp-of")
    copies: list[Path] = []
    try:
        trees = []
        for label, path, aiohttp in args.sides:
            if aiohttp:
                copies.append(Path(tempfile.mkdtemp(prefix="aiohttp-of-")))
                path = aiohttp_copy(path, copies[-1])
            trees.append((label, path))
        return measure(args, trees)
    finally:
        for copy in copies:
            shutil.rmtree(copy, ignore_errors=True)


def measure(args: argparse.Namespace, trees: list[tuple[str, Path]]) -> int:
    """Every side at every N, ``--rounds`` times; JSON per run, then the table."""
    rows: list[dict[str, Any]] = []
    for n in args.targets:
        with tempfile.TemporaryDirectory(prefix="scrape-client-") as tmp:
            workdir = Path(tmp)
            per_run = args.warmup + args.window + 60
            exporters = _Exporters(n, workdir, duration=per_run * args.rounds * len(trees) + 300)
            try:
                exporters.changing(INTERVAL)
                time.sleep(2)
                urls_file = workdir / "urls.json"
                urls_file.write_text(json.dumps(
                    [f"http://127.0.0.1:{p}/metrics" for p in exporters.ports]))
                for round_ in range(args.rounds):
                    for label, tree in trees:
                        row = summary(label, run_tree(tree, urls_file, args.warmup,
                                                      args.window))
                        row["round"] = round_ + 1
                        rows.append(row)
                        print(json.dumps(row), flush=True)
            finally:
                exporters.stop()
    print()
    print("| N | client | round | CPU per scrape (us) | share of a core | scrapes/s "
          "(expected) | skipped | RSS MiB | load before / after |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['targets']} | {r['client']} | {r['round']} | {r['us_per_scrape']} | "
              f"{r['core_pct']} % | {r['scrapes_per_s']} ({r['expected_per_s']}) | "
              f"{r['skipped']} | {r['rss_mib']} | {r['load_before']} / {r['load_after']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
