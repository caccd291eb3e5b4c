"""Scraping one exporter over HTTP: a target in, a validated status or a typed failure out.

Knows the exporter's wire contract (docs/architecture.md) and nothing of the
Kubernetes API.  One pooled :class:`aiohttp.ClientSession` with keep-alive
serves every target; each scrape has a timeout, a body-size cap, never follows
redirects and waits for a slot under a concurrency cap.
"""

from __future__ import annotations

import asyncio
import enum
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from exporter_lib.status import StatusError, TrainerStatus, metric_value_text
from scraper.targets import Target

#: JSON first; the Prometheus text format is the fallback any exporter can serve.
ACCEPT = "application/json, text/plain;version=0.0.4;q=0.5, */*;q=0.1"
USER_AGENT = "trainjob-scraper/0.1"


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
    """A new status.  ``etag`` is the response's ETag (None when absent)."""

    status: TrainerStatus
    etag: str | None


@dataclass(frozen=True)
class NotModified:
    """304: the status is the one the given ETag names."""


@dataclass(frozen=True)
class NothingYet:
    """204 (or text without trainjob series): the job has not reported yet."""


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


ScrapeResult = Fresh | NotModified | NothingYet | Failure | Busy


@dataclass(frozen=True)
class ScrapeLimits:
    """Bounds of one scrape: ``timeout`` seconds, ``max_body_bytes`` bytes."""

    timeout: float = 10.0
    max_body_bytes: int = 1 << 20
    concurrency: int = 32


