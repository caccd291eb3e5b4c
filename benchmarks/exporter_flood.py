"""Normal scrapes of a real exporter under connection floods (issue 21, input 7).

``python -m benchmarks.exporter_flood [--seconds S] [--report PATH]``

A real training process (a child with ``RLIMIT_NOFILE=1024`` stepping every 10 ms and
calling ``exporter_lib.update()``) serves on 127.0.0.1.  For each flood a flood child
holds its connections for ``S`` seconds and reconnects every one the exporter closes
(a sustained flood, not a burst):

* ``trickle``: 3000 connections, half never sending, half sending a request head one
  byte per 0.5 s (never complete, never reading);
* ``pipeline-N`` (N = 300, 1000, 3000): N clients, each with a 4 KiB receive buffer,
  sending 200 pipelined ``GET /metrics`` and never reading.

Meanwhile this process scrapes the trainer from 127.0.0.1 every 0.1 s in two ways side
by side: with the scraper's own client (``scraper.scrape.exporter.ExporterScraper``: a pooled
keep-alive connection, as deployed) and with one fresh connection per scrape (10 s
timeout each, the scraper's default), and reads the trainer's steps/s and its threads
and descriptors from ``/proc``.  Each flood runs
twice: from another address
(127.0.0.2, as another pod) and from the scraper's own address (127.0.0.1: the
per-peer share cannot help, only the stalled-first rule).  A baseline row has no
flood.  Loopback only; every process started is stopped at the end.

Control rows aim the same flood at an exporter in another process (no training in it)
while the trainer's exporter is scraped unflooded: the steps/s there is what the
machine's load alone leaves the trainer, the like-for-like base of the flooded rows.

Prints one Markdown table (and writes it to ``--report`` when given).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import resource
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TRAINING = r"""
import os, resource, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
import exporter_lib
exp = exporter_lib.start(port=0, host="127.0.0.1", install_signal_handler=False)
print(exp.port, flush=True)
print(exporter_lib.__file__, file=sys.stderr, flush=True)
step = 0
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    step += 1
    exporter_lib.update(progress_percentage=step % 100, metrics={"step": step})
    with open(sys.argv[2] + ".tmp", "w") as handle:  # the loop needs descriptors too
        handle.write(str(step))
    os.replace(sys.argv[2] + ".tmp", sys.argv[2])
    time.sleep(0.01)
