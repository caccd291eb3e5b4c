"""Smoke tests of the benchmark machinery (not timed tests): the nginx farm speaks the
exporter's wire contract, and the bypassed scraper harness reports scrapes and CPU."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from benchmarks.__main__ import run_ours
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
