"""What ``benchmarks.vs_push`` makes of a run: the summary per N (the JSON's ``by_n``
and ``push``/``pull`` keys), the issue's targets, the Markdown table and one picture
per N (API writes per TrainJob-hour against progress-freshness p99)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.report import fmt, verdict

#: The keys each design holds per N in ``by_n`` (issue 26).
KEYS = ("api_writes_per_trainjob_hour", "progress_freshness_p50_s",
        "progress_freshness_p99_s", "metrics_freshness_p99_s", "training_cost_p99_us",
        "reports_lost", "finals_delivered", "finals_expected")
#: The kind of a design's real trainings and of its farmed ones.
REAL_KIND = {"push": "sdk", "pull": "exporter_lib"}
FARM_KIND = {"push": "sdk-farm", "pull": "exporter_lib-farm"}


def stated_max_staleness() -> float | None:
    """The scraper's default maximum staleness of a metric-only change (seconds), as its
    configuration states it; None when it states none."""
    from scraper.config import ScraperSettings

    fields = ScraperSettings.model_fields
    for name in ("metrics_max_staleness", "max_staleness", "metrics_staleness",
                 "metrics_write_interval"):
        if name in fields:
            value = fields[name].default
            return float(value) if value else None
    return None


def _defaults(run: dict[str, Any]) -> dict[str, Any] | None:
    return next((w for w in run.get("windows", []) if w["label"] == "defaults"), None)


def headline(run: dict[str, Any]) -> dict[str, Any]:
    """The :data:`KEYS` of a session at its defaults' window, plus the farm's cost and
    where each figure comes from."""
    w = _defaults(run) or {}
    cost = w.get("cost") or {}
    real = cost.get(REAL_KIND[run["design"]]) or {}
    farm = cost.get(FARM_KIND[run["design"]]) or {}
    return {
        "api_writes_per_trainjob_hour": w.get("api_writes_per_trainjob_hour"),
        "progress_freshness_p50_s": w.get("progress_freshness_p50_s"),
        "progress_freshness_p99_s": w.get("progress_freshness_p99_s"),
        "metrics_freshness_p50_s": w.get("metrics_freshness_p50_s"),
        "metrics_freshness_p99_s": w.get("metrics_freshness_p99_s"),
        "training_cost_p50_us": real.get("p50_us"),
        "training_cost_p99_us": real.get("p99_us"),
        "training_cost_max_us": real.get("max_us"),
        "training_cost_farm_p50_us": farm.get("p50_us"),
        "training_cost_farm_p99_us": farm.get("p99_us"),
        "training_cost_farm_max_us": farm.get("max_us"),
        "reports_lost": (cost.get("all") or {}).get("lost"),
        "finals_delivered": run.get("finals_delivered"),
        "finals_expected": run.get("finals_expected"),
        "real_trainings": run.get("real"), "farmed_trainings": run.get("farmed"),
        "progress_censored": w.get("progress_censored"),
        "metrics_censored": w.get("metrics_censored"),
        "window_seconds": w.get("seconds"),
        "worker_cpu_seconds": (w.get("cpu_seconds") or {}).get("worker"),
        "apiserver_cpu_seconds": (w.get("cpu_seconds") or {}).get("apiserver"),
        "farm_cpu_seconds": w.get("farm_cpu_seconds"),
        "loadavg": w.get("loadavg"),
    }


def summarise(res: dict[str, Any]) -> None:
    """Fill ``res["by_label"]`` ({label: {design: headline}}), ``res["by_n"]`` (the labels
    at the run's report interval, keyed by N), ``res["push"]``/``res["pull"]`` ({key:
    {label: value}}) and ``res["targets"]``."""
    by_label: dict[str, dict[str, Any]] = {}
    for run in res["runs"]:
        if "error" not in run:
            by_label.setdefault(run["label"], {})[run["design"]] = headline(run)
    res["by_label"] = by_label
    every = (res.get("plan") or {}).get("every", 1.0)
    res["by_n"] = {label.split()[0][2:]: d for label, d in by_label.items()
                   if label.endswith(f"every={every:g}s")}
    for design in ("push", "pull"):
        res[design] = {k: {lb: d[design].get(k) for lb, d in by_label.items() if design in d}
                       for k in KEYS}
    res["max_staleness_s"] = stated_max_staleness()
    res["targets"] = targets(res)


def _ratio(x: float | None, y: float | None) -> float | None:
    return None if x is None or not y else x / y


def _le(x: float | None, y: float | None) -> bool | None:
    return None if x is None or y is None else x <= y


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each ``{label, target, value, met}`` (met None: not measured)."""
    out: list[dict[str, Any]] = []
    staleness = res.get("max_staleness_s")
    for label, d in res["by_label"].items():
        push, pull = d.get("push", {}), d.get("pull", {})
        n = int(label.split()[0][2:])
        small = n == min(int(lb.split()[0][2:]) for lb in res["by_label"])
        every = label.endswith(f"every={(res.get('plan') or {}).get('every', 1.0):g}s")
        if not every:
            continue
        pp, qp = push.get("progress_freshness_p99_s"), pull.get("progress_freshness_p99_s")
        if small:
            w = _ratio(pull.get("api_writes_per_trainjob_hour"),
                       push.get("api_writes_per_trainjob_hour"))
            fresh = _le(qp, pp)
            out += [
                {"label": label, "target": "pull writes <= 0.5x push", "value": w,
                 "met": None if w is None else w <= 0.5},
                {"label": label, "target": "pull progress-freshness p99 <= push's",
                 "value": (qp, pp), "met": fresh},
                {"label": label, "target": "pull metrics freshness p99 <= the stated "
                 f"maximum staleness ({fmt(staleness, '.0f', ' s')})",
                 "value": (pull.get("metrics_freshness_p99_s"), staleness),
                 "met": _le(pull.get("metrics_freshness_p99_s"), staleness)}]
        else:
            c = _ratio(pull.get("training_cost_p99_us"), push.get("training_cost_p99_us"))
            fd, fe = pull.get("finals_delivered"), pull.get("finals_expected")
            lost = pull.get("reports_lost")
            out += [
                {"label": label, "target": "pull progress-freshness p99 <= push's",
                 "value": (qp, pp), "met": _le(qp, pp)},
                {"label": label, "target": "pull training-side cost p99 <= 0.01x push's",
                 "value": c, "met": None if c is None else c <= 0.01},
                {"label": label, "target": "pull delivers every final",
                 "value": (fd, fe), "met": None if fd is None else fd == fe},
                {"label": label, "target": "pull loses no report", "value": lost,
                 "met": None if lost is None else lost == 0}]
    return out


