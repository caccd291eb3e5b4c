"""Hostile clients reach neither the training loop nor the scraper's scrapes (issue 13,
input 10; issue 21, input 7).

A real training process (a child with ``RLIMIT_NOFILE=1024``, stepping and calling
``update()``) serves on loopback; this test opens thousands of connections to it, some
idle, some trickling a request head one byte at a time.  Before: 2008 threads and 2011
descriptors in the training process, and the loop died of EMFILE.  Checked: the
process's threads and descriptors stay bounded, the loop keeps stepping, a scrape still
gets through.  Bounded: 3000 connections, 20 s of trickling.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks import exporter_flood
from exporter_lib import server
from tests.helpers.scraper import wait_for

CONNECTIONS = 3000


def _stepping(steps: Path) -> None:
    """Until the training's loop has stepped (its exporter serves and its threads are
    all up: the baseline of threads and descriptors is taken then)."""
    wait_for(lambda: exporter_flood.training_steps(steps) >= 10, 30, "the training stepping")


def test_connection_flood_leaves_threads_fds_and_the_loop_alone(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard >= CONNECTIONS + 200, f"this test needs RLIMIT_NOFILE >= {CONNECTIONS + 200}"
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    steps = tmp_path / "steps"
    child = subprocess.Popen([sys.executable, "-c", exporter_flood.TRAINING, "60", str(steps)],
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "RANK": "0"})
    socks: list[socket.socket] = []
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        _stepping(steps)
        base_threads, base_fds = exporter_flood.proc_counts(child.pid)
        before = exporter_flood.training_steps(steps)
        peak_threads, peak_fds = base_threads, base_fds
        deadline = time.monotonic() + 40
        for i in range(CONNECTIONS):
            if time.monotonic() > deadline:
                break
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                continue  # backlog full: the kernel refuses, the trainer never sees it
            sock.setblocking(False)
            if i % 2:
                with contextlib.suppress(OSError):
                    sock.send(b"G")  # the start of a head that never ends
            socks.append(sock)
            if i % 250 == 0:
                threads, fds = exporter_flood.proc_counts(child.pid)
                peak_threads, peak_fds = max(peak_threads, threads), max(peak_fds, fds)
        trickle_end = time.monotonic() + 20
        while time.monotonic() < trickle_end:
            for sock in socks[1::2][:500]:
                with contextlib.suppress(OSError):
                    sock.send(b"E")
            threads, fds = exporter_flood.proc_counts(child.pid)
            peak_threads, peak_fds = max(peak_threads, threads), max(peak_fds, fds)
            time.sleep(0.5)
        after = exporter_flood.training_steps(steps)
        # A scrape still gets through (it evicts the longest-waiting idle connection).
        with socket.create_connection(("127.0.0.1", port), timeout=10) as probe:
            probe.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\n"
                          b"Connection: close\r\n\r\n")
            answer = b""
            while chunk := probe.recv(65536):
                answer += chunk
        assert child.poll() is None, "the training process died"
        print(json.dumps({"threads": [base_threads, peak_threads], "fds": [base_fds, peak_fds],
                          "steps_during_flood": after - before, "opened": len(socks)}))
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert peak_threads <= base_threads + 1
        # Open connections are capped, and a socket over the cap plus its headroom is
        # closed where it is accepted (asyncio's own accept loop let bursts of a backlog's
        # worth pile up: 293-429 descriptors were measured here with it).
        assert peak_fds <= base_fds + server.MAX_CONNECTIONS + server.ACCEPT_HEADROOM + 4
        assert after - before > 100, "the training loop stalled"
    finally:
        for sock in socks:
            sock.close()
        child.kill()
        child.wait(timeout=10)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# -- issue 21, input 7: the scraper's scrapes get through a flood ----------------------

#: (kind, connections, reconnect, flood source): the floods of the issue (held, as
#: opened by a client that does not retry), and reconnecting ones from another address
#: and (trickling) from the scraper's own.  Not here: a pipelining flood from the
#: scraper's own address that reconnects at once, where fresh connections still lose
#: some scrapes (benchmarks/reports/exporter-flood.md, docs/exporter.md).
FLOODS = [
    ("trickle", 3000, False, "127.0.0.2"),
    ("pipeline", 300, False, "127.0.0.2"),
    ("pipeline", 1000, False, "127.0.0.2"),
    ("pipeline", 3000, False, "127.0.0.2"),
    ("pipeline", 3000, False, "127.0.0.1"),
    ("trickle", 3000, True, "127.0.0.2"),
    ("trickle", 3000, True, "127.0.0.1"),
    ("pipeline", 1000, True, "127.0.0.2"),
]


#: Scrapes of the scraper's pooled client during each flood; every one must succeed.
POOLED_SCRAPES = 10


@pytest.mark.parametrize(("kind", "count", "reconnect", "source"), FLOODS)
def test_normal_scrapes_succeed_under_a_flood(tmp_path: Path, kind: str, count: int,
                                              reconnect: bool, source: str) -> None:
    """Before: 5-10 % of scrapes reset under 3000 trickling connections, and 2 of 124
    succeeded under 3000 pipelining non-readers.  Every scrape (a fresh connection with
    the scraper's default 10 s timeout, as the benchmark's) must get its 200 now, and
    the loop keep stepping."""
    steps = tmp_path / "steps"
    child = subprocess.Popen([sys.executable, "-c", exporter_flood.TRAINING, "30", str(steps)],
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "RANK": "0"}, cwd=tmp_path)
    flooder = None
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        _stepping(steps)
        base_threads, base_fds = exporter_flood.proc_counts(child.pid)
        flooder = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.exporter_flood", "--flood", kind, str(count),
             str(port), "8", source, "1" if reconnect else "0", str(tmp_path / "flood.json")])
        # The flood at full size (all opened; held 8 s from then).
        wait_for(lambda: (tmp_path / "flood.json.full").exists(), 60, "the flood at full size")
        before, started = exporter_flood.training_steps(steps), time.monotonic()
        # The scraper's own client (pooled keep-alive connection) beside fresh connections:
        # a number of scrapes, not a number within a time (a connect that waits for the
        # kernel's backlog on a loaded machine costs seconds, not a scrape).
        pooled = exporter_flood.Probe()
        scraper = threading.Thread(target=exporter_flood.scraper_probe,
                                   args=(port, 30.0, pooled, POOLED_SCRAPES))
        scraper.start()
        outcomes = []
        for _ in range(15):  # one scrape per 0.1 s at most, as the benchmark's
            outcomes.append(exporter_flood.scrape_once(port)[0])
            time.sleep(0.1)
        scraper.join(timeout=60)
        after, took = exporter_flood.training_steps(steps), time.monotonic() - started
        threads, fds = exporter_flood.proc_counts(child.pid)
        assert flooder.wait(timeout=30) == 0
        stats = json.loads((tmp_path / "flood.json").read_text())
        assert stats["connects"] >= count, stats
        assert outcomes == ["ok"] * len(outcomes), outcomes
        assert pooled.outcomes == {"ok": POOLED_SCRAPES}, pooled.outcomes
        assert child.poll() is None, "the training process died"
        # The loop steps every 10 ms; a quarter of that pace under a loaded machine.
        assert after - before > took * 100 / 4, f"the loop stalled: {after - before} steps"
        assert threads <= base_threads + 1
        assert fds <= base_fds + server.MAX_CONNECTIONS + server.ACCEPT_HEADROOM + 4
    finally:
        if flooder is not None and flooder.poll() is None:
            flooder.kill()
            flooder.wait(timeout=10)
        child.kill()
        child.wait(timeout=10)


# -- the eviction rules themselves, deterministic (issue 21, input 7) --------------------

def _trainer(tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    # cwd: not the checkout, whose exporter_lib ``-c`` would import before PYTHONPATH's.
    child = subprocess.Popen([sys.executable, "-c", exporter_flood.TRAINING, "30",
                              str(tmp_path / "steps")],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "RANK": "0"},
                             cwd=tmp_path)
    assert child.stdout is not None
    return child, int(child.stdout.readline())


def _client(port: int, source: str, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((source, 0))
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    return sock


def _get(sock: socket.socket) -> bytes:
    """One keep-alive GET on ``sock``; the answer's head (raises on a reset)."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while not answer.endswith(b"ok\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionResetError("closed")
        answer += chunk
    return answer


