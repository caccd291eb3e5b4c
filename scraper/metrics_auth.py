"""Authentication and authorization of the scraper's own ``/metrics``, as Kubernetes
components do it.

The scraper's ``/metrics`` names every watched TrainJob, its pod and its metric
values, so it is not for any pod that reaches the port.  Like kube-controller-manager
and kube-scheduler with delegated authentication and authorization
(``k8s.io/apiserver/pkg/server/options``: ``DelegatingAuthenticationOptions``,
``DelegatingAuthorizationOptions``, ``--authorization-always-allow-paths``):

1. the request's ``Authorization: Bearer <token>`` is checked with a TokenReview
   (``authentication.k8s.io/v1``): who is it?  No token or a token the API server
   does not accept: 401.
2. that user is checked with a SubjectAccessReview (``authorization.k8s.io/v1``) for
   the non-resource URL of the request (``/metrics``) and its verb (the lowercase HTTP
   method, ``get``), as the API server's own authorizer names non-resource requests:
   not allowed, 403.  RBAC grants it with ``nonResourceURLs: ["/metrics"], verbs: ["get"]``.
3. ``/healthz`` and ``/readyz`` are always allowed (the kubelet's probes carry no token),
   and a path with no route gets its 404 without any review.

Each decision (allowed, unauthenticated, forbidden) is kept for ``ttl`` seconds in a
cache of at most ``size`` entries keyed by a SHA-256 of the token, the verb and the
path (the token itself is never stored), so Prometheus scraping every 15 s costs two
API calls per ``ttl``, not per scrape.  A failed review (API unreachable, timeout) is
never cached: the request is answered 503 and the next one asks again.  Concurrent
requests for one key share one review; at most :data:`MAX_REVIEWS_IN_FLIGHT` reviews
run at once, and a request that would need another is answered 429, so a flood of
made-up tokens cannot turn into a flood of API calls.

The API calls go through :class:`KubeReviewer` (the official client, run off the event
loop); anything with the :class:`Reviewer` shape can take its place.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from aiohttp import web
from cachetools import TTLCache
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry, Counter

from scraper.kube import calls as kube_calls
from scraper.kube.client import request_timeout

log = logging.getLogger(__name__)

#: Paths served without a token (the probes), as ``--authorization-always-allow-paths``.
ALWAYS_ALLOW_PATHS = frozenset({"/healthz", "/readyz"})
#: Deadline of one TokenReview or SubjectAccessReview call (seconds); below Prometheus'
#: default scrape timeout of 10 s, so a slow API server shows as a 503, not a timeout.
REVIEW_TIMEOUT_SECONDS = 5.0
#: Reviews (a TokenReview and its SubjectAccessReview) running at once, at most.
MAX_REVIEWS_IN_FLIGHT = 4
#: Longest bearer token looked at (bytes); ServiceAccount tokens are about 1 KiB.
MAX_TOKEN_BYTES = 8192

_REALM = 'Bearer realm="trainjob-scraper"'


class ReviewError(Exception):
    """A review could not be made (API unreachable, timeout, error answer)."""


@dataclass(frozen=True)
class User:
    """The identity a TokenReview returned (``status.user``)."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict, hash=False, compare=False)


class Reviewer(Protocol):
    """The two API calls behind a decision."""

    async def authenticate(self, token: str) -> User | None:
        """The token's user, or None if the API server does not accept the token.

        Raises:
            ReviewError: the TokenReview could not be made.
        """
        ...

    async def authorize(self, user: User, verb: str, path: str) -> tuple[bool, str]:
        """Whether ``user`` may ``verb`` the non-resource URL ``path``, and the reason.

        Raises:
            ReviewError: the SubjectAccessReview could not be made.
        """
        ...


