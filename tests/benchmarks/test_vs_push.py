"""benchmarks.vs_push: the audit-log count on the real API server, the delivery rule (shown,
superseded, never shown; censored freshness), the SDK outcome rule, the plans' sessions,
and a ``--quick`` run of every side on the local stack, the patched Trainer included (the
JSON's keys and sane values, not timings)."""

from __future__ import annotations

import json
import math
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from kubernetes import client

from benchmarks import vs_push
from benchmarks import vs_push_delivery as delivery
from benchmarks import vs_push_report as report
from benchmarks import vs_push_sides as sides
from benchmarks import vs_push_training as training
from exporter_lib.status import API_GROUP, API_VERSION
from localdev.cluster import ControlPlane, install_trainjob_crds, objects
from localdev.cluster.stack import trainer_configuration

pytestmark = pytest.mark.benchmarks


def _apply(api: client.ApiClient, ns: str, name: str, manager: str, progress: int) -> None:
    objects.apply_trainjob_status(api, ns, name, {"trainerStatus": {
        "progressPercentage": progress, "lastUpdatedTime": "2026-01-01T00:00:00Z"}},
        field_manager=manager)


def test_picture_labels_each_side_with_its_settings_and_values(tmp_path: Path) -> None:
    """A point per session: two keys for one session (pull at its defaults = pull capped
    at the same budget) share one legend entry; a censored p99 is labelled ">="."""
    def run(side: str, keys: list[str], x: float, y: float, censored: bool = False
            ) -> dict[str, object]:
        return {"side": side, "keys": keys, "side_label": f"label of {side}",
                "design": "push" if side.startswith("push") else "pull",
                "label": "N=20 every=1s percent=15s", "jobs": 20, "every": 1.0,
                "window": {"progress_freshness_p99_s": x, "api_writes_per_trainjob_hour": y,
                           "progress_freshness_p99_censored": censored}}

    runs = [run("push_as_shipped", ["push_as_shipped"], 59.0, 0.0, True),
            run("push_best", ["push_best"], 0.5, 720.0),
            run("pull", ["pull", "pull_equal_budget"], 0.17, 240.0)]
    points = report.plot_points(runs)
    labels = [p[0] for p in points]
    assert len(set(labels)) == len(labels) == 3
    assert labels[0].startswith("push_as_shipped: label of push_as_shipped")
    assert "p99 >= 59.00 s, 0 writes/h" in labels[0]
    assert labels[2].startswith("pull = pull_equal_budget: label of pull: p99 0.17 s")
    assert len({p[3] for p in points}) == 3  # each side its own marker
    written = report.plot({"runs": runs}, tmp_path / "vs-push-x")
    assert [p.name for p in written] == ["vs-push-x-n20-every1s-percent15s.png"]
    assert written[0].stat().st_size > 1000


def test_cliff_states_both_n_and_draws_one_picture(tmp_path: Path) -> None:
    def h(rate: float, p99: float, censored: bool = False) -> dict[str, object]:
        return {"api_writes_per_s": rate, "progress_freshness_p99_s": p99,
                "progress_freshness_p99_censored": censored, "budget": [5.0, 10]}

    res = {"plan": {"budget": [5.0, 10]}, "sides": {k: k for k in sides.SIDE_KEYS},
           "by_label": {
               "N=20 every=1s percent=15s": {"push_as_shipped": h(4.9, 5.0),
                                             "push_best": h(4.9, 5.0),
                                             "pull_equal_budget": h(4.0, 6.0)},
               "N=60 every=1s percent=15s": {"push_as_shipped": h(0.0, 170.0, True),
                                             "push_best": h(5.0, 9.0),
                                             "pull_equal_budget": h(4.5, 8.0)},
               "N=200 every=10s percent=15s": {"push_as_shipped": h(0.0, 1.0)}}}
    assert report.cliff(res) == {"push_as_shipped_cliff_n": 60,
                                 "push_best_slower_than_pull_from_n": 60,
                                 "measured_n": [20, 60]}
    series = report.cliff_series(res)
    assert series["push_as_shipped"] == [(20, 4.9, 5.0, False), (60, 0.0, 170.0, True)]
    path = report.plot_cliff(res, tmp_path / "vs-push-cliff-x")
    assert path.name == "vs-push-cliff-x-cliff.png" and path.stat().st_size > 1000


