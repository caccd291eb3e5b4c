"""Smoke tests of the benchmark machinery (not timed tests): the nginx farm speaks the
exporter's wire contract, and the bypassed scraper harness reports scrapes and CPU."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from benchmarks import breakdown
from benchmarks.__main__ import problems, run_ours, table
from benchmarks.farm import NginxFarm
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
    with NginxFarm(3) as farm:
        result = run_ours(farm.urls(), 1.0, 2.0, 4.0)  # about 12 scrapes: margin under load
    assert result["targets"] == 3
    assert result["results"].get("not_modified", 0) >= 3  # 304s after the first scrape
    assert result["cpu_seconds"] > 0


def test_procstat_reads_this_process() -> None:
    assert cpu_seconds() > 0
    assert rss_bytes() > 1 << 20


def test_a_run_with_targets_down_or_failed_scrapes_gets_no_ratio() -> None:
    def prom(up: float) -> dict[str, float]:
        return {"targets": 10, "cpu_seconds": 0.01, "scrapes": 100.0, "rss": 1 << 20, "up": up}

    def ours(results: dict[str, float]) -> dict[str, object]:
        return {"targets": 10, "cpu_seconds": 0.02, "scrapes": sum(results.values()),
                "results": results, "writes": 0, "rss_before": 0, "rss_after": 1 << 20}

    res: dict[str, object] = {
        "targets": 10, "interval": 1.0, "series": 15, "machine": "test",
        "loadavg_start": "0", "payload_bytes": {"text": 1, "json": 1},
        "prom_static": prom(10), "ours_static": ours({"not_modified": 100.0}),
        "prom_changing": prom(3), "ours_changing": ours({"ok": 90.0, "timeout": 10.0}),
    }
    assert problems(res) == [
        "Prometheus, changing: only 3 of 10 targets up",
        "ours, changing: 10 of 100 scrapes failed ({'ok': 90.0, 'timeout': 10.0})",
    ]
    report = table(res)
    assert "| 100 us | 200 us | 2.00x | <= 0.5x | NOT met |" in report  # unchanged: valid
    assert "| 100 us | 200 us | n/a | <= 1.0x | n/a |" in report  # changing: no verdict
    assert "**Not a valid comparison**" in report


def test_breakdown_measures_each_piece() -> None:
    lines = breakdown.measure(40, window=1.0)
    assert [line.split(",")[0].split(" ")[0] for line in lines] == \
        ["asyncio", "APScheduler", "aiohttp", "asyncio.to_thread(no-op)"]
    for line in lines:
        value = float(line.rsplit(": ", 1)[1].removesuffix(" us"))
        assert 0 < value < 1e6, line  # a real CPU cost per operation, in microseconds
