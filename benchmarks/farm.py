"""Target farms on 127.0.0.1: nginx serving one static payload on N ports, and real
exporter_lib exporters (in a few child processes) whose status changes in a loop.

Every farm is a context manager that kills what it started, also on errors.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from benchmarks.payload import render_payloads
from benchmarks.pinning import pinned
from localdev.cluster import processes

NGINX = "/usr/sbin/nginx"


#: Lowest port a farm takes: above the well-known and registered ports most services use.
FARM_PORT_LOW = 10000


def _ephemeral_low() -> int:
    """Lowest port of the kernel's ephemeral range (``ip_local_port_range``)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (all bound at once, then released).

    Taken below the kernel's ephemeral range, from a random start: between this call and
    the farm's own bind, other processes on a shared machine that bind port 0 (or
    connect out) get ephemeral ports, and took a farm port often enough at 4000 ports
    to stop nginx from starting.  Falls back to ephemeral ports when the range below is
    too small.

    Raises:
        OSError: fewer than ``count`` ports could be bound.
    """
    high = _ephemeral_low()
    span = high - FARM_PORT_LOW
    socks: list[socket.socket] = []
    try:
        if span >= 2 * count:
            start = random.randrange(span)
            for i in range(span):
                if len(socks) == count:
                    break
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    sock.bind(("127.0.0.1", FARM_PORT_LOW + (start + i) % span))
                except OSError:
                    sock.close()
                    continue
                socks.append(sock)
        while len(socks) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def wait_http(url: str, timeout: float, headers: dict[str, str] | None = None) -> None:
    """Poll ``url`` until it answers 2xx; raise RuntimeError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(req, timeout=2) as resp:
                if 200 <= resp.status < 300:
                    return
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout}s: {last}")


def unready(urls: list[str], timeout: float) -> list[str]:
    """The ``urls`` that still do not answer 2xx when ``timeout`` seconds have passed
    (each tried until it answers or the shared deadline passes)."""
    deadline = time.monotonic() + timeout
    left = list(urls)
    while left and time.monotonic() < deadline:
        still = []
        for url in left:
            try:
                req = urllib.request.Request(url, headers={"Accept": "application/json"})
                with urllib.request.urlopen(req, timeout=2) as resp:
                    if 200 <= resp.status < 300:
                        continue
            except OSError:
                pass
            still.append(url)
        left = still
        if left:
            time.sleep(0.5)
    return left


# One process (no master): the one the benchmark started, so PDEATHSIG and process-group
# kills reach the process serving the farm.
NGINX_CONF = """\
master_process off;
worker_processes 1;
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
worker_rlimit_nofile {nofile};
events {{ worker_connections 16384; }}
http {{
    access_log off;
    client_body_temp_path {root}/tmp/body;
    proxy_temp_path {root}/tmp/proxy;
    fastcgi_temp_path {root}/tmp/fastcgi;
    uwsgi_temp_path {root}/tmp/uwsgi;
    scgi_temp_path {root}/tmp/scgi;
    types {{
        "text/plain; version=0.0.4; charset=utf-8" prom;
        application/json json;
    }}
    # JSON when the scraper asks for it; the Prometheus text format otherwise.
    map $http_accept $payload {{
        ~*application/json /payload.json;
        default /payload.prom;
    }}
    keepalive_requests 100000000;
    keepalive_timeout 600s;
    etag on;
    server {{
{listens}
        root {root}/www;
        location / {{
            try_files $payload =404;
        }}
    }}
}}
"""


