"""Which core the target farm runs on and which the scraper under test runs on.

A scraper that shares its cores with its own targets measures the farm as much as itself:
the exporter_lib farm alone takes most of a core at 1000 targets.  ``python -m benchmarks``
therefore starts the farm (nginx, the exporter_lib children, and in the control-plane
phase the API server and etcd) on one core and the scraper under test (ours, then
Prometheus) on another.

Children inherit the CPU affinity of the thread that starts them (``sched_setaffinity(2)``:
the mask is per thread and survives ``fork`` and ``exec``), so :func:`pinned` narrows the
calling thread's mask while a child is started and restores it afterwards.  Other
processes on the machine are not kept off either core: pinning keeps the two sides of
the benchmark apart, not the machine quiet.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Pinning:
    """``farm``: the targets' core(s); ``scraper``: the core(s) of the scraper under test."""

    farm: frozenset[int]
    scraper: frozenset[int]

    def text(self) -> str:
        """One line for the report."""
        return (f"target farm (nginx, exporter_lib farm, API server and etcd) pinned to "
                f"core {_cores(self.farm)}, scraper under test (ours, Prometheus) to core "
                f"{_cores(self.scraper)} (sched_setaffinity)")


def _cores(cores: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cores))


def choose(allowed: set[int] | None = None) -> Pinning | None:
    """The lowest allowed core for the farm, the highest for the scraper; ``None`` when
    this process may run on fewer than two cores (then nothing is pinned).

    ``allowed`` defaults to this process's affinity (``os.sched_getaffinity(0)``).
    """
    cores = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    if len(cores) < 2:
        return None
    return Pinning(farm=frozenset({cores[0]}), scraper=frozenset({cores[-1]}))


@contextlib.contextmanager
def pinned(cores: frozenset[int] | None) -> Iterator[None]:
    """Run the block (and every child it starts) on ``cores``; ``None``: unchanged.

    Raises:
        OSError: a core is not allowed to this process (from ``sched_setaffinity``).
    """
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def affinity(pid: int) -> set[int]:
    """The cores ``pid`` may run on (its main thread's mask)."""
    return set(os.sched_getaffinity(pid))
