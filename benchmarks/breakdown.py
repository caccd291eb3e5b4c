"""Where a scrape's CPU goes: the pieces of our scraper measured one at a time.

``python -m benchmarks.breakdown [--targets N]`` prints one line per piece, CPU
microseconds (user+system of this process) per operation:

* a bare asyncio timer wakeup, N timers a second spread over the interval;
* one APScheduler job run through :class:`scraper.scrape.scheduling.TargetScheduler` for a
  scrape that does nothing, N targets at a 1 s interval;
* aiohttp's ``ClientSession`` GET answered by a 304 from nginx, alone, in the
  pattern the 20 phases give (N/20 requests at once, 20 times a second);
* a changing scrape's pieces (:func:`changing_pieces`): aiohttp's GET -> 200 with the
  JSON body read, alone; :meth:`scraper.scrape.exporter.ExporterScraper.scrape` of the same
  answer (slot, timeout, GET, body cap, decode and validate); the decode and validate
  of the body alone; and the scrape loop's handling of a fresh status
  (:meth:`scraper.scrape.loop.ScrapeLoop._handle`: counts, compare, hand to the write queue,
  no writer running);
* ``asyncio.to_thread`` of a no-op, the hop every call into the synchronous
  Kubernetes client makes (status writes made it too before they moved to aiohttp);
* one status write to a real kube-apiserver (``--writes N``, 0 skips it; needs the
  control-plane binaries), four ways (:data:`WRITE_PATHS`): the pre-queue path (the
  client's JSON body, model deserialisation of the answer, one ``to_thread`` per
  write); today's queue and writer with the request through ``ApiClient.call_api`` in
  a thread (stop 10), with the PATCH straight to the client's urllib3 pool in a
  thread (stop 11), and today's :class:`scraper.write.writer.StatusWriter` (an
  aiohttp PATCH on the loop, :mod:`scraper.kube.apply_request`).  The last three
  alternate twice in the same control plane.  CPU of this process only (the API
  server's is not counted): hand-off + serialisation + TLS request + response
  handling.

Every loop is bounded (a few seconds each); nginx listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import time
from collections.abc import Awaitable, Callable

import aiohttp

from benchmarks.farm import NginxFarm
from scraper.scrape.exporter import USER_AGENT, ScrapeLimits
from scraper.scrape.scheduling import PHASES, TargetScheduler
from scraper.shared.targets import Target

WINDOW = 4.0  # default measured seconds per timed piece


def aiohttp_session(concurrency: int) -> aiohttp.ClientSession:
    """aiohttp's pooled session as the scraper configured it until issue 23, deliverable
    4 (keep-alive 120 s, at most ``concurrency`` connections, no cookies, no
    decompression, no timers of its own): the library row of the breakdown."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=120,
                                       enable_cleanup_closed=True),
        headers={"User-Agent": USER_AGENT}, auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout())


async def timer_wakeups(n: int, window: float = WINDOW) -> float:
    """CPU per wakeup of ``n`` call_at timers a second, each re-arming itself."""
    loop = asyncio.get_running_loop()
    count = 0

    def fire(at: float) -> None:
        nonlocal count
        count += 1
        if not stop:
            loop.call_at(at + 1.0, fire, at + 1.0)

    stop = False
    base = loop.time() + 0.1
    for i in range(n):
        loop.call_at(base + i / n, fire, base + i / n)
    await asyncio.sleep(1.5)
    c0, k0 = time.process_time(), count
    await asyncio.sleep(window)
    c1, k1 = time.process_time(), count
    stop = True
    return 1e6 * (c1 - c0) / max(1, k1 - k0)


