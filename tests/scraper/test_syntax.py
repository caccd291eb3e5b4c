"""The one home of syntax rules (scraper.syntax), as properties over all inputs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scraper.config import ConfigError, load_settings
from scraper.syntax import (
    INTERVAL_MAX_SECONDS,
    INTERVAL_MIN_SECONDS,
    IntervalOutOfRange,
    parse_duration,
    parse_interval,
)

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(sorted(_UNITS))),
                min_size=1, max_size=4))
def test_unit_parts_add_up(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{unit}" for n, unit in parts)
    expected = sum(n * _UNITS[unit] for n, unit in parts)
    assert math.isclose(parse_duration(text), expected)


@given(st.floats(0, 1e9, allow_nan=False))
def test_plain_seconds_as_number_or_text(seconds: float) -> None:
    assert parse_duration(seconds) == seconds
    assert parse_duration(repr(seconds)) == seconds


@given(st.text(alphabet="xyz -+!(),", min_size=1))
def test_garbage_is_refused_naming_the_value(text: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_duration(text)
    assert "not a duration" in str(err.value) and repr(text) in str(err.value)


@given(st.floats(0, 10 * INTERVAL_MAX_SECONDS, allow_nan=False))
def test_interval_bounds(seconds: float) -> None:
    if INTERVAL_MIN_SECONDS <= seconds <= INTERVAL_MAX_SECONDS:
        assert parse_interval(f"{seconds}s") == pytest.approx(seconds)
    else:
        with pytest.raises(IntervalOutOfRange, match="must be between 1s and 1h"):
            parse_interval(seconds)


def test_negative_and_bool_refused() -> None:
    for value in ("-3s", -1, True):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(value)


@given(st.sampled_from(["interval", "progress_floor", "metrics_staleness"]),
       st.one_of(st.text(alphabet="xyz -+!(),", min_size=1),
                 st.sampled_from(["nan", "inf", "-1s", "-0.5", "-2m"])))
def test_a_bounded_duration_option_refused_names_option_value_and_limit(
        option: str, text: str) -> None:
    # A newcomer typed "abc" and "-1s" and was told neither what is accepted nor the range.
    with pytest.raises(ConfigError) as err:
        load_settings({option: text})
    (problem,) = err.value.problems
    # The limit in the same words as a well-formed value out of range gets.
    out_of_range = {"interval": "2h", "progress_floor": "2h", "metrics_staleness": "2h"}
    with pytest.raises(ConfigError) as far:
        load_settings({option: out_of_range[option]})
    limit = far.value.problems[0].split(": ", 1)[1]
    assert limit.startswith("must be between ")
    try:
        parse_duration(text)
        negative = False
    except ValueError as why:
        negative = "must be >= 0" in str(why)
    if negative:
        # A negative duration is out of range: one limit, the range (a newcomer got two).
        assert problem == f"{option.replace('_', '-')}={text!r}: {limit}"
    else:
        assert problem.startswith(f"{option.replace('_', '-')}={text!r}: not a duration")
        assert problem.endswith("; " + limit)


def test_a_negative_or_non_finite_duration_says_why() -> None:
    with pytest.raises(ValueError, match=r"must be >= 0"):
        parse_duration("-1s")
    for text in ("nan", "inf", "-inf"):
        with pytest.raises(ValueError, match=r"not a finite number"):
            parse_duration(text)