@pytest.mark.timeout(180)
@pytest.mark.cluster  # starts a control plane of its own
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


def test_delivery_tells_shown_superseded_and_never_shown_values_apart() -> None:
    # One training reports every second at 100..105 s (stamps = report times), its
    # percentage 1 -> 2 at 102 s -> 3 at 105 s; the final at 200 s.  The TrainJob shows
    # (1, stamp 100) at 100.5 and (2, stamp 102) at 103.0, nothing after.
    record = {"stamps": [100.0, 101.0, 102.0, 103.0, 104.0, 105.0, 200.0],
              "percents": [1, 1, 2, 2, 2, 3, 100], "final": 200.0}
    seen = {"job-0": [(100.5, 1, 100.0), (103.0, 2, 102.0)]}
    got = delivery.delivery({"job-0": record}, seen, a=100.0, b=110.0, observed_until=120.0)
    # Percentages 1 and 2 shown (0.5 s, 1.0 s); 3 never shown: a lower bound of 15 s.
    assert (got["progress_values_reported"], got["progress_values_shown"],
            got["progress_values_superseded"], got["progress_values_never_shown"]) == (3, 2, 0, 1)
    assert got["progress_freshness_p50_s"] == pytest.approx(1.0)
    assert got["progress_freshness_p50_censored"] is False
    assert got["progress_freshness_p99_s"] == pytest.approx(15.0)
    assert got["progress_freshness_p99_censored"] is True
    # Stamps: 100 and 102 shown; 101 superseded (102 was shown instead); 103..105 never
    # shown; freshness over the shown ones and the bounds, not the superseded one.
    assert (got["metrics_values_reported"], got["metrics_values_shown"],
            got["metrics_values_superseded"], got["metrics_values_never_shown"]) == (6, 2, 1, 3)
    assert got["values_reported"] == 9 and got["values_never_shown"] == 4
    assert got["metrics_freshness_p50_s"] == pytest.approx(15.0)  # of 0.5, 1, 15, 16, 17
    # Percent error each second of [100, 110]: 0 while 1 is shown, 1 at 102 (shown 1),
    # 0 from 103 to 104, 1 from 105 (3 reported, 2 shown): max 1.
    assert got["percent_error_max"] == 1 and got["percent_error_p50"] == 1
    # The final: delivered only when a watch event shows 100 with its stamp.
    assert delivery.finals({"job-0": record}, seen, ["job-0"], 300.0)["delivered"] == 0
    seen["job-0"].append((201.5, 100, 200.0))
    fin = delivery.finals({"job-0": record}, seen, ["job-0"], 300.0)
    assert fin == {"delivered": 1, "expected": 1, "freshness_max_s": pytest.approx(1.5),
                   "freshness_p50_s": pytest.approx(1.5)}
    assert delivery.finals({"job-0": record}, seen, ["job-0"], 201.0)["delivered"] == 0


def test_censored_percentile_is_a_lower_bound_only_when_a_bound_can_move_it() -> None:
    assert delivery.censored_percentile([1.0, 2.0, 3.0], [], 0.5) == (2.0, False)
    # A bound above the percentile cannot move it: exact.
    assert delivery.censored_percentile([1.0, 2.0, 3.0], [50.0], 0.5) == (3.0, False)
    assert delivery.censored_percentile([1.0, 2.0, 3.0], [0.5], 0.5) == (2.0, True)
    assert delivery.censored_percentile([], [], 0.99) == (None, False)


