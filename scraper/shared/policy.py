"""Writing by significance: what users look at is written when it changes, the rest
within a stated staleness (docs/scraper.md, "Writing by significance").

* **Significant**: a change of the integer ``progressPercentage`` (the bar in
  ``kubectl``, the notebook, the dashboard).  Written at once, but no sooner than
  :attr:`WritePolicy.progress_floor` after the TrainJob's previous write; finals and a
  TrainJob's first status never wait.
* **Everything else** (metrics, ``estimatedRemainingSeconds``): written within
  :attr:`WritePolicy.metrics_staleness` of when the scraper took the status the TrainJob
  holds, or with the next significant write (a write always carries the newest
  status, metrics included).

The defaults come from ``--progress-floor`` and ``--metrics-staleness``; a TrainJob (or
its target pod) overrides them with the annotations :data:`ANNOTATION_PROGRESS_FLOOR`
and :data:`ANNOTATION_METRICS_STALENESS` (pod first, then the TrainJob, then the flags).
:class:`PolicyResolver` reads them; a bad value is logged once, naming the annotation,
the value and the limit, and the next level's value is used (a typo in a cost setting
must not stop a TrainJob's progress).

The decision (:func:`scraper.decide.decision.decide`) applies the policy to every source
alike (exporter answers, log reads, termination messages); the scrape loop states it to
exporters of contract 3 (:mod:`exporter_lib.hold_policy`), which hold a waiting scrape by
the same rule (:mod:`exporter_lib.write_rule`), so a held scrape is answered only for a
change that will be written.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from exporter_lib.status import TrainerStatus
from exporter_lib.write_rule import significant as rule_significant
from scraper.syntax import parse_duration

log = logging.getLogger(__name__)

#: Default of ``--progress-floor`` (seconds): at most one progress write per second per
#: TrainJob, the pace ``kubectl get -w`` and a notebook bar refresh at.
PROGRESS_FLOOR_SECONDS = 1.0
#: Default of ``--metrics-staleness`` (seconds): the default scrape interval, so metric
#: writes cost no more than polling every TrainJob at the default interval did.
METRICS_STALENESS_SECONDS = 30.0
#: Bounds of the progress floor (seconds).  Below 0.1 s nothing is gained: the exporter
#: looks for a new status every 0.1 s.  Above a minute a progress bar stands still.
PROGRESS_FLOOR_MIN, PROGRESS_FLOOR_MAX = 0.1, 60.0
#: Bounds of the metrics staleness (seconds); 0 writes every change at once.
METRICS_STALENESS_MIN, METRICS_STALENESS_MAX = 0.0, 3600.0

ANNOTATION_PROGRESS_FLOOR = "trainjob-progress.dev/progress-floor"
ANNOTATION_METRICS_STALENESS = "trainjob-progress.dev/metrics-staleness"
ANNOTATIONS = (ANNOTATION_PROGRESS_FLOOR, ANNOTATION_METRICS_STALENESS)

#: Policy annotations as found on an object: ``(name, value)`` pairs, sorted by name.
Overrides = tuple[tuple[str, str], ...]

#: Bad annotation values remembered as logged at most (a bound under churn).
_TOLD_MAX = 10_000


#: Default of ``--other-writer-grace``: another writer whose last change is younger
#: than this keeps the field (seconds, docs/scraper.md, "Other writers and time").
OTHER_WRITER_GRACE_SECONDS = 60.0


@dataclass(frozen=True)
class WritePolicy:
    """When a TrainJob's changes are written (module doc).  Seconds.

    ``other_writer_grace`` is ``--other-writer-grace`` (no annotation overrides it)."""

    progress_floor: float = PROGRESS_FLOOR_SECONDS
    metrics_staleness: float = METRICS_STALENESS_SECONDS
    other_writer_grace: float = OTHER_WRITER_GRACE_SECONDS


DEFAULT_POLICY = WritePolicy()


def _within(seconds: float, low: float, high: float) -> float:
    if not low <= seconds <= high:
        raise ValueError(f"must be between {low:g}s and {high:g}s")
    return seconds


def check_progress_floor(seconds: float) -> float:
    """``seconds`` when it is a valid progress floor.

    Raises:
        ValueError: outside :data:`PROGRESS_FLOOR_MIN`..:data:`PROGRESS_FLOOR_MAX`.
    """
    return _within(seconds, PROGRESS_FLOOR_MIN, PROGRESS_FLOOR_MAX)


def check_metrics_staleness(seconds: float) -> float:
    """``seconds`` when it is a valid metrics staleness.

    Raises:
        ValueError: outside :data:`METRICS_STALENESS_MIN`..:data:`METRICS_STALENESS_MAX`.
    """
    return _within(seconds, METRICS_STALENESS_MIN, METRICS_STALENESS_MAX)


_CHECKS = {ANNOTATION_PROGRESS_FLOOR: ("progress_floor", check_progress_floor),
           ANNOTATION_METRICS_STALENESS: ("metrics_staleness", check_metrics_staleness)}


def significant(stored: TrainerStatus | None, new: TrainerStatus) -> bool:
    """True when ``new`` changes what users look at first, the integer percentage, against
    the ``stored`` status (:func:`exporter_lib.write_rule.significant`: the exporter holds
    a waiting scrape by the same rule)."""
    return rule_significant(None if stored is None else stored.progress_percentage,
                            new.progress_percentage)


def overrides_of(annotations: Mapping[str, Any] | None) -> Overrides:
    """The policy annotations among ``annotations`` (values as text)."""
    if not annotations:
        return ()
    return tuple((name, str(annotations[name])) for name in ANNOTATIONS if name in annotations)


def apply_overrides(base: WritePolicy, overrides: Overrides) -> tuple[WritePolicy, list[str]]:
    """``base`` with each valid override applied, and one problem line per invalid one
    (``annotation='value': reason``, the limit named)."""
    values: dict[str, float] = {}
    problems = []
    for name, text in overrides:
        field, check = _CHECKS[name]
        try:
            values[field] = check(parse_duration(text))
        except ValueError as exc:
            problems.append(f"{name}={text[:64]!r}: {exc}")
    return replace(base, **values), problems


class PolicyResolver:
    """A TrainJob's :class:`WritePolicy` from its target pod's annotations, then its own,
    then ``default`` (the flags); cached per combination of annotation values.

    A bad value is logged once (WARNING, annotation, value and limit) and skipped.
    """

    def __init__(self, default: WritePolicy = DEFAULT_POLICY) -> None:
        self.default = default
        self._told: set[tuple[str, Overrides]] = set()
        self._resolve = functools.lru_cache(maxsize=1024)(self._uncached)

    def policy(self, pod: Overrides = (), trainjob: Overrides = (), *,
               where: str = "") -> WritePolicy:
        """The policy for a TrainJob whose pod carries ``pod`` and which itself carries
        ``trainjob`` (``where`` names it in a warning)."""
        if not pod and not trainjob:
            return self.default
        policy, problems = self._resolve(pod, trainjob)
        if problems:
            self._tell(where, pod, trainjob, problems)
        return policy

    def _uncached(self, pod: Overrides, trainjob: Overrides) -> tuple[WritePolicy, list[str]]:
        from_trainjob, problems = apply_overrides(self.default, trainjob)
        policy, more = apply_overrides(from_trainjob, pod)
        return policy, [f"TrainJob annotation {p}" for p in problems] + [
            f"pod annotation {p}" for p in more]

    def _tell(self, where: str, pod: Overrides, trainjob: Overrides,
              problems: list[str]) -> None:
        key = (where, pod + trainjob)
        if key in self._told:
            return
        if len(self._told) >= _TOLD_MAX:
            self._told.clear()
        self._told.add(key)
        log.warning("%s: %s; the scraper's default is used instead (progress floor %gs, "
                    "metrics staleness %gs, or a valid annotation of the TrainJob)",
                    where or "write policy", "; ".join(problems),
                    self.default.progress_floor, self.default.metrics_staleness)
