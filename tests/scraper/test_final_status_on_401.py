"""A final status whose write is answered 401 (the token in hand was revoked or expired;
the next refresh of the credentials brings a valid one, as the in-cluster loader re-reads
the projected token every minute): the standard says the scraper never loses a final
status.  The writer treated 403 as retryable but 401 as a refusal of the body, and the
final status was dropped (found by a newcomer's check, 2026-12-01); a 401 now stays
queued and the next try reads the credentials again.

Real parts: kube-apiserver, a ServiceAccount token bound to the chart's rules, the
StatusWriter with its informer (tests/helpers/writer.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes import client

from exporter_lib.status import TrainerStatus
from localdev.cluster import objects
from scraper.kube.client import without_retries
from scraper.shared.outcome import WriteOutcome
from tests.helpers.scraper import progress_of, scraper_service_account
from tests.helpers.writer import running_writer

pytestmark = [pytest.mark.usefixtures("trainjob_crd"), pytest.mark.timeout(60)]


async def test_a_final_status_answered_401_is_kept_until_a_valid_token(
        control_plane: Any, kube_api: client.ApiClient, namespace: str) -> None:
    objects.create_trainjob(kube_api, namespace, "fin")
    with scraper_service_account(kube_api, control_plane, namespace) as token:
        api = without_retries(control_plane.api_client_for_token(token))
        revoked = False

        def refresh(configuration: client.Configuration) -> None:
            configuration.api_key = {"authorization": "not-a-token" if revoked else token}

        api.configuration.refresh_api_key_hook = refresh
        try:
            async with running_writer(api, namespace) as (writer, _):
                revoked = True

                async def restore() -> None:
                    nonlocal revoked
                    await asyncio.sleep(1.0)
                    revoked = False  # the next refresh reads a valid token

                restorer = asyncio.create_task(restore())
                final = TrainerStatus.from_api({"progressPercentage": 100,
                                                "lastUpdatedTime": "2026-01-01T00:00:00Z"})
                outcome = await asyncio.wait_for(
                    writer.apply_and_wait(namespace, "fin", final, final=True), 30)
                await restorer
        finally:
            api.close()
    assert outcome is WriteOutcome.WRITTEN
    assert progress_of(kube_api, namespace, "fin") == 100
