"""The write-order simulation runs the real queue and reports what the order does: every
wait stays within round robin's turn plus the lead, and weighting by how far behind a
TrainJob is lowers the largest error where trainings move at different paces.

Nothing is mocked: :mod:`benchmarks.write_order_sim` drives the real
:class:`scraper.write.queue.WriteQueue` on a simulated clock (the subject is the order,
not time)."""

from __future__ import annotations

import pytest

from benchmarks.write_order_sim import main, periods, simulate
from scraper.write.queue import MAX_LEAD_SECONDS, POINT_SECONDS

JOBS, RATE, SECONDS = 60, 2.0, 400


def test_round_robin_waits_one_turn_and_the_weighted_order_at_most_the_lead_more() -> None:
    every = periods("mixed", JOBS, 0)
    plain = simulate(JOBS, RATE, SECONDS, every, 0.0, 0.0, 0)
    weighted = simulate(JOBS, RATE, SECONDS, every, POINT_SECONDS, MAX_LEAD_SECONDS, 0)
    turn = JOBS / RATE
    assert plain["longest_wait_s"] <= turn + 1
    assert weighted["longest_wait_s"] <= turn + MAX_LEAD_SECONDS + 1
    assert weighted["percent_error_max"] < plain["percent_error_max"]
    assert weighted["percent_error_p99"] <= plain["percent_error_p99"]


def test_at_one_pace_the_weighted_order_is_no_worse() -> None:
    every = periods("uniform", JOBS, 0)
    plain = simulate(JOBS, RATE, SECONDS, every, 0.0, 0.0, 0)
    weighted = simulate(JOBS, RATE, SECONDS, every, POINT_SECONDS, MAX_LEAD_SECONDS, 0)
    assert weighted["percent_error_max"] <= plain["percent_error_max"]
    assert weighted["longest_wait_s"] <= plain["longest_wait_s"] + 1


@pytest.mark.parametrize(("argv", "said"), [
    (["--jobs", "0"], "--jobs=0: must be at least 1 and finite"),
    (["--rate", "0"], "--rate=0.0: must be at least 0.001 and finite"),
    (["--rate", "nan"], "--rate=nan: must be at least 0.001 and finite"),
    (["--rate", "inf"], "--rate=inf: must be at least 0.001 and finite"),
    (["--seconds", "-1"], "--seconds=-1: must be at least 1 and finite"),
    (["--seeds", "0"], "--seeds=0: must be at least 1 and finite")])
def test_a_bad_setting_is_one_error_naming_flag_value_and_limit(
        argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err


def test_a_run_no_longer_than_one_turn_prints_n_a_not_a_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:
    main(["--jobs", "10", "--rate", "100", "--seconds", "2", "--seeds", "2"])
    assert "n/a" in capsys.readouterr().out
