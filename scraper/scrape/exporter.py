"""Scraping one exporter over HTTP: a target in, a validated status or a typed failure out.

Knows the exporter's wire contract (docs/architecture.md) and nothing of the
Kubernetes API.  One keep-alive pool (:class:`scraper.scrape.http_exchange.ConnectionPool`,
the scrape's own lean HTTP/1.1 client) serves every target; each scrape
has a timeout, a body-size cap, never follows redirects and waits for a slot under a
concurrency cap.

Slots come in two lanes (docs/decisions.md, "Hung exporters get a lane of their
own").  A target whose
last :data:`HUNG_AFTER` scrapes timed out is *hung*: its scrapes take a slot of the
small hung lane (:func:`hung_slots` of ``concurrency``) and never wait for one (a
full lane skips the run at once), so however many exporters of one namespace
hang, they hold at most that lane and the other targets keep every regular slot.
Any answer moves the target back.  In the hung lane no namespace holds more than
half of the slots while another namespace waits for one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client.parser import text_string_to_metric_families

from exporter_lib.hold_policy import WRITE_POLICY_HEADER
from exporter_lib.pod import POD_HEADER, PodIdentity, hostname_label
from exporter_lib.status import StatusError, TrainerStatus, metric_value_text
from scraper.scrape.http_exchange import (
    BadAnswer,
    BodyTooLarge,
    ConnectFailed,
    ConnectionPool,
    Endpoint,
    Response,
    StaleConnection,
    endpoint,
)
from scraper.shared.scrapes import (
    Busy,
    Failure,
    FailureKind,
    Fresh,
    NothingYet,
    NotModified,
    ScrapeResult,
    WrongPod,
)
from scraper.shared.sequence import SEQUENCE_HEADER, Sequence, sequence_of
from scraper.shared.targets import Target

#: JSON first; the Prometheus text format is the fallback any exporter can serve.
ACCEPT = "application/json, text/plain;version=0.0.4;q=0.5, */*;q=0.1"
USER_AGENT = "trainjob-scraper/0.1"
#: The request headers of a scrape without an ETag (never mutated).
HEADERS = {"Accept": ACCEPT, "Accept-Encoding": "identity"}


def wrong_pod(target: Target, stated: PodIdentity | None) -> WrongPod | None:
    """Compare what the exporter states (:data:`~exporter_lib.pod.POD_HEADER`) with the
    pod the target was made from; ``None`` when every stated part agrees.

    An exporter that states nothing (a third-party exporter, an older exporter_lib) is
    accepted: it cannot be checked (docs/scraper.md, "Which pod answers").  The UID,
    name and namespace are compared when stated (downward API); the hostname with the
    one the kubelet gives the target's pod, first DNS label only (``setHostnameAsFQDN``).
    """
    if stated is None:
        return None
    for reason, said, meant in _compared(target, stated):
        if said != meant:
            return WrongPod(reason, f"the answer at {target.url} is from pod {reason} "
                            f"{excerpt(said)}, not {meant}: the pod IP was reused")
    return None


def names_the_pod(target: Target, stated: PodIdentity | None) -> bool:
    """Whether ``stated`` (already found to agree, :func:`wrong_pod`) names the target's
    pod by parts that were compared: its UID, or its name or hostname together with its
    namespace.  A name or hostname alone does not: pod names and JobSet hostnames
    (``<trainjob>-node-0-0``) repeat across namespaces.  Nor does a namespace alone, or a
    hostname where the target's is unknown (a ``hostNetwork`` pod's containers have the
    node's).  Such an answer is treated as one that states no pod (checked at a shared
    address, its pod read before the write)."""
    if stated is None:
        return False
    parts = {part for part, _, _ in _compared(target, stated)}
    return "uid" in parts or ("namespace" in parts and not parts.isdisjoint(_NAMING))


#: The parts that name one pod within its namespace.
_NAMING = frozenset({"name", "hostname"})


def _compared(target: Target, stated: PodIdentity) -> list[tuple[str, str, str]]:
    """The parts of ``stated`` the scraper can compare, each as ``(part, stated, the
    target's)``: both sides known; the hostname as its first DNS label."""
    parts = (("uid", stated.uid, target.pod_uid), ("name", stated.name, target.pod_name),
             ("namespace", stated.namespace, target.namespace),
             ("hostname", None if stated.hostname is None else hostname_label(stated.hostname),
              target.hostname or None))
    return [(part, said, meant) for part, said, meant in parts
            if said is not None and meant is not None]


@dataclass(frozen=True)
class ScrapeLimits:
    """Bounds of one scrape: ``timeout`` seconds, ``max_body_bytes`` bytes."""

    timeout: float = 10.0
    max_body_bytes: int = 1 << 20
    concurrency: int = 32


#: The exporter's contract header (docs/architecture.md, "Wire contract").
CONTRACT_HEADER = "Trainjob-Exporter-Contract"
#: Longest wait asked for (seconds), whatever an exporter advertises.
WAIT_MAX_SECONDS = 300.0
#: The first contract version whose held scrapes follow the stated write policy.
POLICY_CONTRACT = 3
_CONTRACT = re.compile(r"^\s*(\d+)\s*;\s*max-wait\s*=\s*(\d{1,6})\s*$")


@functools.lru_cache(maxsize=256)  # an exporter sends the same header every time
def max_wait_of(header: str | None) -> float | None:
    """The seconds an exporter may hold a scrape, from ``Trainjob-Exporter-Contract:
    <version>;max-wait=<seconds>``; None without the header, below version 2, or when it
    is malformed (then the target is polled)."""
    match = _CONTRACT.match(header or "")
    if match is None or int(match.group(1)) < 2 or int(match.group(2)) < 1:
        return None
    return min(float(match.group(2)), WAIT_MAX_SECONDS)


@functools.lru_cache(maxsize=256)
def holds_by_policy(header: str | None) -> bool:
    """True when ``Trainjob-Exporter-Contract`` is at least :data:`POLICY_CONTRACT` (with a
    valid max-wait): the exporter answers a held scrape only for a change the stated
    write policy writes (:mod:`exporter_lib.hold_policy`)."""
    match = _CONTRACT.match(header or "")
    return (match is not None and int(match.group(1)) >= POLICY_CONTRACT
            and max_wait_of(header) is not None)


#: Consecutive timeouts after which a target's scrapes move to the hung lane.
HUNG_AFTER = 1
#: Targets remembered as timing out at most (a bound under pod churn; the oldest go).
TIMEOUTS_KEPT = 100_000


def hung_slots(concurrency: int) -> int:
    """Slots of the hung lane: a quarter of ``concurrency``, at least 1."""
    return max(1, concurrency // 4)


class HungLane:
    """The hung lane's slots: at most ``size`` at once, and a namespace at most half of
    them (at least 1) while scrapes of other namespaces are in the lane."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.in_use = 0
        self._per_namespace: dict[str, int] = {}

    def try_take(self, namespace: str) -> bool:
        """Take a slot now if the rules allow it; never waits."""
        if self.in_use >= self.size:
            return False
        mine = self._per_namespace.get(namespace, 0)
        others = self.in_use - mine
        if others and mine >= max(1, self.size // 2):
            return False
        self.in_use += 1
        self._per_namespace[namespace] = mine + 1
        return True

    def give(self, namespace: str) -> None:
        self.in_use -= 1
        left = self._per_namespace[namespace] - 1
        if left:
            self._per_namespace[namespace] = left
        else:
            del self._per_namespace[namespace]


class ExporterScraper:
    """Scrapes exporters; create inside a running loop, ``await close()`` at the end."""

    def __init__(self, limits: ScrapeLimits,
                 observe: Callable[[float], None] | None = None, *,
                 waiting: bool = False) -> None:
        """``observe(seconds)`` gets the duration of each request made, from the moment a
        slot was free (the wait for a slot is the scraper's, not the exporter's).

        ``waiting``: the caller turns an answer offering waiting scrapes into held
        requests (``--wait-scrapes``); the polled connection of such an answer is then
        closed rather than pooled, since the held requests have a pool of their own and
        it would sit idle until the keep-alive ends (two descriptors per target for up to
        two minutes after a start: 20,000 at 10,000 targets, the whole of a common limit).
        """
        self.limits = limits
        self._waiting = waiting
        self._observe = observe
        self._hung = HungLane(hung_slots(limits.concurrency))
        # The pool's cap covers both lanes.
        self._pool = ConnectionPool(limits.concurrency + self._hung.size)
        self._slots = asyncio.Semaphore(limits.concurrency)
        self._timeouts: dict[str, int] = {}  # target key -> consecutive timeouts
        # Held requests have their own pool: they sit idle by design and must take
        # neither a scrape slot nor a pooled connection the polled scrapes need.
        self._held_pool: ConnectionPool | None = None
        self.held = 0  # held requests in flight
        # Each target's URL parsed once, with its request's first lines built.
        self._ends: dict[str, Endpoint] = {}
        # Scrapes in flight per target key, and the targets forgotten meanwhile: what such
        # a scrape re-adds (its URL, its pooled connection) is let go when it ends.
        self._in_flight: dict[str, int] = {}
        self._gone: dict[str, Target] = {}

    def _endpoint(self, url: str) -> Endpoint:
        """Raises ValueError for a URL that is not ``http://host[:port]/path``."""
        where = self._ends.get(url)
        if where is None:
            if len(self._ends) >= TIMEOUTS_KEPT:  # a bound under pod churn: the oldest go
                del self._ends[next(iter(self._ends))]
            where = self._ends[url] = endpoint(url, USER_AGENT)
        return where

    def is_hung(self, key: str) -> bool:
        """Whether the target's scrapes go to the hung lane."""
        return self._timeouts.get(key, 0) >= HUNG_AFTER

    def _note(self, key: str, result: ScrapeResult) -> None:
        if isinstance(result, Failure) and result.kind is FailureKind.TIMEOUT:
            self._timeouts[key] = self._timeouts.pop(key, 0) + 1
            if len(self._timeouts) > TIMEOUTS_KEPT:
                del self._timeouts[next(iter(self._timeouts))]
        elif not isinstance(result, Busy):
            self._timeouts.pop(key, None)

    def sizes(self) -> dict[str, int]:
        """Entries of each map kept per target: timeout counts, parsed URLs, idle pooled
        connections (both pools)."""
        held = self._held_pool.idle_count() if self._held_pool is not None else 0
        return {"timeouts": len(self._timeouts), "endpoints": len(self._ends),
                "in_flight": len(self._in_flight), "gone": len(self._gone),
                "idle_connections": self._pool.idle_count() + held}

    def forget(self, target: Target) -> None:
        """Drop what is kept for a target that is gone (its pod deleted, ended or moved):
        its timeout count and its idle keep-alive connections in both pools.

        Without this, every deleted pod left its idle connection pooled until the
        keep-alive ended (120 s), since the pool's cap counts only connections in use:
        under pod churn thousands of sockets, parsers and buffers to gone pods stayed
        open.
        """
        if target.key in self._in_flight:
            self._gone[target.key] = target
        self._timeouts.pop(target.key, None)
        where = self._ends.pop(target.url, None)
        if where is None:
            try:
                where = endpoint(target.url, USER_AGENT)
            except ValueError:
                return
        for pool in (self._pool, self._held_pool):
            if pool is not None:
                pool.close_idle(where.host, where.port)

    async def close(self) -> None:
        """Close pooled connections."""
        await self._pool.close()
        if self._held_pool is not None:
            await self._held_pool.close()

    async def wait_for_change(self, target: Target, etag: str | None,
                              wait: float, policy: str | None = None) -> ScrapeResult:
        """A waiting scrape: GET with ``If-None-Match: etag`` and ``Prefer: wait=<wait>``
        (RFC 7240), which an exporter of contract 2 holds until its status changes or
        ``wait`` seconds pass.  ``policy``: the
        :data:`~exporter_lib.hold_policy.WRITE_POLICY_HEADER` value; an exporter of
        contract 3 then answers only for a change it says will be written.

        Takes no scrape slot (a held request is not a hung exporter); bounded by
        ``wait`` plus the scrape timeout.  The caller keeps one per target.  Returns as
        :meth:`scrape` does (never :class:`Busy`); raises nothing but cancellation.
        """
        if self._held_pool is None:
            self._held_pool = ConnectionPool(0)
        limit = wait + min(self.limits.timeout, target.interval * 0.9)
        headers = {**HEADERS, "Prefer": f"wait={int(wait)}"}
        if etag:
            headers["If-None-Match"] = etag
            if policy:
                headers[WRITE_POLICY_HEADER] = policy
        self.held += 1
        try:
            with self._tracked(target):
                return await self._scrape(target, headers, limit, self._held_pool)
        finally:
            self.held -= 1

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
        with self._tracked(target):
            return await self._slotted(target, etag)

    async def _slotted(self, target: Target, etag: str | None = None) -> ScrapeResult:
        """One GET within a scrape slot (or the hung lane)."""
        timeout = min(self.limits.timeout, target.interval * 0.9)
        headers = {**HEADERS, "If-None-Match": etag} if etag else HEADERS
        if self.is_hung(target.key):
            return await self._scrape_hung(target, headers, timeout)
        if not self._slots.locked():
            await self._slots.acquire()  # a free slot: taken at once, no timer needed
        else:
            try:
                # The wait for a slot is bounded too: hung exporters holding every slot
                # must not stall the other targets' runs without end.
                async with asyncio.timeout(timeout):
                    await self._slots.acquire()
            except TimeoutError:
                return Busy()
        started = time.monotonic()
        try:
            result = await self._scrape(target, headers, timeout)
        finally:
            self._slots.release()
            if self._observe is not None:
                self._observe(time.monotonic() - started)
        return result

    async def _scrape_hung(self, target: Target, headers: dict[str, str],
                           limit: float) -> ScrapeResult:
        """A scrape of a hung target in the hung lane; :class:`Busy` at once when full."""
        if not self._hung.try_take(target.namespace):
            return Busy()
        started = time.monotonic()
        try:
            result = await self._scrape(target, headers, limit)
        finally:
            self._hung.give(target.namespace)
            if self._observe is not None:
                self._observe(time.monotonic() - started)
        return result

    async def _scrape(self, target: Target, headers: dict[str, str], limit: float,
                      pool: ConnectionPool | None = None) -> ScrapeResult:
        """One GET (retried once on a stale pooled connection) within ``limit`` seconds."""
        result = await self._scrape_once(target, headers, limit, pool)
        self._note(target.key, result)
        return result

    @contextlib.contextmanager
    def _tracked(self, target: Target) -> Iterator[None]:
        """Count a scrape of ``target`` in flight (from before it waits for a slot); a
        target forgotten meanwhile is forgotten again once its last scrape ends, so what
        such a scrape added back (its parsed URL, its pooled connection, a timeout count)
        does not outlive the pod."""
        self._in_flight[target.key] = self._in_flight.get(target.key, 0) + 1
        try:
            yield
        finally:
            left = self._in_flight.pop(target.key) - 1
            if left:
                self._in_flight[target.key] = left
            elif (gone := self._gone.pop(target.key, None)) is not None:
                self.forget(gone)

    async def _scrape_once(self, target: Target, headers: dict[str, str], limit: float,
                           pool: ConnectionPool | None = None) -> ScrapeResult:
        pool = pool or self._pool
        try:
            where = self._endpoint(target.url)
            async with asyncio.timeout(limit):
                try:
                    return await self._exchange(target, where, headers, pool, fresh=False)
                except StaleConnection:
                    # A pooled keep-alive connection the exporter closed while idle:
                    # not the exporter's fault, so try once more on a fresh one.
                    return await self._exchange(target, where, headers, pool, fresh=True)
        except TimeoutError:
            return Failure(FailureKind.TIMEOUT, f"no complete answer within {limit:g}s")
        except ConnectFailed as exc:
            if exc.refused:
                return Failure(FailureKind.REFUSED, "connection refused")
            return Failure(FailureKind.UNREACHABLE, f"cannot connect: {exc.os_error}")
        except BodyTooLarge as exc:
            return Failure(FailureKind.TOO_LARGE, str(exc))
        except (BadAnswer, StaleConnection, ValueError, OSError) as exc:
            return Failure(FailureKind.HTTP_ERROR, f"{type(exc).__name__}: {excerpt(str(exc))}")

    async def _exchange(self, target: Target, where: Endpoint, headers: dict[str, str],
                        pool: ConnectionPool, *, fresh: bool) -> ScrapeResult:
        cap = self.limits.max_body_bytes
        resp = await pool.get(where, headers, cap, fresh=fresh)
        keep = True
        try:
            # Before anything of the answer is read: another pod's status, 304 or error
            # says nothing about this target.
            stated = PodIdentity.parse(resp.header(POD_HEADER))
            if other := wrong_pod(target, stated):
                return other
            contract = resp.header(CONTRACT_HEADER)
            max_wait = max_wait_of(contract)
            if max_wait is not None and self._waiting and pool is self._pool:
                # Held requests take over on their own pool (__init__): this connection
                # is closed, not left idle.
                keep = False
            answer = await self._answer(resp, max_wait, cap, holds_by_policy(contract))
            if not names_the_pod(target, stated) and isinstance(answer, Fresh):
                answer = dataclasses.replace(answer, identified=False)
            return answer
        finally:
            # Pooled only when the answer ended cleanly (a cancelled or unread one closes).
            resp.release(keep)

    async def _answer(self, resp: Response, max_wait: float | None,
                      cap: int, by_policy: bool = False) -> ScrapeResult:
        status = resp.status
        if status == 304:
            return NotModified(max_wait, by_policy)
        if status == 204:
            return NothingYet(max_wait, by_policy)
        if 300 <= status < 400:
            where = excerpt(resp.header("Location") or "?")
            return Failure(FailureKind.REDIRECT,
                           f"HTTP {status} redirect to {where} (not followed)")
        if status != 200:
            return Failure(FailureKind.HTTP_ERROR, f"HTTP {status}")
        length = resp.content_length
        if length is not None and length > cap:
            return Failure(FailureKind.TOO_LARGE,
                           f"body of {length} bytes exceeds the {cap}-byte cap")
        body = await resp.read()  # BodyTooLarge past the cap
        etag = resp.header("ETag")
        sequence = sequence_of(resp.header(SEQUENCE_HEADER))
        if resp.content_type == "application/json":
            try:
                return Fresh(TrainerStatus.from_json(body), etag, max_wait, sequence,
                             by_policy)
            except StatusError as exc:
                return Failure(FailureKind.INVALID, f"invalid trainerStatus JSON: {exc}"[:1000])
        return parse_text(body, etag, sequence)


def parse_text(body: bytes, etag: str | None = None,
               sequence: Sequence | None = None) -> ScrapeResult:
    """Build a status from the Prometheus text series of docs/metrics.md.

    ``trainjob_progress_ratio`` (0..1) becomes ``progressPercentage`` (rounded),
    ``trainjob_estimated_remaining_seconds`` ``estimatedRemainingSeconds``
    (rounded), ``trainjob_last_update_timestamp_seconds`` ``lastUpdatedTime``,
    ``trainjob_last_checkpoint_timestamp_seconds`` ``lastCheckpointTime`` (when present),
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
    checkpoint: float | None = None
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
            elif name == "trainjob_last_checkpoint_timestamp_seconds":
                checkpoint = value
            elif name == "trainjob_metric" and "name" in labels:
                metrics[labels["name"]] = _number_text(value)
            elif name == "trainjob_metric_info" and "name" in labels and value == 1:
                metrics[labels["name"]] = labels.get("value", "")
    if updated is None:
        return NothingYet()
    try:
        if not all(math.isfinite(v) for v in (progress or 0.0, remaining or 0.0, updated,
                                              checkpoint or 0.0)):
            raise StatusError(["a trainjob_* sample is NaN or infinite"])
        data = {
            "progress_percentage": None if progress is None else round(progress * 100),
            "estimated_remaining_seconds": None if remaining is None else round(remaining),
            "metrics": [{"name": k, "value": v} for k, v in metrics.items()],
            "last_updated_time": datetime.fromtimestamp(updated, UTC),
            "last_checkpoint_time": (None if checkpoint is None
                                     else datetime.fromtimestamp(checkpoint, UTC)),
        }
        return Fresh(TrainerStatus.from_api(data), etag, sequence=sequence)
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

