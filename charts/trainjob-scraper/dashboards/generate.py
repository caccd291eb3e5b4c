"""Generate the chart's Grafana dashboard, ``trainjob-progress.json``, with Grafana's
grafana-foundation-sdk.

    python charts/trainjob-scraper/dashboards/generate.py          # write the JSON
    python charts/trainjob-scraper/dashboards/generate.py --check  # exit 1 if it differs

The JSON is committed (the chart's ConfigMap reads it; the Grafana sidecar loads it as
is, so every query names the ``$datasource`` variable, and there are no ``__inputs``).
``tests/chart/test_dashboard.py`` checks that the committed file is this module's output,
and ``tests/chart/test_chart_rbac_e2e.py`` runs every query on a real Prometheus.  The
series are those of ``docs/metrics.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Literal, TypeVar

from grafana_foundation_sdk.builders import (
    bargauge,
    common,
    dashboard,
    prometheus,
    stat,
    statetimeline,
    timeseries,
)
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BarGaugeDisplayMode,
    BigValueColorMode,
    BigValueTextMode,
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    TooltipDisplayMode,
    VisibilityMode,
    VizOrientation,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    DynamicConfigValue,
    FieldColorModeId,
    GridPos,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMappingResult,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

OUTPUT = Path(__file__).with_name("trainjob-progress.json")

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
#: The selector every per-TrainJob series is filtered by (the two template variables).
JOBS = 'namespace=~"$namespace", trainjob=~"$trainjob"'
PER_JOB = "{{namespace}}/{{trainjob}}"

Mode = Literal["range", "instant", "default"]
Panel = bargauge.Panel | stat.Panel | statetimeline.Panel | timeseries.Panel
P = TypeVar("P", bargauge.Panel, stat.Panel, statetimeline.Panel, timeseries.Panel)


def query(expr: str, legend: str, ref: str = "A", mode: Mode = "range") -> prometheus.Dataquery:
    """One PromQL query of a panel, through the ``$datasource`` variable.

    ``mode``: ``range`` (a series over time), ``instant`` (the latest value), or
    ``default`` (Grafana's own choice, neither flag set).
    """
    target = (prometheus.Dataquery().datasource(DATASOURCE).expr(expr).ref_id(ref)
              .legend_format(legend))
    if mode == "range":
        target.range()
    elif mode == "instant":
        target.instant()
    return target


def place(panel: P, panel_id: int, title: str, description: str,
          h: int, w: int, x: int, y: int) -> P:
    """Give a panel its id, title, description, data source and place on the grid."""
    return (panel.id(panel_id).title(title).description(description).datasource(DATASOURCE)
            .grid_pos(GridPos(h=h, w=w, x=x, y=y)))


def row(panel_id: int, title: str, y: int) -> dashboard.Row:
    return dashboard.Row(title).id(panel_id).collapsed(False).grid_pos(GridPos(h=1, w=24, x=0, y=y))


def last_value() -> common.ReduceDataOptions:
    return common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def thresholds(*steps: tuple[str, float | None]) -> dashboard.ThresholdsConfig:
    return dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
        [Threshold(color=color, value=value) for color, value in steps])


def per_job_bar(panel_id: int, title: str, description: str, expr: str, unit: str,
                display: BarGaugeDisplayMode, w: int, x: int) -> bargauge.Panel:
    panel = (bargauge.Panel().with_target(query(expr, PER_JOB, mode="instant")).unit(unit).min(0)
             .orientation(VizOrientation.HORIZONTAL).display_mode(display)
             .reduce_options(last_value()))
    return place(panel, panel_id, title, description, 8, w, x, 1)


def legend() -> common.VizLegendOptions:
    """Grafana's default legend: a list below the graph."""
    return (common.VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.LIST)
            .placement(LegendPlacement.BOTTOM).calcs([]))


def tooltip(mode: TooltipDisplayMode = TooltipDisplayMode.SINGLE) -> common.VizTooltipOptions:
    return common.VizTooltipOptions().mode(mode).sort(SortOrder.NONE)


