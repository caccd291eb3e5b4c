"""What ``benchmarks.vs_push`` makes of a run: the figures per case and side (the JSON's
``by_label``: ``{case label: {side key: figures}}``), the issue's targets, the cliff's
two N, the Markdown table and the pictures (per case: API writes per TrainJob-hour
against progress-freshness p99; the cliff: delivered writes/s and progress-freshness
p99 against N)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.report import fmt, verdict
from benchmarks.vs_push_sides import SIDE_KEYS

#: The keys each side holds per case in ``by_label`` (issue 37's acceptance).
KEYS = ("api_writes_per_trainjob_hour", "progress_freshness_p50_s",
        "progress_freshness_p99_s", "metrics_freshness_p99_s", "values_reported",
        "values_shown", "values_superseded", "values_never_shown", "finals_delivered",
        "finals_expected", "training_cost_p99_us", "apiserver_cpu_s")
#: The kind of a design's real trainings and of its farmed ones.
REAL_KIND = {"push": "sdk", "pull": "exporter_lib"}
FARM_KIND = {"push": "sdk-farm", "pull": "exporter_lib-farm"}
#: Slack of the target "pull's progress-freshness p99 <= push's + 1 s" (seconds).
FRESHNESS_SLACK_S = 1.0
#: Push as shipped is past its cliff when it delivers under this share of its budget.
CLIFF_SHARE = 0.5
#: The cases the cliff reads: a report every 1 s, a percentage point every 15 s.
CLIFF_CASE = " every=1s percent=15s"


def headline(run: dict[str, Any]) -> dict[str, Any]:
    """A session's figures under :data:`KEYS` and the rest of its columns."""
    w = run.get("window") or {}
    cost = w.get("cost") or {}
    real = cost.get(REAL_KIND[run["design"]]) or {}
    farm = cost.get(FARM_KIND[run["design"]]) or {}
    cpu = w.get("cpu_seconds") or {}
    fin = run.get("finals") or {}
    writes = w.get("writes")
    out = {k: w.get(k) for k in (
        "api_writes_per_trainjob_hour", "api_writes_per_s",
        "progress_freshness_p50_s", "progress_freshness_p99_s",
        "progress_freshness_p50_censored", "progress_freshness_p99_censored",
        "progress_freshness_max_s", "metrics_freshness_p50_s", "metrics_freshness_p99_s",
        "metrics_freshness_p50_censored", "metrics_freshness_p99_censored",
        "values_reported", "values_shown", "values_superseded", "values_never_shown",
        "progress_values_reported", "progress_values_shown", "progress_values_superseded",
        "progress_values_never_shown", "metrics_values_reported", "metrics_values_shown",
        "metrics_values_superseded", "metrics_values_never_shown", "percent_error_p50",
        "percent_error_p99", "percent_error_max", "trainer_reconciles", "farm_cpu_seconds",
        "loadavg")}
    out.update({
        "side": run["side"], "side_label": run.get("side_label"),
        "budget": run.get("budget"), "window_seconds": w.get("seconds"),
        "finals_delivered": {g: f.get("delivered") for g, f in fin.items()},
        "finals_expected": {g: f.get("expected") for g, f in fin.items()},
        "finals_freshness_max_s": {g: f.get("freshness_max_s") for g, f in fin.items()},
        "training_cost_p50_us": real.get("p50_us"), "training_cost_p99_us": real.get("p99_us"),
        "training_cost_max_us": real.get("max_us"),
        "training_cost_farm_p50_us": farm.get("p50_us"),
        "training_cost_farm_p99_us": farm.get("p99_us"),
        "training_cost_farm_max_us": farm.get("max_us"),
        "apiserver_cpu_s": cpu.get("apiserver"), "etcd_cpu_s": cpu.get("etcd"),
        "trainer_cpu_s": cpu.get("trainer"), "worker_cpu_s": cpu.get("worker"),
        "trainer_reconciles_per_write": (w.get("trainer_reconciles") / writes
                                         if writes and w.get("trainer_reconciles")
                                         is not None else None),
        "real_trainings": run.get("real"), "farmed_trainings": run.get("farmed")})
    return out


def session_keys(run: dict[str, Any]) -> list[str]:
    """The JSON keys a session's figures stand for: its ``keys``, else its side alone."""
    return list(run.get("keys") or [run["side"]])


def summarise(res: dict[str, Any]) -> None:
    """Fill ``res["by_label"]`` ({case label: {side key: headline}}; a session standing
    for two keys fills both), ``res["targets"]`` and ``res["cliff"]``."""
    by_label: dict[str, dict[str, Any]] = {}
    for run in res["runs"]:
        if "error" in run:
            continue
        for key in session_keys(run):
            figures = headline(run)
            figures["session"] = run["side"]
            by_label.setdefault(run["label"], {})[key] = figures
    res["by_label"] = by_label
    res["targets"] = targets(res)
    res["cliff"] = cliff(res)


