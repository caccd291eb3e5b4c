"""One definition of delivery for every side of ``benchmarks.vs_push``, judged only by
a watch on the TrainJobs (:class:`benchmarks.vs_push_figures.StatusWatch`), never by
what a report call returned.

A **reported value** is one integer percentage (its first report), one metrics value
(a report's ``stamp`` metric: every report carries a new one) or the final (progress
100 with the last stamp).  Of the values a training reported in a window ``[a, b]``:

* **shown**: a watch event shows exactly that value (the percentage; the stamp);
* **superseded**: never shown, but a newer value was (a higher percentage; a later
  stamp): the next value replaced it before it was shown;
* **never shown**: neither, by the end of the observation (``observed_until``: the end
  of the settle period after the trainings ended).

**Freshness** is the time from a value's report (the training's wall clock) to the
first watch event that shows it, over shown values; a never-shown value enters as the
lower bound ``observed_until - t`` (censored), and a percentile that such a bound can
move is printed ``>=`` (``*_censored``: True).  Superseded values are counted, not
timed.  **Percent error** samples, every second of the window, |the percentage the
training last reported - the percentage the TrainJob last showed| (0 before anything
is shown counts as shown 0).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

#: ``(seen at: epoch s, progressPercentage, stamp metric)`` of one watch event.
View = tuple[float, int, float]
#: Two stamps closer than this are the same value (the stamp has 3 decimals).
STAMP_EPSILON = 5e-4


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def censored_percentile(exact: Sequence[float], bounds: Sequence[float],
                        q: float) -> tuple[float | None, bool]:
    """The ``q`` quantile of ``exact`` values and lower ``bounds`` taken as values, and
    whether it is only a lower bound: True when a bound at or below it could, being
    larger in truth, move it up."""
    p = percentile([*exact, *bounds], q)
    return p, p is not None and any(x <= p for x in bounds)


class _Tally:
    """Counts and freshness of one kind of value."""

    def __init__(self) -> None:
        self.reported = self.shown = self.superseded = self.never = 0
        self.fresh: list[float] = []
        self.bounds: list[float] = []

    def add(self, t: float, shown_at: float | None, superseded: bool,
            observed_until: float) -> None:
        self.reported += 1
        if shown_at is not None:
            self.shown += 1
            self.fresh.append(max(0.0, shown_at - t))
        elif superseded:
            self.superseded += 1
        else:
            self.never += 1
            self.bounds.append(max(0.0, observed_until - t))

    def figures(self, prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            f"{prefix}_values_reported": self.reported, f"{prefix}_values_shown": self.shown,
            f"{prefix}_values_superseded": self.superseded,
            f"{prefix}_values_never_shown": self.never}
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            value, bound = censored_percentile(self.fresh, self.bounds, q)
            out[f"{prefix}_freshness_{name}_s"] = value
            out[f"{prefix}_freshness_{name}_censored"] = bound
        every = [*self.fresh, *self.bounds]
        out[f"{prefix}_freshness_max_s"] = max(every) if every else None
        return out


def _progress_fate(views: list[View], t: float, pct: int) -> tuple[float | None, bool]:
    i = bisect.bisect_left(views, (t, -1, float("-inf")))
    superseded = False
    for at, shown, _ in views[i:]:
        if shown == pct:
            return at, False
        superseded = superseded or shown > pct
    return None, superseded


def _stamp_fate(views: list[View], t: float, stamp: float) -> tuple[float | None, bool]:
    i = bisect.bisect_left(views, (t, -1, float("-inf")))
    superseded = False
    for at, _, shown in views[i:]:
        if abs(shown - stamp) < STAMP_EPSILON:
            return at, False
        superseded = superseded or shown > stamp
    return None, superseded


def delivery(records: Mapping[str, Mapping[str, Any]], seen: Mapping[str, list[View]],
             a: float, b: float, observed_until: float,
             errors_until: float | None = None) -> dict[str, Any]:
    """Delivery and freshness of the values reported in ``[a, b]`` (module doc), and the
    percent error over ``[a, errors_until or b]``; ``records`` as
    :meth:`benchmarks.vs_push_training.Training.record`."""
    progress, metrics = _Tally(), _Tally()
    errors: list[float] = []
    for job, rec in records.items():
        views = sorted(v for v in seen.get(job, []) if v[0] <= observed_until)
        stamps, percents = rec["stamps"][:-1], rec["percents"][:-1]  # the final: apart
        for i, (t, pct) in enumerate(zip(stamps, percents, strict=True)):
            if not a <= t <= b:
                continue
            at, sup = _stamp_fate(views, t, t)
            metrics.add(t, at, sup, observed_until)
            if i == 0 or pct != percents[i - 1]:
                at, sup = _progress_fate(views, t, pct)
                progress.add(t, at, sup, observed_until)
        errors += percent_errors(stamps, percents, views, a,
                                 b if errors_until is None else errors_until)
    out = {**progress.figures("progress"), **metrics.figures("metrics")}
    for key in ("reported", "shown", "superseded", "never_shown"):
        out[f"values_{key}"] = out[f"progress_values_{key}"] + out[f"metrics_values_{key}"]
    out["percent_error_p50"] = percentile(errors, 0.5)
    out["percent_error_p99"] = percentile(errors, 0.99)
    out["percent_error_max"] = max(errors) if errors else None
    return out


def percent_errors(stamps: Sequence[float], percents: Sequence[int], views: list[View],
                   a: float, b: float) -> list[float]:
    """|reported - shown| percentage at each whole second of ``[a, b]`` after the
    training's first report (``stamps``/``percents``: its reports, time-sorted)."""
    out: list[float] = []
    times = [v[0] for v in views]
    s = a
    while s <= b:
        k = bisect.bisect_right(stamps, s)
        if k:
            j = bisect.bisect_right(times, s)
            shown = views[j - 1][1] if j else 0
            out.append(abs(percents[k - 1] - shown))
        s += 1.0
    return out


def finals(records: Mapping[str, Mapping[str, Any]], seen: Mapping[str, list[View]],
           names: Sequence[str], observed_until: float) -> dict[str, Any]:
    """Finals of TrainJobs ``names``: delivered when a watch event by ``observed_until``
    shows progress 100 with the final's stamp; their freshness (s, over delivered)."""
    delivered: list[float] = []
    for name in names:
        final = (records.get(name) or {}).get("final")
        if final is None:
            continue
        for at, pct, stamp in seen.get(name, []):
            if at <= observed_until and pct == 100 and abs(stamp - final) < STAMP_EPSILON:
                delivered.append(max(0.0, at - final))
                break
    return {"delivered": len(delivered), "expected": len(names),
            "freshness_max_s": max(delivered) if delivered else None,
            "freshness_p50_s": percentile(delivered, 0.5)}


def final_shown(views: list[View], final: float | None) -> bool:
    """Whether ``views`` include the final (progress 100, its stamp)."""
    return final is not None and any(
        pct == 100 and abs(stamp - final) < STAMP_EPSILON for _, pct, stamp in views)