class KubeReviewer:
    """TokenReview and SubjectAccessReview through the official client, off the loop.

    Args:
        api: the scraper's ApiClient; its identity needs ``create`` on ``tokenreviews``
            and ``subjectaccessreviews`` (the chart's ``-metrics-auth`` ClusterRole, the
            same grants as the built-in ``system:auth-delegator``).
        timeout: seconds each of the call's connect and read may take
            (:func:`scraper.kube.client.request_timeout`); the whole call is cut at twice
            that (:func:`scraper.kube.calls.deadline_of`) and counts as an error.
        on_call: called with (``"TokenReview"`` or ``"SubjectAccessReview"``, ``"ok"`` or
            ``"error"``) after every call, to count them.
    """

    def __init__(self, api: k8s.ApiClient, *, timeout: float = REVIEW_TIMEOUT_SECONDS,
                 on_call: Callable[[str, str], None] = lambda kind, result: None) -> None:
        self._authn = k8s.AuthenticationV1Api(api)
        self._authz = k8s.AuthorizationV1Api(api)
        self._timeout = request_timeout(timeout)
        self._on_call = on_call

    async def _call(self, kind: str, fn: Callable[[], Any]) -> dict[str, Any]:
        def call() -> dict[str, Any]:
            # _preload_content=False: the client logs every preloaded response body at
            # DEBUG, and a TokenReview's body echoes the token.
            response = fn()
            try:
                loaded = json.loads(response.data)
            finally:
                response.release_conn()
            return loaded if isinstance(loaded, dict) else {}

        try:
            result = await kube_calls.call(call, deadline=kube_calls.deadline_of(self._timeout))
        except Exception as exc:  # ApiException, urllib3 errors, timeouts, bad JSON
            self._on_call(kind, "error")
            status = getattr(exc, "status", None)
            reason = f" {getattr(exc, 'reason', '')}" if status else ""
            raise ReviewError(f"{kind} failed: {status or type(exc).__name__}{reason}"
                              ) from None  # the chained exception holds the request body
        self._on_call(kind, "ok")
        return result

    async def authenticate(self, token: str) -> User | None:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token}}
        review = await self._call("TokenReview", lambda: self._authn.create_token_review(
            body, _request_timeout=self._timeout, _preload_content=False))
        status = review.get("status") or {}
        user = status.get("user") or {}
        if status.get("authenticated") is not True or not user.get("username"):
            return None
        return User(username=str(user["username"]), uid=str(user.get("uid") or ""),
                    groups=tuple(str(g) for g in user.get("groups") or ()),
                    extra={str(k): [str(x) for x in v]
                           for k, v in (user.get("extra") or {}).items()})

    async def authorize(self, user: User, verb: str, path: str) -> tuple[bool, str]:
        spec: dict[str, Any] = {"user": user.username,
                                "nonResourceAttributes": {"path": path, "verb": verb}}
        if user.uid:
            spec["uid"] = user.uid
        if user.groups:
            spec["groups"] = list(user.groups)
        if user.extra:
            spec["extra"] = user.extra
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": spec}
        review = await self._call(
            "SubjectAccessReview", lambda: self._authz.create_subject_access_review(
                body, _request_timeout=self._timeout, _preload_content=False))
        status = review.get("status") or {}
        return status.get("allowed") is True, str(status.get("reason") or "")


class Decision(Enum):
    """What a request to a guarded path gets; the value is the HTTP status."""

    ALLOWED = 200
    UNAUTHENTICATED = 401
    FORBIDDEN = 403
    THROTTLED = 429
    UNAVAILABLE = 503