def _le(x: float | None, y: float | None) -> bool | None:
    return None if x is None or y is None else x <= y


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 37's targets per case, pull capped at the budget against push (b) and (c):
    each ``{label, against, target, value, met}`` (met None: not measured)."""
    out: list[dict[str, Any]] = []
    for label, d in res["by_label"].items():
        pull = d.get("pull_equal_budget")
        if pull is None:
            continue
        fd, fe = pull.get("finals_delivered") or {}, pull.get("finals_expected") or {}
        every_final = (None if not fe or None in fd.values()
                       else all(fd.get(g) == n for g, n in fe.items()))
        out.append({"label": label, "against": "-", "target": "pull delivers every final, "
                    "with and without the fault", "value": (fd, fe), "met": every_final})
        never = pull.get("values_never_shown")
        out.append({"label": label, "against": "-", "target": "pull: no value never shown "
                    "(superseded only)", "value": never,
                    "met": None if never is None else never == 0})
        for key in ("push_equal_budget", "push_best"):
            push = d.get(key)
            if push is None:
                continue
            qp, pp = pull.get("progress_freshness_p99_s"), push.get("progress_freshness_p99_s")
            qw, pw = pull.get("api_writes_per_trainjob_hour"), push.get(
                "api_writes_per_trainjob_hour")
            out += [
                {"label": label, "against": key,
                 "target": f"pull progress-freshness p99 <= push's + {FRESHNESS_SLACK_S:g} s",
                 "value": (qp, pp),
                 "met": _le(qp, None if pp is None else pp + FRESHNESS_SLACK_S)},
                {"label": label, "against": key, "target": "pull writes <= push's",
                 "value": (qw, pw), "met": _le(qw, pw)}]
    return out


def cliff(res: dict[str, Any]) -> dict[str, Any]:
    """From the cases of :data:`CLIFF_CASE`: the smallest N where push as shipped
    delivers under :data:`CLIFF_SHARE` of its budget's writes/s, and the smallest N
    where best push's progress-freshness p99 is above pull's (capped); None when not
    reached."""
    rows: list[tuple[int, dict[str, Any]]] = []
    for label, d in res["by_label"].items():
        if label.endswith(CLIFF_CASE):
            rows.append((int(label.split()[0][2:]), d))
    rows.sort(key=lambda r: r[0])
    cliff_n = passes_n = None
    for n, d in rows:
        shipped = d.get("push_as_shipped") or {}
        rate, budget = shipped.get("api_writes_per_s"), shipped.get("budget")
        if cliff_n is None and rate is not None and budget and rate < CLIFF_SHARE * budget[0]:
            cliff_n = n
        best = (d.get("push_best") or {}).get("progress_freshness_p99_s")
        pull = (d.get("pull_equal_budget") or {}).get("progress_freshness_p99_s")
        if passes_n is None and best is not None and pull is not None and best > pull:
            passes_n = n
    return {"push_as_shipped_cliff_n": cliff_n, "push_best_slower_than_pull_from_n": passes_n,
            "measured_n": [n for n, _ in rows]}


def _value(v: Any) -> str:
    if isinstance(v, tuple | list):
        return " vs ".join(_value(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k} {x}" for k, x in v.items())
    return fmt(v, ".2f") if isinstance(v, float) else str(v)


def fresh(w: dict[str, Any], name: str) -> str:
    """A freshness figure, ``>=`` when censored (module :mod:`benchmarks.vs_push_delivery`)."""
    bound = ">= " if w.get(f"{name}_censored") else ""
    return bound + fmt(w.get(f"{name}_s"), ".2f")


def _carried(res: dict[str, Any]) -> list[str]:
    """The paragraph naming the earlier runs whose sessions this report carries, each
    with the sides it gave."""
    origins: dict[tuple[str, str, str], set[str]] = {}
    for run in res["runs"]:
        if c := run.get("carried_from"):
            key = (c["file"], str(c.get("started")), str(c.get("commit", "not recorded")))
            origins.setdefault(key, set()).add(run["side"])
    if not origins:
        return []
    parts = [f"sessions of {', '.join(f'`{k}`' for k in sorted(sides))} come from the "
             f"earlier run {file} (started {started}, commit {commit})"
             for (file, started, commit), sides in origins.items()]
    text = "; ".join(parts)
    return [f"{text[0].upper()}{text[1:]}, the same plan; this run measured the other "
            "sessions.", ""]


def table(res: dict[str, Any]) -> str:
    """The Markdown of a run: one row per session (its side's settings stated), the
    targets, the cliff."""
    plan = res.get("plan") or {}
    lines = [
        f"{res['machine']}; load average at start {res['loadavg_start']}, end "
        f"{res.get('loadavg_end')}; {res.get('memory_available_bytes', 0) >> 20} MiB "
        f"available at start; plan {plan.get('name')}; budget {plan.get('budget')} "
        f"(writes/s, burst) for push (b), (c) and pull capped; fault {plan.get('fault')} s "
        f"across the fault half's end; settle {plan.get('settle')} s per half; commit "
        f"{res.get('commit', 'not recorded')}.", "",
        *_carried(res),
        "Sides: " + "; ".join(f"`{k}` {v}" for k, v in (res.get("sides") or {}).items()
                              if k in {r["side"] for r in res["runs"]}),
        "",
        "| case | side | trainings | window | writes/s; per TrainJob-hour (audit) | "
        "progress freshness p50 / p99 | metrics freshness p50 / p99 | values reported / "
        "shown / superseded / never shown | percent error p99 | finals no fault; fault | "
        "blocked per report p50 / p99 / max: real; farm | CPU-s apiserver / etcd / "
        "Trainer / worker | Trainer reconciles (per write) | load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in res["runs"]:
        if "error" in run:
            continue
        h = headline(run)
        w = run.get("window") or {}
        real, farm = REAL_KIND[run["design"]], FARM_KIND[run["design"]]
        who = (f"{run['real']} real ({real}) + {run['farmed']} farmed ({farm})"
               if run["farmed"] else f"{run['real']} real ({real})")
        keys = " = ".join(f"`{k}`" for k in session_keys(run))
        if "carried_from" in run:
            keys += f" (from {run['carried_from']['file']})"
        fin = "; ".join(f"{(h['finals_delivered'] or {}).get(g)} of "
                        f"{(h['finals_expected'] or {}).get(g)}" for g in ("no_fault", "fault"))
        lines.append(
            f"| {run['label']} | {keys}: {run.get('side_label')} | {who} | "
            f"{fmt(w.get('seconds'), '.0f', ' s')} | {fmt(h['api_writes_per_s'], '.2f')}; "
            f"{fmt(h['api_writes_per_trainjob_hour'], '.0f')} | "
            f"{fresh(w, 'progress_freshness_p50')} / {fresh(w, 'progress_freshness_p99')} s | "
            f"{fresh(w, 'metrics_freshness_p50')} / {fresh(w, 'metrics_freshness_p99')} s | "
            f"{h['values_reported']} / {h['values_shown']} / {h['values_superseded']} / "
            f"{h['values_never_shown']} | {fmt(h['percent_error_p99'], '.0f')} | {fin} | "
            f"{fmt(h['training_cost_p50_us'], '.0f')} / {fmt(h['training_cost_p99_us'], '.0f')}"
            f" / {fmt(h['training_cost_max_us'], '.0f')} us; "
            f"{fmt(h['training_cost_farm_p50_us'], '.0f')} / "
            f"{fmt(h['training_cost_farm_p99_us'], '.0f')} / "
            f"{fmt(h['training_cost_farm_max_us'], '.0f')} us | "
            f"{fmt(h['apiserver_cpu_s'], '.1f')} / {fmt(h['etcd_cpu_s'], '.1f')} / "
            f"{fmt(h['trainer_cpu_s'], '.1f')} / {fmt(h['worker_cpu_s'], '.1f')} | "
            f"{h['trainer_reconciles']} ({fmt(h['trainer_reconciles_per_write'], '.2f')}) | "
            f"{h['loadavg']} |")
    lines += ["", "| case | against | target | value (pull vs push) | verdict |",
              "| --- | --- | --- | --- | --- |"]
    for t in res.get("targets", []):
        lines.append(f"| {t['label']} | {t['against']} | {t['target']} | {_value(t['value'])} "
                     f"| {verdict(t['met'])} |")
    c = res.get("cliff") or {}
    if c.get("measured_n"):
        lines += ["", f"Cliff (every 1 s, N = {c['measured_n']}): push as shipped delivers "
                  f"under {CLIFF_SHARE:g} of its budget from N = "
                  f"{c.get('push_as_shipped_cliff_n') or 'none measured'}; best push's "
                  f"progress-freshness p99 is above pull's from N = "
                  f"{c.get('push_best_slower_than_pull_from_n') or 'none measured'}."]
    for what, err in res.get("errors", {}).items():
        lines += ["", f"{what} not run: {err[:400]}"]
    for run in res["runs"]:
        if "error" in run:
            lines += ["", f"{run['side']} {run['label']} failed: `{run['error'][:400]}`"]
    return "\n".join(lines)


#: Each side's marker and colour in the pictures.
STYLE = {"push_as_shipped": ("s", "tab:red"), "push_equal_budget": ("D", "tab:orange"),
         "push_best": ("^", "tab:purple"), "pull": ("o", "tab:blue"),
         "pull_equal_budget": ("v", "tab:cyan")}


def plot_points(runs: list[dict[str, Any]]) -> list[tuple[str, float, float, str, str]]:
    """The points of one case's picture: per side with both figures, (legend label with
    its values, progress-freshness p99 in s, writes per TrainJob-hour, marker, colour);
    a censored p99 labelled ``>=``."""
    points = []
    for run in runs:
        w = run.get("window") or {}
        x, y = w.get("progress_freshness_p99_s"), w.get("api_writes_per_trainjob_hour")
        if x is None or y is None:
            continue
        keys = session_keys(run)
        marker, colour = STYLE[keys[0]]
        bound = ">= " if w.get("progress_freshness_p99_censored") else ""
        points.append((f"{' = '.join(keys)}: {run.get('side_label')}: p99 {bound}{x:.2f} s, "
                       f"{y:.0f} writes/h", x, y, marker, colour))
    return points


def plot(res: dict[str, Any], stem: Path) -> list[Path]:
    """One PNG per case: writes per TrainJob-hour (y) against progress-freshness p99
    (x), a point per side, ``<stem>-n<N>-every<S>s-percent<P>s.png``; returns the files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    labels = sorted({r["label"] for r in res["runs"] if "error" not in r})
    for label in labels:
        runs = [r for r in res["runs"] if "error" not in r and r["label"] == label]
        points = plot_points(runs)
        fig, ax = plt.subplots(figsize=(7.5, 5.2), dpi=110)
        for text, x, y, marker, colour in points:
            ax.scatter([x], [y], marker=marker, s=80, color=colour, label=text,
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
        ax.set_title(label)
        ax.grid(alpha=0.3, which="both")
        if points:
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=7,
                      frameon=False, ncol=1)
        n, every, pct = label.split()
        path = stem.with_name(f"{stem.name}-n{n[2:]}-every{every[6:]}-percent{pct[8:]}.png")
        fig.tight_layout()
        fig.savefig(path, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def cliff_series(res: dict[str, Any]) -> dict[str, list[tuple[int, float | None,
                                                                float | None, bool]]]:
    """Per side key, (N, delivered writes/s, progress-freshness p99, censored) of the
    cases at every 1 s, by N."""
    series: dict[str, list[tuple[int, float | None, float | None, bool]]] = {}
    for label, d in res["by_label"].items():
        if not label.endswith(CLIFF_CASE):
            continue
        n = int(label.split()[0][2:])
        for key, h in d.items():
            series.setdefault(key, []).append(
                (n, h.get("api_writes_per_s"), h.get("progress_freshness_p99_s"),
                 bool(h.get("progress_freshness_p99_censored"))))
    return {k: sorted(v) for k, v in series.items()}


def plot_cliff(res: dict[str, Any], stem: Path) -> Path:
    """The cliff: delivered writes/s (left) and progress-freshness p99 (right, log;
    a censored point hollow) against N, a line per side; ``<stem>-cliff.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = cliff_series(res)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6), dpi=110)
    for key in SIDE_KEYS:
        points = series.get(key)
        if not points:
            continue
        marker, colour = STYLE[key]
        text = (res.get("sides") or {}).get(key, key)
        ns = [p[0] for p in points]
        left.plot(ns, [p[1] if p[1] is not None else float("nan") for p in points],
                  marker=marker, color=colour, label=text)
        right.plot(ns, [p[2] if p[2] is not None else float("nan") for p in points],
                   color=colour)
        for n, _, p99, censored in points:
            if p99 is not None:
                right.scatter([n], [p99], marker=marker, s=50, color="white" if censored
                              else colour, edgecolors=colour, zorder=3)
    budget = (res.get("plan") or {}).get("budget") or [None]
    if budget[0]:
        left.axhline(budget[0], color="grey", linestyle=":", label=f"budget {budget[0]:g}/s")
    left.set_xlabel("TrainJobs (N), a report every 1 s")
    left.set_ylabel("status writes delivered per second (audit log)")
    left.set_ylim(bottom=0)
    right.set_xlabel("TrainJobs (N), a report every 1 s")
    right.set_ylabel("progress freshness p99 (s; hollow: a lower bound)")
    right.set_yscale("log")
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
    handles, texts = left.get_legend_handles_labels()
    fig.legend(handles, texts, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0.0, 0.12, 1.0, 1.0))
    path = stem.with_name(f"{stem.name}-cliff.png")
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path