@pytest.mark.parametrize("source", ["127.0.0.2", "127.0.0.1"])
def test_a_fresh_scrape_evicts_a_non_reading_pipeliner(tmp_path: Path, source: str) -> None:
    """Every slot held by clients that pipelined thousands of GETs and read nothing
    (their answers back up into the exporter): before, they were "busy", never
    evicted, and the new scrape was reset.  Now a non-reader goes, the scrape is
    answered, whichever address the non-readers come from."""
    child, port = _trainer(tmp_path)
    socks: list[socket.socket] = []
    try:
        pipelined = exporter_flood.PIPELINED * 3000
        for _ in range(server.MAX_CONNECTIONS):
            sock = _client(port, source, rcvbuf=exporter_flood.RCVBUF)
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.send(pipelined)
            socks.append(sock)
        time.sleep(2.0)  # answered until each one's answers back up
        assert exporter_flood.scrape_once(port)[0] == "ok"
    finally:
        for sock in socks:
            sock.close()
        child.kill()
        child.wait(timeout=10)


@pytest.mark.parametrize("source", ["127.0.0.2", "127.0.0.1"])
def test_a_keep_alive_scraper_outlives_idle_connections(tmp_path: Path, source: str) -> None:
    """The scraper's pooled connection, idle between two scrapes, while 3 times the cap of
    silent connections arrive: before, the connection idle longest went first, which
    was the scraper's.  Now a peer over its share, and silent or new connections, go
    before a keep-alive client that read every answer."""
    child, port = _trainer(tmp_path)
    socks: list[socket.socket] = []
    try:
        pooled = _client(port, "127.0.0.1")
        assert _get(pooled).startswith(b"HTTP/1.1 200")
        time.sleep(0.2)
        for _ in range(3 * server.MAX_CONNECTIONS):
            with contextlib.suppress(OSError):
                socks.append(_client(port, source))
        time.sleep(1.5)  # past the new-connection grace, and more of them
        for _ in range(server.MAX_CONNECTIONS):
            with contextlib.suppress(OSError):
                socks.append(_client(port, source))
        time.sleep(0.5)
        assert _get(pooled).startswith(b"HTTP/1.1 200")
    finally:
        for sock in [*socks]:
            sock.close()
        child.kill()
        child.wait(timeout=10)
