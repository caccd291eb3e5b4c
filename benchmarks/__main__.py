"""``python -m benchmarks``: our scraper versus Prometheus, side by side, one run, one machine.

Phases (each bounded in time; every process started is stopped in ``finally``):

1. ``benchmarks/exporter_bench.py`` first, while no farm runs (update(), render,
   training-loop overhead versus the Kubeflow SDK's push client as shipped).
2. nginx farm (N static targets, ETag/304, JSON by ``Accept``): Prometheus, then our
   scraper with discovery bypassed; CPU per scrape from ``/proc/<pid>/stat``.
3. capacity: our scraper pinned to one core, more targets per second until intervals
   are missed.
4. the real control plane: ``python -m scraper run`` with N pods (unchanged), then M
   live pods: freshness and API writes versus real changes.
5. exporter farm (N real exporter_lib exporters updated every interval/2): Prometheus,
   ours, and ours with the status write path left out.
6. ``benchmarks/breakdown.py``: timer wakeup, APScheduler job run, aiohttp GET -> 304
   and the write's thread hop, each alone.

With two or more cores, the farm (nginx, the exporter_lib children; the API server and
etcd in phase 4) runs on one core and the scraper under test (ours, then Prometheus) on
another (:mod:`benchmarks.pinning`); the report names the cores each process was
allowed, read back from it.  The exporter benchmark and the breakdown are not pinned.
A run of ours that skipped scheduled runs or came short of its expected scrapes is
"NOT met (behind schedule)" whatever its ratio; a Prometheus run short of its schedule
gets no ratio.

Writes ``benchmarks/results/bench-<time>.{md,json}`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import breakdown, cp, pinning, prom
from benchmarks.farm import ExporterFarm, NginxFarm
from benchmarks.payload import render_payloads, series_count
from benchmarks.pinning import Pinning, pinned
from benchmarks.report import fmt, loadavg, verdict

RESULTS = Path(__file__).resolve().parent / "results"
#: Our CPU per scrape relative to Prometheus's (issue 7 targets).
TARGET_UNCHANGED_RATIO = 0.5
TARGET_CHANGING_RATIO = 1.0
TARGET_RATE = 2000.0
#: Share of the expected scrapes that must happen for a rate to count as sustained.
SUSTAINED_SHARE = 0.97
#: Share of 304s above which a changing-payload run did not see changing payloads.
STALE_SHARE = 0.03
#: CPU seconds a run needs in its window: /proc/<pid>/stat counts 10 ms ticks.
MIN_CPU_SECONDS = 1.0


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_ours(urls: list[str], interval: float, warmup: float, window: float,
             cores: frozenset[int] | None = None, profile: Path | None = None,
             writes: bool = True, wait: bool = True,
             default_budget: bool = False, queue_only: bool = False) -> dict[str, Any]:
    """Our scraper (discovery bypassed) in a child process started on ``cores``; see
    benchmarks/our_scraper.py (writes go to memory: no API request)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(urls, handle)
    try:
        cmd = [sys.executable, "-m", "benchmarks.our_scraper", "--urls-file", handle.name,
               "--interval", str(interval), "--warmup", str(warmup), "--window", str(window)]
        if not writes:
            cmd.append("--no-writes")
        if not wait:
            cmd.append("--no-wait-scrapes")
        if default_budget:
            cmd.append("--default-budget")
        if queue_only:
            cmd.append("--queue-only")
        if profile is not None:  # py-spy (dev extra) samples the child without pausing it
            spy = Path(sys.executable).with_name("py-spy")
            cmd = [str(spy), "record", "--nonblocking", "-r", "250", "-f", "raw",
                   "-o", str(profile), "--", *cmd]
        with pinned(cores):
            done = subprocess.run(cmd, capture_output=True, text=True,
                                  timeout=warmup + window + 120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"our_scraper failed: {done.stderr[-2000:]}")
        # py-spy adds its own lines to stdout; the child's JSON is the last "{" line.
        last = [line for line in done.stdout.splitlines() if line.startswith("{")][-1]
        result: dict[str, Any] = json.loads(last)
        return result
    finally:
        os.unlink(handle.name)


