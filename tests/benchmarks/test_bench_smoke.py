"""Smoke tests of the benchmark machinery (not timed tests): the nginx farm speaks the
exporter's wire contract, and the bypassed scraper harness reports scrapes and CPU."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

import pytest

from benchmarks import breakdown
from benchmarks.__main__ import problems, rate_text, rate_verdict, run_ours, table
from benchmarks.farm import ExporterFarm, NginxFarm
from benchmarks.procstat import cpu_seconds, rss_bytes

pytestmark = pytest.mark.timeout(60)


def test_nginx_farm_serves_json_text_and_304() -> None:
    with NginxFarm(2) as farm:
        url = farm.urls()[1]
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            etag = resp.headers["ETag"]
            assert resp.headers["Content-Type"] == "application/json"
            assert json.loads(resp.read())["progressPercentage"] == 42
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain")
            assert resp.headers["ETag"] != etag
        req = urllib.request.Request(url, headers={"Accept": "application/json",
                                                   "If-None-Match": etag})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=5)
        assert info.value.code == 304


def test_bypassed_scraper_scrapes_every_target_each_interval() -> None:
    # 40 targets for 4 s: about 160 scrapes, enough CPU for a few of /proc's 10 ms ticks.
    with NginxFarm(40) as farm:
        result = run_ours(farm.urls(), 1.0, 2.0, 4.0)
    assert result["targets"] == 40
    assert result["results"].get("not_modified", 0) >= 40 * 2  # 304s after the first scrape
    assert result["expected"] == pytest.approx(40 * result["window"])
    assert result["cpu_seconds"] > 0


def test_bypassed_scraper_writes_changes_within_the_budget() -> None:
    """Real exporter_lib exporters changing every 0.5 s, the write budget of the
    benchmark's default-budget row: changes reach the (in-memory) apply request.  An
    empty in-memory store once counted as no store, and that row read 0 writes."""
    with ExporterFarm(10, period=0.5, duration=30) as farm:
        result = run_ours(farm.urls(), 1.0, 2.0, 4.0, default_budget=True)
    assert result["results"].get("ok", 0) >= 10 * 2
    assert result["writes"] >= 10 * 2


def test_procstat_reads_this_process() -> None:
    assert cpu_seconds() > 0
    assert rss_bytes() > 1 << 20


def test_a_run_with_targets_down_or_failed_scrapes_gets_no_ratio() -> None:
    def prom(up: float, scrapes: float = 10000.0) -> dict[str, float]:
        return {"targets": 10, "cpu_seconds": 1.0, "scrapes": scrapes, "expected": 10000.0,
                "rss": 1 << 20, "up": up}

    def ours(results: dict[str, float], skipped: float = 0.0) -> dict[str, object]:
        return {"targets": 10, "cpu_seconds": 2.0, "scrapes": sum(results.values()),
                "results": results, "writes": 0, "rss_before": 0, "rss_after": 1 << 20,
                "skipped": skipped, "expected": 10000.0}

    res: dict[str, object] = {
        "targets": 10, "interval": 1.0, "series": 15, "machine": "test",
        "loadavg_start": "0", "payload_bytes": {"text": 1, "json": 1},
        "prom_static": prom(10), "ours_static": ours({"not_modified": 10000.0}),
        "prom_changing": prom(3), "ours_changing": ours({"ok": 9000.0, "timeout": 1000.0}),
        "ours_changing_no_writes": ours({"ok": 8000.0}, skipped=2000.0),
    }
    assert problems(res) == [
        ("changing", "Prometheus, changing: only 3 of 10 targets up"),
        ("changing", "ours, changing: 1000 of 10000 scrapes failed "
                     "({'ok': 9000.0, 'timeout': 1000.0})"),
    ]
    report = table(res)
    assert "| 100 us | 200 us | 2.00x | <= 0.5x | NOT met |" in report  # unchanged: valid
    assert "| 100 us | 200 us | n/a | <= 1.0x | n/a |" in report  # changing: no verdict
    assert "**Not a valid comparison**" in report
    assert "**Our scraper fell behind**" in report
    assert "- ours, changing, no writes: behind schedule: 8000 of 10000 expected scrapes, " \
        "2000 runs skipped" in report

    # Behind schedule with a ratio under the target is still not met.
    res["prom_static"] = prom(10) | {"cpu_seconds": 10.0}
    res["ours_static"] = ours({"not_modified": 10000.0}, skipped=3.0)
    assert "| 1000 us | 200 us | 0.20x | <= 0.5x | NOT met (behind schedule) |" in table(res)
    # Prometheus behind, a changing farm that stopped changing, too few CPU ticks: no ratio.
    res["prom_static"] = prom(10, scrapes=5000.0)
    assert ("unchanged", "Prometheus, unchanged: fell behind, 5000 of 10000 expected "
                         "scrapes") in problems(res)
    res["ours_changing"] = ours({"ok": 5000.0, "not_modified": 5000.0})
    assert ("changing", "ours, changing: 5000 of 10000 scrapes found the payload "
                        "unchanged") in problems(res)
    res["prom_static"] = prom(10) | {"cpu_seconds": 0.05}
    assert any(row == "unchanged" and "10 ms ticks" in why for row, why in problems(res))
    assert "| 5 us | 200 us | n/a | <= 0.5x | n/a |" in table(res)


def test_control_plane_windows_that_fell_behind_say_so() -> None:
    """Issue 28: ``benchmarks/cp.py``'s windows carry their schedule; a window with
    skipped runs or short of its expected scrapes is marked in its row and listed."""
    def window(scrapes: float, skipped: float) -> dict[str, float]:
        return {"window": 10.0, "cpu_seconds": 1.0, "scrapes": scrapes, "writes": 0.0,
                "expected": 10000.0, "skipped": skipped}

    res: dict[str, object] = {
        "targets": 1000, "interval": 1.0, "series": 15, "machine": "test",
        "loadavg_start": "0", "payload_bytes": {"text": 1, "json": 1},
        "controlplane": {"targets": 1000, "live_targets": 50,
                         "unchanged": window(10000.0, 0.0),
                         "changing": window(9000.0, 845.0)},
    }
    report = table(res)
    rows = {line.split(" | ")[0]: line for line in report.splitlines() if "discovery" in line}
    unchanged = rows["| CPU per scrape with discovery (control plane, unchanged)"]
    assert "100 us |" in unchanged and "behind" not in unchanged
    changing = next(line for key, line in rows.items() if "changing" in key)
    assert "1000 unchanged nginx targets and 50 changing exporters" in changing
    assert "111 us (behind schedule)" in changing  # 1 CPU-s / 9000 scrapes
    assert ("- ours with discovery, changing, real writes: behind schedule: 9000 of 10000 "
            "expected scrapes, 845 runs skipped") in report
    assert "ours with discovery, unchanged:" not in report


def test_capacity_verdict_only_for_what_was_tried() -> None:
    def step(rate: int, ok: bool) -> dict[str, object]:
        return {"targets": rate, "interval": 1.0, "sustained": ok}

    assert rate_verdict({"steps": [step(200, True)], "sustained_rate": 200.0}) is None
    assert rate_text({"steps": [step(200, True)], "sustained_rate": 200.0}) == \
        ">= 200 (highest tried)"
    held = {"steps": [step(2000, True), step(2500, False)], "sustained_rate": 2000.0}
    assert rate_verdict(held) is True and rate_text(held) == "2000"
    missed = {"steps": [step(1000, True), step(1500, False)], "sustained_rate": 1000.0}
    assert rate_verdict(missed) is False
    none = {"steps": [step(1000, False)], "sustained_rate": 0.0}
    assert rate_verdict(none) is False and rate_text(none) == "< 1000"


def test_breakdown_measures_each_piece() -> None:
    lines = breakdown.measure(40, window=1.0)
    assert [line.split(",")[0].split(" ")[0] for line in lines] == \
        ["asyncio", "APScheduler", "aiohttp", *["changing"] * len(breakdown.CHANGING_PIECES),
         "asyncio.to_thread(no-op)"]
    changing = [line for line in lines if line.startswith("changing")]
    assert [next(k for k, text in breakdown.CHANGING_PIECES.items() if text in line)
            for line in changing] == list(breakdown.CHANGING_PIECES)
    for line in lines:
        value = float(line.rsplit(": ", 1)[1].removesuffix(" us"))
        assert 0 < value < 1e6, line  # a real CPU cost per operation, in microseconds


def test_benchmark_pods_belong_to_their_trainjobs(
        kube_api: Any, trainjob_crd: None, namespace: str) -> None:
    """The control-plane benchmarks' pods pass the scraper's identity check: Pod -> Job
    -> JobSet -> TrainJob by UID (pods without the chain are never targets)."""
    from kubernetes import client

    from benchmarks.cp import _make_jobs
    from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL

    ran = _make_jobs(kube_api, namespace, [41001, 41002])
    assert sorted(ran) == ["job-0", "job-1"]
    custom, batch = client.CustomObjectsApi(kube_api), client.BatchV1Api(kube_api)
    for pod in client.CoreV1Api(kube_api).list_namespaced_pod(namespace).items:
        [job_ref] = [r for r in pod.metadata.owner_references if r.controller]
        job = batch.read_namespaced_job(job_ref.name, namespace)
        assert (job_ref.kind, job_ref.uid) == ("Job", job.metadata.uid)
        [jobset_ref] = [r for r in job.metadata.owner_references if r.controller]
        jobset = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace,
                                                     "jobsets", jobset_ref.name)
        [tj_ref] = [r for r in jobset["metadata"]["ownerReferences"] if r.get("controller")]
        trainjob = custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace,
                                                       TRAINJOB_PLURAL, tj_ref["name"])
        assert tj_ref["uid"] == trainjob["metadata"]["uid"]
        assert pod.metadata.labels["jobset.sigs.k8s.io/jobset-name"] == tj_ref["name"]


@pytest.mark.timeout(180)
@pytest.mark.cluster  # breakdown.status_writes starts a control plane of its own
def test_write_cost_harness_writes_through_every_path() -> None:
    """breakdown.status_writes drives every write path against its own API server; a
    writer whose request signature drifted from StatusWriter's raised on every write."""
    import asyncio

    costs = asyncio.run(breakdown.status_writes(4))
    assert set(costs) == set(breakdown.WRITE_PATHS) and all(c > 0 for c in costs.values()), \
        costs


