"""The churn benchmark's own rules (not timed): its plateau verdict, its pod IPs, and its
probe's report on this process."""

from __future__ import annotations

import ipaddress
import itertools

from benchmarks.churn import plateau
from benchmarks.churn_api import pod_ips
from benchmarks.churn_probe import report


def test_plateau_judges_the_second_half_of_the_series() -> None:
    # The report's shape: +13..18 MiB per round never settles.
    assert not plateau([122, 140, 153, 167, 180, 195], 4.0)["plateau"]
    # Growth early, then flat within the bound: a plateau.
    verdict = plateau([137, 149, 156, 162, 164, 171, 171.5, 171.5, 171.8, 171.8, 171.8], 4.0)
    assert verdict["plateau"] and verdict["last_half_spread_mib"] == 0.8
    assert not plateau([100, 100, 100, 105], 4.0)["plateau"]


def test_pod_ips_are_distinct_loopback_host_addresses() -> None:
    ips = list(itertools.islice(pod_ips(), 70_000))
    assert len(set(ips)) == len(ips)
    for text in ips[:: 997] + ips[-3:]:
        ip = ipaddress.ip_address(text)
        assert ip.is_loopback and text.split(".")[-1] not in ("0", "255")


def test_probe_reports_this_processes_memory() -> None:
    out = report()
    assert out["rss_kib"] > 1024
    assert out["smaps_rollup_kib"]["Anonymous"] > 0
    assert out["pymalloc"]["arenas_current"] >= 1
    assert out["pymalloc"]["total_bytes"] >= out["pymalloc"]["allocated_bytes"] > 0
    assert out["gc_objects"] >= sum(out["by_type"].values()) > 0  # by_type: the top 25