def profile_summary(raw: Path, top: int = 25) -> list[str]:
    """Inclusive share of the event-loop samples per function (imports and idle left out)."""
    incl: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "run_forever" not in stack or "_find_and_load" in stack or "select (" in stack:
            continue
        total += int(count)
        for frame in {f.split(" (")[0] for f in stack.split(";")}:
            incl[frame] = incl.get(frame, 0) + int(count)
    ranked = sorted(incl.items(), key=lambda kv: -kv[1])[:top]
    return [f"{100 * v / max(1, total):5.1f}%  {k}" for k, v in ranked]


def per_scrape_us(r: dict[str, Any] | None) -> float | None:
    if not r or not r.get("scrapes"):
        return None
    return 1e6 * float(r["cpu_seconds"]) / float(r["scrapes"])


def capacity(farm: NginxFarm, interval: float, steps: list[int], warmup: float,
             window: float, pin: Pinning | None) -> dict[str, Any]:
    """Most scrapes/s our scraper sustains on one core (pinned) without missing intervals:
    the scraper's core when the run is pinned, else the highest this process may use."""
    cores = pin.scraper if pin else frozenset({max(os.sched_getaffinity(0))})
    core = min(cores)
    tried: list[dict[str, Any]] = []
    best = 0.0
    for n in steps:
        if n > len(farm.ports):
            break
        r = run_ours(farm.urls(n), interval, warmup, window, cores=cores)
        # No missed intervals: no run skipped, the scrapes all there (within the count's
        # granularity of one phase burst), and the core not saturated.
        r["sustained"] = behind(r) is None and r["cpu_seconds"] / r["window"] < 0.95
        tried.append(r)
        log(f"capacity: {n / interval:.0f}/s wanted, {r['scrapes'] / r['window']:.0f}/s done, "
            f"{r.get('skipped', 0):.0f} runs skipped, {r['cpu_seconds'] / r['window']:.0%} "
            "of a core -> "
            f"{'ok' if r['sustained'] else 'missed'}")
        if not r["sustained"]:
            break
        best = n / interval
    return {"core": core, "steps": tried, "sustained_rate": best}


def exporter_bench() -> str:
    """The exporter engineer's benchmark, run as it is (its printed lines are the figures)."""
    script = Path(__file__).resolve().parent / "exporter_bench.py"
    if not script.exists():
        return "(benchmarks/exporter_bench.py not present)"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=600, check=False)
    return (done.stdout + ("" if done.returncode == 0 else done.stderr[-1500:])).strip()


#: The runs the CPU ratios rest on: result key -> (label, row).
PROM_RUNS = {"prom_static": ("Prometheus, unchanged", "unchanged"),
             "prom_changing": ("Prometheus, changing", "changing")}
OUR_RUNS = {"ours_static": ("ours, unchanged", "unchanged"),
            "ours_changing": ("ours, changing", "changing"),
            "ours_changing_budget": ("ours, changing, default budget", "changing_budget"),
            "ours_changing_no_writes": ("ours, changing, no writes", "no_writes")}
#: The control-plane windows (:mod:`benchmarks.cp`), keys of ``res["controlplane"]``.
CP_RUNS = {"unchanged": ("ours with discovery, unchanged", "cp_unchanged"),
           "changing": ("ours with discovery, changing, real writes", "cp_changing")}


