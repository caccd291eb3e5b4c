"""An answer that states no pod, at an address shared by two live pods, is not written
(issue 27, point 3).

Pod A (TrainJob ``a``) still shows Running at ``127.0.0.1:P`` (a stale pod object) while
pod B (TrainJob ``b``) runs there.  The exporter at that address is a real HTTP server
on loopback serving the documented JSON with or without ``Trainjob-Exporter-Pod``.
The real :class:`~scraper.scrape.manager.TargetManager`,
:class:`~scraper.scrape.loop.ScrapeLoop` and
:class:`~scraper.scrape.exporter.ExporterScraper` run in process; the write side is the real
write queue behind ``QueueWriter`` and Events are recorded by ``FakeEvents`` (the API
server is not needed for the rule; tests/scraper/test_reused_pod_ip.py covers it there).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter_lib.pod import POD_HEADER, PodIdentity
from scraper.discovery.pod_targets import PodTargets
from scraper.discovery.pods import Synced
from scraper.scrape.exporter import ExporterScraper, ScrapeLimits
from scraper.scrape.loop import REASON_SHARED_ADDRESS, ScrapeLoop
from scraper.scrape.manager import TargetManager
from scraper.scrape.target_table import AddressIndex, address_of
from tests.scraper.test_loop import Counted, FakeEvents, FakeScheduler, QueueWriter

NS = "ns"


class PlainExporter:
    """A loopback HTTP exporter serving ``progressPercentage``; ``stated``: the pod it
    names in ``Trainjob-Exporter-Pod`` (None: no header, as a third-party exporter)."""

    def __init__(self) -> None:
        self.progress = 90
        self.stated: PodIdentity | None = None
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _serve(self, request: web.Request) -> web.Response:
        headers = {}
        if self.stated is not None and (value := self.stated.header()):
            headers[POD_HEADER] = value
        body = {"progressPercentage": self.progress,
                "lastUpdatedTime": "2025-01-01T00:00:00Z"}
        return web.Response(text=json.dumps(body), content_type="application/json",
                            headers=headers)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._serve)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def _pod(trainjob: str, uid: str, phase: str = "Running",
         ip: str = "127.0.0.1", host_network: bool = False) -> dict[str, Any]:
    return {"metadata": {"namespace": NS, "name": f"{trainjob}-node-0", "uid": uid,
                         "labels": {"jobset.sigs.k8s.io/jobset-name": trainjob}},
            "spec": {"hostNetwork": True} if host_network else {},
            "status": {"phase": phase, "podIP": ip}}


class Stack:
    def __init__(self, port: int) -> None:
        self.writer, self.events = QueueWriter(), FakeEvents()
        self.scrapes: list[str] = []
        self.scraper = ExporterScraper(ScrapeLimits(5.0, 1 << 20, 4))
        holder: dict[str, TargetManager] = {}
        self.loop = ScrapeLoop(self.scraper, self.writer, self.events, backoff_max=35.0,
                               leading=lambda: True, counts=Counted(self.scrapes),
                               pods_at=lambda url: holder["m"].addresses.pods_at(url))
        self.manager = TargetManager(self.loop, FakeScheduler(), spawn=lambda coro: coro.close(),
                                     leading=True)
        holder["m"] = self.manager
        self.pods = PodTargets(self.manager, default_port=port, default_path="/metrics",
                               default_interval=1.0)

    async def scrape(self, key: str) -> None:
        await self.loop.run(self.manager.states[key])
        self.writer.flush()

    def written(self, trainjob: str) -> int | None:
        held = self.writer.held.get((NS, trainjob))
        return None if held is None else held.progress_percentage

    def shared_events(self) -> list[tuple[str, str, str, str]]:
        return [e for e in self.events.recorded if e[2] == REASON_SHARED_ADDRESS]


@pytest.fixture
async def exporter() -> AsyncIterator[PlainExporter]:
    exp = PlainExporter()
    await exp.start()
    yield exp
    await exp.stop()


@pytest.fixture
async def stack(exporter: PlainExporter) -> AsyncIterator[Stack]:
    s = Stack(exporter.port)
    yield s
    await s.scraper.close()


A, B = f"{NS}/a-node-0", f"{NS}/b-node-0"


async def test_two_pods_at_the_address_an_answer_without_identity_is_not_written(
        stack: Stack, exporter: PlainExporter) -> None:
    stack.pods.on_pod(_pod("a", "uid-a"), deleted=False)
    stack.pods.on_pod(_pod("b", "uid-b"), deleted=False)
    assert stack.manager.addresses.pods_at(f"http://127.0.0.1:{exporter.port}/x") == (A, B)
    for progress in (90, 96, 97):
        exporter.progress = progress
        await stack.scrape(A)
        await stack.scrape(B)
    assert stack.written("a") is None and stack.written("b") is None
    assert stack.scrapes == ["shared_address"] * 6
    assert stack.manager.states[A].etag is None
    # One Event per TrainJob for this set of pods, not one per scrape.
    assert [(e[1]) for e in stack.shared_events()] == ["a", "b"]
    assert A in stack.shared_events()[0][3] and B in stack.shared_events()[0][3]
    # The stale pod object goes: B alone at the address, its answers are written again.
    stack.pods.on_pod(_pod("a", "uid-a"), deleted=True)
    assert stack.manager.addresses.pods_at(f"http://127.0.0.1:{exporter.port}/") == (B,)
    await stack.scrape(B)
    assert stack.written("b") == 97
    assert stack.written("a") is None
    # A new conflict (another set of pods) is evented again.
    stack.pods.on_pod(_pod("c", "uid-c"), deleted=False)
    await stack.scrape(B)
    assert len(stack.shared_events()) == 3


async def test_one_pod_at_the_address_an_answer_without_identity_is_written(
        stack: Stack, exporter: PlainExporter) -> None:
    stack.pods.on_pod(_pod("a", "uid-a"), deleted=False)
    await stack.scrape(A)
    assert stack.written("a") == 90
    assert stack.scrapes == ["ok"] and stack.shared_events() == []


async def test_answers_with_identity_are_unchanged_at_a_shared_address(
        stack: Stack, exporter: PlainExporter) -> None:
    stack.pods.on_pod(_pod("a", "uid-a"), deleted=False)
    stack.pods.on_pod(_pod("b", "uid-b"), deleted=False)
    exporter.stated = PodIdentity(uid="uid-b", name="b-node-0", namespace=NS)
    await stack.scrape(B)
    await stack.scrape(A)
    assert stack.written("b") == 90
    assert stack.written("a") is None  # B's answer at A's target: WrongPod, as before
    assert stack.scrapes == ["ok", "wrong_pod"]
    assert stack.shared_events() == []


@pytest.mark.parametrize("stated", [PodIdentity(namespace=NS),
                                    PodIdentity(hostname="node-1", namespace=NS)],
                         ids=["namespace-only", "node-hostname"])
async def test_an_answer_that_names_no_pod_is_one_that_states_none(
        stack: Stack, exporter: PlainExporter, stated: PodIdentity) -> None:
    """A namespace names no pod, nor does the node's hostname that a hostNetwork pod's
    exporter states (the target's own hostname is unknown): at an address two live pods
    share, such an answer is not written, as one without the header."""
    stack.pods.on_pod(_pod("a", "uid-a", host_network=True), deleted=False)
    stack.pods.on_pod(_pod("b", "uid-b", host_network=True), deleted=False)
    exporter.stated = stated
    await stack.scrape(A)
    await stack.scrape(B)
    assert stack.written("a") is None and stack.written("b") is None
    assert stack.scrapes == ["shared_address"] * 2
    # Alone at the address it is written, with its pod to be read before the write.
    stack.pods.on_pod(_pod("a", "uid-a", host_network=True), deleted=True)
    await stack.scrape(B)
    assert stack.written("b") == 90
    assert stack.writer.confirms[-1] is not None
    assert stack.writer.confirms[-1].pod_uid == "uid-b"


@pytest.mark.parametrize("naming", [PodIdentity(hostname="b-node-0"),
                                    PodIdentity(name="b-node-0")], ids=["hostname", "name"])
async def test_a_hostname_or_name_names_the_pod_only_with_its_namespace(
        stack: Stack, exporter: PlainExporter, naming: PodIdentity) -> None:
    """A TrainJob of one name in two namespaces has pods of one hostname (JobSet's
    ``<trainjob>-node-0-0``), so a hostname or name without the namespace beside it is
    handled as no identity; with the namespace it names the pod.  The rule is what is
    tested (both pods here are in one namespace, sharing one address)."""
    stack.pods.on_pod(_pod("a", "uid-a"), deleted=False)
    stack.pods.on_pod(_pod("b", "uid-b"), deleted=False)
    exporter.stated = naming
    await stack.scrape(B)
    assert stack.written("b") is None and stack.scrapes == ["shared_address"]
    exporter.stated = dataclasses.replace(naming, namespace=NS)
    await stack.scrape(B)
    assert stack.written("b") == 90 and stack.scrapes[-1] == "ok"
    assert stack.writer.confirms[-1] is None, "a named pod needs no read before the write"
    # Alone at the address, the bare hostname or name is written once its pod is read.
    stack.pods.on_pod(_pod("a", "uid-a"), deleted=True)
    exporter.stated, exporter.progress = naming, 95
    await stack.scrape(B)
    assert stack.written("b") == 95
    assert stack.writer.confirms[-1] is not None
    assert stack.writer.confirms[-1].pod_uid == "uid-b"


async def test_the_address_index_follows_pods_and_stays_bounded(
        stack: Stack, exporter: PlainExporter) -> None:
    """Entries go with the pod's target: an address change moves it, a deleted or ended
    pod removes it, and addresses left by every pod are forgotten."""
    port = exporter.port
    first = [f"http://127.0.1.{i}:{port}/metrics" for i in range(50)]
    moved = [f"http://127.0.2.{i}:{port}/metrics" for i in range(50)]
    for i in range(50):
        stack.pods.on_pod(_pod(f"j{i}", f"u{i}", ip=f"127.0.1.{i}"), deleted=False)
    assert len(stack.manager.addresses) == 50
    assert [stack.manager.addresses.pods_at(url) for url in first] == \
        [(f"{NS}/j{i}-node-0",) for i in range(50)]
    for i in range(50):  # every pod's IP changes (the same pod objects, a new address)
        stack.pods.on_pod(_pod(f"j{i}", f"u{i}", ip=f"127.0.2.{i}"), deleted=False)
    assert len(stack.manager.addresses) == 50
    assert all(stack.manager.addresses.pods_at(url) == () for url in first)
    assert [stack.manager.addresses.pods_at(url) for url in moved] == \
        [(f"{NS}/j{i}-node-0",) for i in range(50)]
    for i in range(25):
        stack.pods.on_pod(_pod(f"j{i}", f"u{i}", ip=f"127.0.2.{i}"), deleted=True)
    for i in range(25, 50):
        stack.pods.on_pod(_pod(f"j{i}", f"u{i}", "Succeeded", ip=f"127.0.2.{i}"),
                             deleted=False)
    assert len(stack.manager.addresses) == 0
    assert all(stack.manager.addresses.pods_at(url) == () for url in first + moved)
    # A relist that no longer holds a pod drops it from the index too.
    stack.pods.on_pod(_pod("r", "ur"), deleted=False)
    assert len(stack.manager.addresses) == 1
    stack.pods.on_synced(Synced(scope=None, pods=()))
    assert len(stack.manager.addresses) == 0
    await asyncio.sleep(0)


_KEYS = st.sampled_from([f"{NS}/p{i}" for i in range(6)])
_URLS = st.none() | st.builds("http://127.0.0.{}:{}/metrics".format,
                              st.integers(1, 3), st.sampled_from([28080, 28081]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_KEYS, _URLS), max_size=60))
def test_the_address_index_is_the_last_address_of_each_pod(
        moves: list[tuple[str, str | None]]) -> None:
    """Whatever the order of pod events, the index holds each pod at its last address
    only, and nothing for pods without one (its size is the pods with a target)."""
    index, last = AddressIndex(), {}
    for key, url in moves:
        index.place(key, url)
        last[key] = None if url is None else address_of(url)
    placed = {key: address for key, address in last.items() if address is not None}
    assert len(index) == len(placed)
    for address in {a for a in last.values() if a is not None} | {"127.0.0.9:1"}:
        expected = [key for key, at in placed.items() if at == address]
        assert sorted(index.pods_at(f"http://{address}/x")) == sorted(expected)
