"""The work-at-risk rule and its boost (scraper/boost/rule.py): bounded, monotonic, 0 off."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from scraper.boost.rule import (
    MAX_BOOST_LIMIT,
    UNIT_RESOURCE_SECONDS,
    BoostRangeError,
    Resources,
    boost_for,
    check_range,
    is_accelerator,
    resources_of,
    work_at_risk,
)

works = st.floats(allow_nan=True, allow_infinity=True)
ranges = st.integers(min_value=0, max_value=MAX_BOOST_LIMIT)


@given(works, ranges)
def test_boost_is_bounded(work: float, max_boost: int) -> None:
    assert 0 <= boost_for(work, max_boost) <= max_boost


@given(st.floats(min_value=0, allow_infinity=True), st.floats(min_value=0, allow_infinity=True),
       ranges)
def test_boost_is_monotonic_in_work(a: float, b: float, max_boost: int) -> None:
    low, high = sorted((a, b))
    assert boost_for(low, max_boost) <= boost_for(high, max_boost)


@given(ranges, ranges, st.floats(min_value=0, allow_infinity=True))
def test_boost_is_monotonic_in_the_range(a: int, b: int, work: float) -> None:
    low, high = sorted((a, b))
    assert boost_for(work, low) <= boost_for(work, high)


@given(works)
def test_zero_range_disables(work: float) -> None:
    assert boost_for(work, 0) == 0


@given(ranges)
def test_no_work_no_boost(max_boost: int) -> None:
    assert boost_for(0.0, max_boost) == 0
    assert boost_for(-5.0, max_boost) == 0
    assert boost_for(math.nan, max_boost) == 0


def test_one_step_per_doubling() -> None:
    unit = UNIT_RESOURCE_SECONDS
    assert [boost_for(unit * m, 100) for m in (0.5, 1, 2, 3, 7, 15, 1023)] == [
        0, 1, 1, 2, 3, 4, 10]
    assert boost_for(math.inf, 7) == 7
    # 20 minutes of 8 accelerators against a fresh checkpoint: far apart.
    assert boost_for(20 * 60 * 8, 100) == 7 and boost_for(30 * 8, 100) == 2


@given(st.floats(min_value=0, max_value=1e9), st.floats(min_value=0, max_value=1e6),
       st.floats(min_value=0, max_value=1e9), st.floats(min_value=0, max_value=1e9))
@example(started=0.0, units=42800.0, checkpoint=2.0**28, elapsed=0.0005)
def test_work_at_risk_counts_from_the_checkpoint_else_the_admission(
        started: float, units: float, checkpoint: float, elapsed: float) -> None:
    resources = Resources(accelerators=units, cpus=0.0)
    now = checkpoint + elapsed
    work = work_at_risk(now, started=started, checkpoint=checkpoint, resources=resources)
    assert work >= 0
    # now - checkpoint is exact only to the absolute times' float spacing (math.ulp of
    # now): the slack is that spacing times the resources, and 1e-3 below it.
    slack = max(1e-3, 2 * math.ulp(now) * resources.units)
    assert math.isclose(work, elapsed * resources.units, rel_tol=1e-6, abs_tol=slack)
    fresh = work_at_risk(started + elapsed, started=started, checkpoint=None,
                         resources=resources)
    slack = max(1e-3, 2 * math.ulp(started + elapsed) * resources.units)
    assert math.isclose(fresh, elapsed * resources.units, rel_tol=1e-6, abs_tol=slack)
    # A later checkpoint never raises the work at risk.
    later = work_at_risk(now, started=started, checkpoint=checkpoint + 1, resources=resources)
    assert later <= work + 1e-6
    assert work_at_risk(started - 1, started=started, checkpoint=None,
                        resources=resources) == 0.0


def test_resources_count_accelerators_else_cpus() -> None:
    gpus = resources_of({"cpu": 16, "memory": 2**36, "nvidia.com/gpu": 8})
    assert (gpus.units, gpus.unit_name) == (8, "accelerator")
    cpus = resources_of({"cpu": 2.5, "memory": 2**30, "example.kubernetes.io/x": 3})
    assert (cpus.units, cpus.unit_name) == (2.5, "cpu")
    assert is_accelerator("google.com/tpu") and is_accelerator("amd.com/gpu")
    assert not is_accelerator("cpu") and not is_accelerator("hugepages-2Mi")
    assert not is_accelerator("kubernetes.io/batch-cpu")


@pytest.mark.parametrize("bad", [-1, MAX_BOOST_LIMIT + 1, 1.5, True, "3"])
def test_bad_range_names_flag_value_and_limit(bad: object) -> None:
    with pytest.raises(BoostRangeError) as caught:
        check_range(bad)  # type: ignore[arg-type]
    text = str(caught.value)
    assert "--priority-boost-max" in text and repr(bad) in text and str(MAX_BOOST_LIMIT) in text
    assert check_range(0) == 0 and check_range(MAX_BOOST_LIMIT) == MAX_BOOST_LIMIT
