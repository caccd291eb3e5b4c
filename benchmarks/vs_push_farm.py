"""Many TrainJobs' trainings in one process (``benchmarks.vs_push``'s farm).

A real training per TrainJob is one Python process of about 90 MB with the Kubeflow
SDK: 1000 of them do not fit a small machine.  Beyond the real ones, each TrainJob's
pod runs :data:`STUB` (a shell that hands over what the pod was given and then waits)
and one farm process runs that TrainJob's :class:`~benchmarks.vs_push_training.Training`
in a thread of its own, reporting with what the pod was given:

* push: :class:`SdkPusher`, the Kubeflow SDK's ``update_trainjob_status`` as 0.5.0
  makes it, per TrainJob: the injected URL (the Trainer's Service name, resolved by a
  hosts file as in the pod), the pod's projected token (re-read after 300 s) and CA, the
  same JSON body, one ``requests`` session, at most one POST per 5 s counted from the
  last 200, a 5 s timeout, no retry.  The farm runs in a private mount namespace whose
  ``/etc/hosts`` names the Service, as the pod's does;
* pull: one :class:`exporter_lib.Exporter` per TrainJob at the pod's IP and port, its
  final status written to the pod's termination message file before the stub exits.

``python -m benchmarks.vs_push_farm --mode push|pull --out DIR --names a,b,... --every S
--percent-seconds S --end-file F --max-seconds S``.  Bounded: each thread waits at most
``--max-seconds`` for its pod, then reports until the end; every stub is released.
The exporters state no pod identity (the farm process is no pod; the scraper accepts
an exporter that states none).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from benchmarks.vs_push_training import Reporter, Training, end_reader
from exporter_lib.api import DEFAULT_PORT, Exporter
from exporter_lib.state import State

#: A farmed TrainJob's trainer command (``sh -c STUB``): the pod's token and CA copied
#: out, its environment written to ``$VS_PUSH_OUT/<name>.env``, then it waits until the
#: farm opens its FIFO (or ``VS_PUSH_MAX_SECONDS``) and exits 0.  No ``$(`` in it: the
#: kubelet (and the pod runner) expand ``$(VAR)`` in a command.
STUB = """set -e
d="$VS_PUSH_OUT"; n="$VS_PUSH_NAME"
rm -f "$d/$n.fifo"; mkfifo "$d/$n.fifo"
if [ -n "$KUBEFLOW_TRAINER_SERVER_TOKEN" ]; then
  cp "$KUBEFLOW_TRAINER_SERVER_TOKEN" "$d/$n.token"
  cp "$KUBEFLOW_TRAINER_SERVER_CA_CERT" "$d/$n.ca"
