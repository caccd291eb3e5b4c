"""The preemption simulation's model of Kueue's victim choice (benchmarks/preemption.py),
on small cases worked by hand from Kueue v0.17.0's ``CandidatesOrdering`` and
``fillBackWorkloads``."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.preemption import (
    CAPACITY,
    HIGH_PRIORITY,
    LOW_PRIORITY,
    SHAPES,
    Job,
    OptimumSim,
    Sim,
    main,
    run,
)


def _sim(running: list[Job]) -> Sim:
    sim = Sim(low=[], arrivals=[], boost_of=lambda work: 0)
    sim.running = running
    return sim


def test_lowest_effective_priority_then_most_recently_admitted_goes_first() -> None:
    old = Job(uid=1, accelerators=32, priority=LOW_PRIORITY, created=0, admitted=0.0, runs=1)
    new = Job(uid=2, accelerators=32, priority=LOW_PRIORITY, created=1, admitted=100.0, runs=1)
    sim = _sim([old, new])
    sim.preempt_for(Job(uid=3, accelerators=8, priority=HIGH_PRIORITY, created=200), 200.0)
    assert sim.running == [old]  # equal priority: the most recently admitted
    old.boost, new.boost = 0, 3
    sim = _sim([old, new])
    new.admitted = 100.0
    sim.preempt_for(Job(uid=4, accelerators=8, priority=HIGH_PRIORITY, created=200), 200.0)
    assert sim.running == [new]  # the boost outranks the admission order


def test_fill_back_returns_victims_not_needed() -> None:
    small = Job(uid=1, accelerators=4, priority=LOW_PRIORITY, created=0, admitted=50.0, runs=1)
    big = Job(uid=2, accelerators=CAPACITY - 4, priority=LOW_PRIORITY, created=1,
              admitted=10.0, runs=1)
    sim = _sim([small, big])
    # small goes first (admitted last) but frees too little; big alone is enough: small
    # is given back.
    sim.preempt_for(Job(uid=3, accelerators=16, priority=HIGH_PRIORITY, created=60), 60.0)
    assert sim.running == [small] and sim.preemptions == 1


def test_the_optimum_takes_the_cheapest_set_that_frees_room() -> None:
    # The 4-accelerator job saved 3500 s ago (14,000 acc-s at risk); the two
    # 2-accelerator jobs started 100 s ago and saved nothing (200 acc-s each): the optimum
    # gives up the two.
    old = Job(uid=1, accelerators=4, priority=LOW_PRIORITY, created=0, period=1e9,
              phase=100.0, admitted=0.0, runs=1)
    fresh = [Job(uid=2 + i, accelerators=2, priority=LOW_PRIORITY, created=1, period=1e9,
                 phase=1e9, admitted=3500.0, runs=1) for i in range(2)]
    filler = Job(uid=9, accelerators=CAPACITY - 8, priority=HIGH_PRIORITY, created=0,
                 admitted=0.0, runs=1)
    sim = OptimumSim(low=[], arrivals=[], boost_of=lambda work: 0)
    sim.running = [old, *fresh, filler]
    sim.preempt_for(Job(uid=10, accelerators=4, priority=HIGH_PRIORITY, created=3600),
                    3600.0)
    assert sim.running == [old, filler] and sim.preemptions == 2
    assert sum(j.lost for j in fresh) == 2 * 2 * 100.0


def test_report_fields_and_the_rule_near_the_per_preemption_optimum() -> None:
    res = run(5, 10, SHAPES[::2])  # two shapes: the smallest run that has both kinds
    assert len(res["per_seed"]) == 5
    assert [sh["shape"] for sh in res["shapes"]] == [SHAPES[0].name, SHAPES[2].name]
    for row in res["per_seed"]:
        assert row["without_boost"]["arrivals"] == row["with_boost"]["arrivals"]
        assert row["without_boost"]["accelerator_seconds_lost"] > 0
    assert 0 <= res["work_lost_reduction_median"] <= 1
    # Not a bound over a run (module doc), but the rule never ends far above it.
    for shape in res["shapes"]:
        assert shape["optimum_reduction_median"] >= shape["work_lost_reduction_median"] - 0.05


def test_among_sets_that_lose_as_little_the_optimum_takes_the_fewest_accelerators() -> None:
    # Nothing at risk anywhere (no run has started its clock): {2, 3} and {4} both free
    # the 4 needed at no loss; the optimum takes the 4 alone.
    jobs = [Job(uid=i, accelerators=a, priority=LOW_PRIORITY, created=0, period=1e9,
                phase=0.0, admitted=100.0, runs=1) for i, a in enumerate((2, 3, 4))]
    filler = Job(uid=9, accelerators=CAPACITY - 9, priority=HIGH_PRIORITY, created=0,
                 admitted=0.0, runs=1)
    sim = OptimumSim(low=[], arrivals=[], boost_of=lambda work: 0)
    sim.running = [*jobs, filler]
    sim.preempt_for(Job(uid=10, accelerators=4, priority=HIGH_PRIORITY, created=100),
                    100.0)
    assert sim.running == [jobs[0], jobs[1], filler]


def test_an_out_that_is_a_file_is_one_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["--seeds", "5", "--out", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert f"--out={blocker}: the report cannot be written there" in err
    assert "Traceback" not in err