def problems(res: dict[str, Any]) -> list[tuple[str, str]]:
    """(row, why) for each run whose CPU-per-scrape figure does not count.

    Targets down or scrapes failed: failed scrapes are cheaper than good ones, so a
    run where the farm could not keep up would flatter whoever saw more failures.
    """
    out = []
    for key, (label, row) in PROM_RUNS.items():
        r = res.get(key)
        if not r:
            continue
        if r.get("up") is None or r["up"] < r["targets"]:
            out.append((row, f"{label}: only {fmt(r.get('up'))} of {r['targets']} targets up"))
        if short_of_schedule(r):
            out.append((row, f"{label}: fell behind, {r['scrapes']:.0f} of "
                             f"{r['expected']:.0f} expected scrapes"))
    for key, (label, row) in OUR_RUNS.items():
        r = res.get(key)
        if not r:
            continue
        good = sum(r["results"].get(k, 0.0) for k in ("ok", "not_modified"))
        if r["scrapes"] and good < r["scrapes"]:
            out.append((row, f"{label}: {r['scrapes'] - good:.0f} of {r['scrapes']:.0f} "
                             f"scrapes failed ({r['results']})"))
        unchanged = r["results"].get("not_modified", 0.0)
        if row != "unchanged" and unchanged > STALE_SHARE * r["scrapes"]:
            # 304s are cheap: a farm that stopped changing would flatter us.
            out.append((row, f"{label}: {unchanged:.0f} of {r['scrapes']:.0f} scrapes "
                             "found the payload unchanged"))
    for key, (label, row) in {**PROM_RUNS, **OUR_RUNS}.items():
        r = res.get(key)
        if r and r["cpu_seconds"] < MIN_CPU_SECONDS:
            out.append((row, f"{label}: {r['cpu_seconds']:.2f} s of CPU in the window; /proc "
                             f"counts 10 ms ticks, so a figure needs >= {MIN_CPU_SECONDS:g} s "
                             "to be within 1% (use more targets or a longer --window)"))
    return out


def short_of_schedule(r: dict[str, Any]) -> bool:
    """True when a run did fewer scrapes than its targets and window call for."""
    return "expected" in r and r["scrapes"] < SUSTAINED_SHARE * r["expected"]


def behind(r: dict[str, Any] | None) -> str | None:
    """Why our run did not keep its schedule (runs skipped, scrapes short), or None."""
    if not r or "expected" not in r:
        return None
    if r.get("skipped", 0) or short_of_schedule(r):
        return (f"{r['scrapes']:.0f} of {r['expected']:.0f} expected scrapes, "
                f"{r.get('skipped', 0):.0f} runs skipped")
    return None


def lagging(res: dict[str, Any]) -> list[tuple[str, str]]:
    """(row, why) for each of our runs that fell behind its schedule: its CPU per scrape
    still counts, but the rate was not sustained, so the row is NOT met whatever the ratio
    (the control-plane rows have no verdict: their figure says "behind schedule")."""
    out = []
    cpd = res.get("controlplane") or {}
    runs = [(res.get(key), label, row) for key, (label, row) in OUR_RUNS.items()]
    runs += [(cpd.get(key), label, row) for key, (label, row) in CP_RUNS.items()]
    for r, label, row in runs:
        why = behind(r)
        if why:
            out.append((row, f"{label}: behind schedule: {why}"))
    return out


def rate_text(cap: dict[str, Any]) -> str:
    """The sustained rate: "< lowest step" when even the first step missed, ">= highest
    step" when every step tried held."""
    if not cap or not cap.get("steps"):
        return "n/a"
    steps = cap["steps"]
    if not cap.get("sustained_rate"):
        return f"< {steps[0]['targets'] / steps[0]['interval']:.0f}"
    if all(step["sustained"] for step in steps):
        return f">= {fmt(cap['sustained_rate'])} (highest tried)"
    return fmt(cap["sustained_rate"])


def rate_verdict(cap: dict[str, Any]) -> bool | None:
    """Met, NOT met, or None when the steps tried stop short of the target and all held."""
    if not cap or not cap.get("steps"):
        return None
    if cap.get("sustained_rate", 0) >= TARGET_RATE:
        return True
    if all(step["sustained"] for step in cap["steps"]):
        return None
    return False


