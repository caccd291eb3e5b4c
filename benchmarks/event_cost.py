"""CPU per pod event, per relist pod and per write taken, at several numbers of targets.

``python -m benchmarks.event_cost [N ...]`` (default 1000 10000 50000) builds a
:class:`scraper.discovery.pod_targets.PodTargets` feeding a
:class:`scraper.scrape.manager.TargetManager` (stub scheduler and scrape loop: the manager's
own work only, as issue 27 measured it) and a :class:`scraper.write.queue.WriteQueue`,
and prints the process CPU time of: the first list (and its longest slice between two
returns to the event loop), one relist of N pods (total and per pod), one
MODIFIED pod event with N targets known, and one take+done+put of the queue with N
pending.  Flat per-event figures from 1,000 to 50,000 is the target.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from typing import Any

from exporter_lib.status import TrainerStatus
from scraper.discovery.pod_targets import PodTargets
from scraper.discovery.pods import Synced
from scraper.scrape.manager import TargetManager
from scraper.shared.targets import Target
from scraper.write.queue import Priority, WriteQueue


class _Scheduler:
    def __init__(self) -> None:
        self.keys: set[str] = set()

    def schedule(self, target: Target) -> None:
        self.keys.add(target.key)

    def unschedule(self, key: str) -> None:
        self.keys.discard(key)

    def scheduled_keys(self) -> set[str]:
        return set(self.keys)


def _pod(i: int, rv: int = 1) -> dict[str, Any]:
    return {"metadata": {"namespace": "bench", "name": f"tj-{i}-node-0", "uid": f"u{i}",
                         "resourceVersion": str(rv),
                         "labels": {"jobset.sigs.k8s.io/jobset-name": f"tj-{i}"}},
            "status": {"phase": "Running", "podIP": "127.0.0.1"}}


def manager_cost(n: int, events: int = 2000) -> dict[str, float]:
    target_manager = TargetManager(None, _Scheduler(), spawn=lambda c: c.close(),  # type: ignore[arg-type]
                                   leading=True)
    manager = PodTargets(target_manager, default_port=28080, default_path="/metrics",
                         default_interval=30.0)
    pods = [_pod(i) for i in range(n)]
    # As the scraper applies a list: in slices, returning to the event loop between them.
    began = time.process_time()
    longest, mark = 0.0, began
    for _ in manager.synced_steps(Synced(None, pods)):
        now = time.process_time()
        longest, mark = max(longest, now - mark), now
    first = time.process_time() - began
    longest = max(longest, time.process_time() - mark)
    began = time.process_time()
    manager.on_synced(Synced(None, pods))
    relist = time.process_time() - began
    began = time.process_time()
    for e in range(events):
        manager.on_pod(_pod(e % n, rv=2 + e), deleted=False)
    event = (time.process_time() - began) / events
    return {"first_list_s": first, "longest_slice_ms": longest * 1e3, "relist_s": relist,
            "relist_per_pod_us": relist / n * 1e6, "event_us": event * 1e6}


def queue_cost(n: int, cycles: int = 2000) -> dict[str, float]:
    status = TrainerStatus.from_api({"progressPercentage": 1, "metrics": [],
                                     "lastUpdatedTime": datetime(2026, 1, 1, tzinfo=UTC)})
    queue = WriteQueue()
    for i in range(n):
        queue.put(("bench", f"tj-{i}"), status, Priority(1 + i % 3))
    item = queue.take()  # the first take after a bulk put sorts what became due
    assert item is not None
    queue.done(item)
    began = time.process_time()
    for _ in range(cycles):
        item = queue.take()
        assert item is not None
        queue.done(item)
        queue.put(item.key, status, Priority.PROGRESS)
    return {"write_us": (time.process_time() - began) / cycles * 1e6}


def main(argv: list[str]) -> None:
    sizes = [int(a) for a in argv] or [1000, 10_000, 50_000]
    print("targets  first list s  longest slice ms  relist s  relist/pod us  pod event us  "
          "write us")
    for n in sizes:
        m, q = manager_cost(n), queue_cost(n)
        print(f"{n:7d}  {m['first_list_s']:12.3f}  {m['longest_slice_ms']:16.1f}  "
              f"{m['relist_s']:8.3f}  "
              f"{m['relist_per_pod_us']:13.1f}  {m['event_us']:12.1f}  {q['write_us']:8.1f}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