"""

#: The control rows' flood target: an exporter in a process of its own, not training.
ELSEWHERE = r"""
import sys, time
import exporter_lib
exp = exporter_lib.start(port=0, host="127.0.0.1", install_signal_handler=False)
print(exp.port, flush=True)
time.sleep(float(sys.argv[1]))
"""

SCRAPE = (b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n"
          b"Connection: close\r\n\r\n")
PIPELINED = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"  # the text format: ~1 KiB answers
PIPELINE_DEPTH = 200
RCVBUF = 4096
TRICKLE_HEAD = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4000
SCRAPE_PERIOD = 0.1
#: The scraper's default ``--scrape-timeout`` (scraper.scrape.exporter.ScrapeLimits).
SCRAPE_TIMEOUT = 10.0
FLOODS = [("trickle", 3000), ("pipeline", 300), ("pipeline", 1000), ("pipeline", 3000)]


# ------------------------------------------------------------------------ flood child


@dataclass
class _Client:
    sock: socket.socket
    pending: bytes
    sent_head: int = 0


def flood(kind: str, count: int, port: int, seconds: float, source: str,
          reconnect: bool, full: Path | None = None) -> dict[str, int]:
    """Open ``count`` flood connections of ``kind`` and hold them for ``seconds`` from
    when all were opened; with ``reconnect`` every one the exporter closes is opened
    again at once.  ``full``, if given, is created once all were opened (a test waits
    for it instead of guessing how long opening takes on a loaded machine).

    Returns counts: connects made, closes seen (the exporter evicted or refused).
    """
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    poller = select.epoll()
    clients: dict[int, _Client] = {}
    stats = {"connects": 0, "closed": 0}

    def open_one() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if kind == "pipeline":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        sock.bind((source, 0))
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        data = PIPELINED * PIPELINE_DEPTH if kind == "pipeline" else b""
        clients[sock.fileno()] = _Client(sock, data)
        poller.register(sock.fileno(), select.EPOLLOUT | select.EPOLLRDHUP)
        stats["connects"] += 1

    def drop(fd: int) -> None:
        client = clients.pop(fd)
        with contextlib.suppress(OSError):
            poller.unregister(fd)
        client.sock.close()
        stats["closed"] += 1

    # Bounded: opening takes well under a minute even on a loaded machine.
    end = time.monotonic() + seconds + 60
    next_trickle = time.monotonic()
    opened = False
    while time.monotonic() < end:
        # Keep ``count`` open: at most 500 connects per pass, as a fast client would.
        missing = count - (len(clients) if reconnect else stats["connects"])
        for _ in range(min(500, missing)):
            try:
                open_one()
            except OSError:
                break
        if not opened and stats["connects"] >= count:
            opened, end = True, time.monotonic() + seconds
            if full is not None:
                full.touch()
        for fd, events in poller.poll(0.05):
            client = clients.get(fd)
            if client is None:
                continue
            if events & (select.EPOLLERR | select.EPOLLHUP | select.EPOLLRDHUP):
                drop(fd)
                continue
            if events & select.EPOLLOUT:
                try:
                    if client.pending:
                        client.pending = client.pending[client.sock.send(client.pending):]
                    if not client.pending:
                        poller.modify(fd, select.EPOLLRDHUP)  # never reads, waits for close
                except OSError:
                    drop(fd)
        if kind == "trickle" and time.monotonic() >= next_trickle:
            next_trickle = time.monotonic() + 0.5
            for fd, client in list(clients.items()):
                if fd % 2 and client.sent_head < len(TRICKLE_HEAD):
                    try:
                        client.sock.send(TRICKLE_HEAD[client.sent_head:client.sent_head + 1])
                        client.sent_head += 1
                    except OSError:
                        drop(fd)
    for fd in list(clients):
        clients.pop(fd).sock.close()
    return stats


# ------------------------------------------------------------------------ measuring


def scrape_once(port: int) -> tuple[str, float]:
    """One scrape on a fresh connection: (``ok``|``reset``|``timeout``|``other``, seconds)."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=SCRAPE_TIMEOUT) as sock:
            sock.settimeout(max(0.1, SCRAPE_TIMEOUT - (time.monotonic() - started)))
            sock.sendall(SCRAPE)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    except TimeoutError:
        return "timeout", time.monotonic() - started
    except ConnectionError:
        return "reset", time.monotonic() - started
    except OSError:
        return "other", time.monotonic() - started
    outcome = "ok" if answer.startswith(b"HTTP/1.1 200") else "other"
    return outcome, time.monotonic() - started


def proc_counts(pid: int) -> tuple[int, int]:
    """Threads and open descriptors of process ``pid`` (``/proc/PID/status``, ``/proc/PID/fd``)."""
    threads = int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text()
                       .splitlines() if line.startswith("Threads:")))
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def training_steps(path: Path) -> int:
    """The step count :data:`TRAINING` last wrote to ``path`` (0 before its first step)."""
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


@dataclass
class Probe:
    """Outcomes and latencies (seconds) of one kind of scrape."""

    outcomes: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)

    def add(self, outcome: str, took: float) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if outcome == "ok":
            self.latencies.append(took)

    def cells(self) -> list[str]:
        total = sum(self.outcomes.values())
        lat = sorted(self.latencies)
        p50 = statistics.median(lat) * 1000 if lat else float("nan")
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else float("nan")
        failed = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()) if k != "ok")
        return [f"{self.outcomes.get('ok', 0)}/{total}", failed or "-", f"{p50:.1f}",
                f"{p99:.1f}"]


