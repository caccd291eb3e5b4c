"""The scheduler of the test suite's pytest-xdist workers (:mod:`tests.helpers.xdist_groups`).

In process: the workers are stand-ins with the three members the scheduler uses
(``send_runtest_some``, ``shutdown``, ``shutting_down``), since a real pytest-xdist
worker cannot be driven test by test from here.  That the groups reach real workers is
seen in every ``make test`` (each cluster's start appears once in the durations).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.xdist_groups import REFILL_AT, GroupScheduling


class Worker:
    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def _run(tmp_path: Path, ids: list[str],
         groups: dict[str, str], workers: int) -> list[Worker]:
    """Schedule ``ids`` on ``workers`` stand-ins, completing tests until all ran."""
    (tmp_path / "groups.json").write_text(json.dumps(groups))
    sched = GroupScheduling(workers, tmp_path / "groups.json")
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, ids)
    sched.schedule()
    for turn in range(10 * len(ids)):  # bounded: each pass completes one test somewhere
        busy = [n for n in nodes if sched.pending[n]]
        if not busy:
            break
        node = busy[turn % len(busy)]  # the workers take turns finishing a test
        sched.mark_test_complete(node, sched.pending[node][0])
    assert sched.tests_finished and not sched.has_pending
    assert all(n.shutting_down for n in nodes)
    return nodes


def test_each_group_runs_whole_in_one_worker_and_every_test_once(tmp_path: Path) -> None:
    ids = [f"t{i}" for i in range(40)]
    groups = {**{f"t{i}": "kube_stack" for i in range(0, 40, 3)},
              **{f"t{i}": "captures" for i in (1, 5, 7)}}
    nodes = _run(tmp_path, ids, groups, workers=2)
    ran = sorted(i for n in nodes for i in n.sent)
    assert ran == list(range(40))  # every test once
    for group in ("kube_stack", "captures"):
        members = {ids.index(k) for k, g in groups.items() if g == group}
        holders = [n.name for n in nodes if members & set(n.sent)]
        assert len(holders) == 1, (group, holders)
    # The rest spread over both workers.
    assert all(len(n.sent) > 3 for n in nodes)


def test_a_crashed_worker_names_its_test_and_gives_the_rest_back(tmp_path: Path) -> None:
    ids = [f"t{i}" for i in range(6)]
    (tmp_path / "groups.json").write_text(json.dumps({i: "g" for i in ids[:4]}))
    sched = GroupScheduling(2, tmp_path / "groups.json")
    a, b = Worker("gw0"), Worker("gw1")
    for node in (a, b):
        sched.add_node(node)
        sched.add_node_collection(node, ids)
    sched.schedule()
    assert a.sent == [0, 1, 2, 3]  # the group, whole
    assert b.sent == list(range(4, 4 + REFILL_AT))
    assert sched.remove_node(a) == "t0"  # crashed while running its first test
    sched.mark_test_complete(b, 4)
    assert set(b.sent) >= {1, 2, 3}  # the crashed worker's other tests, given back
