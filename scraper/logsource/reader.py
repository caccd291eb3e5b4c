"""Bounded reads of a trainer container's log through the pods/log API.

One read per scrape, ``GET /api/v1/namespaces/{ns}/pods/{pod}/log`` with

* ``timestamps=true``: each entry's time, so ``lastUpdatedTime`` is when the line was
  printed and the next read can start there;
* ``sinceTime``: the newest timestamp read so far, in whole seconds (``metav1.Time``
  keeps no more): bytes already read are not read again, except the last second's
  (and the rest of a line whose entries the kubelet sends behind one timestamp);
  what was applied before is found by its bytes and not applied again
  (:mod:`.cursor`);
* ``tailLines`` and ``limitBytes``: at most that many entries and bytes.  The API
  server cuts at ``limitBytes`` from the *start* of the tail, which would drop the
  newest bytes; an answer that reached ``limitBytes`` is read again with a tail that
  fits (:data:`FIT_TAIL_LINES` of the runtime's 16 KiB entries), so a scrape costs at
  most two reads of ``limitBytes`` each, whatever the training prints.

Reads take a token from their own bucket (``--log-qps``/``--log-burst``), separate from
the status writes' budget.  A container that has terminated keeps its log (the kubelet
serves it until the pod is deleted): its final status is read from the last lines
(:meth:`LogScraper.final`), where the last redraw counts as complete.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiolimiter import AsyncLimiter
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from exporter_lib.status import StatusError, TrainerStatus
from scraper.kube.calls import call
from scraper.kube.client import request_timeout
from scraper.logsource.progress import LogProgress
from scraper.shared.scrapes import Failure, FailureKind, Fresh, NothingYet, ScrapeResult
from scraper.shared.targets import SOURCE_AUTO, Final, Target

log = logging.getLogger(__name__)

#: containerd's and CRI-O's default longest log entry (bytes of content).
RUNTIME_ENTRY_BYTES = 16 * 1024
#: One entry as the API server sends it: its content, a 30-byte timestamp, space, newline.
_ENTRY_BYTES = RUNTIME_ENTRY_BYTES + 32
_TS = re.compile(rb"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d{1,9})?Z ")


@dataclass(frozen=True)
class LogLimits:
    """Bounds of the log reads (see the module docstring).

    ``limit_bytes``: bytes one read may return (>= one runtime entry);
    ``tail_lines``: entries one read may return; ``qps``/``burst``: the reads' token
    bucket; ``timeout``: seconds one read may take.
    """

    limit_bytes: int = 64 * 1024
    tail_lines: int = 200
    qps: float = 10.0
    burst: int = 20
    timeout: float = 10.0

    @property
    def fit_tail_lines(self) -> int:
        """Entries that always fit in ``limit_bytes``, however long each is."""
        return max(1, self.limit_bytes // _ENTRY_BYTES)


@dataclass
class _LogState:
    progress: LogProgress = field(default_factory=LogProgress)
    since: str | None = None  # sinceTime of the next read (RFC 3339, whole seconds)


class LogScraper:
    """Turns a target's container log into a TrainerStatus, one bounded read per scrape.

    Args:
        api: the scraper's Kubernetes client (needs ``get`` on ``pods/log``).
        limits: the read bounds.
        on_read: called with ``(result, bytes)`` per read; ``result`` is ``ok``,
            ``cut`` (reached ``limitBytes``), ``forbidden`` or ``error``.
        on_parse_failure: called when what was read gave a status that breaks a
            Trainer API limit (nothing is written then).
    """

    def __init__(self, api: k8s.ApiClient, limits: LogLimits, *,
                 on_read: Callable[[str, int], None] = lambda result, size: None,
                 on_parse_failure: Callable[[], None] = lambda: None) -> None:
        self.api = api
        self.limits = limits
        self._limiter = AsyncLimiter(limits.burst, limits.burst / limits.qps)
        self._states: dict[str, _LogState] = {}
        self._on_read = on_read
        self._on_parse_failure = on_parse_failure

    def sizes(self) -> dict[str, int]:
        """Entries of each map kept per pod: read positions."""
        return {"states": len(self._states)}

    def forget(self, target: Target) -> None:
        """Drop what was read of ``target``'s pod."""
        self._states.pop(target.pod_uid, None)

    async def scrape(self, target: Target, etag: str | None = None) -> ScrapeResult:
        """Read the newest part of the log of ``target.container``; never raises."""
        state = self._states.setdefault(target.pod_uid, _LogState())
        return await self._read(state, target.namespace, target.pod_name,
                                target.log_container, ended=False)

    async def final(self, namespace: str, pod: str, pod_uid: str,
                    container: str) -> TrainerStatus | None:
        """The status the last lines of a terminated container give, or None."""
        state = self._states.pop(pod_uid, None) or _LogState()
        result = await self._read(state, namespace, pod, container, ended=True)
        return result.status if isinstance(result, Fresh) else None

    async def final_of(self, final: Final, answered: bool) -> TrainerStatus | None:
        """The final status of an ended pod from its log (:meth:`final`), given whether
        its exporter ever answered: for an ``auto`` source that did, None (the exporter's
        last status stands)."""
        if final.source == SOURCE_AUTO and answered:
            return None
        return await self.final(final.namespace, final.pod_name, final.pod_uid,
                                final.log_container)

    async def _read(self, state: _LogState, namespace: str, pod: str, container: str, *,
                    ended: bool) -> ScrapeResult:
        limits = self.limits
        try:
            body = await self._get(namespace, pod, container, state.since, limits.tail_lines)
            cut = len(body) >= limits.limit_bytes
            self._on_read("cut" if cut else "ok", len(body))
            if cut:
                body = await self._get(namespace, pod, container, state.since,
                                       limits.fit_tail_lines)
                self._on_read("ok", len(body))
        except ApiException as exc:
            self._on_read("forbidden" if exc.status == 403 else "error", 0)
            return Failure(FailureKind.HTTP_ERROR,
                           f"reading the log of pod {pod} container {container}: "
                           f"{exc.status} {exc.reason}")
        except (OSError, TimeoutError, ValueError) as exc:
            self._on_read("error", 0)
            return Failure(FailureKind.TIMEOUT if isinstance(exc, TimeoutError)
                           else FailureKind.UNREACHABLE,
                           f"reading the log of pod {pod} container {container}: {exc!r}")
        newest = max((m.group(1) for m in _TS.finditer(body)), default=None)
        # The beginning of the log is a line start; a later read may begin mid-line.
        trust_first = (state.since is None and not cut
                       and body.count(b"\n") < limits.tail_lines)
        if newest is not None:
            state.since = newest.decode() + "Z"
        state.progress.read(body, ended=ended, from_start=trust_first)
        try:
            status = state.progress.status(ended=ended)
        except StatusError as exc:
            self._on_parse_failure()
            return Failure(FailureKind.INVALID, f"log of pod {pod}: {exc}")
        return NothingYet() if status is None else Fresh(status, etag=None)

    async def _get(self, namespace: str, pod: str, container: str, since: str | None,
                   tail: int) -> bytes:
        query: list[tuple[str, Any]] = [
            ("container", container), ("timestamps", "true"), ("tailLines", tail),
            ("limitBytes", self.limits.limit_bytes)]
        if since is not None:
            query.append(("sinceTime", since))
        return await call(self._request, namespace, pod, query, limiter=self._limiter,
                          deadline=self.limits.timeout)

    def _request(self, namespace: str, pod: str, query: list[tuple[str, Any]]) -> bytes:
        response = self.api.call_api(
            "/api/v1/namespaces/{namespace}/pods/{name}/log", "GET",
            path_params={"namespace": namespace, "name": pod}, query_params=query,
            header_params={"Accept": "*/*"}, auth_settings=["BearerToken"],
            _preload_content=False, _return_http_data_only=True,
            _request_timeout=request_timeout(self.limits.timeout))
        try:
            # The server stops at limitBytes; one more entry's worth guards a server that
            # does not (the read stays bounded either way).
            return bytes(response.read(self.limits.limit_bytes + _ENTRY_BYTES))
        finally:
            response.release_conn()