def series() -> timeseries.Panel:
    """A time series panel with Grafana's default legend and tooltip stated (the SDK
    would otherwise leave its options empty)."""
    return timeseries.Panel().legend(legend()).tooltip(tooltip())


def quantiles(histogram: str) -> list[cogbuilder.Builder[cogvariants.Dataquery]]:
    """p50, p90 and p99 of a histogram over all its series."""
    return [query(f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket"
                  f"[$__rate_interval])))", f"p{label}", ref)
            for q, label, ref in ((0.5, "50", "A"), (0.9, "90", "B"), (0.99, "99", "C"))]


def training_panels() -> list[Panel]:
    """The row "Training progress": one series per TrainJob."""
    progress = f"max by (namespace, trainjob) (trainjob_progress_ratio{{{JOBS}}})"
    remaining = f"max by (namespace, trainjob) (trainjob_estimated_remaining_seconds{{{JOBS}}})"
    return [
        per_job_bar(2, "Progress", "Latest progress of each TrainJob "
                    "(status.trainerStatus.progressPercentage / 100).", progress,
                    "percentunit", BarGaugeDisplayMode.GRADIENT, 12, 0).max(1),
        per_job_bar(3, "Estimated time remaining",
                    "Latest estimatedRemainingSeconds reported by each TrainJob.", remaining,
                    "s", BarGaugeDisplayMode.BASIC, 6, 12),
        per_job_bar(4, "Time since last status update",
                    "Seconds since the scraper last wrote status.trainerStatus for each "
                    "TrainJob (lastUpdatedTime). A growing value means the job stopped "
                    "reporting.",
                    "time() - max by (namespace, trainjob) "
                    f"(trainjob_last_update_timestamp_seconds{{{JOBS}}})",
                    "s", BarGaugeDisplayMode.BASIC, 6, 18),
        place(series().with_target(query(progress, PER_JOB))
              .unit("percentunit").min(0).max(1),
              5, "Progress over time", "Progress of each TrainJob.", 9, 12, 0, 9),
        place(series().with_target(query(remaining, PER_JOB)).unit("s").min(0),
              6, "ETA over time", "Estimated seconds remaining, as reported by each TrainJob.",
              9, 12, 12, 9),
        place(series().with_target(query(
            "max by (namespace, trainjob, name) "
            f'(trainjob_metric{{{JOBS}, name=~"$metric"}})', "{{trainjob}} {{name}}")),
              7, "Training metrics",
              "Numeric values of status.trainerStatus.metrics (choose them with the metric "
              "variable). Metrics whose value is not a number are not exported as series.",
              10, 24, 0, 18),
        place(statetimeline.Panel()
              .with_target(query(f"max by (namespace, trainjob) "
                                 f"(trainjob_progress_stalled{{{JOBS}}})", PER_JOB,
                                 mode="default"))
              .min(0).max(1)
              .mappings([ValueMap(options={
                  "0": ValueMappingResult(text="moving", color="green"),
                  "1": ValueMappingResult(text="stalled", color="red")})])
              .color_scheme(dashboard.FieldColor().mode(FieldColorModeId.THRESHOLDS))
              .thresholds(thresholds(("green", None), ("red", 1)))
              .show_value(VisibilityMode.NEVER).merge_values(True).row_height(0.9)
              .legend(legend()).tooltip(tooltip()),
              23, "Stalled trainings",
              "1 while a training is stalled: its status (progress, remaining time, metrics) "
              "has not changed for longer than its threshold while its pod runs and its "
              "exporter answers (docs/scraper.md, Stall detection). The alert "
              "TrainJobStalled fires on it.", 8, 12, 0, 28),
        place(series()
              .with_target(query(f"max by (namespace, trainjob) "
                                 f"(trainjob_progress_seconds_since_change{{{JOBS}}})",
                                 f"{PER_JOB} since change", "A", "default"))
              .with_target(query(f"max by (namespace, trainjob) "
                                 f"(trainjob_progress_stall_threshold_seconds{{{JOBS}}})",
                                 f"{PER_JOB} threshold", "B", "default"))
              .unit("s").min(0)
              .override_by_query("B", [DynamicConfigValue(
                  id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]})])
              .tooltip(tooltip(TooltipDisplayMode.MULTI)),
              24, "Time since the last change, and the stall threshold",
              "Seconds since each training's status last changed, as the scraper saw it, "
              "and its stall threshold (auto: 3x the longest gap between its changes, at "
              "least 5m; or its trainjob-progress.dev/stall-after annotation). A training "
              "is stalled while the first is above the second.", 8, 12, 12, 28),
    ]