def test_pull_capped_at_the_budget_is_a_fixed_rate_and_a_session_of_its_own() -> None:
    # The scraper's defaults adapt their rate (20 up to 200 writes/s): pull at its
    # defaults is not pull at push's budget, so the two never share a session, and the
    # capped side pins the ceiling at the budget (seen: without it, "pull capped at 5/s"
    # wrote 6.7/s at N=100).
    args = ["--plan", "main", "--jobs", "20"]
    plan = vs_push.plan_of(vs_push.parse_args(args))
    one = [s for s in vs_push.sessions(plan, 8 << 30) if s.every == 1.0]
    assert [s.side.key for s in one] == ["push_as_shipped", "push_equal_budget", "push_best",
                                         "pull", "pull_equal_budget"]
    assert [s.keys for s in one[-2:]] == [("pull",), ("pull_equal_budget",)]
    assert one[-2].side.scraper_flags() == ()
    assert one[-1].side.scraper_flags() == ("--write-qps", "20", "--write-burst", "30",
                                            "--write-qps-max", "20")
    assert one[1].side.budget == sides.equal_budget() == sides.Budget(20.0, 30)
    assert sides.pull_defaults() == sides.Budget(20.0, 30, 200.0)
    assert "adapting up to 200/s" in one[-2].side.label
    assert "adapting" not in one[1].side.label and "(fixed)" in one[-1].side.label
    cliff = vs_push.plan_of(vs_push.parse_args(["--plan", "cliff", "--jobs", "40"]))
    keys = [(s.side.key, s.keys) for s in vs_push.sessions(cliff, 8 << 30)]
    assert keys == [("push_as_shipped", ("push_as_shipped",)), ("push_best", ("push_best",)),
                    ("pull_equal_budget", ("pull_equal_budget",))]
    capped = vs_push.sessions(cliff, 8 << 30)[-1].side
    assert capped.scraper_flags() == ("--write-qps", "5", "--write-burst", "10",
                                      "--write-qps-max", "5")
    with pytest.raises(SystemExit):
        vs_push.parse_args(["--budget", "fast"])


def _cliff_res(sides_run: list[str], started: str) -> dict[str, Any]:
    plan = vs_push.plan_of(vs_push.parse_args(["--plan", "cliff", "--jobs", "20", "40"]))
    runs = [{"side": side, "keys": [side], "label": s.label, "jobs": s.jobs, "every": 1.0,
             "design": s.side.design, "real": 2, "farmed": 0,
             "percent_seconds": 15.0, "budget": [5.0, 10],
             "window": {"api_writes_per_s": 1.0, "seconds": 180.0}}
            for s in vs_push.sessions(plan, 8 << 30) for side in [s.side.key]
            if side in sides_run]
    return {"started": started, "commit": f"commit-{started}", "runs": runs, "errors": {},
            "plan": {"name": "cliff", "cases": [c.__dict__ for c in plan.cases],
                     "budget": [5.0, 10]},
            "sides": {k: f"{k} at {started}" for k in sides.SIDE_KEYS}}


def test_a_rerun_side_joins_the_earlier_runs_other_sides_marked(tmp_path: Path) -> None:
    old = _cliff_res(["push_as_shipped", "push_best", "pull_equal_budget"], "t0")
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    new = _cliff_res(["pull_equal_budget"], "t1")
    vs_push.carry(new, path)
    by_side: dict[str, list[dict[str, Any]]] = {}
    for run in new["runs"]:
        by_side.setdefault(run["side"], []).append(run)
    assert sorted(by_side) == ["pull_equal_budget", "push_as_shipped", "push_best"]
    # The rerun side is this run's only; the others come from the old run, marked.
    assert all("carried_from" not in r for r in by_side["pull_equal_budget"])
    assert len(by_side["pull_equal_budget"]) == 2
    for key in ("push_as_shipped", "push_best"):
        assert [r["carried_from"]["commit"] for r in by_side[key]] == ["commit-t0"] * 2
    assert new["carried"]["sides"] == ["push_as_shipped", "push_best"]
    assert new["sides"]["pull_equal_budget"].endswith("t1")
    assert new["sides"]["push_best"].endswith("t0")
    assert set(next(iter(new["by_label"].values()))) == {
        "push_as_shipped", "push_best", "pull_equal_budget"}
    text = report.table({**new, "machine": "2 cores", "loadavg_start": "0.1"})
    assert "come from the earlier run old.json (started t0, commit commit-t0)" in text
    assert text.count("(from old.json)") == 4 and "commit commit-t1." in text
    other = _cliff_res(["pull_equal_budget"], "t2")
    other["plan"]["cases"] = other["plan"]["cases"][:1]
    with pytest.raises(vs_push.UsageError, match="--carry"):
        vs_push.carry(other, path)


