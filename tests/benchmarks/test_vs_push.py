"""benchmarks.vs_push: the audit-log count on the real API server, and a ``--quick`` run
of both designs on the local stack (the JSON's keys and sane values, not timings)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from kubernetes import client

from benchmarks import vs_push
from exporter_lib.status import API_GROUP, API_VERSION
from localdev.cluster import ControlPlane, install_trainjob_crds, objects

pytestmark = pytest.mark.benchmarks


def _apply(api: client.ApiClient, ns: str, name: str, manager: str, progress: int) -> None:
    objects.apply_trainjob_status(api, ns, name, {"trainerStatus": {
        "progressPercentage": progress, "lastUpdatedTime": "2026-01-01T00:00:00Z"}},
        field_manager=manager)


@pytest.mark.timeout(180)
def test_audit_log_counts_status_writes_by_field_manager_with_bytes() -> None:
    with ControlPlane(audit_log="Request") as plane, plane.api_client() as api:
        install_trainjob_crds(api)
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "a"}})
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "b"}})
        for ns in ("a", "b"):
            objects.create_trainjob(api, ns, "j")
        start = time.time() - 1
        for k in range(3):
            _apply(api, "a", "j", "trainer-status", k)
        _apply(api, "a", "j", "trainjob-scraper", 7)
        _apply(api, "b", "j", "trainjob-scraper", 8)  # another namespace: not counted
        # A write the API server refuses (progress above the schema's maximum): not counted.
        with pytest.raises(client.ApiException):
            _apply(api, "a", "j", "trainjob-scraper", 1000)
        end = time.time() + 1
        deadline = time.monotonic() + 10  # the log backend writes each event as it ends
        while True:
            audit = vs_push.read_audit(plane.audit_log_path, "a", start, end)
            if sum(audit.count.values()) >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert audit.writer("trainer-status")[0] == 3
    writes, nbytes = audit.writer("trainjob-scraper")
    assert writes == 1
    # The compact JSON of the apply body: about the size of what was sent.
    sent = len(json.dumps({"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "TrainJob",
                           "metadata": {"name": "j", "namespace": "a"},
                           "status": {"trainerStatus": {
                               "progressPercentage": 7,
                               "lastUpdatedTime": "2026-01-01T00:00:00Z"}}},
                          separators=(",", ":")))
    assert nbytes == sent
    # The key names the user (the admin certificate's CN) after the field manager.
    assert all(k.split(" ")[1] == "devcluster-admin" for k in audit.count), audit.count


@pytest.mark.timeout(1500)
def test_quick_run_writes_both_designs(tmp_path: Path) -> None:
    assert vs_push.main(["--quick", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("vs-push-*.json")
    res = json.loads(path.read_text())
    assert not res["errors"], res["errors"]
    assert (tmp_path / path.name.replace(".json", ".md")).exists()
    label = "N=3 every=1s"
    for design in ("push", "pull"):
        figures = res[design]
        assert set(vs_push.KEYS) <= set(figures)
        assert figures["finals_expected"][label] == 3
        assert figures["api_writes_per_trainjob_hour"][label] > 0, (design, res["runs"])
        assert 0 <= figures["freshness_p50_s"][label] <= figures["freshness_p99_s"][label]
        assert figures["training_cost_us_per_report"][label] > 0
    # Pull delivers every final although the scraper was down across the trainings' end.
    assert res["pull"]["finals_delivered"][label] == 3, res["runs"]
    assert res["pull"]["cpu_seconds_per_trainjob_hour"][label] > 0
    assert label in res["targets"]
