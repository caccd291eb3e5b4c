"""Where a scrape's CPU goes: the pieces of our scraper measured one at a time.

``python -m benchmarks.breakdown [--targets N]`` prints one line per piece, CPU
microseconds (user+system of this process) per operation:

* a bare asyncio timer wakeup, N timers a second spread over the interval;
* one APScheduler job run through :class:`scraper.scheduling.TargetScheduler` for a
  scrape that does nothing, N targets at a 1 s interval;
* aiohttp's ``ClientSession`` GET answered by a 304 from nginx, alone, in the
  pattern the 20 phases give (N/20 requests at once, 20 times a second);
* ``asyncio.to_thread`` of a no-op, the hop every status write makes into the
  synchronous Kubernetes client.

Every loop is bounded (a few seconds each); nginx listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from benchmarks.farm import NginxFarm
from scraper.scheduling import PHASES, TargetScheduler
from scraper.scraping import ScrapeLimits, client_session
from scraper.targets import Target

WINDOW = 4.0  # default measured seconds per timed piece


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
    session = client_session(ScrapeLimits().concurrency)  # the scraper's own session
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


async def thread_hop(count: int = 2000) -> float:
    """CPU per ``asyncio.to_thread`` of a function that does nothing."""
    c0 = time.process_time()
    for _ in range(count):
        await asyncio.to_thread(lambda: None)
    return 1e6 * (time.process_time() - c0) / count


def measure(n: int, window: float = WINDOW) -> list[str]:
    """All pieces for ``n`` targets, ``window`` seconds each; one printable line each."""
    lines = [f"asyncio timer wakeup, {n}/s spread: "
             f"{asyncio.run(timer_wakeups(n, window)):.0f} us",
             f"APScheduler job run, no-op scrape, {n} targets, {PHASES} phases: "
             f"{asyncio.run(scheduler_noop(n, window)):.0f} us"]
    with NginxFarm(n) as farm:
        lines.append(f"aiohttp ClientSession GET -> 304, {max(1, n // PHASES)} at once x "
                     f"{PHASES}/s: "
                     f"{asyncio.run(aiohttp_304(farm.urls(n), window)):.0f} us")
    lines.append(f"asyncio.to_thread(no-op), the status write's hop: "
                 f"{asyncio.run(thread_hop()):.0f} us")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.breakdown")
    parser.add_argument("--targets", type=int, default=1000, help="at least 1")
    args = parser.parse_args()
    if args.targets < 1:
        parser.error(f"--targets={args.targets}: must be at least 1")
    print("\n".join(measure(args.targets)))


if __name__ == "__main__":
    main()