@dataclass
class Row:
    flood: str
    source: str
    seconds: float
    steps_per_second: float
    pooled: Probe = field(default_factory=Probe)
    fresh: Probe = field(default_factory=Probe)
    threads: int = 0
    fds: int = 0
    flood_stats: dict[str, int] = field(default_factory=dict)

    def cells(self) -> list[str]:
        return [self.flood, self.source, *self.pooled.cells(), *self.fresh.cells(),
                f"{self.steps_per_second:.1f}", str(self.threads), str(self.fds),
                str(self.flood_stats.get("connects", 0)),
                str(self.flood_stats.get("closed", 0))]


def scraper_probe(port: int, seconds: float, probe: Probe, scrapes: int | None = None) -> None:
    """Scrape as the scraper does, for ``seconds`` (or until ``scrapes`` are done, if
    given, within ``seconds``): its own client (:class:`scraper.scrape.exporter.ExporterScraper`:
    pooled keep-alive connection, one retry on a stale one, the default 10 s timeout),
    one scrape per :data:`SCRAPE_PERIOD`."""
    from scraper.scrape.exporter import ExporterScraper
    from scraper.scrape.exporter import ScrapeLimits as Limits
    from scraper.shared.scrapes import Failure, Fresh, NothingYet, NotModified
    from scraper.shared.targets import Target

    async def run() -> None:
        scraper = ExporterScraper(Limits())
        target = Target("bench", "flood", "", "", f"http://127.0.0.1:{port}/metrics", 15.0)
        end = time.monotonic() + seconds
        try:
            done = 0
            while time.monotonic() < end and (scrapes is None or done < scrapes):
                done += 1
                started = time.monotonic()
                result = await scraper.scrape(target)
                took = time.monotonic() - started
                if isinstance(result, Fresh | NotModified | NothingYet):
                    probe.add("ok", took)
                elif isinstance(result, Failure):
                    probe.add(result.kind.value, took)
                else:
                    probe.add(type(result).__name__, took)
                await asyncio.sleep(max(0.0, SCRAPE_PERIOD - took))
        finally:
            await scraper.close()

    asyncio.run(run())


def measure(port: int, pid: int, steps: Path, seconds: float, flood_cmd: list[str] | None,
            name: str, source: str) -> Row:
    """Scrape for ``seconds`` (the scraper's client and fresh connections, side by side)
    while ``flood_cmd`` (if any) runs."""
    child = None
    out = None
    if flood_cmd is not None:
        out = tempfile.NamedTemporaryFile("w+", suffix=".json", delete=False)  # noqa: SIM115
        child = subprocess.Popen([*flood_cmd, out.name])
        time.sleep(1.5)  # the flood reaches its size
    row = Row(name, source, seconds, 0.0)
    pooled = threading.Thread(target=scraper_probe, args=(port, seconds, row.pooled))
    before, start = training_steps(steps), time.monotonic()
    pooled.start()
    end = start + seconds
    while time.monotonic() < end:
        outcome, took = scrape_once(port)
        row.fresh.add(outcome, took)
        threads, fds = proc_counts(pid)
        row.threads, row.fds = max(row.threads, threads), max(row.fds, fds)
        time.sleep(max(0.0, SCRAPE_PERIOD - took))
    row.steps_per_second = (training_steps(steps) - before) / (time.monotonic() - start)
    pooled.join(timeout=SCRAPE_TIMEOUT + 5)
    if child is not None and out is not None:
        child.wait(timeout=seconds + 30)
        with contextlib.suppress(ValueError):
            row.flood_stats = json.loads(Path(out.name).read_text() or "{}")
        os.unlink(out.name)
    return row


