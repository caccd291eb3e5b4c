"""Finals through an API outage and a leader change, two replicas, counted in the audit log.

Issue 27, point 1: every ended pod whose final is not on its TrainJob is owed exactly
one write by whoever leads, whatever happened before.  Two ``python -m scraper``
processes run with the chart's leader election (Lease 15 s, renew deadline 10 s,
retry 2 s) and write budget (20/s, burst 30), each reaching the real kube-apiserver
through a TCP proxy of its own (:class:`tests.helpers.tcp_hold.HoldingProxy`).

Each round: 20 TrainJobs with a running trainer pod each, whose exporter's 50 % the
leader writes first (so its writers' API connections are open when the outage
comes, and a final sent into it is a request on the wire); both proxies stop
forwarding requests; the 20 pods end (termination message: 100 % and a final
``loss``), so the leader sees every end on its watch and sends or queues all 20
finals into the outage; then answers are held too.  Nothing of either replica
reaches the API server for about 13 s: the leader's Lease is not renewed and it
steps down at its renew deadline, dropping its write queue.  Then

* ``regain``: the old leader's proxy is released first and it wins its Lease back,
  the standby's once it leads;
* ``takeover``: the standby's proxy is released first; the old leader's stays held
  until the standby has taken the Lease over (the old leader is then unreachable a
  few seconds longer than 13 s: that is what lets the standby's Lease expire first).

Every TrainJob must then show its final, and the API server's audit log must hold
exactly one successful status write carrying 100 % per TrainJob: none lost, none
twice.  The audit log needs an API server of its own (the session's runs without
one); everything else is the real thing.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client

from localdev.cluster import objects
from localdev.cluster.controlplane import ControlPlane, trainjob_status_writes
from localdev.cluster.crds import install_trainjob_crds
from tests.helpers.scraper import (
    FakeExporter,
    ScraperProcess,
    leaders,
    progress_of,
    scraper_service_account,
    status_json,
    trainer_status,
    wait_for,
)
from tests.helpers.tcp_hold import HoldingProxy

pytestmark = [pytest.mark.timeout(400),
              pytest.mark.cluster]  # starts a control plane of its own (audit log on)

TRAININGS = 20
#: How long nothing of either replica reaches the API server (seconds).
OUTAGE_SECONDS = 13.0
#: The chart's values (charts/trainjob-scraper/values.yaml): leaderElection, config.
CHART_ARGS = ["--leader-election", "--lease-duration=15s", "--renew-deadline=10s",
              "--retry-period=2s", "--write-qps=20", "--write-burst=30"]
#: Every final must be on its TrainJob within this long after the outage (seconds).
LANDED_WITHIN = 120.0
FINAL_LOSS = "0.0123"


@pytest.fixture(scope="module")
def audited() -> Iterator[tuple[ControlPlane, client.ApiClient]]:
    """A control plane of this module's own, with the audit log at Request level for
    TrainJob writes, and the TrainJob CRDs."""
    with ControlPlane(audit_log="Request") as plane, plane.api_client() as api:
        install_trainjob_crds(api)
        yield plane, api


@dataclass
class Round:
    """What one round measured."""

    name: str
    leader_before: str = ""
    leader_after: str = ""
    pending_at_hold: float = 0.0
    old_leader_lost_lease: bool = False
    outage: dict[str, float] = field(default_factory=dict)  # replica -> seconds held
    landed_after: float | None = None  # seconds from the first release to the last final
    missing: list[str] = field(default_factory=list)  # TrainJobs without their final
    finals: Counter[str] = field(default_factory=Counter)  # TrainJob -> 2xx writes of 100
    codes: Counter[int] = field(default_factory=Counter)  # status code -> writes of 100
    #: TrainJob -> the resourceVersions its writes of 100 were decided against, of the
    #: writes the API server did not refuse before applying (all but 4xx)
    decided_on: dict[str, set[str]] = field(default_factory=dict)
    wall: float = 0.0


def _kubeconfig(plane: ControlPlane, token: str, proxy: HoldingProxy, path: Path) -> Path:
    """A kubeconfig reaching the API server through ``proxy`` (TLS end to end)."""
    config = yaml.safe_load(plane.kubeconfig_for_token(token, path).read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _final_message(name: str) -> str:
    return json.dumps({"progressPercentage": 100,
                       "metrics": [{"name": "loss", "value": FINAL_LOSS}],
                       "lastUpdatedTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")})


def _has_final(api: client.ApiClient, namespace: str, name: str) -> bool:
    status = trainer_status(api, namespace, name) or {}
    return status.get("progressPercentage") == 100 and any(
        m.get("name") == "loss" and m.get("value") == FINAL_LOSS
        for m in status.get("metrics") or [])


def _audited_finals(path: Path, namespace: str, offset: int, out: Round) -> None:
    """From the audit log (from byte ``offset``), the scraper's status writes carrying
    100 %: per TrainJob the successful ones (``out.finals``), by status code all of them
    (``out.codes``), and per TrainJob the ``resourceVersion`` preconditions of those that
    may have been applied (``out.decided_on``).

    A write the API server answered 504 (its client gone: a write of the old term held
    until after its deadline) may still have been applied, so it counts as possibly
    applied; a 409 (the precondition failed) or another 4xx was not.  Writes decided
    against one resourceVersion can be applied at most once between them (optimistic
    concurrency), so one precondition per TrainJob means at most one applied write.
    """
    for event in trainjob_status_writes(path, offset, namespace):
        if "fieldManager=trainjob-scraper" not in urlsplit(event.get("requestURI", "")).query:
            continue
        ref = event.get("objectRef") or {}
        body = event.get("requestObject") or {}
        status = (body.get("status") or {}).get("trainerStatus") or {}
        if status.get("progressPercentage") != 100:
            continue
        code = (event.get("responseStatus") or {}).get("code", 0)
        name = ref.get("name", "")
        out.codes[code] += 1
        if 200 <= code < 300:
            out.finals[name] += 1
        if not 400 <= code < 500:
            out.decided_on.setdefault(name, set()).add(
                (body.get("metadata") or {}).get("resourceVersion", ""))


def _run_round(plane: ControlPlane, api: client.ApiClient, tmp_path: Path, name: str,
               exporter_factory: Callable[..., FakeExporter]) -> Round:
    out = Round(name)
    began = time.monotonic()
    namespace = f"outage-{name}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    pods = {}
    for i in range(TRAININGS):
        trainjob = objects.create_trainjob(api, namespace, f"tj-{i}")
        exporter = exporter_factory(body=status_json(50))
        pod = objects.create_trainer_pod(api, namespace, f"tj-{i}", port=exporter.port,
                                         trainjob=trainjob)
        pods[f"tj-{i}"] = pod.metadata.name
    scrapers: list[ScraperProcess] = []
    with (scraper_service_account(api, plane, namespace) as token,
          HoldingProxy("127.0.0.1", urlsplit(plane.server_url).port or 443) as proxy_a,
          HoldingProxy("127.0.0.1", urlsplit(plane.server_url).port or 443) as proxy_b):
        proxies = {"replica-a": proxy_a, "replica-b": proxy_b}
        try:
            for identity, proxy in proxies.items():
                scrapers.append(ScraperProcess(
                    _kubeconfig(plane, token, proxy, tmp_path / f"{name}-{identity}.kubeconfig"),
                    [f"--namespaces={namespace}", f"--lease-namespace={namespace}",
                     f"--identity={identity}", *CHART_ARGS],
                    tmp_path / f"{name}-{identity}.log"))
            for s in scrapers:
                s.wait_ready(120)  # a loaded CI machine: imports take long
            first = wait_for(lambda: leaders(scrapers), 30, "a leader")
            assert len(first) == 1
            old = first[0]
            standby = scrapers[1] if old is scrapers[0] else scrapers[0]
            by_scraper = {id(s): ident for s, ident in zip(scrapers, proxies, strict=True)}
            out.leader_before = by_scraper[id(old)]
            old_proxy = proxies[by_scraper[id(old)]]
            standby_proxy = proxies[by_scraper[id(standby)]]
            wait_for(lambda: all(progress_of(api, namespace, tj) == 50 for tj in pods), 60,
                     "every TrainJob at its exporter's 50 %")
            audit_offset = plane.audit_log_path.stat().st_size

            # The outage: requests first, so the leader still sees every end on its watch.
            for proxy in proxies.values():
                proxy.hold_requests()
            held_at = time.monotonic()
            for trainjob, pod in pods.items():
                objects.terminate_pod(api, namespace, pod, _final_message(trainjob))
            wait_for(lambda: old.value("trainjob_scraper_status_writes_pending") == TRAININGS,
                     10, "the leader holding all 20 finals (sent into the outage or queued)")
            out.pending_at_hold = old.value("trainjob_scraper_status_writes_pending")
            for proxy in proxies.values():
                proxy.hold_answers()
            time.sleep(max(0.0, held_at + OUTAGE_SECONDS - time.monotonic()))

            first_release, second = ((old_proxy, standby) if name == "regain"
                                     else (standby_proxy, old))
            later_release = standby_proxy if name == "regain" else old_proxy
            first_release.release()
            released = time.monotonic()
            out.outage[by_scraper[id(old if name == "regain" else standby)]] = (
                released - held_at)
            winner = old if name == "regain" else standby
            # A standby takes an unrenewed Lease after lease duration (15 s) on its clock.
            wait_for(lambda: leaders([winner]), 20, f"{name}: the Lease taken")
            later_release.release()
            out.outage[by_scraper[id(second)]] = time.monotonic() - held_at
            out.old_leader_lost_lease = "lost leadership" in old.log()

            deadline = released + LANDED_WITHIN
            while True:
                out.missing = [tj for tj in pods if not _has_final(api, namespace, tj)]
                if not out.missing or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if not out.missing:
                out.landed_after = time.monotonic() - released
                # Settled: nothing left to write on either side, then a few retry periods.
                wait_for(lambda: all(s.value("trainjob_scraper_status_writes_pending") == 0
                                     for s in scrapers), 30, "both write queues empty")
                time.sleep(5)  # a late duplicate would show
            out.leader_after = by_scraper[id(leaders(scrapers)[0])]
            _audited_finals(plane.audit_log_path, namespace, audit_offset, out)
        except BaseException:
            for s in scrapers:
                sys.stderr.write(f"--- {s.log_path}\n{s.log()[-8000:]}\n")
            raise
        finally:
            for s in scrapers:
                with contextlib.suppress(Exception):
                    s.terminate()
    out.wall = time.monotonic() - began
    return out


@pytest.mark.parametrize("name", ["regain", "takeover"])
def test_every_final_lands_exactly_once_through_an_outage_and_a_leader_change(
    audited: tuple[ControlPlane, client.ApiClient], tmp_path: Path, name: str,
    exporter_factory: Callable[..., FakeExporter],
) -> None:
    plane, api = audited
    result = _run_round(plane, api, tmp_path, name, exporter_factory)
    landed = ("" if result.landed_after is None
              else f" (the last {result.landed_after:.1f}s after the first release)")
    print(f"round {result.name}: leader {result.leader_before} -> {result.leader_after}, "
          f"pending at the hold {result.pending_at_hold:g}, held "
          + ", ".join(f"{k} {v:.1f}s" for k, v in sorted(result.outage.items()))
          + f", {TRAININGS - len(result.missing)} of {TRAININGS} finals on their "
          f"TrainJobs{landed}; audit: {sum(result.finals.values())} writes of 100 % landed "
          f"over {len(result.finals)} TrainJobs, all writes of 100 % by code "
          f"{dict(result.codes)}; "
          f"wall {result.wall:.1f}s; logs in {tmp_path}")
    assert result.old_leader_lost_lease, "the outage did not cost the leader its Lease"
    expected = result.leader_before if name == "regain" else next(
        r for r in ("replica-a", "replica-b") if r != result.leader_before)
    assert result.leader_after == expected
    assert result.pending_at_hold == TRAININGS
    assert not result.missing, f"finals lost (not within {LANDED_WITHIN:g}s): {result.missing}"
    # Landed once: every TrainJob shows its final, and of its writes of 100 % at most one
    # succeeded and all that may have been applied were decided against one version.
    doubled = {tj: n for tj, n in result.finals.items() if n > 1}
    assert not doubled, f"finals written more than once: {doubled}"
    assert set(result.decided_on) == {f"tj-{i}" for i in range(TRAININGS)}, result.decided_on
    again = {tj: rvs for tj, rvs in result.decided_on.items() if len(rvs) != 1}
    assert not again, f"finals written again after they landed: {again}"
