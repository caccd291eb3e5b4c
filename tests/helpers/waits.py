"""Bounded waits for an event, in place of a sleep of a guessed length.

A test that waits for what it is about (a run, a skip, a connection) passes as soon as
it happened and fails with what it waited for after the bound, on a quick machine and
a loaded one alike; the bound is the only number, and it is far above the time the
event takes (docs/testing.md, "Waiting for events").  The synchronous form is
:func:`tests.helpers.scraper.wait_for`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from kubernetes import client

_T = TypeVar("_T")


async def until(predicate: Callable[[], _T], within: float, what: str,
                period: float = 0.02) -> _T:
    """Poll ``predicate`` on the running loop until it returns a truthy value; return it.

    Args:
        within: the bound (seconds); the predicate is tried at least once.
        what: named in the failure.
        period: seconds between tries (the loop runs meanwhile).

    Raises:
        AssertionError: not true after ``within`` seconds (names ``what``).
    """
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(period)


#: How long the ServiceAccount controller may take to create a namespace's ``default``.
SERVICE_ACCOUNT_TIMEOUT_SECONDS = 30.0


def default_service_account(api: client.ApiClient, namespace: str) -> None:
    """Wait until the ServiceAccount controller created ``namespace``'s ``default``: until
    then the API server refuses pods there and token requests for it (seen: a test's
    TokenRequest answered 404 'serviceaccounts "default" not found')."""
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + SERVICE_ACCOUNT_TIMEOUT_SECONDS
    while True:
        try:
            core.read_namespaced_service_account("default", namespace)
            return
        except client.ApiException as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.1)