def _value(v: Any) -> str:
    if isinstance(v, tuple | list):
        return " vs ".join(fmt(x, ".2f") for x in v)
    return fmt(v, ".3f") if isinstance(v, float) else str(v)


def table(res: dict[str, Any]) -> str:
    """The Markdown of a run: sessions, every window, targets."""
    plan = res.get("plan") or {}
    lines = [
        f"{res['machine']}; load average at start {res['loadavg_start']}, end "
        f"{res.get('loadavg_end')}; {res.get('memory_available_bytes', 0) >> 20} MiB "
        f"available at start; report every {plan.get('every')} s; a percentage point "
        f"every {plan.get('percent_seconds')} s; windows {plan.get('window')} s at the "
        f"defaults, {plan.get('sweep_window')} s per sweep setting; fault "
        f"{plan.get('fault')} s across the end; stated maximum staleness "
        f"{fmt(res.get('max_staleness_s'), '.0f', ' s')}.", "",
        "| run | design | trainings | window | writes / TrainJob-hour (audit) | "
        "progress freshness p50 / p99 (censored) | metrics freshness p50 / p99 | "
        "cost per report p50 / p99 / max: real; farm | reports lost | finals | "
        "CPU-s worker / apiserver / farm | load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in res["runs"]:
        if "error" in run:
            continue
        real, farm = REAL_KIND[run["design"]], FARM_KIND[run["design"]]
        who = f"{run['real']} real ({real}) + {run['farmed']} farmed ({farm}, one process " \
              f"per 250)" if run["farmed"] else f"{run['real']} real ({real})"
        for w in run["windows"]:
            cost = w.get("cost") or {}
            r, f = cost.get(real) or {}, cost.get(farm) or {}
            cpu = w.get("cpu_seconds") or {}
            every_call = cost.get("all") or {}
            lines.append(
                f"| {run['label']} | {run['design']} | {who} | {w['label']} "
                f"({w['seconds']:.0f} s) | {fmt(w.get('api_writes_per_trainjob_hour'), '.0f')} | "
                f"{fmt(w.get('progress_freshness_p50_s'), '.2f')} / "
                f"{fmt(w.get('progress_freshness_p99_s'), '.2f')} s "
                f"({w.get('progress_censored')} of {w.get('progress_changes')}) | "
                f"{fmt(w.get('metrics_freshness_p50_s'), '.2f')} / "
                f"{fmt(w.get('metrics_freshness_p99_s'), '.2f')} s | "
                f"{fmt(r.get('p50_us'), '.0f')} / {fmt(r.get('p99_us'), '.0f')} / "
                f"{fmt(r.get('max_us'), '.0f')} us; {fmt(f.get('p50_us'), '.0f')} / "
                f"{fmt(f.get('p99_us'), '.0f')} / {fmt(f.get('max_us'), '.0f')} us | "
                f"{every_call.get('lost')} of {every_call.get('calls')} | "
                f"{run.get('finals_delivered')} of {run.get('finals_expected')} | "
                f"{fmt(cpu.get('worker'), '.1f')} / {fmt(cpu.get('apiserver'), '.1f')} / "
                f"{fmt(w.get('farm_cpu_seconds'), '.1f')} | {w.get('loadavg')} |")
    lines += ["", "| run | target | value (pull vs push) | verdict |", "| --- | --- | --- | --- |"]
    for t in res.get("targets", []):
        lines.append(f"| {t['label']} | {t['target']} | {_value(t['value'])} | "
                     f"{verdict(t['met'])} |")
    for design, err in res.get("errors", {}).items():
        lines += ["", f"{design} not run: {err[:400]}"]
    for run in res["runs"]:
        if "error" in run:
            lines += ["", f"{run['design']} {run['label']} failed: `{run['error'][:400]}`"]
    return "\n".join(lines)


#: Markers of the pull windows in a picture, in window order (defaults: a filled circle).
_PULL_MARKERS = ("^", "v", "D", "P", "X")


def plot_points(runs: list[dict[str, Any]]) -> list[tuple[str, float, float, str, str, int]]:
    """The points of one picture: per window of ``runs`` with both figures, (legend
    label with its values, progress-freshness p99 in s, writes per TrainJob-hour, marker,
    colour, marker size); push a square, pull's defaults a large circle, each sweep
    setting its own marker."""
    points: list[tuple[str, float, float, str, str, int]] = []
    for run in runs:
        push = run["design"] == "push"
        sweep = 0
        for w in run["windows"]:
            x, y = w.get("progress_freshness_p99_s"), w.get("api_writes_per_trainjob_hour")
            if x is None or y is None:
                continue
            if push:
                style = ("s", "tab:red", 90)
                text = "push (SDK, status server as shipped)"
            elif w["label"] == "defaults":
                style = ("o", "tab:blue", 110)
                text = "pull: defaults"
            else:
                style = (_PULL_MARKERS[sweep % len(_PULL_MARKERS)], "tab:cyan", 55)
                sweep += 1
                text = f"pull: {w['label']}"
            # A change never shown in the window counts as its time unseen: then the
            # p99 is a lower bound.
            bound = ">= " if w.get("progress_censored") else ""
            points.append((f"{text}: p99 {bound}{x:.2f} s, {y:.0f} writes/h", x, y,
                           *style))
    return points


def plot(res: dict[str, Any], stem: Path) -> list[Path]:
    """One PNG per N at the run's report interval: writes per TrainJob-hour (y) against
    progress-freshness p99 (x), push's point and every pull window (the sweep and the
    defaults); ``<stem>-n<N>.png``.  Returns the files written.

    Each point has its own marker and a legend entry below the axes with its values
    (points of equal values overlap, labels never do); the x axis is logarithmic when
    the p99s span more than a factor of 20."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    every = (res.get("plan") or {}).get("every", 1.0)
    written = []
    for run_n in sorted({r["jobs"] for r in res["runs"] if "error" not in r}):
        runs = [r for r in res["runs"] if "error" not in r and r["jobs"] == run_n
                and r["every"] == every]
        points = plot_points(runs)
        fig, ax = plt.subplots(figsize=(7.0, 5.2), dpi=110)
        # Large markers first, so a smaller one at the same place stays visible on top.
        for label, x, y, marker, colour, size in sorted(points, key=lambda p: -p[5]):
            ax.scatter([x], [y], marker=marker, s=size, color=colour, label=label,
                       edgecolors="black", linewidths=0.5, zorder=3)
        xs = [p[1] for p in points if p[1] > 0]
        if xs and max(xs) / min(xs) > 20:
            ax.set_xscale("log")
            ax.set_xlim(min(xs) / 2, max(xs) * 2)
        else:
            ax.set_xlim(0, (max(xs) if xs else 1.0) * 1.15)
        ax.set_ylim(0, max([p[2] for p in points] + [1.0]) * 1.15)
        ax.set_xlabel("progress freshness p99 (s)")
        ax.set_ylabel("API writes per TrainJob-hour (audit log)")
        ax.set_title(f"N={run_n} TrainJobs, a report every {every:g} s")
        ax.grid(alpha=0.3, which="both")
        if points:
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=8,
                      frameon=False, ncol=1)
        path = stem.with_name(f"{stem.name}-n{run_n}.png")
        fig.tight_layout()
        fig.savefig(path, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written
