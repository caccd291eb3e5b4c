"""What one scrape of a target gave, whatever its source (an exporter, a log): the
:data:`ScrapeResult` the scrape loop takes its rules from
(:class:`scraper.scrape.exporter.ExporterScraper`, :class:`scraper.logsource.reader.LogScraper`),
and the :class:`Source` interface both implement.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from exporter_lib.status import TrainerStatus
from scraper.shared.outcome import WriteOutcome
from scraper.shared.sequence import Sequence
from scraper.shared.targets import Target

__all__ = ["Busy", "Failure", "FailureKind", "Fresh", "NotModified", "NothingYet",
           "ScrapeResult", "SharedAddress", "Source", "WrongPod"]


class FailureKind(enum.Enum):
    """Why a scrape gave no status.  ``value`` is the metrics/Event label."""

    REFUSED = "refused"  # nothing listens: not instrumented (backed off, no Event)
    UNREACHABLE = "unreachable"  # connect failed otherwise (backed off, no Event)
    TIMEOUT = "timeout"
    TOO_LARGE = "too_large"
    REDIRECT = "redirect"
    HTTP_ERROR = "http_error"
    INVALID = "invalid"

    @property
    def not_instrumented(self) -> bool:
        """True for failures that mean "no exporter here", which are only backed off."""
        return self in (FailureKind.REFUSED, FailureKind.UNREACHABLE)


@dataclass(frozen=True)
class Fresh:
    """A new status.  ``etag`` is the response's ETag (None when absent); ``max_wait`` the
    exporter's longest wait when it serves waiting scrapes
    (:func:`scraper.scrape.exporter.max_wait_of`); ``sequence`` the answer's place in its
    exporter's order (:data:`scraper.shared.sequence.SEQUENCE_HEADER`; None without the
    header); ``by_policy``: the exporter holds waiting scrapes by the stated write policy
    (contract 3, :func:`scraper.scrape.exporter.holds_by_policy`); ``identified``: False
    when an exporter's answer did not name its pod (no :data:`~exporter_lib.pod.POD_HEADER`,
    or one without the UID or a name or hostname with the namespace:
    :func:`scraper.scrape.exporter.names_the_pod`), so that it may be another pod's at a
    shared address (:class:`SharedAddress`)."""

    status: TrainerStatus
    etag: str | None
    max_wait: float | None = None
    sequence: Sequence | None = None
    by_policy: bool = False
    identified: bool = True


@dataclass(frozen=True)
class NotModified:
    """304: the status is the one the given ETag names (``max_wait`` and ``by_policy`` as
    in :class:`Fresh`)."""

    max_wait: float | None = None
    by_policy: bool = False


@dataclass(frozen=True)
class NothingYet:
    """204 (or text without trainjob series): the job has not reported yet."""

    max_wait: float | None = None
    by_policy: bool = False


@dataclass(frozen=True)
class Failure:
    """No status; ``detail`` is one human-readable line (for logs and Events)."""

    kind: FailureKind
    detail: str


@dataclass(frozen=True)
class Busy:
    """No scrape: every slot stayed taken for a whole scrape timeout.

    The scraper is behind (too many slow or hung exporters for ``--concurrency``);
    nothing is known about this target, so it is neither up nor down.
    """


@dataclass(frozen=True)
class WrongPod:
    """The answer came from another pod than the target's: its pod
    IP was reused while the pod watch still showed the old pod there.  Nothing of the
    answer is used.  ``reason`` (``uid``, ``name``, ``namespace``, ``hostname``) names
    the first stated part that differs; ``detail`` is one line for logs and Events."""

    reason: str
    detail: str


@dataclass(frozen=True)
class SharedAddress:
    """An answer that states no pod identity, while more than one live pod is known at
    the target's address: it may be any of them, so nothing of it is
    used.  Made by the loop (:class:`scraper.scrape.loop.ScrapeLoop`) from an unidentified
    :class:`Fresh`; ``pods`` are the keys (``namespace/pod``) known there."""

    pods: tuple[str, ...]


ScrapeResult = Fresh | NotModified | NothingYet | Failure | Busy | WrongPod | SharedAddress


class Source(Protocol):
    """One source of a target's status: a scrape, with the ETag of the status held
    (None: none), gives a :data:`ScrapeResult`; never raises for the target's faults."""

    async def scrape(self, target: Target, etag: str | None = None) -> ScrapeResult: ...

    def forget(self, target: Target) -> None:
        """Drop what is kept for ``target`` (it is gone)."""


class ScrapeCounts(Protocol):
    """What the scrape loop counts (implemented by :class:`scraper.telemetry.Telemetry`)."""

    def scraped(self, result: str) -> None:
        """One scrape came to ``result`` (``ok``, ``not_modified``, ``empty``, ``late``,
        ``wrong_pod``, ``shared_address`` or a :class:`FailureKind` value)."""

    def wrong_pod(self, reason: str) -> None:
        """One answer came from another pod (:attr:`WrongPod.reason`)."""

    def written(self, outcome: WriteOutcome) -> None:
        """One write of the loop came to ``outcome`` (it counts only
        :attr:`WriteOutcome.FAILED`: the writer counts the others)."""


class _NoScrapeCounts:
    def scraped(self, result: str) -> None:
        pass

    def wrong_pod(self, reason: str) -> None:
        pass

    def written(self, outcome: WriteOutcome) -> None:
        pass


#: A :class:`ScrapeCounts` that counts nothing.
NO_SCRAPE_COUNTS: ScrapeCounts = _NoScrapeCounts()
