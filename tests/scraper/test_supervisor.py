"""Root tasks are supervised: a failure is logged at once and stops the scraper non-zero."""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

import pytest

from localdev.cluster.controlplane import ControlPlane
from scraper import cli
from scraper.scrape.manager import TargetManager
from scraper.supervisor import RootTaskFailed, Supervisor


async def test_a_failed_root_task_is_logged_at_once_and_sets_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sup = Supervisor()

    async def broken() -> None:
        await asyncio.sleep(0)
        raise ValueError("boom")

    async def forever() -> None:
        await asyncio.Event().wait()

    sup.root("forever", forever())
    sup.root("broken", broken())
    await asyncio.wait_for(sup.failed.wait(), 5)
    assert isinstance(sup.failure, RootTaskFailed) and sup.failure.name == "broken"
    assert isinstance(sup.failure.__cause__, ValueError)
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage() == "root task broken failed; stopping"
    assert record.exc_info is not None and "boom" in str(record.exc_info[1])
    await sup.cancel()  # the failed one is not reported twice; the other is cancelled
    assert [r for r in caplog.records if r.levelno == logging.ERROR] == [record]


async def test_a_root_task_that_returns_is_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    sup = Supervisor()

    async def done() -> None:
        return None

    sup.root("short-lived", done())
    await asyncio.wait_for(sup.failed.wait(), 5)
    assert sup.failure is not None and sup.failure.name == "short-lived"
    assert "root task short-lived ended although it runs until stopped" in caplog.text


async def test_a_failed_background_task_is_logged_but_does_not_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sup = Supervisor()

    async def broken() -> None:
        raise KeyError("x")

    task = sup.background("final-status", broken())
    await asyncio.wait([task])
    await asyncio.sleep(0)
    assert not sup.failed.is_set()
    assert "task final-status failed" in caplog.text


def test_scraper_exits_non_zero_naming_the_task_when_the_leadership_callback_raises(
    control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
) -> None:
    """The real CLI against the real API server, with one fault injected into our own code:
    starting to lead raises (before, this ended leadership silently and the process ran on)."""

    def broken(self: TargetManager, leading: bool) -> Any:
        raise RuntimeError("injected fault in the leadership callback")

    monkeypatch.setattr(TargetManager, "set_leading", broken)
    caplog.set_level(logging.INFO)
    code = cli.main(["run", f"--kubeconfig={control_plane.kubeconfig_path}",
                     "--listen-host=127.0.0.1", "--listen-port=0", "--leader-election",
                     "--lease-namespace=default", f"--lease-name=t-{secrets.token_hex(4)}",
                     "--namespaces=default", "--shutdown-timeout=2s"])
    assert code == 1
    failed = [r for r in caplog.records if r.getMessage().startswith("root task leader-election "
                                                                     "failed")]
    assert len(failed) == 1 and failed[0].levelno == logging.ERROR
    assert "injected fault" in str(failed[0].exc_info[1])  # type: ignore[index]
    assert "root task 'leader-election' failed" in capsys.readouterr().err
    assert "stopped" in [r.getMessage() for r in caplog.records]