async def scheduler_noop(n: int, window: float = WINDOW) -> float:
    """CPU per job run of ``n`` targets at 1 s whose scrape does nothing."""
    count = 0

    async def scrape(key: str) -> None:
        nonlocal count
        count += 1

    scheduler = TargetScheduler(scrape)
    scheduler.start()
    try:
        for i in range(n):
            scheduler.schedule(Target("bench", f"job-{i}", f"pod-{i}", "uid",
                                      f"http://127.0.0.1:1/{i}", 1.0))
        await asyncio.sleep(2.5)
        c0, k0 = time.process_time(), count
        await asyncio.sleep(window)
        c1, k1 = time.process_time(), count
    finally:
        scheduler.shutdown()
    return 1e6 * (c1 - c0) / max(1, k1 - k0)


async def aiohttp_304(urls: list[str], window: float = WINDOW) -> float:
    """CPU per GET -> 304, ``len(urls)/PHASES`` at once, ``PHASES`` bursts a second."""
    session = aiohttp_session(ScrapeLimits().concurrency)
    try:
        async with session.get(urls[0], headers={"Accept": "application/json"}) as resp:
            etag = resp.headers["ETag"]
        headers = {"Accept": "application/json", "If-None-Match": etag}

        async def one(url: str) -> None:
            async with session.get(url, headers=headers, allow_redirects=False) as resp:
                if resp.status != 304:
                    raise RuntimeError(f"{url}: HTTP {resp.status}, expected 304")

        burst = max(1, len(urls) // PHASES)
        batches = [urls[i:i + burst] for i in range(0, len(urls), burst)]
        for batch in batches:  # open every connection first
            await asyncio.gather(*(one(u) for u in batch))
        done, c0 = 0, time.process_time()
        end = time.monotonic() + window
        while time.monotonic() < end:
            for batch in batches:
                await asyncio.gather(*(one(u) for u in batch))
                done += len(batch)
                await asyncio.sleep(1.0 / PHASES)
                if time.monotonic() >= end:
                    break
        return 1e6 * (time.process_time() - c0) / max(1, done)
    finally:
        await session.close()


async def changing_pieces(urls: list[str], window: float = WINDOW) -> dict[str, float]:
    """CPU us per operation of a changing scrape's pieces, nginx answering 200 with the
    JSON body (no ``If-None-Match``), ``len(urls)/PHASES`` at once, ``PHASES`` bursts a
    second, as :func:`aiohttp_304`; the pure-CPU pieces in a loop of their own."""
    from exporter_lib.status import TrainerStatus
    from scraper.decide.decision import decide
    from scraper.scrape.exporter import ExporterScraper
    from scraper.scrape.loop import ScrapeLoop
    from scraper.scrape.target_state import TargetState
    from scraper.shared.scrapes import Fresh
    from scraper.shared.trainjobs import TrainJobRecord, TrainJobStore
    from scraper.telemetry import JobView, Telemetry
    from scraper.write.rate import WriteBudget
    from scraper.write.rules import WriteRules
    from scraper.write.writer import StatusWriter

    targets = [Target("bench", f"job-{i}", f"pod-{i}", "uid", url, 1.0)
               for i, url in enumerate(urls)]
    burst = max(1, len(urls) // PHASES)
    batches = [targets[i:i + burst] for i in range(0, len(targets), burst)]
    scraper = ExporterScraper(ScrapeLimits())
    session = aiohttp_session(ScrapeLimits().concurrency)
    headers = {"Accept": "application/json", "Accept-Encoding": "identity"}

    async def raw(target: Target) -> None:
        async with session.get(target.url, headers=headers,
                               allow_redirects=False) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{target.url}: HTTP {resp.status}, expected 200")
            await resp.read()

    # The scraper's own exchange (scraper/scrape/http_exchange.py), when the code measured has
    # it (an older commit under breakdown_compare does not: the row is left out).
    lean = None
    if importlib.util.find_spec("scraper.scrape.http_exchange") is not None:
        from scraper.scrape.http_exchange import ConnectionPool, endpoint
        lean = ConnectionPool(ScrapeLimits().concurrency)
        ends = {t.url: endpoint(t.url, USER_AGENT) for t in targets}

    async def lean_get(target: Target) -> None:
        assert lean is not None
        resp = await lean.get(ends[target.url], headers, 1 << 20)
        try:
            if resp.status != 200:
                raise RuntimeError(f"{target.url}: HTTP {resp.status}, expected 200")
            await resp.read()
        finally:
            resp.release()

    async def full(target: Target) -> None:
        result = await scraper.scrape(target)
        if not isinstance(result, Fresh):
            raise RuntimeError(f"{target.url}: {result}, expected a fresh status")

    async def timed(one: Callable[[Target], Awaitable[None]]) -> float:
        for batch in batches:  # open every connection first
            await asyncio.gather(*(one(t) for t in batch))
        done, c0 = 0, time.process_time()
        end = time.monotonic() + window
        while time.monotonic() < end:
            for batch in batches:
                await asyncio.gather(*(one(t) for t in batch))
                done += len(batch)
                await asyncio.sleep(1.0 / PHASES)
                if time.monotonic() >= end:
                    break
        return 1e6 * (time.process_time() - c0) / max(1, done)

    out: dict[str, float] = {}
    try:
        async def noop(target: Target) -> None:
            return None

        # The harness's own cost per operation (tasks, gather, the bursts' sleeps), paid
        # alike by every row below: the exchanges' own cost is a row minus this one.
        out["harness"] = await timed(noop)
        # Alternated twice, so a change of the machine's load hits both alike.
        for rep in range(2):
            out[f"aiohttp_200_{rep}"] = await timed(raw)
            if lean is not None:
                out[f"lean_200_{rep}"] = await timed(lean_get)
        for name in ("aiohttp_200", "lean_200"):
            if f"{name}_0" in out:
                out[name] = (out.pop(f"{name}_0") + out.pop(f"{name}_1")) / 2
        out["scrape_200"] = await timed(full)
        async with session.get(urls[0], headers={"Accept": "application/json"}) as resp:
            body = await resp.read()
    finally:
        await scraper.close()
        await session.close()
        if lean is not None:
            await lean.close()
    count = 20_000
    c0 = time.process_time()
    for _ in range(count):
        TrainerStatus.from_json(body)
    out["decode"] = 1e6 * (time.process_time() - c0) / count

    # The loop's rules for a fresh status, with the writer's real apply (informer store
    # lookup, same-report compare, the write queue); no writer task runs.
    from kubernetes import client as k8s
    store = TrainJobStore([None])
    store.synced.set()
    writer = StatusWriter.for_client(k8s.ApiClient(), identity="bench",
                                     budget=WriteBudget(20, 30), store=store,
                                     rules=WriteRules(decide))
    telemetry = Telemetry(lambda: [])
    loop = ScrapeLoop(scraper, writer, writer.events, backoff_max=60,
                      counts=telemetry)
    status = TrainerStatus.from_json(body)
    states = []
    for t in targets:
        store._records[(t.namespace, t.trainjob)] = TrainJobRecord("uid", None)
        states.append(TargetState(JobView(t.namespace, t.trainjob, t.pod_name), target=t))
    fresh = [Fresh(status.model_copy(update={"progress_percentage": p}), '"e"', 300.0)
             for p in range(2)]
    rounds = max(1, count // len(states))
    c0 = time.process_time()
    for k in range(rounds):
        for state in states:
            assert state.target is not None
            await loop._handle(state, state.target, fresh[k % 2])
    out["handle"] = 1e6 * (time.process_time() - c0) / (rounds * len(states))
    return out


#: The pieces :func:`changing_pieces` measures.
CHANGING_PIECES = {
    "harness": "the measuring harness alone (a no-op per operation; in every row)",
    "aiohttp_200": "aiohttp ClientSession GET -> 200, JSON body read",
    "lean_200": "scraper.scrape.http_exchange ConnectionPool GET -> 200, JSON body read",
    "scrape_200": "ExporterScraper.scrape -> Fresh (slot, timeout, GET, body cap, decode, "
                  "validate)",
    "decode": "decode + validate of the JSON body alone",
    "handle": "ScrapeLoop._handle of a fresh status (counts, compare, hand to the write "
              "queue; no writer)",
}


async def thread_hop(count: int = 2000) -> float:
    """CPU per ``asyncio.to_thread`` of a function that does nothing."""
    c0 = time.process_time()
    for _ in range(count):
        await asyncio.to_thread(lambda: None)
    return 1e6 * (time.process_time() - c0) / count


#: TrainJobs written at once by the writer paths of :func:`status_writes`.
LANES = 8


async def status_writes(count: int) -> dict[str, float]:
    """CPU us per status write, ``count`` writes each, by path (:data:`WRITE_PATHS`); the
    three writer paths twice each, alternated, averaged, :data:`LANES` TrainJobs at once
    (the pre-queue path one write at a time, as it was called)."""
    import json
    from datetime import UTC, datetime
    from typing import Any
    from urllib.parse import quote, urlencode

    import urllib3
    from aiolimiter import AsyncLimiter
    from kubernetes import client

    from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL, TrainerStatus
    from localdev.cluster.controlplane import ControlPlane
    from localdev.cluster.crds import install_trainjob_crds
    from localdev.cluster.objects import create_trainjob
    from scraper.decide.decision import decide
    from scraper.kube.apply_request import APPLY_CONTENT_TYPE, encode_apply_body
    from scraper.kube.calls import Retries, call
    from scraper.kube.client import REQUEST_TIMEOUT
    from scraper.shared.outcome import FIELD_MANAGER, WriteOutcome
    from scraper.shared.trainjobs import TrainJobStore
    from scraper.write.annotation_target import Place, apply_request
    from scraper.write.rate import WriteBudget
    from scraper.write.rules import WriteRules
    from scraper.write.worker import StatusRequest
    from scraper.write.writer import StatusWriter

    def status(i: int) -> TrainerStatus:
        return TrainerStatus.from_api({
            "progressPercentage": i % 101,
            "metrics": [{"name": f"m{j}", "value": f"{i}.{j}"} for j in range(8)],
            "lastUpdatedTime": datetime.now(UTC)})

    with ControlPlane() as plane:
        api = plane.api_client()
        install_trainjob_crds(api)
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "bench"}})
        for k in range(LANES):
            create_trainjob(api, "bench", f"w{k}")
        custom = client.CustomObjectsApi(api)
        path = "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/status"
        params = {"group": API_GROUP, "version": API_VERSION, "namespace": "bench",
                  "plural": TRAINJOB_PLURAL, "name": "w0"}

        def former(i: int) -> object:
            body = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "TrainJob",
                    "metadata": {"name": "w0", "namespace": "bench"},
                    "status": {"trainerStatus": status(i).to_api()}}
            return api.call_api(path, "PATCH", dict(params),
                                [("fieldManager", FIELD_MANAGER), ("force", "true")],
                                {"Content-Type": "application/apply-patch+yaml",
                                 "Accept": "application/json"},
                                body=body, response_type="object",
                                auth_settings=["BearerToken"], _return_http_data_only=True)

        limiter = AsyncLimiter(10**6, 1.0)
        retries = Retries(attempts=5)
        for i in range(20):  # warm the connection
            await call(former, i, limiter=limiter, retries=retries)
        c0 = time.process_time()
        for i in range(count):  # as the former StatusWriter._apply called it
            await call(former, i + 1, limiter=limiter, retries=retries)
        before = 1e6 * (time.process_time() - c0) / count

        class CallApiRequest:
            """Today's queue and writer tasks with the request made as before issue 14,
            deliverable 4: ``ApiClient.call_api`` (``_preload_content=False`` and one
            ``json.loads``)."""

            async def apply(self, namespace: str, name: str, st: TrainerStatus,
                            place: Place, uid: str, resource_version: str) -> dict[str, Any]:
                return await asyncio.to_thread(self._call_api, namespace, name, st,
                                               resource_version)

            def _call_api(self, namespace: str, name: str, st: TrainerStatus,
                          resource_version: str) -> dict[str, Any]:
                # The same body as today's (resourceVersion precondition included).
                _, _, body = apply_request(Place.STATUS, namespace, name, st, "",
                                           resource_version)
                resp = api.call_api(
                    path, "PATCH", {**params, "name": name}, [("fieldManager", FIELD_MANAGER),
                                                  ("force", "true")],
                    {"Content-Type": APPLY_CONTENT_TYPE, "Accept": "application/json"},
                    body=encode_apply_body(body), auth_settings=["BearerToken"],
                    _return_http_data_only=True, _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT)
                if resp.status >= 300:  # as the real path: an error answer raises
                    raise client.ApiException(status=resp.status, reason=resp.reason)
                result: dict[str, Any] = json.loads(resp.data)
                return result

            async def close(self) -> None:
                return None

        class PoolRequest:
            """Today's queue and writer tasks with the request of stop 11: the PATCH
            straight to the official client's urllib3 pool, in a worker thread."""

            async def apply(self, namespace: str, name: str, st: TrainerStatus,
                            place: Place, uid: str, resource_version: str) -> dict[str, Any]:
                return await asyncio.to_thread(self._pool, namespace, name, st,
                                               resource_version)

            def _pool(self, namespace: str, name: str, st: TrainerStatus,
                      resource_version: str) -> dict[str, Any]:
                request_path, request_params, body = apply_request(
                    Place.STATUS, namespace, name, st, "", resource_version)
                headers = {**api.default_headers, "Content-Type": APPLY_CONTENT_TYPE,
                           "Accept": "application/json"}
                query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
                api.update_params_for_auth(headers, query, ["BearerToken"])
                url = (f"{api.configuration.host}"
                       f"{quote(request_path.format(**request_params))}?{urlencode(query)}")
                resp = api.rest_client.pool_manager.request(
                    "PATCH", url, body=encode_apply_body(body), headers=headers,
                    timeout=urllib3.Timeout(connect=REQUEST_TIMEOUT[0],
                                            read=REQUEST_TIMEOUT[1]))
                if resp.status >= 300:  # as the real path: an error answer raises
                    raise client.ApiException(status=resp.status, reason=resp.reason)
                result: dict[str, Any] = json.loads(resp.data)
                return result

            async def close(self) -> None:
                return None

        async def per_write(name: str, request: StatusRequest | None, base: int) -> float:
            store = TrainJobStore(["bench"])
            # The TrainJobs as they are now (the earlier paths wrote them): every write is
            # decided against the current resourceVersion, as the informer gives it.
            store.on_list("bench", [custom.get_namespaced_custom_object(
                API_GROUP, API_VERSION, "bench", TRAINJOB_PLURAL, f"w{k}")
                for k in range(LANES)])
            writer = StatusWriter.for_client(api, identity="bench",
                                             budget=WriteBudget(1e6, 10**6), store=store,
                                             rules=WriteRules(decide), request=request)
            writer.start()

            async def lane(k: int, first: int, n: int) -> list[WriteOutcome]:
                # One TrainJob's writes one after the other; the lanes run at once, so
                # the writers stay busy as under a stream of changes.
                return [await writer.apply_and_wait("bench", f"w{k}", status(first + i))
                        for i in range(n)]

            per_lane = max(1, count // LANES)
            try:
                await asyncio.gather(*(lane(k, base, 5) for k in range(LANES)))
                c0 = time.process_time()
                lanes = await asyncio.gather(*(lane(k, base + 100, per_lane)
                                               for k in range(LANES)))
                cpu = time.process_time() - c0
                outcomes = {o for one in lanes for o in one}
                if outcomes != {WriteOutcome.WRITTEN}:
                    raise RuntimeError(f"{name}: outcomes {outcomes}, not written")
                return 1e6 * cpu / (LANES * per_lane)
            finally:
                await writer.stop()

        # None: today's request (scraper.write.worker.StatusApply).
        writers: list[tuple[str, Callable[[], StatusRequest | None]]] = [
            ("call_api", CallApiRequest), ("pool_thread", PoolRequest),
            ("today", lambda: None)]
        runs: dict[str, list[float]] = {name: [] for name, _ in writers}
        try:
            # Alternated, so a change of the machine's load hits all alike.
            for rep in range(2):
                for k, (name, make) in enumerate(writers):
                    runs[name].append(await per_write(name, make(),
                                                      10_000 * (3 * rep + k + 1)))
        finally:
            api.close()
    return {"pre_queue": before, **{name: sum(v) / len(v) for name, v in runs.items()}}


#: The status write paths :func:`status_writes` measures, in the order they were built.
WRITE_PATHS = {
    "pre_queue": "before the write queue (stop 9: the client's JSON body and answer "
                 "models, a to_thread per write)",
    "call_api": "the queue, the request through ApiClient.call_api in a thread (stop 10)",
    "pool_thread": "the queue, the PATCH straight to the client's urllib3 pool in a "
                   "writer thread (stop 11)",
    "today": "the queue, an aiohttp PATCH on the event loop (today)",
}


def measure(n: int, window: float = WINDOW, writes: int = 0,
            cores: tuple[int, int] | None = None) -> list[str]:
    """All pieces for ``n`` targets, ``window`` seconds each; one printable line each.

    ``cores``: ``(nginx's, this process's)`` CPU to pin each to, or None (unpinned)."""
    if cores is not None:
        os.sched_setaffinity(0, {cores[1]})
    lines = [f"asyncio timer wakeup, {n}/s spread: "
             f"{asyncio.run(timer_wakeups(n, window)):.0f} us",
             f"APScheduler job run, no-op scrape, {n} targets, {PHASES} phases: "
             f"{asyncio.run(scheduler_noop(n, window)):.0f} us"]
    with NginxFarm(n) as farm:
        if cores is not None:
            os.sched_setaffinity(farm.pid, {cores[0]})
        lines.append(f"aiohttp ClientSession GET -> 304, {max(1, n // PHASES)} at once x "
                     f"{PHASES}/s: "
                     f"{asyncio.run(aiohttp_304(farm.urls(n), window)):.0f} us")
        pieces = asyncio.run(changing_pieces(farm.urls(n), window))
        lines += [f"changing scrape, {max(1, n // PHASES)} at once x {PHASES}/s: "
                  f"{CHANGING_PIECES[k]}: {v:.0f} us" for k, v in pieces.items()]
    lines.append(f"asyncio.to_thread(no-op), the hop of each official-client call: "
                 f"{asyncio.run(thread_hop()):.0f} us")
    if writes:
        paths = asyncio.run(status_writes(writes))
        lines.append(f"status write to kube-apiserver (8 metrics), CPU of the scraper "
                     f"process, {writes} writes each: " + "; ".join(
                         f"{WRITE_PATHS[k]}: {v:.0f} us" for k, v in paths.items()))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.breakdown")
    parser.add_argument("--targets", type=int, default=1000, help="at least 1")
    parser.add_argument("--writes", type=int, default=300,
                        help="status writes per path to a real kube-apiserver (0: skip)")
    parser.add_argument("--pin", action="store_true",
                        help="nginx on core 0, this process on core 1")
    parser.add_argument("--window", type=float, default=WINDOW, help="seconds per piece")
    args = parser.parse_args()
    if args.targets < 1:
        parser.error(f"--targets={args.targets}: must be at least 1")
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("\n".join(measure(args.targets, args.window, writes=max(0, args.writes),
                           cores=(0, 1) if args.pin else None)))
    print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
