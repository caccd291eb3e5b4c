"""The work a preemption would throw away now, and the priority boost it maps to.

Work at risk (resource-seconds): the seconds since the training last saved a checkpoint
(or since its current run was admitted, when it has reported none) times the TrainJob's
resources: accelerators when it asks for any, else CPUs (:func:`work_at_risk`).  A
preempted training restarts from its last checkpoint, so everything since that
checkpoint is computed again, whichever run computed it first.

The boost (:func:`boost_for`) climbs one step per doubling of that work::

    boost = min(max_boost, floor(log2(1 + work / unit)))

with ``unit`` = :data:`UNIT_RESOURCE_SECONDS` (one accelerator, or CPU, minute).  Its
properties, property-tested in tests/scraper/test_boost_rule.py:

* bounded: ``0 <= boost <= max_boost`` for every input;
* monotonic: more work at risk never gives a smaller boost;
* ``max_boost = 0`` turns it off: every boost is 0;
* zero work (a checkpoint saved just now) gives 0;
* a step per doubling: the annotation changes at most ``max_boost`` times between two
  checkpoints, so the writes stay few whatever the scrape interval.

Kueue adds the boost to the Workload's priority when it orders and preempts
(``kueue.x-k8s.io/priority-boost``, ``pkg/util/priority/priority.go`` in Kueue v0.17.0:
``EffectivePriority`` = priority + boost, with the ``PriorityBoost`` feature gate on).
So with ``max_boost`` below the gap between two priority classes a boosted job never
passes a job of a higher class: the boost only orders jobs of one class (or of classes
the admin set closer together than ``max_boost``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from scraper.shared.boost_range import MAX_BOOST_LIMIT

#: One resource-minute: the work at which the boost reaches 1.
UNIT_RESOURCE_SECONDS = 60.0


class BoostRangeError(ValueError):
    """A boost range outside ``0..MAX_BOOST_LIMIT``; the message names value and limit."""


def check_range(max_boost: int, what: str = "--priority-boost-max") -> int:
    """``max_boost`` when it is an int in ``0..MAX_BOOST_LIMIT``.

    Raises:
        BoostRangeError: otherwise (naming ``what``, the value and the limit).
    """
    if isinstance(max_boost, bool) or not isinstance(max_boost, int) or not (
            0 <= max_boost <= MAX_BOOST_LIMIT):
        raise BoostRangeError(f"{what}={max_boost!r}: must be an integer from 0 (off) to "
                              f"{MAX_BOOST_LIMIT}")
    return max_boost


@dataclass(frozen=True)
class Resources:
    """What a TrainJob holds while it runs: ``accelerators`` (sum over its pods of
    accelerator units) and ``cpus`` (cores, fractional); ``units`` is what work is counted
    in: accelerators when there are any, else CPUs."""

    accelerators: float
    cpus: float

    @property
    def units(self) -> float:
        """Accelerators when the job has any, else CPUs (never negative)."""
        return max(0.0, self.accelerators if self.accelerators > 0 else self.cpus)

    @property
    def unit_name(self) -> str:
        """``accelerator`` or ``cpu``: what :attr:`units` counts."""
        return "accelerator" if self.accelerators > 0 else "cpu"


def is_accelerator(resource: str) -> bool:
    """An extended resource that is a device: a domain-prefixed name (``nvidia.com/gpu``,
    ``amd.com/gpu``, ``google.com/tpu``, ``habana.ai/gaudi``), not one of Kubernetes' own
    (``kubernetes.io/...``) and not huge pages or storage."""
    if "/" not in resource:
        return False
    domain = resource.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def resources_of(usage: Mapping[str, float]) -> Resources:
    """:class:`Resources` from a total usage map (resource name -> amount, CPUs in cores):
    accelerators are the :func:`is_accelerator` names summed."""
    accelerators = sum(v for k, v in usage.items() if is_accelerator(k) and v > 0)
    return Resources(accelerators=float(accelerators), cpus=float(max(0.0, usage.get("cpu", 0))))


def work_at_risk(now: float, *, started: float, checkpoint: float | None,
                 resources: Resources) -> float:
    """Resource-seconds a preemption at ``now`` would throw away (all times unix seconds).

    ``started``: when the current run began (its admission), counted from when no
    checkpoint was reported; ``checkpoint``: the last checkpoint's time, or None.  A
    checkpoint earlier than ``started`` (one a resumed training reports it loaded) counts
    as it is: a preemption now sends the training back to it.  A clock that runs behind
    (``now`` before the reference) gives 0, never a negative amount.
    """
    since = started if checkpoint is None else checkpoint
    seconds = now - since
    if not math.isfinite(seconds) or seconds <= 0:
        return 0.0
    return seconds * resources.units


def boost_for(work: float, max_boost: int) -> int:
    """The priority boost for ``work`` resource-seconds at risk, in ``0..max_boost``
    (module docstring).  ``max_boost = 0``: always 0.  NaN and negative work: 0."""
    if max_boost <= 0 or not work > 0:
        return 0
    if math.isinf(work):
        return max_boost
    steps = math.floor(math.log2(1.0 + work / UNIT_RESOURCE_SECONDS))
    return max(0, min(max_boost, steps))
