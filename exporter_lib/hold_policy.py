"""The write policy a waiting scrape states, and when a held answer is due by it.

A scraper that writes by significance (docs/scraper.md, "Writing by significance")
tells the exporter in the waiting request what it would write, so the exporter answers
a held scrape only for a change that will be written (contract version 3,
docs/architecture.md, "Wire contract")::

    Trainjob-Write-Policy: progress=42; metrics-staleness=30; metrics-age=12.5

* ``progress``: the integer ``progressPercentage`` of the scraper's last status from
  this exporter; absent when that status had none.  A status reporting a different
  percentage is *significant*: answered at once (:mod:`exporter_lib.write_rule`).
* ``metrics-staleness``: seconds a change of anything else (metrics, the remaining
  time, ``lastUpdatedTime``) may wait before it is written.
* ``metrics-age``: seconds since the scraper last took a status from this exporter.
  Once ``metrics-age`` plus the time held reaches ``metrics-staleness``, any change
  is answered (the metrics are then due).

Pure functions of the header and the status (no I/O, no clock): the exporter's server
(:mod:`exporter_lib.server`) holds and wakes, this module decides.  The scraper builds
the header with :func:`format_policy`, so both sides share one grammar.  Parameters
are ``;``-separated ``name=value`` pairs in any order; unknown names are ignored, so a
later version may add some.  A header that is malformed (a bad number, a percentage
outside 0..100, a value over :data:`SECONDS_MAX`) is ignored as a whole: the request is
then a plain version-2 waiting scrape (any change answers), never a refusal.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from exporter_lib.status import PROGRESS_MAX, PROGRESS_MIN, TrainerStatus
from exporter_lib.write_rule import metrics_wait, significant

#: The request header a scraper states its write policy in.
WRITE_POLICY_HEADER = "Trainjob-Write-Policy"
#: Longest staleness or age taken from the header (seconds); more is malformed.
SECONDS_MAX = 366 * 24 * 3600.0
#: Longest header value read (characters); a longer one is ignored.
HEADER_MAX = 256

_PARAM = re.compile(r"^\s*([a-z][a-z0-9-]{0,31})\s*=\s*([0-9]{1,12}(?:\.[0-9]{1,6})?)\s*$")


@dataclass(frozen=True)
class HoldPolicy:
    """A parsed :data:`WRITE_POLICY_HEADER`.

    Attributes:
        progress: the scraper's last ``progressPercentage`` (None: it holds none).
        metrics_staleness: seconds an insignificant change may wait (>= 0).
        metrics_age: seconds since the scraper last took a status (>= 0).
    """

    progress: int | None
    metrics_staleness: float
    metrics_age: float

    def metrics_due_in(self, held_for: float) -> float:
        """Seconds, after ``held_for`` seconds of holding, until any change is due
        (0 when it already is)."""
        return metrics_wait(self.metrics_staleness, self.metrics_age + held_for)

    def answers(self, status: TrainerStatus | None, held_for: float) -> bool:
        """True when a *changed* ``status`` is worth an answer after ``held_for`` seconds
        of holding: its percentage is significant against the scraper's, or the metrics
        are due (:mod:`exporter_lib.write_rule`, the rule the scraper writes by).

        The caller has already found the answer changed (a different ETag); ``None``
        (no report yet) is never worth one: there is nothing to write.
        """
        if status is None:
            return False
        if significant(self.progress, status.progress_percentage):
            return True
        return self.metrics_due_in(held_for) <= 0.0


def parse_policy(header: str | None) -> HoldPolicy | None:
    """The :class:`HoldPolicy` of a request's :data:`WRITE_POLICY_HEADER`; None when it is
    absent or malformed (module doc).  Never raises."""
    if not header or len(header) > HEADER_MAX:
        return None
    values: dict[str, float] = {}
    for part in header.split(";"):
        if not part.strip():
            continue
        match = _PARAM.match(part)
        if match is None:
            return None
        name, number = match.group(1), float(match.group(2))
        values.setdefault(name, number)  # the first of a repeated name counts
    staleness, age = values.get("metrics-staleness"), values.get("metrics-age", 0.0)
    progress = values.get("progress")
    if staleness is None or staleness > SECONDS_MAX or age > SECONDS_MAX:
        return None
    if progress is not None and not (progress.is_integer()
                                     and PROGRESS_MIN <= progress <= PROGRESS_MAX):
        return None
    return HoldPolicy(None if progress is None else int(progress), staleness, age)


def format_policy(progress: int | None, metrics_staleness: float, metrics_age: float) -> str:
    """The :data:`WRITE_POLICY_HEADER` value for a scraper's state (module doc).

    ``metrics_age`` is cut to ``metrics_staleness`` (more says nothing more; an unknown
    age, ``inf``, is "due"); seconds are sent with at most 3 decimals.

    Raises:
        ValueError: ``progress`` outside 0..100, or a negative or NaN staleness.
    """
    if progress is not None and not PROGRESS_MIN <= progress <= PROGRESS_MAX:
        raise ValueError(f"progress={progress!r}: must be {PROGRESS_MIN}..{PROGRESS_MAX}")
    if not metrics_staleness >= 0 or math.isinf(metrics_staleness):
        raise ValueError(f"metrics_staleness={metrics_staleness!r}: must be a finite "
                         "number >= 0")
    staleness = min(metrics_staleness, SECONDS_MAX)
    age = min(max(metrics_age, 0.0), staleness) if metrics_age == metrics_age else staleness
    parts = [] if progress is None else [f"progress={progress}"]
    parts += [f"metrics-staleness={_seconds(staleness)}", f"metrics-age={_seconds(age)}"]
    return "; ".join(parts)


def _seconds(value: float) -> str:
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return text or "0"