class NginxFarm:
    """nginx serving the payload on ``count`` ports: N distinct targets like N pods.

    Static files get an ``ETag`` from nginx, and ``If-None-Match`` gets ``304``.
    ``cores``: the CPUs nginx is started on (see :mod:`benchmarks.pinning`); ``None``: all.
    """

    #: Starts with fresh ports when nginx exits because a port was taken meanwhile.
    START_ATTEMPTS = 3

    def __init__(self, count: int, cores: frozenset[int] | None = None) -> None:
        self.count = count
        self.cores = cores
        self.ports: list[int] = []
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def urls(self, n: int | None = None) -> list[str]:
        return [f"http://127.0.0.1:{p}/metrics" for p in self.ports[: n or self.count]]

    def __enter__(self) -> NginxFarm:
        if not os.access(NGINX, os.X_OK):
            raise RuntimeError(f"{NGINX} missing: install Debian's nginx-light "
                               "(scripts/bootstrap test does)")
        self._dir = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
        try:
            # The worker may run as another user (nginx started as root): make it readable.
            self._dir.chmod(0o755)
            (self._dir / "www").mkdir(mode=0o755)
            (self._dir / "tmp").mkdir()
            text, js = render_payloads()
            (self._dir / "www" / "payload.prom").write_bytes(text)
            (self._dir / "www" / "payload.json").write_bytes(js)
            conf = self._dir / "nginx.conf"
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            nofile = 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)
            for attempt in range(self.START_ATTEMPTS):
                self.ports = free_ports(self.count)
                listens = "\n".join(f"        listen 127.0.0.1:{p};" for p in self.ports)
                conf.write_text(NGINX_CONF.format(root=self._dir, listens=listens,
                                                  nofile=nofile))
                # Own process group, killed with this process even when it dies abruptly.
                with pinned(self.cores):
                    self._proc = processes.spawn(
                        [NGINX, "-p", str(self._dir), "-c", str(conf), "-e",
                         str(self._dir / "error.log")], self._dir / "stderr.log")
                try:
                    wait_http(self.urls(1)[0], 15)
                    wait_http(self.urls()[-1], 15)
                    break
                except RuntimeError:
                    # nginx exits when one listen fails: another process took a port.
                    if self._proc.poll() is None or attempt == self.START_ATTEMPTS - 1:
                        raise
                    processes.stop(self._proc)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._proc is not None and self._proc.poll() is None:
            # SIGQUIT: graceful stop of master and worker.
            self._proc.send_signal(signal.SIGQUIT)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                processes.stop(self._proc)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


class ExporterFarm:
    """``count`` real exporter_lib exporters in ``processes`` child processes.

    Each child (``python -m benchmarks.exporter_farm``) serves its share of the ports
    and calls ``update()`` on every exporter every ``period`` seconds for at most
    ``duration`` seconds, then exits by itself.  Each update carries a ``stamp`` metric
    (wall-clock time of the update) so a reader can tell updates apart and time them.
    ``log_dir`` receives one JSON file per child with every (port, stamp) it set.
    ``cores``: the CPUs the children are started on (see :mod:`benchmarks.pinning`).
    """

    #: Exporters per child process at most.  Each exporter is a stdlib threading server,
    #: so 500 of them in one process (two children for 1000) starve each other on the
    #: GIL: Prometheus 2.42 then saw 0-70% of the targets up ("context deadline
    #: exceeded" at a 0.9 s timeout); 125 per process kept all 1000 up.
    PER_PROCESS = 125

    def __init__(self, count: int, *, period: float, duration: float,
                 processes: int | None = None,
                 jitter: bool = False, cores: frozenset[int] | None = None) -> None:
        self.cores = cores
        self.count = count
        self.period = period
        self.duration = duration
        if processes is None:
            processes = -(-count // self.PER_PROCESS)
        self.processes = max(1, min(processes, count))
        self.jitter = jitter
        self.ports: list[int] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._dir: Path | None = None
        #: Exporter URLs that did not answer within the start's deadline.
        self.unready: list[str] = []

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}/metrics" for p in self.ports]

    @property
    def pids(self) -> list[int]:
        """The child processes serving the exporters."""
        return [proc.pid for proc in self._procs]

    def __enter__(self) -> ExporterFarm:
        self._dir = Path(tempfile.mkdtemp(prefix="bench-exporters-"))
        try:
            self.ports = free_ports(self.count)
            for i in range(self.processes):
                share = self.ports[i:: self.processes]
                cmd = [sys.executable, "-m", "benchmarks.exporter_farm",
                       "--ports", ",".join(map(str, share)), "--period", str(self.period),
                       "--duration", str(self.duration), "--log", str(self._dir / f"{i}.json")]
                if self.jitter:
                    cmd.append("--jitter")
                with pinned(self.cores):
                    self._procs.append(processes.spawn(cmd, self._dir / f"{i}.log"))
            for url in (self.urls()[0], self.urls()[-1]):
                wait_http(url, 30, {"Accept": "application/json"})
            # Every exporter, not only the first and last: on a loaded core some start
            # late, and a port another process took never answers.  Bounded; what still
            # does not answer is counted (``unready``) for the report, not waited for.
            self.unready = unready(self.urls(), 30)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def stamps(self) -> dict[int, list[float]]:
        """Per port, the stamps set (after the children wrote their logs at exit)."""
        out: dict[int, list[float]] = {}
        assert self._dir is not None
        for path in self._dir.glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                for port, stamps in json.loads(path.read_text()).items():
                    out[int(port)] = stamps
        return out

    def stop(self) -> None:
        """Stop the children (each writes its stamp log on SIGTERM)."""
        for proc in self._procs:
            processes.stop(proc, grace=10.0)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