HEADER = ["flood", "flood from", "scraper's client: ok", "failed", "p50 ms", "p99 ms",
          "fresh connection: ok", "failed", "p50 ms", "p99 ms", "trainer steps/s",
          "threads (max)", "fds (max)", "flood connects", "flood closes seen"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--report", type=Path)
    parser.add_argument("--exporter-from", type=Path, help="import the trainer's exporter_lib "
                        "from this directory (e.g. another checkout, for a before/after)")
    parser.add_argument("--flood", nargs=6, help=argparse.SUPPRESS,
                        metavar=("KIND", "N", "PORT", "SECONDS", "SOURCE", "RECONNECT"))
    parser.add_argument("out", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.flood:
        kind, n, port, seconds, source, again = args.flood
        stats = flood(kind, int(n), int(port), float(seconds), source, again == "1",
                      Path(args.out + ".full"))
        Path(args.out).write_text(json.dumps(stats))
        return 0

    # The trainer's lifetime: far beyond the rows (it is killed at the end); a lifetime
    # fitted to the rows ran out on a loaded machine and left the last rows unserved.
    total = 20 * (args.seconds + 4) * (1 + 6 * len(FLOODS))
    # The trainer imports exporter_lib from PYTHONPATH (this checkout) or --exporter-from:
    # a directory holding only an ``exporter_lib`` (e.g. a symlink to another checkout's).
    trainer_path = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    if args.exporter_from:
        trainer_path["PYTHONPATH"] = os.pathsep.join(
            [str(args.exporter_from.resolve()), os.environ.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as tmp:
        steps = Path(tmp) / "steps"
        # cwd: not a checkout, whose exporter_lib ``-c`` would import before PYTHONPATH's.
        trainer = subprocess.Popen([sys.executable, "-c", TRAINING, str(total), str(steps)],
                                   stdout=subprocess.PIPE, text=True, cwd=tmp,
                                   env={**os.environ, "RANK": "0", **trainer_path})
        other = subprocess.Popen([sys.executable, "-c", ELSEWHERE, str(total)],
                                 stdout=subprocess.PIPE, text=True, cwd=tmp,
                                 env={**os.environ, "RANK": "0", **trainer_path})
        try:
            assert trainer.stdout is not None and other.stdout is not None
            port = int(trainer.stdout.readline())
            other_port = int(other.stdout.readline())
            time.sleep(1.0)
            load_before = os.getloadavg()
            rows = [measure(port, trainer.pid, steps, args.seconds, None, "none", "-")]
            for (kind, n), again, (source, target) in itertools.product(
                    FLOODS, ("0", "1"),
                    (("127.0.0.2", port), ("127.0.0.1", port), ("127.0.0.2", other_port))):
                cmd = [sys.executable, "-m", "benchmarks.exporter_flood", "--flood", kind,
                       str(n), str(target), str(args.seconds + 2.0), source, again]
                if target == other_port:
                    source = "control: flood on another process's exporter"
                name = (f"{kind}-{n}" if kind == "pipeline" else f"{kind} {n}") + (
                    ", reconnecting" if again == "1" else "")
                rows.append(measure(port, trainer.pid, steps, args.seconds, cmd, name,
                                    source))
                print(" | ".join(rows[-1].cells()), file=sys.stderr, flush=True)
            load_after = os.getloadavg()
        finally:
            for child in (trainer, other):
                child.kill()
                child.wait(timeout=10)
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.node()} "
        f"({os.cpu_count()} cores, Python {platform.python_version()}); load average "
        f"before {load_before[0]:.2f}, after {load_after[0]:.2f} (shared machine). "
        f"{args.seconds:g} s per row; one scrape per {SCRAPE_PERIOD:g} s, fresh connection, "
        f"{SCRAPE_TIMEOUT:g} s timeout; trainer RLIMIT_NOFILE=1024, one step per 10 ms; "
        f"exporter_lib from {args.exporter_from or 'this checkout'}.",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
        *("| " + " | ".join(row.cells()) + " |" for row in rows),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
