"""The target manager's table of per-pod states, indexed by TrainJob.

A pod event changes the states of one TrainJob; :meth:`TargetTable.of_trainjob` finds
them without scanning the table (a scan per event made a relist of N pods cost N^2).
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from urllib.parse import urlsplit

from scraper.scrape.target_state import TargetState
from scraper.telemetry import JobView

TrainJobKey = tuple[str, str]


class TargetTable(MutableMapping[str, TargetState]):
    """``namespace/pod`` -> :class:`~scraper.scrape.target_state.TargetState`, with the keys of each
    TrainJob (``state.trainjob_key``, fixed for a state's life) kept alongside."""

    def __init__(self) -> None:
        self._states: dict[str, TargetState] = {}
        self._by_trainjob: dict[TrainJobKey, dict[str, None]] = {}  # ordered sets

    def sizes(self) -> dict[str, int]:
        """Entries of each map kept (each is bounded by the live objects)."""
        return {"states": len(self._states), "states_by_trainjob": len(self._by_trainjob)}

    def __getitem__(self, key: str) -> TargetState:
        return self._states[key]

    def __setitem__(self, key: str, state: TargetState) -> None:
        if key in self._states:
            del self[key]
        self._states[key] = state
        self._by_trainjob.setdefault(state.trainjob_key, {})[key] = None

    def __delitem__(self, key: str) -> None:
        state = self._states.pop(key)
        keys = self._by_trainjob.get(state.trainjob_key)
        if keys is not None:
            keys.pop(key, None)
            if not keys:
                del self._by_trainjob[state.trainjob_key]

    def get(self, key: str, default: TargetState | None = None) -> TargetState | None:  # type: ignore[override]
        return self._states.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._states

    def __iter__(self) -> Iterator[str]:
        return iter(self._states)

    def __len__(self) -> int:
        return len(self._states)

    def snapshot(self) -> list[TargetState]:
        """Every state, a copy taken in one step: safe to call from another thread (the
        /metrics render) while the loop adds and drops states."""
        return list(self._states.values())

    def views(self) -> list[JobView]:
        """One view per TrainJob, a live target's over a terminated pod's; from one
        :meth:`snapshot`, so safe from the /metrics render thread
        (scraper/telemetry.py)."""
        by_job: dict[TrainJobKey, JobView] = {}
        for state in self.snapshot():
            key = state.trainjob_key
            if key not in by_job or state.target is not None:
                by_job[key] = state.view
        return list(by_job.values())

    def of_trainjob(self, trainjob: TrainJobKey) -> list[str]:
        """Keys of the states of ``trainjob``, in the order they were added (a copy)."""
        return list(self._by_trainjob.get(trainjob, ()))

    def trainjobs(self) -> int:
        """How many TrainJobs have a state (the index's size, bounded by the table)."""
        return len(self._by_trainjob)


def address_of(url: str) -> str:
    """``host:port`` of an exporter URL (``http://<pod IP>:<port><path>``)."""
    return urlsplit(url).netloc


class AddressIndex:
    """``host:port`` -> keys (``namespace/pod``) of the live pods scraped there, so that an
    answer that states no pod identity can be refused while more than one pod is known at
    its address (docs/scraper.md, "Which pod answers").  O(1) per :meth:`place`; its size
    is bounded by the pods that have a target."""

    def __init__(self) -> None:
        self._at: dict[str, dict[str, None]] = {}  # ordered sets
        self._of: dict[str, str] = {}

    def place(self, key: str, url: str | None) -> None:
        """Record pod ``key`` at ``url``'s address; ``None``: it has no target any more."""
        address = None if url is None else address_of(url)
        before = self._of.get(key)
        if before == address:
            return
        if before is not None:
            keys = self._at[before]
            keys.pop(key, None)
            if not keys:
                del self._at[before]
            del self._of[key]
        if address is not None:
            self._of[key] = address
            self._at.setdefault(address, {})[key] = None

    def pods_at(self, url: str) -> tuple[str, ...]:
        """Keys of the pods known at ``url``'s address, in the order they came."""
        return tuple(self._at.get(address_of(url), ()))

    def __len__(self) -> int:
        return len(self._of)