def test_pinned_children_run_on_the_core_given_and_the_mask_comes_back() -> None:
    """A child started inside ``pinned`` is allowed that core only, read back from the
    child itself; the parent's mask is what it was before."""
    from benchmarks import pinning

    before = os.sched_getaffinity(0)
    core = frozenset({max(before)})
    with pinning.pinned(core), NginxFarm(2, cores=core) as farm:
        assert pinning.affinity(farm.pid) == set(core)
    assert os.sched_getaffinity(0) == before
    result = run_ours(["http://127.0.0.1:9/metrics"], 1.0, 0.5, 0.5, cores=core)
    assert result["cores"] == sorted(core)


def test_choose_splits_farm_and_scraper_or_pins_nothing() -> None:
    from benchmarks import pinning

    pin = pinning.choose({0, 1, 5})
    assert pin is not None and (pin.farm, pin.scraper) == ({0}, {5})
    assert "core 0" in pin.text() and "core 5" in pin.text()
    assert pinning.choose({3}) is None


def test_rss_per_target_is_computed_the_same_way_for_both_sides() -> None:
    mib = 1 << 20
    res: dict[str, object] = {
        "targets": 100, "interval": 1.0, "series": 15, "machine": "test",
        "loadavg_start": "0", "payload_bytes": {"text": 1, "json": 1},
        # Prometheus: 60 MiB with no targets, 80 MiB with 100; ours: 40 -> 50 MiB.
        "prom_baseline": {"targets": 0, "cpu_seconds": 1.0, "scrapes": 0.0, "rss": 60 * mib},
        "prom_static": {"targets": 100, "cpu_seconds": 1.0, "scrapes": 10000.0,
                        "expected": 10000.0, "rss": 80 * mib, "up": 100.0},
        "ours_static": {"targets": 100, "cpu_seconds": 1.0, "scrapes": 10000.0,
                        "results": {"not_modified": 10000.0}, "writes": 0,
                        "rss_before": 40 * mib, "rss_after": 50 * mib, "skipped": 0.0,
                        "expected": 10000.0},
    }
    report = table(res)
    assert "| 819.2 KiB | 512.0 KiB | 0.62x |" in report  # total / N, both sides
    assert "| 204.8 KiB | 102.4 KiB | 0.50x |" in report  # growth / N, both sides


def test_rows_without_an_api_request_say_so() -> None:
    res: dict[str, object] = {"targets": 1, "interval": 1.0, "series": 15, "machine": "t",
                              "loadavg_start": "0", "payload_bytes": {"text": 1, "json": 1}}
    rows = [line for line in table(res).splitlines() if "changing payload" in line]
    offline = [row for row in rows if "write path left out" not in row]
    assert len(offline) == 2 and all("no API request sent" in row for row in offline)


def test_unready_names_the_exporters_that_do_not_answer() -> None:
    from benchmarks.farm import unready

    with NginxFarm(2) as farm:
        closed = "http://127.0.0.1:9/metrics"  # discard port: nothing listens here
        assert unready([*farm.urls(), closed], 1.0) == [closed]
        assert unready(farm.urls(), 1.0) == []