def test_a_carried_session_keeps_the_run_it_came_from(tmp_path: Path) -> None:
    # Carrying a report that itself carried sessions: those sessions still name the run
    # that measured them, and the report says which sides came from which run.
    first = _cliff_res(["push_as_shipped", "push_best", "pull_equal_budget"], "t0")
    (tmp_path / "first.json").write_text(json.dumps(first))
    second = _cliff_res(["pull_equal_budget"], "t1")
    vs_push.carry(second, tmp_path / "first.json")
    (tmp_path / "second.json").write_text(json.dumps(second))
    third = _cliff_res(["push_best"], "t2")
    vs_push.carry(third, tmp_path / "second.json")
    origin = {r["side"]: r.get("carried_from", {}).get("file") for r in third["runs"]}
    assert origin == {"push_as_shipped": "first.json", "pull_equal_budget": "second.json",
                      "push_best": None}
    assert third["carried"]["from"] == {"push_as_shipped": "first.json",
                                        "pull_equal_budget": "second.json"}
    text = report.table({**third, "machine": "2 cores", "loadavg_start": "0.1"})
    assert "of `push_as_shipped` come from the earlier run first.json" in text
    assert "of `pull_equal_budget` come from the earlier run second.json" in text
    # The Sides line names only the sides the report has rows of.
    sides_line = next(line for line in text.splitlines() if line.startswith("Sides: "))
    assert "`pull`" not in sides_line and "`push_best`" in sides_line


