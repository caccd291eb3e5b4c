"""The scraper's /metrics behind TokenReview and SubjectAccessReview.

End-to-end tests run the real scraper (``python -m scraper run --metrics-auth``)
against the session's kube-apiserver; the tokens are TokenRequest tokens of real
ServiceAccounts, and RBAC decides (a ClusterRole with ``nonResourceURLs: ["/metrics"]``,
as the chart ships).  API calls are counted by the scraper's own
``trainjob_scraper_metrics_auth_reviews_total`` series.

The unit tests at the end drive :class:`MetricsAuth` with an in-process reviewer
(the Protocol neighbour of the class) to pin the cache bound, the sharing of
concurrent reviews and the in-flight cap, which the API server cannot be made to
show deterministically.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import urllib3
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client
from prometheus_client import CollectorRegistry

from localdev.cluster.controlplane import ControlPlane
from scraper.config import ConfigError, load_settings
from scraper.metrics_auth import (
    MAX_REVIEWS_IN_FLIGHT,
    Decision,
    MetricsAuth,
    ReviewError,
    User,
)
from tests.helpers.scraper import ScraperProcess, wait_for

pytestmark = pytest.mark.usefixtures("trainjob_crd")

READER_RULES = [client.V1PolicyRule(non_resource_ur_ls=["/metrics"], verbs=["get"])]


def _get(scraper: ScraperProcess, path: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=1, read=10), retries=False)
    resp = http.request("GET", f"http://127.0.0.1:{scraper.port}{path}", headers=headers)
    return resp.status, resp.data.decode()


def _reviews(scraper: ScraperProcess, token: str, kind: str, result: str = "ok") -> float:
    """One ``trainjob_scraper_metrics_auth_reviews_total`` sample, read with ``token``."""
    status, text = _get(scraper, "/metrics", token)
    assert status == 200, text
    want = f'trainjob_scraper_metrics_auth_reviews_total{{kind="{kind}",result="{result}"}}'
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


class Identities:
    """ServiceAccounts in one namespace, with or without the /metrics reader grant."""

    def __init__(self, control_plane: ControlPlane, kube_api: client.ApiClient,
                 namespace: str) -> None:
        self.plane = control_plane
        self.rbac = client.RbacAuthorizationV1Api(kube_api)
        self.namespace = namespace
        self.role = f"metrics-reader-{secrets.token_hex(3)}"
        self.bindings: list[str] = []
        self.rbac.create_cluster_role(client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name=self.role), rules=READER_RULES))

    def token(self, name: str, *, reader: bool) -> str:
        token = self.plane.service_account_token(self.namespace, name)
        if reader:
            self.grant(name)
        return token

    def grant(self, name: str) -> str:
        binding = f"{self.role}-{name}"
        self.rbac.create_cluster_role_binding(client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=binding),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io",
                                      kind="ClusterRole", name=self.role),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=name,
                                           namespace=self.namespace)]))
        self.bindings.append(binding)
        return binding

    def revoke(self, binding: str) -> None:
        self.rbac.delete_cluster_role_binding(binding)
        self.bindings.remove(binding)

    def cleanup(self) -> None:
        for binding in list(self.bindings):
            self.revoke(binding)
        self.rbac.delete_cluster_role(self.role)


@pytest.fixture
def identities(control_plane: ControlPlane, kube_api: client.ApiClient,
               namespace: str) -> Iterator[Identities]:
    ids = Identities(control_plane, kube_api, namespace)
    try:
        yield ids
    finally:
        ids.cleanup()


def test_metrics_needs_a_token_allowed_by_rbac_and_probes_stay_open(
    scraper_factory: Callable[..., ScraperProcess], identities: Identities,
) -> None:
    scraper = scraper_factory("--metrics-auth", "--metrics-auth-cache-ttl=1m")
    allowed = identities.token("prometheus", reader=True)
    other = identities.token("some-pod", reader=False)

    status, body = _get(scraper, "/metrics", allowed)
    assert status == 200, body
    assert "trainjob_scraper_targets" in body

    status, body = _get(scraper, "/metrics")
    assert status == 401, body
    assert "no bearer token" in body

    status, body = _get(scraper, "/metrics", "not-a-token")
    assert status == 401, body
    assert "token not accepted" in body

    status, body = _get(scraper, "/metrics", other)
    assert status == 403, body
    user = f"system:serviceaccount:{identities.namespace}:some-pod"
    assert f'user "{user}" cannot get path "/metrics"' in body
    assert "trainjob_" not in body

    for probe in ("/healthz", "/readyz"):
        assert _get(scraper, probe)[0] == 200, probe
        assert _get(scraper, probe, "not-a-token")[0] == 200, probe
    # An unknown path is a 404, and costs no review.
    assert _get(scraper, "/nothing-here")[0] == 404

    log = scraper.log()
    assert allowed not in log and other not in log, "a token was logged"


def test_decisions_are_cached_for_the_ttl_then_asked_again(
    scraper_factory: Callable[..., ScraperProcess], identities: Identities,
) -> None:
    ttl = 3.0
    scraper = scraper_factory("--metrics-auth", f"--metrics-auth-cache-ttl={ttl}s")
    token = identities.token("prometheus", reader=True)

    started = time.monotonic()
    assert _get(scraper, "/metrics", token)[0] == 200  # one TokenReview + one SAR
    token_reviews = _reviews(scraper, token, "TokenReview")
    sars = _reviews(scraper, token, "SubjectAccessReview")
    assert (token_reviews, sars) == (1, 1)
    for _ in range(20):  # 20 scrapes within the TTL: no API call
        assert _get(scraper, "/metrics", token)[0] == 200
    assert time.monotonic() - started < ttl, "too slow to test within the TTL"
    assert _reviews(scraper, token, "TokenReview") == 1
    assert _reviews(scraper, token, "SubjectAccessReview") == 1

    time.sleep(ttl + 0.5)  # expired: the next request asks the API server again
    assert _reviews(scraper, token, "TokenReview") == 2
    assert _reviews(scraper, token, "SubjectAccessReview") == 2
    assert _reviews(scraper, token, "TokenReview", "error") == 0


def test_revoked_grant_is_refused_once_the_cached_decision_expires(
    scraper_factory: Callable[..., ScraperProcess], identities: Identities,
) -> None:
    ttl = 2.0
    scraper = scraper_factory("--metrics-auth", f"--metrics-auth-cache-ttl={ttl}s")
    token = identities.token("prometheus", reader=False)
    binding = identities.grant("prometheus")
    assert _get(scraper, "/metrics", token)[0] == 200
    identities.revoke(binding)
    # Within the TTL the cached decision holds (the documented revocation delay) ...
    assert _get(scraper, "/metrics", token)[0] == 200
    # ... after it, RBAC's answer is asked again.
    wait_for(lambda: _get(scraper, "/metrics", token)[0] == 403, ttl + 5,
             "403 after the grant was revoked and the decision expired")


def test_metrics_are_open_with_the_opt_out(
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    scraper = scraper_factory("--no-metrics-auth")
    assert _get(scraper, "/metrics")[0] == 200
    assert "metrics_auth=false" in scraper.log()


def test_scraper_without_review_rights_answers_503_and_keeps_asking(
    scraper_factory: Callable[..., ScraperProcess], control_plane: ControlPlane,
    identities: Identities, tmp_path: Any,
) -> None:
    """A scraper whose identity may not create TokenReviews refuses with 503, uncached."""
    plain = control_plane.service_account_token(identities.namespace, "scraper-no-rbac")
    kubeconfig = control_plane.kubeconfig_for_token(plain, tmp_path / "plain.kubeconfig")
    scraper = scraper_factory("--metrics-auth", kubeconfig=kubeconfig, ready=False)
    wait_for(lambda: _get(scraper, "/healthz")[0] == 200, 30, "scraper /healthz")
    token = identities.token("prometheus", reader=True)
    for _ in range(2):
        status, body = _get(scraper, "/metrics", token)
        assert status == 503, body
        assert "TokenReview failed: 403" in body
    assert "cannot review a request to /metrics: TokenReview failed: 403" in scraper.log()


# ---------------------------------------------------------------- unit: the decision cache


class CountingReviewer:
    """In-process :class:`Reviewer`: tokens ``ok-*`` may read, ``no-*`` may not."""

    def __init__(self, *, delay: float = 0.0, fail: bool = False) -> None:
        self.calls: list[str] = []
        self.delay = delay
        self.fail = fail

    async def authenticate(self, token: str) -> User | None:
        self.calls.append(f"authn {token}")
        await asyncio.sleep(self.delay)
        if self.fail:
            raise ReviewError("TokenReview failed: 503 Service Unavailable")
        return User(username=f"user-{token}") if token[:3] in ("ok-", "no-") else None

    async def authorize(self, user: User, verb: str, path: str) -> tuple[bool, str]:
        self.calls.append(f"authz {user.username} {verb} {path}")
        return user.username.startswith("user-ok-") and (verb, path) == ("get", "/metrics"), ""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _auth(reviewer: CountingReviewer, *, ttl: float = 60, size: int = 16,
          clock: Callable[[], float] = time.monotonic) -> MetricsAuth:
    return MetricsAuth(reviewer, ttl=ttl, size=size, registry=CollectorRegistry(), clock=clock)


def test_cache_is_bounded_in_size_and_time() -> None:
    async def scenario() -> None:
        reviewer, clock = CountingReviewer(), Clock()
        auth = _auth(reviewer, ttl=10, size=2, clock=clock)
        for token in ("ok-a", "ok-b", "ok-a", "ok-b"):
            assert (await auth.decide(f"Bearer {token}", "get", "/metrics")).decision \
                is Decision.ALLOWED
        assert len(reviewer.calls) == 4  # two tokens, reviewed once each
        await auth.decide("Bearer ok-c", "get", "/metrics")  # evicts the least recent (a)
        await auth.decide("Bearer ok-a", "get", "/metrics")
        assert len(reviewer.calls) == 8
        clock.now += 10.5  # every entry expired
        await auth.decide("Bearer ok-a", "get", "/metrics")
        assert len(reviewer.calls) == 10
        assert len(auth._cache) <= 2

    asyncio.run(scenario())


def test_denials_are_cached_failures_are_not() -> None:
    async def scenario() -> None:
        reviewer = CountingReviewer()
        auth = _auth(reviewer)
        for _ in range(3):
            assert (await auth.decide("Bearer no-x", "get", "/metrics")).decision \
                is Decision.FORBIDDEN
            assert (await auth.decide("Bearer bogus", "get", "/metrics")).decision \
                is Decision.UNAUTHENTICATED
        assert len(reviewer.calls) == 3  # authn+authz for no-x, authn for bogus
        failing = CountingReviewer(fail=True)
        auth = _auth(failing)
        for _ in range(3):
            assert (await auth.decide("Bearer ok-a", "get", "/metrics")).decision \
                is Decision.UNAVAILABLE
        assert len(failing.calls) == 3

    asyncio.run(scenario())


def test_concurrent_requests_share_one_review_and_reviews_in_flight_are_capped() -> None:
    async def scenario() -> None:
        reviewer = CountingReviewer(delay=0.2)
        auth = _auth(reviewer, size=1000)
        same = await asyncio.gather(*(auth.decide("Bearer ok-a", "get", "/metrics")
                                      for _ in range(50)))
        assert {v.decision for v in same} == {Decision.ALLOWED}
        assert len(reviewer.calls) == 2
        reviewer.calls.clear()
        flood = await asyncio.gather(*(auth.decide(f"Bearer ok-{i}", "get", "/metrics")
                                       for i in range(100)))
        decisions = [v.decision for v in flood]
        assert decisions.count(Decision.ALLOWED) == MAX_REVIEWS_IN_FLIGHT
        assert decisions.count(Decision.THROTTLED) == 100 - MAX_REVIEWS_IN_FLIGHT
        assert len(reviewer.calls) == 2 * MAX_REVIEWS_IN_FLIGHT

    asyncio.run(scenario())


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer  ", "Basic b2s6b2s=",
                                    "ok-a", "Bearer " + "x" * 9000])
def test_malformed_authorization_is_unauthenticated_without_a_review(
    header: str | None,
) -> None:
    reviewer = CountingReviewer()
    verdict = asyncio.run(_auth(reviewer).decide(header, "get", "/metrics"))
    assert verdict.decision is Decision.UNAUTHENTICATED
    assert reviewer.calls == []


def test_verb_and_path_are_part_of_the_decision() -> None:
    async def scenario() -> None:
        reviewer = CountingReviewer()
        auth = _auth(reviewer)
        assert (await auth.decide("bearer ok-a", "get", "/metrics")).decision \
            is Decision.ALLOWED
        assert (await auth.decide("Bearer ok-a", "post", "/metrics")).decision \
            is Decision.FORBIDDEN
        assert reviewer.calls[-1] == "authz user-ok-a post /metrics"

    asyncio.run(scenario())


@settings(max_examples=300, deadline=None)
@given(header=st.one_of(st.none(), st.text(max_size=40)),
       token=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1,
                     max_size=40))
def test_only_a_bearer_header_with_a_token_is_reviewed(header: str | None, token: str) -> None:
    """Property: a review happens exactly for ``Bearer <token>`` (scheme in any case);
    the token reviewed is the header's, stripped of surrounding blanks."""
    async def decide(value: str | None) -> list[str]:
        reviewer = CountingReviewer()
        await _auth(reviewer).decide(value, "get", "/metrics")
        return reviewer.calls

    calls = asyncio.run(decide(header))
    scheme, _, rest = (header or "").strip().partition(" ")
    if scheme.lower() == "bearer" and rest.strip():
        assert calls[0] == f"authn {rest.strip()}"
    else:
        assert calls == []
    for spelled in ("Bearer", "bearer", "BEARER"):
        assert asyncio.run(decide(f"{spelled} {token}"))[0] == f"authn {token}"


@pytest.mark.parametrize(("flags", "named"), [
    ({"metrics_auth_cache_ttl": "0s"}, "metrics-auth-cache-ttl='0s': must be > 0"),
    ({"metrics_auth_cache_ttl": "soon"}, "metrics-auth-cache-ttl='soon'"),
    ({"metrics_auth_cache_size": "0"}, "metrics-auth-cache-size='0'"),
    ({"metrics_auth": "perhaps"}, "metrics-auth='perhaps'"),
])
def test_bad_metrics_auth_options_name_option_and_value(flags: dict[str, str],
                                                        named: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(flags)
    assert named in str(err.value)


def test_metrics_auth_defaults() -> None:
    settings = load_settings({})
    assert settings.metrics_auth is True
    assert (settings.metrics_auth_cache_ttl, settings.metrics_auth_cache_size) == (120.0, 1024)
    assert load_settings({"metrics_auth_cache_ttl": "30s"}).metrics_auth_cache_ttl == 30.0