def table(res: dict[str, Any]) -> str:
    """The markdown report of one run."""
    p_static, o_static = res.get("prom_static"), res.get("ours_static")
    p_live, o_live = res.get("prom_changing"), res.get("ours_changing")
    ps, os_, pl, ol = (per_scrape_us(p_static), per_scrape_us(o_static),
                       per_scrape_us(p_live), per_scrape_us(o_live))
    cpd = res.get("controlplane") or {}
    cp_static = per_scrape_us(cpd.get("unchanged"))
    cp_live = cpd.get("changing") or {}
    cap = res.get("capacity") or {}
    n, interval = res["targets"], res["interval"]
    ol_nw = per_scrape_us(res.get("ours_changing_no_writes"))
    o_budget = res.get("ours_changing_budget")
    ol_b = per_scrape_us(o_budget)
    bad = problems(res)
    late = lagging(res)
    invalid = {row for row, _ in bad}
    behind_rows = {row for row, _ in late}
    # A ratio over a run with targets down or scrapes failed is no verdict at all
    # (and a Prometheus figure of 0 CPU ticks is no base for one).
    r_static = None if not ps or os_ is None or "unchanged" in invalid else os_ / ps
    r_live = None if not pl or ol is None or "changing" in invalid else ol / pl
    r_nw = None if not pl or ol_nw is None or "no_writes" in invalid else ol_nw / pl
    r_b = None if not pl or ol_b is None or "changing_budget" in invalid else ol_b / pl

    def ratio_verdict(ratio: float | None, target: float, row: str) -> str:
        if ratio is None:
            return "n/a"
        if row in behind_rows:
            return "NOT met (behind schedule)"
        return verdict(ratio <= target)

    def on_schedule(row: str) -> str:
        return " (behind schedule)" if row in behind_rows else ""
    # Both sides the same two ways: resident memory with N targets over N, and its growth
    # over the same process with no targets (ours: before the targets were scheduled;
    # Prometheus: a run of the same server with an empty scrape configuration).
    kib = 1024
    rss_ours = None if not o_static else o_static["rss_after"] / o_static["targets"] / kib
    rss_prom = None if not p_static else p_static["rss"] / p_static["targets"] / kib
    grow_ours = None if not o_static else \
        (o_static["rss_after"] - o_static["rss_before"]) / o_static["targets"] / kib
    p_base = res.get("prom_baseline")
    grow_prom = None if not p_static or not p_base else \
        (p_static["rss"] - p_base["rss"]) / p_static["targets"] / kib
    p99 = cp_live.get("freshness_p99")
    per_write = cp_live["writes"] / cp_live["scrapes"] if cp_live.get("scrapes") else None
    writes, changes = cp_live.get("writes_checked"), cp_live.get("changes_checked")
    lines = [
        f"N = {n} targets, interval {interval:g} s, payload {res['series']} series "
        f"({res['payload_bytes']['text']} B text / {res['payload_bytes']['json']} B JSON); "
        f"{res['machine']}; started {res.get('started', 'n/a')} UTC, "
        f"{res.get('seconds', 0):.0f} s.",
        "",
        f"Machine load (`uptime` load average, 1/5/15 min) at start {res['loadavg_start']}, at "
        f"end {res.get('loadavg_end', 'n/a')}: the cores are shared with other work, so "
        "these are not quiet-machine figures.",
        "",
        f"Pinning: {res.get('pinning') or 'none (fewer than two cores allowed)'}. "
        f"Cores each measured process was allowed: {cores_text(res)}.",
        "",
        "| figure | Prometheus 2.42 | ours | ratio | target | verdict |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| CPU per scrape, unchanged payload (nginx, 304 for us) | {fmt(ps)} us | {fmt(os_)} us"
        f" | {fmt(r_static, '.2f', 'x')} | <= {TARGET_UNCHANGED_RATIO}x | "
        f"{ratio_verdict(r_static, TARGET_UNCHANGED_RATIO, 'unchanged')} |",
        f"| CPU per scrape, changing payload (exporter_lib exporters; ours at metrics "
        f"staleness 0: every change answered), every change through "
        f"the write queue, **no API request sent** (writes go to memory) | {fmt(pl)} us | "
        f"{fmt(ol)} us | {fmt(r_live, '.2f', 'x')} | <= {TARGET_CHANGING_RATIO}x | "
        f"{ratio_verdict(r_live, TARGET_CHANGING_RATIO, 'changing')} |",
        f"| CPU per scrape, changing payload, default write budget (QPS 20, burst 30: "
        f"{fmt((o_budget or {}).get('writes'))} writes for {fmt((o_budget or {}).get('scrapes'))}"
        f" scrapes, changes coalesced), **no API request sent** | {fmt(pl)} us | "
        f"{fmt(ol_b)} us | "
        f"{fmt(r_b, '.2f', 'x')} | <= {TARGET_CHANGING_RATIO}x | "
        f"{ratio_verdict(r_b, TARGET_CHANGING_RATIO, 'changing_budget')} |",
        f"| CPU per scrape, changing payload, status write path left out (the scrape path "
        f"alone) | {fmt(pl)} us | {fmt(ol_nw)} us | {fmt(r_nw, '.2f', 'x')} | "
        f"<= {TARGET_CHANGING_RATIO}x | "
        f"{ratio_verdict(r_nw, TARGET_CHANGING_RATIO, 'no_writes')} |",
        f"| CPU per scrape with discovery (control plane, unchanged) | | {fmt(cp_static)} us"
        f"{on_schedule('cp_unchanged')} | | | |",
        f"| CPU per scrape with discovery, changing, incl. real API writes (the local API "
        f"server; write QPS 500, metrics staleness 0; {fmt(cpd.get('targets'))} unchanged "
        f"nginx targets and {fmt(cpd.get('live_targets'))} changing exporters) | | "
        f"{fmt(per_scrape_us(cp_live or None))} us{on_schedule('cp_changing')} | | | |",
        f"| scrapes/s sustained on one core, no missed intervals | | "
        f"{rate_text(cap)} | | >= {TARGET_RATE:.0f} | {verdict(rate_verdict(cap))} |",
        f"| freshness p50 / p99 (update -> TrainJob status; write QPS 500, metrics "
        f"staleness 0, not the defaults) | | "
        f"{fmt(cp_live.get('freshness_p50'), '.2f')} / {fmt(p99, '.2f')} s | | "
        f"p99 <= {interval + 1:g} s | {verdict(None if p99 is None else p99 <= interval + 1)} |",
        f"| API writes / real status changes (live, by watch) | | {fmt(writes)} / {fmt(changes)} "
        f"| | equal | {verdict(None if writes is None else writes == changes)} |",
        f"| API writes in an unchanged window | | "
        f"{fmt((cpd.get('unchanged') or {}).get('writes'))} | | 0 | "
        f"{verdict(None if not cpd.get('unchanged') else cpd['unchanged']['writes'] == 0)} |",
        f"| API writes per scrape (live window) | | "
        f"{fmt(per_write, '.3f')} "
        "| | | |",
        f"| RSS per target, total/N (unchanged run, discovery bypassed: no informers) | "
        f"{fmt(rss_prom, '.1f')} KiB | {fmt(rss_ours, '.1f')} KiB | "
        f"{fmt(None if not rss_prom or rss_ours is None else rss_ours / rss_prom, '.2f', 'x')}"
        " | | |",
        f"| RSS per target, growth/N over the same process with no targets | "
        f"{fmt(grow_prom, '.1f')} KiB | {fmt(grow_ours, '.1f')} KiB | "
        f"{fmt(None if not grow_prom or grow_ours is None else grow_ours / grow_prom, '.2f', 'x')}"
        " | | |",
    ]
    if res.get("exporter_farm_unready"):
        lines += ["", f"{res['exporter_farm_unready']} of {n} exporter_lib exporters did not "
                  "answer within 30 s of the farm's start (a port taken by another "
                  "process, or a child starved of CPU)."]
    if bad:
        lines += ["", "**Not a valid comparison**, so no ratio:", ""]
        lines += [f"- {why}" for _, why in bad]
    if late:
        lines += ["", "**Our scraper fell behind** (its CPU per scrape counts; the rate "
                  "was not sustained):", ""]
        lines += [f"- {why}" for _, why in late]
    if cpd.get("error"):
        lines += ["", f"Control-plane phase failed: `{cpd['error'][:300]}`"]
    lines += ["", "Exporter (benchmarks/exporter_bench.py):", "", "```",
              res.get("exporter_bench", "(skipped)"), "```"]
    if res.get("breakdown"):
        lines += ["", "Where a scrape's CPU goes, CPU per operation (benchmarks/breakdown.py):",
                  "", "```", *res["breakdown"], "```"]
    return "\n".join(lines)


