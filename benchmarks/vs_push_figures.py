"""The cost figures of ``benchmarks.vs_push`` from what a run recorded: the API server's
audit log, the trainings' records (:meth:`benchmarks.vs_push_training.Training.record`)
and a watch of the TrainJobs (:class:`StatusWatch`; delivery and freshness from it are
:mod:`benchmarks.vs_push_delivery`'s).
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubernetes import client

from benchmarks.status_watch import TrainJobWatch
from benchmarks.vs_push_delivery import percentile
from localdev.cluster.controlplane import trainjob_status_writes

# ------------------------------------------------------------------ audit log


@dataclass
class AuditWrites:
    """Writes to ``trainjobs/status`` read from an audit log, by writer."""

    count: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)

    def writer(self, field_manager: str) -> tuple[int, int]:
        """(writes, request bytes) whose writer key starts with ``field_manager``."""
        keys = [k for k in self.count if k.split(" ", 1)[0] == field_manager]
        return sum(self.count[k] for k in keys), sum(self.bytes[k] for k in keys)


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def read_audit(path: Path, namespace: str, start: float, end: float,
               offset: int = 0) -> AuditWrites:
    """Count the successful (2xx) writes to ``trainjobs/status`` in ``namespace`` received
    in ``[start, end]`` (epoch seconds) in audit log ``path`` (JSON lines, read from byte
    ``offset``), keyed by ``"<fieldManager> <user> <userAgent product>"``; bytes from
    ``requestObject`` when the policy logged it at Request level (compact JSON), else 0."""
    out = AuditWrites()
    for event in trainjob_status_writes(path, offset, namespace):
        code = (event.get("responseStatus") or {}).get("code", 0)
        if not 200 <= code < 300:
            continue
        if not start <= _stamp(event["requestReceivedTimestamp"]) <= end:
            continue
        query = parse_qs(urlsplit(event.get("requestURI", "")).query)
        manager = (query.get("fieldManager") or ["(none)"])[0]
        agent = (event.get("userAgent") or "").split(" ", 1)[0].split("/", 1)[0]
        key = f"{manager} {(event.get('user') or {}).get('username', '?')} {agent}"
        out.count[key] += 1
        body = event.get("requestObject")
        if body is not None:
            out.bytes[key] += len(json.dumps(body, separators=(",", ":")))
    return out


# ------------------------------------------------------------------ the watch


class StatusWatch(TrainJobWatch):
    """Records ``(seen at, progressPercentage, stamp metric)`` per TrainJob of every
    status write in ``namespace`` (:class:`benchmarks.status_watch.TrainJobWatch`)."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.seen: dict[str, list[tuple[float, int, float]]] = {}
        # Short requests: a session's end waits for the watch to stop (a resumed
        # request loses no event: it starts at the last resourceVersion seen).
        super().__init__(api, namespace, self._record, request_seconds=3)

    def _record(self, now: float, name: str, ts: Mapping[str, Any]) -> None:
        self.seen.setdefault(name, []).append(
            (now, int(ts.get("progressPercentage") or 0), stamp_of(ts) or 0.0))


def stamp_of(status: Mapping[str, Any]) -> float | None:
    """The ``stamp`` metric of a trainerStatus, or None."""
    for m in status.get("metrics") or []:
        if m.get("name") == "stamp":
            with contextlib.suppress(ValueError, TypeError):
                return float(m["value"])
    return None


# ------------------------------------------------------------------ figures


def costs(records: Iterable[Mapping[str, Any]], a: float, b: float) -> dict[str, Any]:
    """Training-side cost per report call: the time the training is blocked in it
    (microseconds: p50, p99, max) of the calls in ``[a, b]``, and what the calls
    returned (not delivery: that is judged by the watch), per kind of training
    (``sdk``, ``sdk-farm``, ...)."""
    by_kind: dict[str, list[float]] = {}
    outcomes: dict[str, Counter[str]] = {}
    for rec in records:
        calls = by_kind.setdefault(rec["kind"], [])
        seen = outcomes.setdefault(rec["kind"], Counter())
        for stamp, ns, outcome in zip(rec["stamps"][:-1], rec["call_ns"][:-1],
                                      rec["outcomes"][:-1], strict=True):
            if a <= stamp <= b:
                calls.append(ns / 1e3)
                seen[outcome] += 1
    out: dict[str, Any] = {}
    for kind, calls in by_kind.items():
        out[kind] = {"calls": len(calls), "p50_us": percentile(calls, 0.5),
                     "p99_us": percentile(calls, 0.99), "max_us": max(calls) if calls else None,
                     "outcomes": dict(outcomes[kind])}
    every = [c for calls in by_kind.values() for c in calls]
    out["all"] = {"calls": len(every), "p50_us": percentile(every, 0.5),
                  "p99_us": percentile(every, 0.99), "max_us": max(every) if every else None}
    return out


def trainjob_hours(records: Iterable[Mapping[str, Any]], a: float, b: float) -> float:
    """TrainJob-hours of training inside ``[a, b]`` (each training's own start and end)."""
    return sum(max(0.0, min(b, float(rec["final"] or b)) - max(a, float(rec["started"])))
               for rec in records) / 3600
