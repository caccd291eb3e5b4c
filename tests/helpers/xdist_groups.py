"""Run each group of tests in one pytest-xdist worker: each local cluster starts once.

tests/conftest.py names each test's group (the cluster fixture it uses; ``None``: no
group).  pytest-xdist's own ``--dist loadgroup`` reads ``xdist_group`` marks by renaming
each item's node ID, which pytest 9.2 no longer lets it do (the ID is kept elsewhere;
the groups were silently ignored and every worker started every cluster it needed).
This plugin uses only pytest-xdist's documented extension points instead:

* each worker writes the groups of its collection (node ID -> group) to a file the
  controller names in ``workerinput`` (``pytest_configure_node``);
* the controller's scheduler (``pytest_xdist_make_scheduler``) reads that file once
  every worker has collected, and hands out work units: each group whole (largest
  first), then the other tests one by one, to whichever worker has run out of work.

A worker that crashes gives its unfinished tests back as one unit.
"""

from __future__ import annotations

import collections
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from xdist.workermanage import parse_tx_spec_config

#: The ``workerinput`` key of the groups file.
GROUPS_KEY = "trainjob_progress_groups"
#: A worker is sent more work when it has at most this many tests left: it needs the
#: next test to run the current one (the teardown of its fixtures depends on it).
REFILL_AT = 2


def write_groups(config: pytest.Config, groups: dict[str, str]) -> None:
    """In a worker: write ``groups`` (node ID -> group) where the controller reads it."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is None or GROUPS_KEY not in workerinput:
        return
    path = Path(workerinput[GROUPS_KEY])
    tmp = path.with_name(f"{path.name}.{workerinput.get('workerid', os.getpid())}.tmp")
    tmp.write_text(json.dumps(groups))
    tmp.replace(path)  # every worker collects the same: the last one wins, whole


class GroupScheduling:
    """A pytest-xdist scheduler (its ``Scheduling`` protocol) that keeps groups whole."""

    def __init__(self, numnodes: int, groups_file: Path) -> None:
        self.numnodes = numnodes
        self.groups_file = groups_file
        self.collection: list[str] | None = None
        self.collections: dict[Any, list[str]] = {}
        self.pending: dict[Any, list[int]] = {}
        self.units: collections.deque[list[int]] = collections.deque()

    @property
    def nodes(self) -> list[Any]:
        return list(self.pending)

    @property
    def collection_is_completed(self) -> bool:
        return len(self.collections) >= self.numnodes

    @property
    def tests_finished(self) -> bool:
        return (self.collection_is_completed and not self.units
                and all(len(p) < REFILL_AT for p in self.pending.values()))

    @property
    def has_pending(self) -> bool:
        return bool(self.units) or any(self.pending.values())

    def add_node(self, node: Any) -> None:
        self.pending[node] = []

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        self.collections[node] = list(collection)

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        self.pending[node].remove(item_index)
        self._refill(node)

    def mark_test_pending(self, item: str) -> None:
        assert self.collection is not None
        self.units.append([self.collection.index(item)])
        for node in self.pending:
            self._refill(node)

    def remove_pending_tests_from_node(self, node: Any, indices: Sequence[int]) -> None:
        for index in indices:
            self.pending[node].remove(index)

    def remove_node(self, node: Any) -> str | None:
        left = self.pending.pop(node)
        if not left:
            return None
        assert self.collection is not None
        crashed, rest = left[0], left[1:]
        if rest:
            self.units.appendleft(rest)
            for other in self.pending:
                self._refill(other)
        return self.collection[crashed]

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:  # a worker restarted: it gets work as it asks
            for node in self.pending:
                self._refill(node)
            return
        collections_seen = list(self.collections.values())
        if any(c != collections_seen[0] for c in collections_seen[1:]):
            raise pytest.UsageError("pytest-xdist workers collected different tests")
        self.collection = collections_seen[0]
        groups: dict[str, str] = (json.loads(self.groups_file.read_text())
                                  if self.groups_file.exists() else {})
        grouped: dict[str, list[int]] = {}
        single: list[list[int]] = []
        for index, nodeid in enumerate(self.collection):
            group = groups.get(nodeid)
            if group is None:
                single.append([index])
            else:
                grouped.setdefault(group, []).append(index)
        self.units.extend(sorted(grouped.values(), key=len, reverse=True))
        self.units.extend(single)
        for node in self.pending:
            self._refill(node)

    def _refill(self, node: Any) -> None:
        if node.shutting_down:
            return
        if len(self.pending[node]) >= REFILL_AT:
            return
        sent: list[int] = []
        while self.units and len(self.pending[node]) + len(sent) < REFILL_AT:
            sent.extend(self.units.popleft())
        if sent:
            self.pending[node].extend(sent)
            node.send_runtest_some(sent)
        elif not self.units:
            node.shutdown()


class GroupsPlugin:
    """Registered by tests/conftest.py in the controller when workers run (``-n``)."""

    def __init__(self) -> None:
        directory = Path(tempfile.mkdtemp(prefix="trainjob-xdist-groups-"))
        self.groups_file = directory / "groups.json"

    @pytest.hookimpl
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[GROUPS_KEY] = str(self.groups_file)

    @pytest.hookimpl
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> GroupScheduling:
        return GroupScheduling(len(parse_tx_spec_config(config)), self.groups_file)

    @pytest.hookimpl
    def pytest_unconfigure(self) -> None:
        self.groups_file.unlink(missing_ok=True)
        self.groups_file.parent.rmdir()
