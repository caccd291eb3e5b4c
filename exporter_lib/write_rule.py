"""The rule of writing by significance, defined once for both sides of the wire.

The scraper writes a TrainJob's status by it (``scraper.decide``), and the exporter
answers a held scrape by it (:class:`exporter_lib.hold_policy.HoldPolicy`), so a held
scrape is answered exactly for a change the scraper will write at once or that is due
(docs/scraper.md, "Writing by significance"):

* a change of the integer ``progressPercentage`` is *significant*: written at once
  (the scraper adds its progress floor between two writes of one TrainJob);
* any other change (metrics, the remaining time, ``lastUpdatedTime``) waits until
  ``metrics_staleness`` seconds after the status the scraper holds was taken.

Pure functions of numbers (no clock, no I/O).  Percentages are integers 0..100 or None
(not reported); seconds are floats.
"""

from __future__ import annotations

__all__ = ["metrics_due", "metrics_wait", "significant"]


def significant(held: int | None, new: int | None) -> bool:
    """True when a status reporting the percentage ``new`` changes what users look at
    first, against the percentage ``held`` (None: none held).

    A status that reports no percentage leaves the held one in place (a server-side
    apply does not send an unset field): never significant.
    """
    return new is not None and new != held


def metrics_due(taken: float, metrics_staleness: float) -> float:
    """When an insignificant change falls due: ``metrics_staleness`` seconds after the
    status held was taken at ``taken`` (seconds on any clock; the result is on the same
    clock and may be past: the scraper ranks an overdue change from when it fell due)."""
    return taken + metrics_staleness


def metrics_wait(metrics_staleness: float, age: float) -> float:
    """Seconds until an insignificant change is due, when the status held was taken
    ``age`` seconds ago and may be ``metrics_staleness`` seconds stale (0: due now):
    :func:`metrics_due` counted from now."""
    return max(0.0, metrics_due(-age, metrics_staleness))
