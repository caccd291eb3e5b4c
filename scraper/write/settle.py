"""The ``lastUpdatedTime`` a write carries: time never moves backwards silently
(docs/scraper.md, "Other writers and time"), a pure decision made right before a write
is sent, against what the TrainJob stores then.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime

__all__ = ["FUTURE_LIMIT_SECONDS", "Skew", "settle_time"]

#: A report's ``lastUpdatedTime`` more than this ahead of the scraper's clock is not
#: written as is (seconds).
FUTURE_LIMIT_SECONDS = 60.0


class Skew(enum.Enum):
    """Why :func:`settle_time` wrote the arrival time; ``value`` is the metrics label."""

    BACK = "back"  # the report's time is older than the stored one's
    FUTURE = "future"  # the report's time is too far ahead of the scraper's clock


def settle_time(reported: datetime, stored: datetime | None, arrival: datetime,
                *, future_limit: float = FUTURE_LIMIT_SECONDS) -> tuple[datetime, Skew | None]:
    """The ``lastUpdatedTime`` to write and why it is not the report's own (None: it is).

    The report's own time, unless it is older than ``stored`` (it would move back) or more
    than ``future_limit`` seconds ahead of ``arrival`` (the scraper's wall clock when the
    report arrived); then ``arrival`` (whole seconds).  ``arrival`` older than ``stored``
    means the stored time was in the future: still ``arrival``, with :attr:`Skew.BACK`.
    """
    arrival = arrival.astimezone(UTC).replace(microsecond=0)
    if (reported - arrival).total_seconds() > future_limit:
        return arrival, Skew.FUTURE
    if stored is not None and reported < stored:
        return arrival, Skew.BACK
    return reported, None
