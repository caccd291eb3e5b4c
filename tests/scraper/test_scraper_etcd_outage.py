"""The leader steps down within its renew deadline when etcd dies (issue 13, input 11).

Kills the real etcd of the test control plane (SIGKILL) under a leading scraper and
measures, from the kill, how long the replica's ``trainjob_scraper_leader`` gauge
stays 1.  The kube-apiserver keeps running and accepts requests it cannot answer,
which is what made a renew block ~40 s before (urllib3's 3 hidden retries of a 10 s
read timeout).  etcd is started again on the same port and data afterwards, and the
replica must lead again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kubernetes import client

from localdev.cluster.controlplane import ControlPlane
from tests.helpers.scraper import ScraperProcess, wait_for

pytestmark = pytest.mark.usefixtures("trainjob_crd")

RENEW_DEADLINE = 4.0
#: Poll period of the gauge plus one short last step (leader.MIN_STEP_SECONDS) and
#: the HTTP round trip of reading /metrics.
MARGIN = 1.5


def test_leader_steps_down_within_renew_deadline_when_etcd_dies(
    kube_api: client.ApiClient, control_plane: ControlPlane, namespace: str,
    scraper_factory: Callable[..., ScraperProcess],
) -> None:
    scraper = scraper_factory(
        f"--namespaces={namespace}", f"--lease-namespace={namespace}", "--leader-election",
        "--lease-duration=6s", f"--renew-deadline={RENEW_DEADLINE:g}s", "--retry-period=1s",
        "--identity=replica-a")
    wait_for(lambda: scraper.value("trainjob_scraper_leader") == 1, 20, "leading")
    time.sleep(1.5)  # a few renews: the last one lands shortly before the kill
    control_plane.kill_etcd()
    killed = time.monotonic()
    try:
        believed = None
        while time.monotonic() - killed < RENEW_DEADLINE + 20:
            if scraper.value("trainjob_scraper_leader") == 0:
                believed = time.monotonic() - killed
                break
            time.sleep(0.1)
        print(f"leader gauge stayed 1 for {believed}s after etcd was killed "
              f"(renew deadline {RENEW_DEADLINE:g}s)")
        assert believed is not None, f"still leading {RENEW_DEADLINE + 20:g}s after the kill"
        assert believed <= RENEW_DEADLINE + MARGIN, believed
        assert "lost leadership" in scraper.log()
        assert scraper.proc.poll() is None  # steps down, keeps running as a candidate
    finally:
        control_plane.start_etcd()
    wait_for(lambda: scraper.value("trainjob_scraper_leader") == 1, 60, "leading again")