def scraper_panels() -> list[Panel]:
    """The row "Scraper health": the scraper's own series."""
    up = f"max by (namespace, trainjob) (trainjob_scraper_target_up{{{JOBS}}})"
    return [
        place(stat.Panel()
              .with_target(query(f"sum({up})", "up", "A", "instant"))
              .with_target(query(f"count({up})", "total", "B", "instant"))
              .reduce_options(last_value()).text_mode(BigValueTextMode.VALUE_AND_NAME)
              .color_mode(BigValueColorMode.VALUE),
              9, "Targets up", "Targets whose last scrape succeeded, of all targets.",
              5, 4, 0, 37),
        place(stat.Panel()
              .with_target(query(f"count({up} == 0) or vector(0)", "down", mode="instant"))
              .thresholds(thresholds(("green", None), ("red", 1)))
              .reduce_options(last_value()).color_mode(BigValueColorMode.BACKGROUND),
              10, "Targets down", "Targets whose last scrape failed.", 5, 4, 4, 37),
        place(stat.Panel()
              .with_target(query("sum(trainjob_scraper_leader)", "leaders", mode="instant"))
              .thresholds(thresholds(("red", None), ("green", 1), ("red", 2)))
              .reduce_options(last_value()).color_mode(BigValueColorMode.BACKGROUND),
              11, "Leaders", "Replicas holding the Lease. Anything but 1 needs a look.",
              5, 4, 8, 37),
        place(series().with_target(query("trainjob_scraper_targets", "{{instance}}"))
              .min(0),
              12, "Targets", "Pods being scraped, per scraper replica (only the leader "
              "scrapes).", 5, 12, 12, 37),
        place(statetimeline.Panel().with_target(query(up, PER_JOB)).min(0).max(1)
              .legend(legend()).tooltip(tooltip()),
              13, "Target up", "1 when the last scrape of the TrainJob's rank-0 pod succeeded.",
              8, 12, 0, 42),
        place(series()
              .with_target(query("sum by (result) (rate(trainjob_scraper_scrapes_total"
                                 "[$__rate_interval]))", "{{result}}"))
              .unit("reqps").min(0),
              14, "Scrapes by result", "Scrapes per second by result: ok, not_modified (ETag "
              "matched), empty (no report yet) or a failure kind.", 8, 12, 12, 42),
        place(series()
              .with_target(query('sum(rate(trainjob_scraper_scrapes_total{result!~"ok|'
                                 'not_modified|empty"}[$__rate_interval])) / '
                                 "sum(rate(trainjob_scraper_scrapes_total[$__rate_interval]))",
                                 "errors"))
              .unit("percentunit").min(0).max(1),
              15, "Scrape error ratio", "Failed scrapes (refused, unreachable, timeout, "
              "too_large, redirect, http_error, invalid) as a share of all scrapes.",
              8, 8, 0, 50),
        place(series().targets(quantiles("trainjob_scraper_scrape_duration_seconds"))
              .unit("s").min(0),
              16, "Scrape duration", "Quantiles of the time one scrape takes.", 8, 8, 8, 50),
        place(series()
              .with_target(query("sum by (result) (rate(trainjob_scraper_status_writes_total"
                                 "[$__rate_interval]))", "{{result}}"))
              .unit("wps").min(0),
              17, "Status writes by result", "Status write decisions per second by result: "
              "written (server-side apply), unchanged (same report, no request), failed, "
              "not_stored (CRD without trainerStatus), not_leader.", 8, 8, 16, 50),
        place(series()
              .with_target(query("sum by (reason) (rate(trainjob_scraper_watch_restarts_total"
                                 "[$__rate_interval]))", "{{reason}}"))
              .min(0),
              18, "Pod watch restarts", "Restarts of the pod watch per second (re-list after "
              "a dropped or expired watch). A steady rate points at API server trouble.",
              7, 12, 0, 58),
        place(series().with_target(query("trainjob_scraper_leader", "{{instance}}"))
              .min(0).max(1),
              19, "Leader", "1 for the replica that holds the Lease.", 7, 12, 12, 58),
        place(series()
              .with_target(query("sum(rate(trainjob_scraper_skipped_runs_total"
                                 "[$__rate_interval]))", "skipped/s"))
              .min(0),
              20, "Skipped scrapes (scraper behind)", "Scheduled scrapes skipped because "
              "the target's previous scrape had not finished. Above zero the scraper is "
              "behind: raise config.concurrency or the interval, or give it more CPU.",
              7, 24, 0, 65),
        place(series()
              .targets(quantiles("trainjob_scraper_status_write_duration_seconds"))
              .unit("s").min(0),
              21, "Status write duration", "One apply PATCH to the API server, whatever its "
              "answer (waiting for the write budget not included)", 7, 12, 0, 72),
        place(series()
              .with_target(query("sum(trainjob_scraper_status_writes_pending)", "pending"))
              .min(0),
              22, "Status writes waiting (write budget saturated while above 0)",
              "TrainJobs whose newest status waits in the write queue", 7, 12, 12, 72),
    ]


