"""Where a target's status comes from: its exporter, its log, or the exporter first.

A pod's ``trainjob-progress.dev/source`` annotation picks (docs/scraper.md):

* ``exporter`` (default): the exporter's ``/metrics``;
* ``logs``: the trainer container's log through the pods/log API
  (:mod:`scraper.logsource`), for trainings nobody instrumented;
* ``auto``: the exporter while one answers; when nothing listens (refused or
  unreachable: not instrumented), the log.

Both sources give the same :data:`~scraper.shared.scrapes.ScrapeResult` (each is a
:class:`~scraper.shared.scrapes.Source`), so the scrape loop's
rules, the write queue and its budget are the same for either.
"""

from __future__ import annotations

from collections.abc import Callable

from scraper.scrape.exporter import ExporterScraper
from scraper.shared.scrapes import Failure, ScrapeResult, Source
from scraper.shared.targets import SOURCE_AUTO, SOURCE_LOGS, Target


class SourceScraper:
    """Sends each scrape to the exporter or the log, as the target's source says."""

    def __init__(self, exporter: ExporterScraper, logs: Source | None, *,
                 on_exporter_answer: Callable[[Target], None] = lambda target: None) -> None:
        """``on_exporter_answer``: called with an ``auto`` target whose exporter answered
        (its final status is then the exporter's, never the log's); the caller keeps
        that per pod (:attr:`scraper.scrape.target_state.TargetState.exporter_answered`), so nothing
        here grows with the pods that come and go."""
        self.exporter = exporter
        self.logs = logs
        self._on_exporter_answer = on_exporter_answer

    @property
    def held(self) -> int:
        return self.exporter.held

    async def scrape(self, target: Target, etag: str | None = None) -> ScrapeResult:
        if target.source == SOURCE_LOGS and self.logs is not None:
            return await self.logs.scrape(target, etag)
        result = await self.exporter.scrape(target, etag)
        if target.source == SOURCE_AUTO and self.logs is not None:
            if isinstance(result, Failure) and result.kind.not_instrumented:
                return await self.logs.scrape(target, etag)
            self._on_exporter_answer(target)
        return result

    async def wait_for_change(self, target: Target, etag: str | None,
                              max_wait: float, policy: str | None = None) -> ScrapeResult:
        return await self.exporter.wait_for_change(target, etag, max_wait, policy)

    def forget(self, target: Target) -> None:
        self.exporter.forget(target)
        if self.logs is not None:
            self.logs.forget(target)

    async def close(self) -> None:
        await self.exporter.close()
