"""The adaptive-rate figures of benchmarks/write_pressure.py: the percent error and
writes/s are computed from the watch's records as their definitions say."""

from __future__ import annotations

import re

import pytest

from benchmarks.write_pressure import (
    freshness,
    percent_errors,
    phase,
    stamp,
    writes_per_second,
)


def test_stamp_counts_changes_of_the_port_at_its_phase() -> None:
    port, period = 10001, 15.0
    at = 100_000 * period - phase(port, period)  # a change of this port
    assert stamp(port, period, at) == stamp(port, period, at - 0.001) + 1
    assert stamp(port, period, at + period - 0.001) == stamp(port, period, at)


def test_percent_error_is_reported_minus_shown_each_second() -> None:
    port, period = 10001, 10.0
    start = 1_000_000.0 - phase(port, period)  # the exporter changes at start + 10 k
    first = stamp(port, period, start)
    # Shown at once, then the change at start + 10 is shown 3 s late.
    seen = [("job-0", float(first), start), ("job-0", float(first + 1), start + 13.0)]
    errors = percent_errors(seen, {"job-0": port}, period, start, start + 20)
    assert len(errors) == 20
    assert errors[:10] == [0] * 10
    assert errors[10:13] == [1, 1, 1]  # reported one change ahead for 3 samples
    assert errors[13:] == [0] * 7


def test_a_trainjob_never_shown_is_not_sampled() -> None:
    assert percent_errors([], {"job-0": 10001}, 10.0, 0.0, 30.0) == []


def test_writes_per_second_counts_each_second() -> None:
    seen = [("a", 0, 100.2), ("b", 0, 100.9), ("a", 1, 101.5), ("a", 2, 99.0)]
    assert writes_per_second(seen, 100.0, 103.0) == [2, 1, 0]


def test_the_static_status_before_the_changes_is_not_an_error_of_every_change_since_1970(
        ) -> None:
    port, period = 10001, 10.0
    start = 1_000_000.0 - phase(port, period)
    first = stamp(port, period, start)
    # The static status (stamp 0) was shown first; the changing one 5 s into the window.
    seen = [("job-0", 0.0, start - 30.0), ("job-0", float(first), start + 5.0)]
    errors = percent_errors(seen, {"job-0": port}, period, start, start + 10)
    assert errors == [0] * 5  # sampled from the first changing status on


def test_freshness_is_from_the_exporters_change_to_its_first_showing() -> None:
    port, period = 10001, 10.0
    start = 1_000_000.0 - phase(port, period)  # the exporter changes at start + 10 k
    first = stamp(port, period, start)
    # The change at start + 10 shown 0.5 s after it and written again later (no second
    # showing); the one at start + 20 never shown (the one at start + 30 superseded it,
    # shown 2 s late); the static status is no change; job-1 is not in port_of.
    seen = [("job-0", 0.0, start + 1.0), ("job-0", float(first + 1), start + 10.5),
            ("job-0", float(first + 1), start + 18.0),
            ("job-0", float(first + 3), start + 32.0), ("job-1", 5.0, start + 3.0)]
    ages, made = freshness(seen, {"job-0": port}, period, start, start + 35)
    assert [round(a, 6) for a in ages] == [0.5, 2.0]
    assert made == 3  # the changes at start + 10, 20 and 30


def test_a_change_made_before_the_window_is_not_one_of_its_changes() -> None:
    port, period = 10001, 10.0
    start = 1_000_000.0 - phase(port, period)
    first = stamp(port, period, start)
    # The change at start (the window's first instant) is shown inside the window.
    seen = [("job-0", float(first), start + 4.0)]
    assert freshness(seen, {"job-0": port}, period, start, start + 5) == ([], 0)


def test_write_budget_names_the_start_rate_and_the_ceiling() -> None:
    from benchmarks.cluster_scale import DEFAULT_QPS, write_budget

    assert write_budget("adaptive") == (DEFAULT_QPS, 200.0)
    assert write_budget("fixed") == (DEFAULT_QPS, DEFAULT_QPS)
    assert write_budget("fixed-42.5") == (42.5, 42.5)


@pytest.mark.parametrize("value", ["fixed-0", "fixed--3", "fixed-x", "fixed-inf", "fixed-nan",
                                   "fixed-1E2", "fixed-+5", "fixed-5_0", "adaptive-40", "fast"])
def test_a_write_rate_that_is_not_one_is_refused_by_name(value: str) -> None:
    from benchmarks.cluster_scale import write_budget

    with pytest.raises(ValueError, match=re.escape(repr(value))):
        write_budget(value)