def _not_run(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``runs`` as a run whose time budget was spent before them records them."""
    head = ("side", "keys", "jobs", "every", "percent_seconds", "label")
    return [{**{k: r[k] for k in head}, "error": "not run: the run's time budget (60 s) "
             "was spent"} for r in runs]


def test_a_resumed_run_measures_only_the_sessions_the_earlier_run_lacks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cliff_sides = ["push_as_shipped", "push_best", "pull_equal_budget"]
    first = _cliff_res(cliff_sides, "t0")
    n20 = [r for r in first["runs"] if r["jobs"] == 20]
    n40 = [r for r in first["runs"] if r["jobs"] == 40]
    first["runs"] = n20 + _not_run(n40)  # its time budget ran out after N=20
    path = tmp_path / "first.json"
    path.write_text(json.dumps(first))
    args = ["--plan", "cliff", "--jobs", "20", "40", "--estimate", "--carry", str(path)]
    assert vs_push.main([*args, "--resume"]) == 0
    planned = json.loads(capsys.readouterr().out)["per_session"]
    assert [(label, side) for label, side, _ in planned] == [
        (r["label"], r["side"]) for r in n40]
    assert vs_push.main(args) == 0  # without --resume: every session again
    assert len(json.loads(capsys.readouterr().out)["per_session"]) == 6
    # Nothing left: no cluster is started; another budget cannot be resumed.
    full = tmp_path / "full.json"
    full.write_text(json.dumps(_cliff_res(cliff_sides, "t0")))
    assert vs_push.main(["--plan", "cliff", "--jobs", "20", "40", "--carry", str(full),
                         "--resume"]) == 0
    assert "nothing to run" in capsys.readouterr().out
    assert re.search(r"--carry=.*: budget \[5\.0, 10\]",
                     _refused([*args, "--resume", "--budget", "20/30"], capsys))
    # The resumed run's report has every session once: N=20 from the first run, marked,
    # and N=40 from this one; the first run's "not run" entries are gone.
    second = _cliff_res(cliff_sides, "t1")
    second["runs"] = [r for r in second["runs"] if r["jobs"] == 40]
    vs_push.carry(second, path)
    origin = {(r["label"], r["side"]): r.get("carried_from", {}).get("file")
              for r in second["runs"]}
    assert origin == {**{(r["label"], r["side"]): "first.json" for r in n20},
                      **{(r["label"], r["side"]): None for r in n40}}
    assert not any("error" in r for r in second["runs"])
    assert {label: sorted(d) for label, d in second["by_label"].items()} == {
        r["label"]: sorted(cliff_sides) for r in first["runs"]}
    # A later run cut short keeps the earlier figures of what it did not get to.
    (tmp_path / "second.json").write_text(json.dumps(second))
    third = _cliff_res(["push_best"], "t2")
    third["runs"] = [r for r in third["runs"] if r["jobs"] == 20] + _not_run(
        [r for r in third["runs"] if r["jobs"] == 40])
    vs_push.carry(third, tmp_path / "second.json")
    best = {r["label"]: r.get("carried_from", {}).get("file") for r in third["runs"]
            if r["side"] == "push_best"}
    assert best == {n20[0]["label"]: None, n40[0]["label"]: "second.json"}
    assert not any("error" in r for r in third["runs"])
    # One entry per case and side, whatever came from where.
    pairs = [(r["label"], r["side"]) for r in third["runs"]]
    assert sorted(pairs) == sorted({*pairs}) and len(pairs) == 6
    assert third["carried"]["from"]["push_best"] == "second.json"
    assert third["carried"]["from"]["push_as_shipped"] == "first.json, second.json"


def test_a_resumed_run_cut_short_again_keeps_one_not_run_entry_per_session(
        tmp_path: Path) -> None:
    cliff_sides = ["push_as_shipped", "push_best", "pull_equal_budget"]
    first = _cliff_res(cliff_sides, "t0")
    n20 = [r for r in first["runs"] if r["jobs"] == 20]
    n40 = [r for r in first["runs"] if r["jobs"] == 40]
    first["runs"] = n20 + _not_run(n40)
    (tmp_path / "first.json").write_text(json.dumps(first))
    second = _cliff_res(cliff_sides, "t1")
    second["runs"] = _not_run([r for r in second["runs"] if r["jobs"] == 40])
    vs_push.carry(second, tmp_path / "first.json")
    errors = [(r["label"], r["side"]) for r in second["runs"] if "error" in r]
    assert sorted(errors) == sorted((r["label"], r["side"]) for r in n40)
    assert all("carried_from" not in r for r in second["runs"] if "error" in r)
    assert [r.get("carried_from", {}).get("file") for r in second["runs"]
            if "error" not in r] == ["first.json"] * 3


def test_a_shared_pull_session_measured_again_for_one_key_keeps_the_other(
        tmp_path: Path) -> None:
    # A session standing for two keys (pull at a budget equal to the capped one): when a
    # later run measures one of them again, the carried session stands for the other only.
    old = _cliff_res(["pull_equal_budget"], "t0")
    for r in old["runs"]:
        r["side"], r["keys"] = "pull", ["pull", "pull_equal_budget"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    new = _cliff_res(["pull_equal_budget"], "t1")
    vs_push.carry(new, tmp_path / "old.json")
    carried = [r for r in new["runs"] if "carried_from" in r]
    assert [r["keys"] for r in carried] == [["pull"], ["pull"]]
    for d in new["by_label"].values():
        assert d["pull"]["session"] == "pull" and d["pull_equal_budget"]["session"] == \
            "pull_equal_budget"


def test_resume_needs_a_run_to_resume(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        vs_push.parse_args(["--plan", "cliff", "--resume"])
    assert "--resume: needs --carry RUN.json" in capsys.readouterr().err


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What ``main(argv)`` wrote to stderr, having refused the options with status 2 (as
    argparse refuses its own) and printed nothing else."""
    capsys.readouterr()
    assert vs_push.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"{vs_push.PROG}: error: "), (out, err)
    return err


