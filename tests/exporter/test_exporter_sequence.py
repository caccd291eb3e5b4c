"""The exporter's sequence header (docs/architecture.md, "Order"): what the scraper orders
one target's answers by (docs/scraper.md, "Other writers and time", rule 5).

The real exporter (exporter_lib's server) answers; the header is read with the
scraper's own parser, and once through the scraper's real HTTP client.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import exporter_lib
from exporter_lib.server import SEQUENCE_HEADER
from scraper.scrape.exporter import ExporterScraper, ScrapeLimits
from scraper.shared.scrapes import Fresh
from scraper.shared.sequence import Sequence, is_late, sequence_of
from scraper.shared.targets import Target

Fetch = Callable[..., Any]
JSON = {"Accept": "application/json"}


def _sequence(resp: Any) -> Sequence:
    parsed = sequence_of(resp.headers[SEQUENCE_HEADER])
    assert parsed is not None, resp.headers[SEQUENCE_HEADER]
    return parsed


def test_sequence_grows_with_each_change_and_only_then(metrics_url: str, fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=1)
    first = _sequence(fetch(metrics_url, headers=JSON))
    again = fetch(metrics_url, headers=JSON)
    assert _sequence(again) == first  # the same status: the same place in the order
    text = fetch(metrics_url)  # every representation carries it
    assert _sequence(text) == first
    exporter_lib.update(progress_percentage=2)
    second = fetch(metrics_url, headers=JSON)
    assert _sequence(second).start == first.start and _sequence(second).n > first.n
    assert is_late(_sequence(second), first)
    not_modified = fetch(metrics_url, headers={**JSON, "If-None-Match": second.headers["ETag"]})
    assert not_modified.status == 304 and _sequence(not_modified) == _sequence(second)


def test_held_answer_carries_the_sequence_of_its_body(metrics_url: str, fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=1)
    before = fetch(metrics_url, headers=JSON)
    timer = threading.Timer(0.4, lambda: exporter_lib.update(progress_percentage=7))
    timer.start()
    held = fetch(metrics_url, headers={**JSON, "If-None-Match": before.headers["ETag"],
                                       "Prefer": "wait=5"})
    timer.join()
    assert held.status == 200 and b'"progressPercentage":7' in held.body
    assert _sequence(held).n > _sequence(before).n


def test_scraper_reads_the_sequence(metrics_url: str) -> None:
    exporter_lib.update(progress_percentage=3)

    async def scrape() -> Any:
        scraper = ExporterScraper(ScrapeLimits(timeout=5.0))
        try:
            return await scraper.scrape(Target("ns", "tj", "pod", "uid", metrics_url, 10.0))
        finally:
            await scraper.close()

    result = asyncio.run(scrape())
    assert isinstance(result, Fresh) and result.status.progress_percentage == 3
    assert result.sequence is not None and result.sequence.n >= 1
