"""Timeouts of the official client's calls against an API server that never answers.

The server here is a loopback listener that accepts connections and never writes a
byte (a hung API server, or a load balancer in front of a dead one).  Nothing is
mocked: the calls go through the official client and urllib3 to a real socket.

A newcomer found that ``_request_timeout=5.0`` (a float) is dropped by the official
client, so a TokenReview of ``/metrics`` could wait forever.  These tests pin both the
fact (a bare float bounds nothing, a ``(connect, read)`` pair does: if the client
changes, the first test says so) and the product's use of it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from scraper.kube.client import request_timeout, without_retries
from scraper.metrics_auth import KubeReviewer, ReviewError
from tests.helpers.silent_server import PlainTextServer, SilentServer

pytestmark = pytest.mark.timeout(60)

#: Seconds a bounded call may take here: its 0.5 s read timeout plus generous slack on
#: a loaded machine (the CI runs beside other work).
BOUNDED_SECONDS = 5.0
#: Seconds an unbounded call is watched before the test calls it unbounded.
WATCHED_SECONDS = 3.0


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.stop()


def _api(port: int) -> k8s.ApiClient:
    return without_retries(k8s.ApiClient(k8s.Configuration(host=f"http://127.0.0.1:{port}")))


def _list_in_thread(api: k8s.ApiClient, timeout: Any) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            k8s.VersionApi(api).get_code(_request_timeout=timeout)
            outcome.append("answered")
        except Exception as exc:  # the read timeout, as urllib3 raises it
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_bare_float_bounds_nothing_and_a_pair_bounds_the_read(
        silent: SilentServer) -> None:
    """The library fact behind :func:`scraper.kube.client.request_timeout`."""
    api = _api(silent.port)
    started = time.monotonic()
    paired, paired_outcome = _list_in_thread(api, request_timeout(0.5))
    bare, bare_outcome = _list_in_thread(api, 0.5)
    paired.join(BOUNDED_SECONDS)
    assert not paired.is_alive(), "a (connect, read) pair did not bound the call"
    assert paired_outcome and isinstance(paired_outcome[0], Exception), paired_outcome
    bare.join(max(0.0, WATCHED_SECONDS - (time.monotonic() - started)))
    # If this fails, the official client now honours a float: request_timeout() is
    # still right, but the docstring's reason is not.
    assert bare.is_alive(), f"a bare float bounded the call this time: {bare_outcome}"
    silent.stop()  # closing the connections ends the unbounded call
    bare.join(BOUNDED_SECONDS)


def test_a_token_review_against_a_hung_api_server_fails_within_its_timeout(
        silent: SilentServer) -> None:
    """Before, the review's float timeout was dropped and ``/metrics`` waited forever."""
    reviewer = KubeReviewer(_api(silent.port), timeout=0.5)

    async def review() -> float:
        started = time.monotonic()
        try:
            with pytest.raises(ReviewError, match="TokenReview failed"):
                await asyncio.wait_for(reviewer.authenticate("token"), 4 * BOUNDED_SECONDS)
        finally:
            silent.stop()  # an unbounded call's thread ends, so asyncio.run can return
        return time.monotonic() - started

    took = asyncio.run(review())
    assert took < BOUNDED_SECONDS, took


def test_a_crd_answer_that_is_not_json_is_unread_not_a_crash() -> None:
    """A newcomer's find: a server answering 200 text/plain (no API server) ended the
    scraper with a JSONDecodeError traceback at start-up; now the CRD is unread and
    checked again later, as for a server that does not answer."""
    from kubernetes.client import ApiextensionsV1Api

    from scraper.kube.crd import CrdSupport

    server = PlainTextServer()
    try:
        crd = CrdSupport(ApiextensionsV1Api(_api(server.port)))
        assert asyncio.run(crd.check()) is None
        assert crd.supported is None
    finally:
        server.stop()
