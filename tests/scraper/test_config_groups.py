"""The settings grouped by the part that uses them (scraper/config_groups.py): every
flag and variable keeps its name, and each group carries the values given."""

from __future__ import annotations

import pytest

from scraper.config import load_settings
from scraper.shared.policy import WritePolicy


def test_each_group_carries_the_flags_given() -> None:
    s = load_settings({
        "namespaces": "b,a", "selector": "app=x", "default_port": 9000,
        "default_path": "/p", "interval": "15s", "resync_interval": "1m",
        "scrape_timeout": "3s", "max_body_bytes": 4096, "concurrency": 7,
        "backoff_max": "1m", "wait_scrapes": False,
        "write_qps": 7, "write_burst": 9, "status_target": "auto",
        "progress_floor": "2s", "metrics_staleness": "10s", "other_writer_grace": "5s",
        "stall_after": "10m", "stall_annotate": False,
        "log_source": True, "log_qps": 3, "log_burst": 4, "log_limit_bytes": 20000,
        "log_tail_lines": 50,
        "leader_election": True, "lease_name": "l", "lease_namespace": "ns",
        "lease_duration": "20s", "renew_deadline": "15s", "retry_period": "3s",
        "identity": "me",
        "listen_host": "127.0.0.1", "listen_port": 0, "metrics_auth": False,
        "metrics_auth_cache_ttl": "30s", "metrics_auth_cache_size": 8,
    })
    d = s.discovery
    assert (d.namespaces, d.selector, d.default_port, d.default_path, d.default_interval,
            d.resync_interval) == (("a", "b"), "app=x", 9000, "/p", 15.0, 60.0)
    sc = s.scrape
    assert (sc.timeout, sc.max_body_bytes, sc.concurrency, sc.backoff_max,
            sc.wait_scrapes) == (3.0, 4096, 7, 60.0, False)
    w = s.write
    assert (w.qps, w.burst, w.status_target) == (7.0, 9, "auto")
    assert w.policy == WritePolicy(2.0, 10.0, 5.0) == s.write_policy()
    assert (s.stall.after, s.stall.annotate) == (600.0, False)
    lg = s.logs
    assert (lg.enabled, lg.qps, lg.burst, lg.limit_bytes, lg.tail_lines) == (
        True, 3.0, 4, 20000, 50)
    le = s.lease
    assert (le.enabled, le.name, le.namespace, le.duration, le.renew_deadline,
            le.retry_period, le.identity) == (True, "l", "ns", 20.0, 15.0, 3.0, "me")
    t = s.telemetry
    assert (t.listen_host, t.listen_port, t.metrics_auth, t.metrics_auth_cache_ttl,
            t.metrics_auth_cache_size) == ("127.0.0.1", 0, False, 30.0, 8)


def test_the_environment_keeps_its_variable_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINJOB_SCRAPER_WRITE_QPS", "5")
    monkeypatch.setenv("TRAINJOB_SCRAPER_METRICS_STALENESS", "45s")
    monkeypatch.setenv("TRAINJOB_SCRAPER_STALL_AFTER", "auto")
    s = load_settings({})
    assert s.write.qps == 5.0 and s.write.policy.metrics_staleness == 45.0
    assert s.stall.after is None


def test_a_group_is_frozen() -> None:
    s = load_settings({})
    with pytest.raises(ValueError, match="frozen"):
        s.write.qps = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("key", ["priority-boost-max", "write-qps-max", "write-burst"])
def test_a_config_files_true_is_no_number(tmp_path: object, key: str) -> None:
    # YAML's true would have counted as 1: the boost, off by default, turned on by `true`.
    from pathlib import Path

    from scraper.config import ConfigError

    path = Path(str(tmp_path)) / "config.yaml"
    path.write_text(f"{key}: true\n")
    with pytest.raises(ConfigError, match=f"{key}=True: a number, not true or false"):
        load_settings({}, path)


def test_the_write_ceiling_and_the_boost_range_are_grouped() -> None:
    s = load_settings({"write_qps": 30, "write_qps_max": 120, "priority_boost_max": 4})
    assert s.write.qps == 30 and s.write.qps_max == 120
    assert s.boost.max_boost == 4
    fixed = load_settings({"write_qps": 300})  # above the default ceiling: a fixed rate
    assert fixed.write.qps_max == 300
