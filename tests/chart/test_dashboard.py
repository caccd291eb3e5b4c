"""The Grafana dashboard JSON: structure, variables, and the series it queries.

Whether every expression parses and returns data is checked against a real
Prometheus in test_chart_rbac_e2e.py; here the file itself is checked.
"""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType
from typing import Any

from tests.helpers.chart import (
    CORE_PANELS,
    DASHBOARD,
    dashboard,
    dashboard_expressions,
    dashboard_panels,
    scraper_series,
    variable_query,
)

REQUIRED_VARIABLES = {"datasource", "namespace", "trainjob"}


def _generator() -> ModuleType:
    """charts/trainjob-scraper/dashboards/generate.py (a script beside the JSON, not a
    package), loaded from its path."""
    path = DASHBOARD.with_name("generate.py")
    spec = importlib.util.spec_from_file_location("dashboard_generate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_dashboard_is_the_generators_output() -> None:
    # The JSON is generated with grafana-foundation-sdk; an edit by hand, or a change of
    # the generator without running it, fails here.
    assert DASHBOARD.read_text() == _generator().render(), (
        "trainjob-progress.json differs from its generator: run "
        "charts/trainjob-scraper/dashboards/generate.py")


def test_generator_keeps_every_panel_id_and_grid_place() -> None:
    board = dashboard()
    panels = dashboard_panels(board)
    assert len(panels) == 24
    assert sorted(p["id"] for p in panels) == list(range(1, 25))
    # No two panels overlap on Grafana's 24-column grid.
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not cells & mine, f"panel {panel['title']!r} overlaps another"
        cells |= mine


def test_dashboard_has_the_sidecar_friendly_shape() -> None:
    board = dashboard()
    assert board["uid"] == "trainjob-progress"
    assert board["title"]
    # No __inputs/${DS_...} placeholders: the Grafana sidecar loads the file as is.
    assert "__inputs" not in board
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) >= REQUIRED_VARIABLES
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "trainjob"):
        assert variables[name]["includeAll"] is True
        assert variables[name]["allValue"] == ".*"
    ids = [p["id"] for p in dashboard_panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_every_panel_queries_through_the_datasource_variable() -> None:
    for panel in dashboard_panels(dashboard()):
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert target["expr"].strip()


def test_per_trainjob_panels_filter_by_namespace_and_trainjob() -> None:
    for title, expr in dashboard_expressions(dashboard()):
        for series in ("trainjob_progress_ratio", "trainjob_estimated_remaining_seconds",
                       "trainjob_metric", "trainjob_last_update_timestamp_seconds",
                       "trainjob_scraper_target_up", "trainjob_progress_stalled",
                       "trainjob_progress_seconds_since_change",
                       "trainjob_progress_stall_threshold_seconds"):
            if re.search(rf"\b{series}\{{", expr) and not title.startswith("variable "):
                assert 'namespace=~"$namespace"' in expr, (title, expr)
                assert 'trainjob=~"$trainjob"' in expr, (title, expr)


def test_core_panels_exist() -> None:
    titles = {p["title"] for p in dashboard_panels(dashboard())}
    assert set(CORE_PANELS) <= titles
    assert {"Training metrics", "ETA over time", "Scrape duration", "Status writes by result",
            "Scrapes by result", "Scrape error ratio", "Pod watch restarts", "Leader",
            "Stalled trainings"} <= titles


def test_dashboard_uses_only_series_the_scraper_exports() -> None:
    exported = scraper_series()
    used: set[str] = set()
    for _, expr in dashboard_expressions(dashboard()):
        used.update(re.findall(r"\btrainjob_[a-z_]+", expr))
    # histogram series are exported as _bucket/_sum/_count of the family
    unknown = {
        name for name in used
        if name not in exported and re.sub(r"_(bucket|sum|count)$", "", name) not in exported
    }
    assert not unknown, f"the dashboard queries series the scraper does not export: {unknown}"


def _variable_queries(board: dict[str, Any]) -> list[str]:
    return [variable_query(v) for v in board["templating"]["list"] if v["type"] == "query"]


def test_variable_queries_use_label_values_of_exported_series() -> None:
    exported = scraper_series()
    for query in _variable_queries(dashboard()):
        match = re.fullmatch(r"label_values\((trainjob_[a-z_]+)(\{.*\})?, *([a-z_]+)\)", query)
        assert match, query
        assert match.group(1) in exported