@dataclass(frozen=True)
class _Review:
    """What a request's token review decided, for whom, and why (cached per token)."""

    decision: Decision
    username: str = ""
    detail: str = ""


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class MetricsAuth:
    """The decision for each request, cached, plus an aiohttp middleware applying it.

    Args:
        reviewer: makes the TokenReview and SubjectAccessReview calls.
        ttl: seconds a decision is reused (> 0).
        size: decisions kept at most (>= 1); the least recently used goes first.
        registry: where ``trainjob_scraper_metrics_auth_requests_total`` is registered.
        open_paths: paths served without a token.
        clock: monotonic seconds (tests may pass their own).
    """

    def __init__(self, reviewer: Reviewer, *, ttl: float, size: int,
                 registry: CollectorRegistry | None = None,
                 open_paths: Iterable[str] = ALWAYS_ALLOW_PATHS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if ttl <= 0 or size < 1:
            raise ValueError(f"ttl must be > 0 (got {ttl}) and size >= 1 (got {size})")
        self._reviewer = reviewer
        self._cache: TTLCache[str, _Review] = TTLCache(maxsize=size, ttl=ttl, timer=clock)
        self._pending: dict[str, asyncio.Future[_Review]] = {}
        self._slots = MAX_REVIEWS_IN_FLIGHT
        self.open_paths = frozenset(open_paths)
        self.requests = Counter(
            "trainjob_scraper_metrics_auth_requests_total",
            "Requests to the scraper's guarded paths (/metrics) by decision and whether "
            "the decision came without an API call (cache, or a review shared with a "
            "concurrent request)", ["decision", "cached"], registry=registry)

    async def decide(self, authorization: str | None, verb: str, path: str) -> _Review:
        """The decision for one request with this ``Authorization`` header value."""
        token = _bearer_token(authorization)
        if token is None:
            return self._count(_Review(Decision.UNAUTHENTICATED,
                                        detail="no bearer token"), cached=False)
        key = hashlib.sha256(b"\0".join(
            (token.encode(), verb.encode(), path.encode()))).hexdigest()
        cached = self._cache.get(key)
        if cached is not None:
            return self._count(cached, cached=True)
        pending = self._pending.get(key)
        if pending is not None:  # the same token's review is under way: share it
            return self._count(await asyncio.shield(pending), cached=True)
        if self._slots <= 0:
            return self._count(_Review(Decision.THROTTLED,
                                        detail="too many reviews in flight"), cached=False)
        self._slots -= 1
        future: asyncio.Future[_Review] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            verdict = await self._review(token, verb, path)
            if verdict.decision is not Decision.UNAVAILABLE:
                self._cache[key] = verdict
            future.set_result(verdict)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: nobody else may be waiting
            raise
        finally:
            self._slots += 1
            del self._pending[key]
        return self._count(verdict, cached=False)

    async def _review(self, token: str, verb: str, path: str) -> _Review:
        try:
            user = await self._reviewer.authenticate(token)
            if user is None:
                return _Review(Decision.UNAUTHENTICATED, detail="token not accepted")
            allowed, reason = await self._reviewer.authorize(user, verb, path)
        except ReviewError as exc:
            log.warning("cannot review a request to %s: %s", path, exc)
            return _Review(Decision.UNAVAILABLE, detail=str(exc))
        if not allowed:
            return _Review(Decision.FORBIDDEN, user.username, reason)
        return _Review(Decision.ALLOWED, user.username)

    def _count(self, verdict: _Review, *, cached: bool) -> _Review:
        self.requests.labels(verdict.decision.name.lower(), str(cached).lower()).inc()
        return verdict

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """aiohttp middleware: guarded paths need an allowed bearer token."""
        if request.path in self.open_paths or request.match_info.http_exception is not None:
            return await handler(request)
        verb, path = request.method.lower(), request.path
        verdict = await self.decide(request.headers.get("Authorization"), verb, path)
        if verdict.decision is Decision.ALLOWED:
            return await handler(request)
        return _refusal(verdict, verb, path)


def metrics_auth_for(api: k8s.ApiClient, *, ttl: float, size: int,
                     registry: CollectorRegistry | None = None) -> MetricsAuth:
    """A :class:`MetricsAuth` reviewing through ``api`` with a :class:`KubeReviewer`.

    Also registers ``trainjob_scraper_metrics_auth_reviews_total{kind, result}``: the
    review API calls made (``kind`` TokenReview or SubjectAccessReview, ``result`` ok
    or error).
    """
    reviews = Counter(
        "trainjob_scraper_metrics_auth_reviews_total",
        "TokenReview and SubjectAccessReview calls made for the scraper's guarded paths, "
        "by kind and result (ok, error)", ["kind", "result"], registry=registry)
    reviewer = KubeReviewer(api, on_call=lambda kind, result: reviews.labels(kind, result).inc())
    return MetricsAuth(reviewer, ttl=ttl, size=size, registry=registry)


def _bearer_token(header: str | None) -> str | None:
    if not header or len(header) > MAX_TOKEN_BYTES:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def _refusal(verdict: _Review, verb: str, path: str) -> web.Response:
    decision = verdict.decision
    if decision is Decision.UNAUTHENTICATED:
        # As the API server answers; the detail says which of the two it was.
        return web.Response(status=401, headers={"WWW-Authenticate": _REALM},
                            text=f"Unauthorized: {verdict.detail}; send "
                            "'Authorization: Bearer <token>' of an identity allowed to "
                            f"{verb} {path} (see docs/operator-guide.md)\n")
    if decision is Decision.FORBIDDEN:
        # The API server's wording for a denied non-resource request.
        reason = f": {verdict.detail}" if verdict.detail else ""
        return web.Response(status=403, text=f'Forbidden: user "{verdict.username}" cannot '
                            f'{verb} path "{path}"{reason}\n')
    if decision is Decision.THROTTLED:
        return web.Response(status=429, headers={"Retry-After": "1"},
                            text="Too many requests: token reviews are busy, retry\n")
    return web.Response(status=503, headers={"Retry-After": "5"},
                        text=f"Service unavailable: cannot review the token now "
                        f"({verdict.detail})\n")
