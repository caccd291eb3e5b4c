"""Chart rules the JSON schema cannot express, checked by the real helm (issue: ``0s``
passed ``helm install`` and the scraper crash-looped).

``templates/_helpers.tpl`` (``trainjob-scraper.validate``) refuses what the scraper
refuses at start (scraper/config.py): ``config.interval`` outside 1s..1h, lease timings
not ordered ``retryPeriod < renewDeadline < leaseDuration``; every value it accepts is
one the scraper starts with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from scraper.config import load_settings
from scraper.syntax import parse_duration, parse_interval
from tests.helpers.chart import FULLNAME, Helm

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"config": {"interval": "0s"}},
                     ["config.interval=0s", "between 1s and 1h"], id="interval-zero"),
        pytest.param({"config": {"interval": "1h0m1s"}},
                     ["config.interval=1h0m1s", "between 1s and 1h"], id="interval-over-1h"),
        pytest.param({"config": {"interval": 0.5}},
                     ["config.interval=0.5", "between 1s and 1h"], id="interval-number"),
        pytest.param({"config": {"interval": "999ms"}},
                     ["config.interval=999ms", "between 1s and 1h"], id="interval-ms"),
        pytest.param({"leaderElection": {"retryPeriod": "0s"}},
                     ["leaderElection.retryPeriod=0s", "> 0"], id="retry-zero"),
        pytest.param({"leaderElection": {"retryPeriod": "10s"}},
                     ["retryPeriod < renewDeadline < leaseDuration", "retryPeriod=10s"],
                     id="retry-not-below-renew"),
        pytest.param({"config": {"scrapeTimeout": "0s"}}, ["config.scrapeTimeout=0s",
                                                           "must be > 0"], id="scrape-timeout-0"),
        pytest.param({"metrics": {"auth": {"cacheTTL": "0s"}}},
                     ["metrics.auth.cacheTTL=0s", "must be > 0"], id="auth-cache-ttl-0"),
        pytest.param({"replicaCount": 3, "leaderElection": {"enabled": False}},
                     ["replicaCount=3 with leaderElection.enabled=false",
                      "set leaderElection.enabled=true"], id="replicas-need-leader-election"),
        pytest.param({"leaderElection": {"renewDeadline": "1m"}},
                     ["renewDeadline=1m", "leaseDuration=15s"], id="renew-not-below-lease"),
        # The write policy and the stall threshold: a newcomer's values that rendered
        # and then crash-looped the scraper.
        pytest.param({"config": {"progressFloor": "50ms"}},
                     ["config.progressFloor=50ms", "between 0.1s and 60s"], id="floor-low"),
        pytest.param({"config": {"progressFloor": "61s"}},
                     ["config.progressFloor=61s", "between 0.1s and 60s"], id="floor-high"),
        pytest.param({"config": {"metricsStaleness": "2h"}},
                     ["config.metricsStaleness=2h", "between 0s and 3600s"], id="staleness"),
        pytest.param({"config": {"stall": {"after": "2s"}}},
                     ["config.stall.after=2s", "between 5s and 720h"], id="stall-low"),
        pytest.param({"config": {"stall": {"after": "721h"}}},
                     ["config.stall.after=721h", "between 5s and 720h"], id="stall-high"),
    ],
)
def test_values_the_scraper_would_refuse_fail_the_install(
    helm: Helm, values: dict[str, Any], expected: list[str]
) -> None:
    result = helm.template_result(values)
    assert not result.ok, f"helm accepted {values}"
    for word in expected:
        assert word in result.stderr, f"{word!r} not in:\n{result.stderr}"


def _settings(helm: Helm, values: dict[str, Any], tmp_path: Path) -> Any:
    config_map = helm.template(values).one("ConfigMap", FULLNAME)
    path = tmp_path / "config.yaml"
    path.write_text(config_map["data"]["config.yaml"])
    return load_settings(config_file=path)


@pytest.mark.parametrize(("interval", "seconds"),
                         [("1s", 1.0), ("1h", 3600.0), ("1m30s", 90.0), ("1500ms", 1.5),
                          ("0.5m", 30.0), (7, 7.0), ("42", 42.0)])
def test_limits_and_forms_the_scraper_accepts_render(
    helm: Helm, tmp_path: Path, interval: object, seconds: float
) -> None:
    values = {"config": {"interval": interval},
              "leaderElection": {"retryPeriod": "500ms", "renewDeadline": "1s",
                                 "leaseDuration": "1.5s"}}
    settings_ = _settings(helm, values, tmp_path)
    assert settings_.interval == seconds
    assert (settings_.retry_period, settings_.renew_deadline,
            settings_.lease_duration) == (0.5, 1.0, 1.5)


def test_lease_order_is_not_checked_without_leader_election(helm: Helm) -> None:
    helm.template({"replicaCount": 1,
                   "leaderElection": {"enabled": False, "retryPeriod": "1m"}})


_PART = st.tuples(st.integers(0, 90), st.sampled_from(["ms", "s", "m", "h"]))


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(_PART, min_size=1, max_size=3))
def test_helm_and_the_scraper_agree_on_every_interval(
    helm: Helm, tmp_path: Path, parts: list[tuple[int, str]]
) -> None:
    text = "".join(f"{n}{unit}" for n, unit in parts)
    try:
        expected: float | None = parse_interval(text)
    except ValueError:
        expected = None
    result = helm.template_result({"config": {"interval": text}})
    if expected is None:
        assert not result.ok and "between 1s and 1h" in result.stderr, (text, result.stderr)
        return
    assert result.ok, (text, result.stderr)
    try:
        assert _settings(helm, {"config": {"interval": text}}, tmp_path).interval == \
            pytest.approx(expected)
    except ValidationError as exc:  # pragma: no cover - a disagreement is the failure
        pytest.fail(f"helm rendered interval {text!r} the scraper refuses: {exc}")


@pytest.mark.parametrize(("floor", "staleness", "after"),
                         [("100ms", "0s", "0"), ("60s", "1h", "5s"), ("1s", "30s", "720h"),
                          ("1s", "30s", "auto")])
def test_write_policy_and_stall_limits_render_and_the_scraper_takes_them(
    helm: Helm, tmp_path: Path, floor: str, staleness: str, after: str
) -> None:
    settings_ = _settings(helm, {"config": {"progressFloor": floor, "metricsStaleness": staleness,
                                            "stall": {"after": after}}}, tmp_path)
    assert settings_.progress_floor == parse_duration(floor)
    assert settings_.metrics_staleness == parse_duration(staleness)