def label_values(name: str, label: str, series: str) -> dashboard.QueryVariable:
    """A multi-value variable listing ``label``'s values of ``series``, "All" by default."""
    text = f"label_values({series}, {label})"
    return (dashboard.QueryVariable(name).label(label.capitalize() if name != "trainjob"
                                                else "TrainJob")
            .datasource(DATASOURCE)
            .query({"query": text, "refId": f"{name}-var", "qryType": 1})
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*").regex("")
            .current(VariableOption(selected=True, text=["All"], value=["$__all"])))


def build() -> dashboard.Dashboard:
    """The dashboard: two rows of 11 and 13 panels, four template variables."""
    board = (dashboard.Dashboard("TrainJob progress").uid("trainjob-progress")
             .description("Progress, ETA and training metrics of Kubeflow TrainJobs, and "
                          "the health of trainjob-scraper.")
             .tags(["kubeflow", "trainjob", "trainjob-scraper"]).editable()
             .tooltip(DashboardCursorSync.CROSSHAIR).version(1).refresh("30s")
             .time("now-6h", "now").timezone("browser")
             .with_variable(dashboard.DatasourceVariable("datasource").label("Data source")
                            .type("prometheus").regex(""))
             .with_variable(label_values("namespace", "namespace", "trainjob_progress_ratio"))
             .with_variable(label_values("trainjob", "trainjob",
                                         'trainjob_progress_ratio{namespace=~"$namespace"}'))
             .with_variable(label_values("metric", "name",
                                         f"trainjob_metric{{{JOBS}}}").label("Metric")))
    board.with_row(row(1, "Training progress", 0))
    for panel in training_panels():
        board.with_panel(panel)
    board.with_row(row(8, "Scraper health", 36))
    for panel in scraper_panels():
        board.with_panel(panel)
    return board


def render() -> str:
    """The dashboard's JSON text, as committed (sorted keys, two-space indent, newline)."""
    return json.dumps(build().build(), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 if {OUTPUT.name} differs from the generator's output")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT} is not the generator's output: run {Path(__file__).name}",
                  file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