def test_a_plan_with_no_session_is_refused_before_anything_starts(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The cliff runs no pull at its defaults: asked for that side alone, the run names
    the options and the plan's cases, and starts nothing (not even with --estimate)."""
    err = _refused(["--plan", "cliff", "--sides", "pull", "--estimate"], capsys)
    assert "--plan=cliff --sides=pull: no session to run" in err
    assert "N=20 every=1s percent=15s" in err
    err = _refused(["--plan", "cliff", "--jobs", "20", "30", "--sides", "pull", "--estimate"],
                   capsys)
    assert "--plan=cliff --sides=pull --jobs=20,30: no session to run" in err


def test_a_carry_file_that_cannot_be_carried_stops_the_run_before_it_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --estimate runs nothing, so reaching its output means the check came first.
    for text in (None, "not json", json.dumps({"plan": {}})):
        path = tmp_path / "old.json"
        path.unlink(missing_ok=True)
        if text is not None:
            path.write_text(text)
        assert re.search(r"--carry=.*old\.json: not a readable run", _refused(
            ["--plan", "cliff", "--jobs", "20", "--estimate", "--carry", str(path)], capsys))
    path.write_text(json.dumps(_cliff_res(["push_best"], "t0")))
    assert re.search(r"--carry=.*: plan 'cliff' with cases", _refused(
        ["--plan", "cliff", "--jobs", "40", "--estimate", "--carry", str(path)], capsys))
    assert vs_push.main(["--plan", "cliff", "--jobs", "20", "40", "--estimate", "--carry",
                         str(path)]) == 0
    # Runs of shapes the report cannot take are refused before the run, not after it.
    good = _cliff_res(["push_best"], "t0")
    estimate = ["--plan", "cliff", "--jobs", "20", "40", "--estimate", "--carry", str(path)]
    for runs in (["a string"], [{"side": "push_best"}],
                 [{k: v for k, v in good["runs"][0].items() if k != "side"}],
                 [{**good["runs"][0], "carried_from": "old.json"}]):
        path.write_text(json.dumps({**good, "runs": runs}))
        assert re.search(r"--carry=.*: its runs cannot be reported",
                         _refused(estimate, capsys))
    path.write_text(json.dumps({**good, "sides": ["push_best"]}))
    assert re.search(r"--carry=.*: its runs cannot be reported", _refused(estimate, capsys))


#: Each option's lower bound, whether it is allowed, and its upper bound (allowed).
_NUMERIC = {"--every": (0.0, False, 3600.0), "--percent-seconds": (0.0, False, 3600.0),
            "--window": (5.0, True, 3600.0), "--warmup": (0.0, True, 3600.0),
            "--fault": (0.0, True, 3600.0), "--settle": (0.0, True, 3600.0),
            "--setup-timeout": (0.0, False, 86400.0), "--time-budget": (0.0, False, 604800.0)}


@given(flag=st.sampled_from(sorted(_NUMERIC)), value=st.floats(allow_nan=True))
@example(flag="--window", value=math.nan)
@example(flag="--settle", value=math.nan)
@example(flag="--every", value=0.0)
@example(flag="--window", value=5.0)
@example(flag="--window", value=3600.0)
@example(flag="--window", value=60000.0)
@example(flag="--fault", value=3600.5)
@example(flag="--time-budget", value=1e300)
def test_each_numeric_option_is_accepted_exactly_in_its_range(flag: str, value: float) -> None:
    low, inclusive, high = _NUMERIC[flag]
    ok = (math.isfinite(value) and (value > low or (inclusive and value == low))
          and value <= high)
    argv = ["--plan", "custom", flag, repr(value)]
    if ok:
        args = vs_push.parse_args(argv)
        assert getattr(args, flag[2:].replace("-", "_")) == value
        return
    with pytest.raises(SystemExit) as exc:
        vs_push.parse_args(argv)
    assert exc.value.code == 2


def test_out_of_range_options_name_the_option_the_value_and_the_limit(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    cases = {("--plan", "custom", "--every", "0"): "--every=0: must be > 0",
             ("--plan", "custom", "--every", "nan"): "--every=nan: must be a finite number",
             ("--window", "nan"): "--window=nan: must be a finite number",
             ("--real", "1"): "--real=1: must be >= 2",
             ("--time-budget", "-1"): "--time-budget=-1: must be > 0",
             ("--window", "60000"): "--window=60000: must be <= 3600",
             ("--real", "20000"): "--real=20000: must be <= 10000",
             ("--plan", "custom", "--jobs", "20", "20001"):
                 "--jobs=[20, 20001]: each N must be <= 10000",
             ("--every", "10"): "--every=10: only with --plan custom",
             ("--jobs", "2000"): "--jobs=[2000]: the main plan's N are [20, 200, 1000]",
             ("--quick", "--plan", "cliff"): "--quick is --plan quick: not with --plan cliff",
             ("--budget", "0/0"): "QPS 0 must be in (0, 1000]",
             ("--budget", "5/0"): "burst 0 must be in [1, 10000]"}
    for argv, message in cases.items():
        with pytest.raises(SystemExit):
            vs_push.parse_args(list(argv))
        assert message in capsys.readouterr().err, argv
    # A time budget no session fits in is refused before a cluster starts.
    assert re.search(r"--time-budget=1: shorter than the shortest session asked for "
                     r"\(\d+ s after its setup\) plus 60 s", _refused(
                         ["--plan", "main", "--jobs", "20", "--time-budget", "1", "--estimate"],
                         capsys))
    assert vs_push.main(["--plan", "main", "--jobs", "20", "--time-budget", "900",
                         "--estimate"]) == 0
    # A run expected to take over a day needs a time budget; run() is not reached.
    def no_run(plan: Any) -> dict[str, Any]:
        raise AssertionError("a run was started")
    monkeypatch.setattr(vs_push, "run", no_run)
    assert "give --time-budget to run it" in _refused(
        ["--plan", "custom", "--jobs", "10000", "--window", "3600"], capsys)
    # A window no value is judged in (custom: every 10 s, so the lookahead is 11 s).
    assert "--window=10: must be longer than the lookahead of N=20 every=10s" in _refused(
        ["--plan", "custom", "--every", "10", "--window", "10", "--estimate"], capsys)
    # --jobs outside the cliff's N adds that N (the cliff plan is a sweep).
    cliff = vs_push.plan_of(vs_push.parse_args(["--plan", "cliff", "--jobs", "1000"]))
    assert [c.jobs for c in cliff.cases] == [1000]


def test_trainer_configuration_sets_the_status_servers_budget_only_when_asked() -> None:
    shipped = trainer_configuration(webhook_port=1, probe_port=2, status_port=3, push=True)
    assert shipped["statusServer"] == {"port": 3}
    budget = trainer_configuration(webhook_port=1, probe_port=2, status_port=3, push=True,
                                   status_qps=20.0, status_burst=30)
    assert budget["statusServer"] == {"port": 3, "qps": 20.0, "burst": 30}


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
@pytest.mark.cluster  # starts a control plane of its own
def test_quick_run_measures_every_side_by_the_watch(tmp_path: Path) -> None:
    assert vs_push.main(["--quick", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("vs-push-quick-*.json")
    res = json.loads(path.read_text())
    assert not res["errors"], res["errors"]
    assert not [r for r in res["runs"] if "error" in r], res["runs"]
    assert (tmp_path / path.name.replace(".json", ".md")).exists()
    png = tmp_path / path.name.replace(".json", "-n4-every1s-percent3s.png")
    assert png.stat().st_size > 1000
    (case,) = res["by_label"].values()
    assert set(case) == set(sides.SIDE_KEYS)
    # Push (c) ran our patched build; pull capped at the budget ran on its own.
    assert Path(res["trainer_best_binary"]).name == "trainer-controller-manager"
    assert case["pull_equal_budget"]["session"] == "pull_equal_budget"
    for key, got in case.items():
        assert set(report.KEYS) <= set(got), key
        assert got["finals_expected"] == {"no_fault": 2, "fault": 2}, key
        assert got["api_writes_per_trainjob_hour"] > 0, (key, res["runs"])
        assert 0 < got["values_shown"] <= got["values_reported"], key
        assert got["values_reported"] == (got["values_shown"] + got["values_superseded"]
                                          + got["values_never_shown"]), key
        assert 0 <= got["progress_freshness_p50_s"] <= got["progress_freshness_p99_s"], key
        assert got["training_cost_p99_us"] > 0 and got["apiserver_cpu_s"] > 0, key
        assert got["real_trainings"] == 2 and got["farmed_trainings"] == 2, key
        # Every status write is an update the Trainer's TrainJob controller admits.
        assert got["trainer_reconciles"] > 0, key
        assert got["percent_error_p99"] is not None, key
    for run in res["runs"]:
        cost = run["window"]["cost"]
        design = run["design"]
        # The real trainings and the farm both reported, and push's farm got through
        # the status server (its token, CA and Service name as the pod's).
        assert cost[report.REAL_KIND[design]]["outcomes"].get("ok", 0) > 0, cost
        assert cost[report.FARM_KIND[design]]["outcomes"].get("ok", 0) > 0, cost
    # Pull delivers every final, with nothing down and with the scraper down across the
    # trainings' end, as the watch saw them.
    assert case["pull"]["finals_delivered"] == {"no_fault": 2, "fault": 2}, res["runs"]
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


def test_each_training_counts_its_points_from_a_phase_of_its_own() -> None:
    """The percentage points of the trainings fall at phases spread over a point's
    length (the same in every run), not at one place of the SDK's throttle window."""
    phases = [training.percent_phase(f"job-{i}", 15.0) for i in range(200)]
    assert all(0.0 <= p < 15.0 for p in phases)
    assert phases == [training.percent_phase(f"job-{i}", 15.0) for i in range(200)]
    # Spread: every 5 s third of a point holds some, and the throttle's window (5 s)
    # sees every place of it.
    assert {int(p // 5) for p in phases} == {0, 1, 2}
    assert {int(p % 5) for p in phases} == {0, 1, 2, 3, 4}


def test_a_sleeping_training_ends_when_the_end_is_brought_forward(tmp_path: Path) -> None:
    """A training reporting once a minute that is asleep when the benchmark writes its
    end (as for the fault half, written as the worker goes down) sends its final within
    about a second of that end, not at its next report: else the fault would not span
    the final it is meant to span."""
    end_file = tmp_path / "end"
    calls: list[tuple[float, int]] = []

    def bring_the_end_forward() -> None:
        end_file.write_text(f"{time.time() + 1.0:.3f}")

    def report(progress: int, eta: int, metrics: dict[str, str]) -> str:
        calls.append((time.time(), progress))
        if len(calls) == 1:  # the end written once it sleeps (its next report 60 s on)
            threading.Timer(1.0, bring_the_end_forward).start()
        return "ok"

    job = training.Training("job-1", report, every=60.0, percent_seconds=15.0,
                            end_at=training.end_reader(end_file, time.time() + 120),
                            out=tmp_path, kind="test")
    started = time.time()
    job.run()
    assert [p for _, p in calls] == [0, 100]
    end = float(end_file.read_text())
    assert end <= calls[1][0] < end + training.END_LOOK + 0.5, (calls, end)
    assert calls[1][0] - started < 10