def cores_text(res: dict[str, Any]) -> str:
    """``run: cores`` for every run that recorded the cores it was allowed."""
    parts = [f"{key} {','.join(map(str, r['cores']))}" for key, r in res.items()
             if isinstance(r, dict) and r.get("cores")]
    parts += [f"{key} {','.join(map(str, cores))}"
              for key, cores in (res.get("farm_cores") or {}).items()]
    return "; ".join(parts) or "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="about two minutes, fewer targets")
    parser.add_argument("-n", "--targets", type=int, default=None,
                        help="targets (default 1000; 200 with --quick)")
    parser.add_argument("--interval", type=float, default=1.0, help="scrape interval, s (>= 1)")
    parser.add_argument("--window", type=float, default=None, help="measured seconds per phase")
    parser.add_argument("--live", type=int, default=None, help="live pods in the control plane")
    parser.add_argument("--skip-controlplane", action="store_true")
    parser.add_argument("--skip-capacity", action="store_true")
    parser.add_argument("--skip-exporter-bench", action="store_true")
    parser.add_argument("--profile", action="store_true",
                        help="also profile our unchanged-payload run with py-spy")
    parser.add_argument("--no-pin", action="store_true",
                        help="leave every process on every core (the runs before issue 23)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    quick = args.quick
    if args.targets is not None and args.targets < 1:
        parser.error(f"--targets={args.targets}: must be at least 1")
    n = args.targets or (200 if quick else 1000)
    if args.interval < 1.0:
        parser.error(f"--interval={args.interval:g}: must be at least 1 s (the scraper's minimum)")
    if args.window is not None and args.window <= 0:
        parser.error(f"--window={args.window:g}: must be more than 0 s")
    interval = args.interval
    window = args.window or (4.0 if quick else 10.0)
    warmup = 2 * interval + 1
    steps = [n] if quick else [1000, 1500, 2000, 2500, 3000, 4000]
    steps = sorted({max(1, s) for s in steps})
    text, js = render_payloads()
    res: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()), "targets": n,
        "interval": interval,
        "window": window, "quick": quick, "series": series_count(text),
        "payload_bytes": {"text": len(text), "json": len(js)},
        "machine": f"{os.cpu_count()} cores, {platform.python_implementation()} "
                   f"{platform.python_version()}",
        "loadavg_start": loadavg(),
    }
    pin = None if args.no_pin else pinning.choose()
    res["pinning"] = pin.text() if pin else None
    farm_cores = pin.farm if pin else None
    ours_cores = pin.scraper if pin else None
    res["farm_cores"] = {}
    started = time.monotonic()
    try:
        if not args.skip_exporter_bench:
            # First, while no farm runs: its microsecond figures are the most sensitive.
            log("exporter_bench")
            res["exporter_bench"] = exporter_bench()
        farm_size = max(n, *(steps if not args.skip_capacity else [n]))
        log(f"nginx farm: {farm_size} ports")
        log("Prometheus with no targets (the RSS baseline)")
        res["prom_baseline"] = prom.measure([], interval, warmup + 5, 1.0, cores=ours_cores)
        with NginxFarm(farm_size, cores=farm_cores) as farm:
            res["farm_cores"]["nginx"] = sorted(pinning.affinity(farm.pid))
            log("Prometheus, unchanged payloads")
            res["prom_static"] = prom.measure(farm.urls(n), interval, warmup + 5, window,
                                              cores=ours_cores)
            log(f"  {per_scrape_us(res['prom_static']):.0f} us/scrape")
            log("ours (discovery bypassed), unchanged payloads")
            res["ours_static"] = run_ours(farm.urls(n), interval, warmup, window,
                                          cores=ours_cores)
            log(f"  {per_scrape_us(res['ours_static']):.0f} us/scrape")
            if args.profile:
                args.out.mkdir(parents=True, exist_ok=True)
                raw = args.out / f"profile-{time.strftime('%Y%m%d-%H%M%S')}.txt"
                run_ours(farm.urls(n), interval, warmup, window, cores=ours_cores,
                         profile=raw)
                res["profile_top"] = profile_summary(raw)
                log("profile (inclusive, event loop):\n" + "\n".join(res["profile_top"]))
            if not args.skip_capacity:
                res["capacity"] = capacity(farm, interval, steps, warmup + 2,
                                           max(4.0, window / 2), pin)
            if not args.skip_controlplane:
                log("control plane: scraper with discovery, then live pods")
                res["controlplane"] = cp.measure(
                    farm.ports[:n], interval, args.live or (10 if quick else 50), warmup, window,
                    pin=pin)
                cpr = res["controlplane"]
                log(f"  {cpr.get('error') or cpr.get('changing')}")
        duration = 4 * (warmup + window) + 90
        log(f"exporter farm: {n} exporter_lib exporters changing every {interval / 2:g} s")
        with ExporterFarm(n, period=interval / 2, duration=duration,
                          cores=farm_cores) as live:
            res["farm_cores"]["exporter_lib farm"] = sorted(
                set().union(*(pinning.affinity(pid) for pid in live.pids)))
            res["exporter_farm_unready"] = len(live.unready)
            if live.unready:
                log(f"  {len(live.unready)} of {n} exporters did not answer within 30 s")
            res["prom_changing"] = prom.measure(live.urls(), interval, warmup + 5, window,
                                                cores=ours_cores)
            log(f"  Prometheus {per_scrape_us(res['prom_changing']):.0f} us/scrape")
            res["ours_changing"] = run_ours(live.urls(), interval, warmup, window,
                                            cores=ours_cores)
            log(f"  ours {per_scrape_us(res['ours_changing']):.0f} us/scrape")
            res["ours_changing_budget"] = run_ours(live.urls(), interval, warmup, window,
                                                   cores=ours_cores, default_budget=True)
            log(f"  ours, default write budget "
                f"{per_scrape_us(res['ours_changing_budget']):.0f} us/scrape")
            res["ours_changing_no_writes"] = run_ours(live.urls(), interval, warmup, window,
                                                      cores=ours_cores, writes=False)
            log(f"  ours without the write path "
                f"{per_scrape_us(res['ours_changing_no_writes']):.0f} us/scrape")
        log("breakdown: the scrape's pieces one at a time")
        res["breakdown"] = breakdown.measure(n)
    finally:
        res["seconds"] = time.monotonic() - started
        res["loadavg_end"] = loadavg()
        args.out.mkdir(parents=True, exist_ok=True)
        stem = args.out / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
        stem.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
        report = table(res) if "ours_static" in res else "(incomplete run)"
        stem.with_suffix(".md").write_text(report + "\n")
        print(report)
        log(f"wrote {stem}.md and .json ({res['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