fi
env > "$d/$n.env.tmp"; mv "$d/$n.env.tmp" "$d/$n.env"
exec timeout "$VS_PUSH_MAX_SECONDS" cat "$d/$n.fifo"
"""

#: The SDK's figures (kubeflow 0.5.0, ``kubeflow/trainer/backends/kubernetes/utils.py``).
SDK_THROTTLE_SECONDS = 5.0
SDK_TIMEOUT_SECONDS = 5.0
SDK_TOKEN_TTL_SECONDS = 300.0
SDK_MAX_METRICS = 256


class SdkPusher:
    """One TrainJob's ``update_trainjob_status`` as the Kubeflow SDK 0.5.0 makes it.

    ``url``: the injected ``KUBEFLOW_TRAINER_SERVER_URL``; ``ca_file`` and ``token_file``:
    the pod's CA and projected token.  Calling it reports once and returns an outcome of
    :data:`benchmarks.vs_push_training.OUTCOMES`; it never raises.
    """

    def __init__(self, url: str, ca_file: Path, token_file: Path) -> None:
        self._url, self._ca, self._token_file = url, ca_file, token_file
        self._session = requests.Session()
        self._last_ok = float("-inf")  # monotonic time of the last 200
        self._token: str | None = None
        self._token_read = float("-inf")

    def _read_token(self) -> str | None:
        now = time.monotonic()
        if self._token and now - self._token_read < SDK_TOKEN_TTL_SECONDS:
            return self._token
        try:
            self._token = self._token_file.read_text().strip() or None
            self._token_read = now
        except OSError:
            return None
        return self._token

    def __call__(self, progress: int, eta: int, metrics: dict[str, str]) -> str:
        if time.monotonic() - self._last_ok < SDK_THROTTLE_SECONDS:
            return "throttled"
        token = self._read_token()
        if not token:
            return "skipped"
        status: dict[str, Any] = {
            "lastUpdatedTime": datetime.now(UTC).isoformat(),
            "progressPercentage": max(0, min(100, progress)),
            "estimatedRemainingSeconds": max(0, eta)}
        if metrics:
            status["metrics"] = [{"name": str(k), "value": str(v)}
                                 for k, v in list(metrics.items())[:SDK_MAX_METRICS]]
        try:
            response = self._session.post(
                self._url, json={"trainerStatus": status},
                headers={"Authorization": f"Bearer {token}",
                         "Content-Type": "application/json"},
                verify=str(self._ca) if self._ca.exists() else True,
                timeout=SDK_TIMEOUT_SECONDS)
        except requests.Timeout:
            return "timeout"
        except Exception:  # the SDK catches everything: a report never raises
            return "error"
        if response.status_code == 200:
            self._last_ok = time.monotonic()
            return "ok"
        return "http"


def read_env(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of ``env`` output (a value's later lines are ignored)."""
    env: dict[str, str] = {}
    for line in path.read_text(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.isidentifier():
            env[key] = value
    return env


def release(fifo: Path, timeout: float = 10.0) -> bool:
    """Open the stub's FIFO for writing and close it: its ``cat`` ends, the pod exits 0.
    Returns False when no stub read it within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            return True
        except OSError as exc:
            if exc.errno not in (errno.ENXIO, errno.ENOENT):
                return False
        time.sleep(0.2)
    return False


def cached(read: Callable[[], float], every: float = 0.5) -> Callable[[], float]:
    """``read`` at most once per ``every`` seconds (the end file, for every thread)."""
    lock = threading.Lock()
    memo = [float("-inf"), 0.0]  # [read at (monotonic), value]

    def get() -> float:
        with lock:
            if time.monotonic() - memo[0] >= every:
                memo[:] = [time.monotonic(), read()]
            return memo[1]
    return get


def farm_job(name: str, mode: str, out: Path, every: float, percent_seconds: float,
             end_at: Callable[[], float], wait_until: float) -> str:
    """Run TrainJob ``name``'s training once its stub has written its environment;
    returns what happened (``done``, ``no pod``, ``no exporter``)."""
    env_file = out / f"{name}.env"
    while not env_file.exists():
        if time.time() > wait_until:
            return "no pod"
        time.sleep(0.5)
    env = read_env(env_file)
    exporter: Exporter | None = None
    report: Reporter
    if mode == "push":
        report = SdkPusher(env.get("KUBEFLOW_TRAINER_SERVER_URL", ""), out / f"{name}.ca",
                           out / f"{name}.token")
    else:
        state = State()
        exporter = Exporter(state, state, host=env.get("TRAINJOB_EXPORTER_HOST", "127.0.0.1"),
                            port=int(env.get("TRAINJOB_EXPORTER_PORT") or DEFAULT_PORT),
                            status_file=None, serve=True,
                            termination_message_path=env.get(
                                "TRAINJOB_EXPORTER_TERMINATION_MESSAGE_PATH"))
        if not exporter.serving:
            release(out / f"{name}.fifo")
            return "no exporter"

        def report(progress: int, eta: int, metrics: dict[str, str]) -> str:
            state.update(progress, eta, metrics)
            return "ok"
    training = Training(name, report, every=every, percent_seconds=percent_seconds,
                        end_at=end_at, out=out,
                        kind="sdk-farm" if mode == "push" else "exporter_lib-farm")
    try:
        training.run()
    finally:
        training.write()
        if exporter is not None:  # as a training process's exit: the final, then gone
            exporter.write_final_status()
            exporter.stop()
        release(out / f"{name}.fifo")
    return "done"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vs_push_farm")
    parser.add_argument("--mode", choices=("push", "pull"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--names", required=True, help="comma-separated TrainJob names")
    parser.add_argument("--every", type=float, required=True)
    parser.add_argument("--percent-seconds", type=float, required=True)
    parser.add_argument("--end-file", type=Path, required=True)
    parser.add_argument("--max-seconds", type=float, required=True)
    args = parser.parse_args(argv)
    started = time.time()
    end_at = cached(end_reader(args.end_file, started + args.max_seconds))
    results: dict[str, str] = {}

    def one(name: str) -> None:
        try:
            results[name] = farm_job(name, args.mode, args.out, args.every,
                                     args.percent_seconds, end_at,
                                     started + args.max_seconds)
        except Exception as exc:  # one TrainJob's failure is its own
            results[name] = f"failed: {exc!r}"[:300]

    threads = [threading.Thread(target=one, args=(n,), name=n, daemon=True)
               for n in args.names.split(",") if n]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, started + args.max_seconds + 60 - time.time()))
    bad = {n: r for n, r in results.items() if r != "done"}
    if bad:
        print(f"farm: {len(bad)} TrainJobs not run: {dict(list(bad.items())[:5])}",
              file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
