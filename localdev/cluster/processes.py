"""Child processes that never outlive the Python process that started them.

Each child runs in its own session (process group), so stopping it also stops
anything it forked.  Every live child is registered; an ``atexit`` hook and
SIGTERM/SIGINT handlers kill the registered groups, so a failed, interrupted or
terminated test run leaves no etcd or kube-apiserver behind.  On Linux the
child additionally gets ``PR_SET_PDEATHSIG`` when started from the main thread,
which covers even SIGKILL of the parent.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

#: How long a child gets to exit after SIGTERM before SIGKILL (seconds).
TERMINATE_GRACE_SECONDS = 5.0

_PR_SET_PDEATHSIG = 1
_live: dict[int, subprocess.Popen[bytes]] = {}
_cleanups: dict[int, Callable[[], None]] = {}
_lock = threading.Lock()
_handlers_installed = False
_previous_handlers: dict[int, Any] = {}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ephemeral_start() -> int:
    """The first port of the kernel's range for outgoing connections (32768 if unread)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def restartable_port(attempts: int = 200) -> int:
    """A TCP port free on every interface a moment ago, below the kernel's range for
    outgoing connections, for a server that is stopped and started again on the same
    port: a port from :func:`free_port` is in that range, and an outgoing connection of
    any process can take it while the server is down (seen: the Trainer's status server
    could not bind again after a restart, with tests of another worker beside it).

    Raises:
        OSError: no free port found in ``attempts`` random tries.
    """
    high = min(_ephemeral_start(), 65536) - 1
    for _ in range(attempts):
        port = random.randint(20000, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free TCP port between 20000 and {high} in {attempts} tries")


def _pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(args: Sequence[str], log_path: Path | None, *, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``args`` in a new session with stdout and stderr appended to ``log_path``.

    ``log_path`` None: stdout and stderr are two pipes (``proc.stdout``,
    ``proc.stderr``) for the caller to read.  ``env`` replaces the environment
    when given; ``cwd`` is the working directory.

    Raises:
        OSError: the executable cannot be started.
    """
    _install_handlers()
    # PDEATHSIG fires when the parent *thread* exits, so only use it from the
    # main thread, whose end is the end of the process.
    preexec = (_pdeathsig if sys.platform.startswith("linux")
               and threading.current_thread() is threading.main_thread() else None)
    with contextlib.ExitStack() as stack:
        log: Any = (subprocess.PIPE if log_path is None
                    else stack.enter_context(open(log_path, "ab")))
        proc = subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.PIPE if log_path is None else subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,
            env=env,
            cwd=cwd,
        )
    with _lock:
        _live[proc.pid] = proc
    return proc


def stop(proc: subprocess.Popen[bytes], grace: float = TERMINATE_GRACE_SECONDS) -> None:
    """SIGTERM the process group of ``proc``, SIGKILL it after ``grace`` seconds.

    Safe to call twice and on a process that already exited.
    """
    with _lock:
        _live.pop(proc.pid, None)
    _signal_group(proc, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    # Kill the whole group even when the leader exited: a forked helper may remain.
    _signal_group(proc, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)


def forget(proc: subprocess.Popen[bytes]) -> None:
    """Unregister ``proc`` (it exited and was reaped by its owner)."""
    with _lock:
        _live.pop(proc.pid, None)


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Send ``sig`` to the process group of ``proc`` (no error when it is gone)."""
    _signal_group(proc, sig)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    # The child is a session leader, so its pid is its process group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def kill_all() -> None:
    """SIGKILL every registered process group at once (exit path: no grace).

    Then runs the callbacks registered with :func:`on_kill_all`.
    """
    with _lock:
        procs = list(_live.values())
        _live.clear()
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=TERMINATE_GRACE_SECONDS)
    with _lock:
        cleanups = list(_cleanups.values())
        _cleanups.clear()
    for cleanup in cleanups:
        with contextlib.suppress(Exception):
            cleanup()


def on_kill_all(key: int, cleanup: Callable[[], None] | None) -> None:
    """Run ``cleanup`` after :func:`kill_all` (exit or signal); ``None`` unregisters ``key``.

    For leftovers other than processes, e.g. a temporary directory.
    """
    with _lock:
        if cleanup is None:
            _cleanups.pop(key, None)
        else:
            _cleanups[key] = cleanup


def _on_signal(signum: int, frame: FrameType | None) -> None:
    kill_all()
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        # e.g. Python's default SIGINT handler raising KeyboardInterrupt.
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(kill_all)
    # signal.signal only works in the main thread; elsewhere atexit must do.
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)
        if previous == signal.SIG_IGN:
            continue
        _previous_handlers[signum] = previous
        signal.signal(signum, _on_signal)
