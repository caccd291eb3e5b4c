"""benchmarks.vs_push: the audit-log count on the real API server, the freshness rule, the
SDK outcome rule, and a ``--quick`` run of both designs on the local stack (the JSON's
keys and sane values, not timings)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from kubernetes import client

from benchmarks import vs_push
from benchmarks import vs_push_figures as figures
from benchmarks import vs_push_report as report
from benchmarks import vs_push_training as training
from exporter_lib.status import API_GROUP, API_VERSION
from localdev.cluster import ControlPlane, install_trainjob_crds, objects

pytestmark = pytest.mark.benchmarks


def _apply(api: client.ApiClient, ns: str, name: str, manager: str, progress: int) -> None:
    objects.apply_trainjob_status(api, ns, name, {"trainerStatus": {
        "progressPercentage": progress, "lastUpdatedTime": "2026-01-01T00:00:00Z"}},
        field_manager=manager)


def test_picture_labels_each_window_once_with_its_values(tmp_path: Path) -> None:
    """Two pull windows at the same point (as at N=20: the defaults and the 120 s
    staleness both at 240 writes) get a legend entry each, not labels drawn over each
    other; a censored p99 is marked as a lower bound."""
    def win(label: str, x: float, y: float, censored: int = 0) -> dict[str, object]:
        return {"label": label, "progress_freshness_p99_s": x,
                "api_writes_per_trainjob_hour": y, "progress_censored": censored}

    runs = [{"design": "push", "jobs": 20, "every": 1.0, "windows": [win("defaults", 59.0, 0, 5)]},
            {"design": "pull", "jobs": 20, "every": 1.0, "windows": [
                win("metrics staleness 10 s", 0.12, 504), win("metrics staleness 120 s", 0.16, 240),
                win("defaults", 0.17, 240)]}]
    points = report.plot_points(runs)
    labels = [p[0] for p in points]
    assert len(set(labels)) == len(labels) == 4
    assert labels[0].startswith("push") and "p99 >= 59.00 s, 0 writes/h" in labels[0]
    assert "pull: defaults: p99 0.17 s, 240 writes/h" in labels
    assert len({(p[3], p[5]) for p in points}) == 4  # each its own marker
    written = report.plot({"plan": {"every": 1.0}, "runs": runs}, tmp_path / "vs-push-x")
    assert [p.name for p in written] == ["vs-push-x-n20.png"]
    assert written[0].stat().st_size > 1000


@pytest.mark.timeout(180)
def test_audit_log_counts_status_writes_by_field_manager_with_bytes() -> None:
    with ControlPlane(audit_log="Request") as plane, plane.api_client() as api:
        # The CPU column "apiserver" reads this pid: kube-apiserver's own executable.
        assert plane.apiserver_pid is not None and plane.apiserver_pid in plane.pids
        assert Path(f"/proc/{plane.apiserver_pid}/exe").resolve().name == "kube-apiserver"
        install_trainjob_crds(api)
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "a"}})
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "b"}})
        for ns in ("a", "b"):
            objects.create_trainjob(api, ns, "j")
        start = time.time() - 1
        for k in range(3):
            _apply(api, "a", "j", "trainer-status", k)
        _apply(api, "a", "j", "trainjob-scraper", 7)
        _apply(api, "b", "j", "trainjob-scraper", 8)  # another namespace: not counted
        # A write the API server refuses (progress above the schema's maximum): not counted.
        with pytest.raises(client.ApiException):
            _apply(api, "a", "j", "trainjob-scraper", 1000)
        end = time.time() + 1
        deadline = time.monotonic() + 10  # the log backend writes each event as it ends
        while True:
            audit = vs_push.read_audit(plane.audit_log_path, "a", start, end)
            if sum(audit.count.values()) >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert audit.writer("trainer-status")[0] == 3
    writes, nbytes = audit.writer("trainjob-scraper")
    assert writes == 1
    # The compact JSON of the apply body: about the size of what was sent.
    sent = len(json.dumps({"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "TrainJob",
                           "metadata": {"name": "j", "namespace": "a"},
                           "status": {"trainerStatus": {
                               "progressPercentage": 7,
                               "lastUpdatedTime": "2026-01-01T00:00:00Z"}}},
                          separators=(",", ":")))
    assert nbytes == sent
    # The key names the user (the admin certificate's CN) after the field manager.
    assert all(k.split(" ")[1] == "devcluster-admin" for k in audit.count), audit.count


def test_freshness_counts_unseen_changes_as_lower_bounds() -> None:
    # One training: reports at 100..105 s, its percentage 1 -> 2 at 102 s; the TrainJob
    # shows stamp 100 at 100.5 and percent 2 with stamp 102 at 103.0, nothing after.
    record = {"stamps": [100.0, 101.0, 102.0, 103.0, 104.0, 105.0, 200.0],
              "percents": [1, 1, 2, 2, 2, 2, 100]}
    seen = {"job-0": [(100.5, 1, 100.0), (103.0, 2, 102.0)]}
    got = figures.freshness({"job-0": record}, seen, a=100.0, b=110.0, lookahead=5.0)
    assert got["progress_changes"] == 1 and got["progress_censored"] == 0
    assert got["progress_freshness_p99_s"] == pytest.approx(1.0)
    # Stamps 100..105 count: 100 -> 0.5 s, 101 and 102 -> seen at 103.0; 103, 104, 105 never
    # shown: counted as b - t (7, 6, 5 s), not left out.
    assert got["metrics_reports"] == 6 and got["metrics_censored"] == 3
    assert got["metrics_freshness_p99_s"] == pytest.approx(7.0)
    assert got["metrics_freshness_p50_s"] == pytest.approx(5.0)


def test_sdk_failures_are_told_from_its_throttle() -> None:
    assert training.classify_failure(None) == "throttled"
    assert training.classify_failure("Status update failed: HTTP 429") == "http"
    assert training.classify_failure(
        "Failed to send status update: HTTPSConnectionPool(host='x', port=1): Read timed out."
        " (read timeout=5)") == "timeout"
    assert training.classify_failure(
        "Failed to send status update: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
        "failed") == "error"


@pytest.mark.timeout(1500)
def test_quick_run_writes_both_designs(tmp_path: Path) -> None:
    assert vs_push.main(["--quick", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("vs-push-*.json")
    res = json.loads(path.read_text())
    assert not res["errors"], res["errors"]
    assert not [r for r in res["runs"] if "error" in r], res["runs"]
    assert (tmp_path / path.name.replace(".json", ".md")).exists()
    assert (tmp_path / path.name.replace(".json", "-n4.png")).stat().st_size > 1000
    for design in ("push", "pull"):
        figures_n = res["by_n"]["4"][design]
        assert set(report.KEYS) <= set(figures_n)
        assert figures_n["finals_expected"] == 4
        assert figures_n["api_writes_per_trainjob_hour"] > 0, (design, res["runs"])
        assert 0 <= figures_n["progress_freshness_p50_s"] <= figures_n["progress_freshness_p99_s"]
        assert figures_n["training_cost_p99_us"] > 0
        assert figures_n["real_trainings"] == 2 and figures_n["farmed_trainings"] == 2
        (run,) = [r for r in res["runs"] if r["design"] == design]
        cost = run["windows"][-1]["cost"]
        # The real trainings and the farm both reported, and push's farm got through
        # the status server (its token, CA and Service name as the pod's).
        assert cost[report.REAL_KIND[design]]["outcomes"].get("ok", 0) > 0, cost
        assert cost[report.FARM_KIND[design]]["outcomes"].get("ok", 0) > 0, cost
    # Pull delivers every final although the scraper was down across the trainings' end,
    # and its sweep window came before the defaults'.
    assert res["by_n"]["4"]["pull"]["finals_delivered"] == 4, res["runs"]
    (pull,) = [r for r in res["runs"] if r["design"] == "pull"]
    assert [w["label"] for w in pull["windows"]][-1] == "defaults"
    assert len(pull["windows"]) == 2
    assert res["targets"]


def test_scraper_window_reads_a_scrapers_metrics_text() -> None:
    # The scraper's own registry renders the text (scraper.telemetry), as its /metrics
    # does: held and polled targets, writes and their request time over one window.
    from prometheus_client import generate_latest

    from scraper.telemetry import Telemetry

    t = Telemetry(lambda: [])
    t.held_scrapes.set(150)
    t.scrapes.labels("ok").inc(10)
    t.writes.labels("written").inc(4)
    t.write_duration.observe(0.5)
    before = vs_push.scraper_sample(generate_latest(t.registry).decode())
    t.held_scrapes.set(190)
    t.scrapes.labels("ok").inc(30)
    t.scrapes.labels("not_modified").inc(2)
    t.writes.labels("written").inc(6)
    t.write_duration.observe(1.5)
    t.write_duration.observe(2.5)
    t.writes_pending.set(7)
    after = vs_push.scraper_sample(generate_latest(t.registry).decode())
    w = vs_push.scraper_window(before, after)
    assert w is not None
    assert w["trainjob_scraper_held_scrapes"] == [150, 190]
    assert w["trainjob_scraper_status_writes_pending"] == [0, 7]
    assert w["increase"]["trainjob_scraper_scrapes_total{result=ok}"] == 30
    assert w["increase"]["trainjob_scraper_scrapes_total{result=not_modified}"] == 2
    assert w["increase"]["trainjob_scraper_status_writes_total{result=written}"] == 6
    assert w["write_seconds_mean"] == pytest.approx(2.0)
    assert vs_push.scraper_window(None, after) is None