def client_session(concurrency: int) -> aiohttp.ClientSession:
    """The pooled session every scrape goes through: keep-alive, at most ``concurrency``
    connections, no cookies, no decompression, no timers of its own.

    Create inside a running loop; the caller closes it.
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=concurrency, keepalive_timeout=120, enable_cleanup_closed=True
        ),
        headers={"User-Agent": USER_AGENT},
        auto_decompress=False,  # a compressed body could exceed the cap once inflated
        # Targets are separate pods: a cookie one sets must not reach another.
        cookie_jar=aiohttp.DummyCookieJar(),
        # scrape() bounds each whole exchange with one asyncio.timeout; aiohttp's
        # default timers (300 s total, 30 s connect) would add timer handles per
        # request and never fire first.
        timeout=aiohttp.ClientTimeout(),
    )


class ExporterScraper:
    """Scrapes exporters; create inside a running loop, ``await close()`` at the end."""

    def __init__(self, limits: ScrapeLimits,
                 observe: Callable[[float], None] | None = None) -> None:
        """``observe(seconds)`` gets the duration of each request made, from the moment a
        slot was free (the wait for a slot is the scraper's, not the exporter's)."""
        self.limits = limits
        self._observe = observe
        self._session = client_session(limits.concurrency)
        self._slots = asyncio.Semaphore(limits.concurrency)

    async def close(self) -> None:
        """Close pooled connections."""
        await self._session.close()

    async def scrape(self, target: Target, etag: str | None = None) -> ScrapeResult:
        """GET the target's URL once.

        Args:
            target: where to scrape; its interval caps the timeout at 90% of it.
            etag: the ETag of the last status seen, sent as ``If-None-Match``.

        Returns:
            :class:`Fresh`, :class:`NotModified`, :class:`NothingYet`, a
            :class:`Failure`, or :class:`Busy` when no slot came free within the
            scrape timeout; this method raises nothing but cancellation.
        """
        timeout = min(self.limits.timeout, target.interval * 0.9)
        headers = {"Accept": ACCEPT, "Accept-Encoding": "identity"}
        if etag:
            headers["If-None-Match"] = etag
        try:
            # The wait for a slot is bounded too: hung exporters holding every slot
            # must not stall the other targets' runs without end.
            async with asyncio.timeout(timeout):
                await self._slots.acquire()
        except TimeoutError:
            return Busy()
        started = time.monotonic()
        try:
            return await self._scrape(target.url, headers, timeout)
        finally:
            self._slots.release()
            if self._observe is not None:
                self._observe(time.monotonic() - started)

    async def _scrape(self, url: str, headers: dict[str, str], limit: float) -> ScrapeResult:
        """One GET (retried once on a stale pooled connection) within ``limit`` seconds."""
        try:
            async with asyncio.timeout(limit):
                try:
                    return await self._get(url, headers)
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                    if isinstance(exc, aiohttp.ClientConnectorError):
                        raise
                    # A pooled keep-alive connection the exporter closed while idle:
                    # not the exporter's fault, so try once more on a fresh one.
                    return await self._get(url, headers)
        except TimeoutError:
            return Failure(FailureKind.TIMEOUT, f"no complete answer within {limit:g}s")
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, ConnectionRefusedError):
                return Failure(FailureKind.REFUSED, "connection refused")
            return Failure(FailureKind.UNREACHABLE, f"cannot connect: {exc.os_error}")
        except (aiohttp.ClientError, OSError) as exc:
            return Failure(FailureKind.HTTP_ERROR, f"{type(exc).__name__}: {excerpt(str(exc))}")

    async def _get(self, url: str, headers: dict[str, str]) -> ScrapeResult:
        async with self._session.get(url, headers=headers, allow_redirects=False) as resp:
            if resp.status == 304:
                return NotModified()
            if resp.status == 204:
                return NothingYet()
            if 300 <= resp.status < 400:
                where = excerpt(resp.headers.get("Location", "?"))
                return Failure(FailureKind.REDIRECT,
                               f"HTTP {resp.status} redirect to {where} (not followed)")
            if resp.status != 200:
                return Failure(FailureKind.HTTP_ERROR, f"HTTP {resp.status}")
            cap = self.limits.max_body_bytes
            if resp.content_length is not None and resp.content_length > cap:
                return Failure(FailureKind.TOO_LARGE,
                               f"body of {resp.content_length} bytes exceeds the {cap}-byte cap")
            body = bytearray()
            while chunk := await resp.content.read(min(65536, cap + 1 - len(body))):
                body += chunk
                if len(body) > cap:
                    return Failure(FailureKind.TOO_LARGE, f"body exceeds the {cap}-byte cap")
            etag = resp.headers.get("ETag")
            ctype = resp.content_type
        if ctype == "application/json":
            try:
                return Fresh(TrainerStatus.from_json(bytes(body)), etag)
            except StatusError as exc:
                return Failure(FailureKind.INVALID, f"invalid trainerStatus JSON: {exc}"[:1000])
        return parse_text(bytes(body), etag)


def parse_text(body: bytes, etag: str | None = None) -> ScrapeResult:
    """Build a status from the Prometheus text series of docs/metrics.md.

    ``trainjob_progress_ratio`` (0..1) becomes ``progressPercentage`` (rounded),
    ``trainjob_estimated_remaining_seconds`` ``estimatedRemainingSeconds``
    (rounded), ``trainjob_last_update_timestamp_seconds`` ``lastUpdatedTime``,
    ``trainjob_metric{name}`` and ``trainjob_metric_info{name,value}`` the metrics.
    Without a ``trainjob_last_update_timestamp_seconds`` sample the job has not
    reported: :class:`NothingYet`.
    """
    try:
        text = body.decode("utf-8")
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError, TypeError, IndexError...
        return Failure(FailureKind.INVALID, f"not Prometheus text: {excerpt(str(exc))}")
    progress: float | None = None
    remaining: float | None = None
    updated: float | None = None
    metrics: dict[str, str] = {}
    for family in families:
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            if name == "trainjob_progress_ratio":
                progress = value
            elif name == "trainjob_estimated_remaining_seconds":
                remaining = value
            elif name == "trainjob_last_update_timestamp_seconds":
                updated = value
            elif name == "trainjob_metric" and "name" in labels:
                metrics[labels["name"]] = _number_text(value)
            elif name == "trainjob_metric_info" and "name" in labels and value == 1:
                metrics[labels["name"]] = labels.get("value", "")
    if updated is None:
        return NothingYet()
    try:
        if not all(math.isfinite(v) for v in (progress or 0.0, remaining or 0.0, updated)):
            raise StatusError(["a trainjob_* sample is NaN or infinite"])
        data = {
            "progress_percentage": None if progress is None else round(progress * 100),
            "estimated_remaining_seconds": None if remaining is None else round(remaining),
            "metrics": [{"name": k, "value": v} for k, v in metrics.items()],
            "last_updated_time": datetime.fromtimestamp(updated, UTC),
        }
        return Fresh(TrainerStatus.from_api(data), etag)
    except (StatusError, ValueError, OverflowError) as exc:
        return Failure(FailureKind.INVALID, f"invalid trainjob_* series: {exc}"[:1000])


#: Longest excerpt (characters) of text an exporter chose (a header, a parser's quote of
#: its body) in a failure's detail.
EXCERPT_MAX = 64


def excerpt(text: str, limit: int = EXCERPT_MAX) -> str:
    """A short printable-ASCII prefix of ``text`` an exporter sent (others become ``?``)."""
    clean = "".join(c if " " <= c <= "~" else "?" for c in text[:limit + 1])
    return clean if len(clean) <= limit else clean[:limit - 3] + "..."


def _number_text(value: float) -> str:
    """Whole floats as integers (``3.0`` -> ``3``), others as the shortest repr."""
    value = float(value)  # the parser gives ints for integral text
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return metric_value_text(value)

