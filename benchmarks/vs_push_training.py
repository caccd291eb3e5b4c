"""The training of ``benchmarks.vs_push``: one loop, reporting through push or pull.

Run as a TrainJob's trainer command (``python -m benchmarks.vs_push_training``) on
the local cluster's runner node.  The same loop in both designs; only the report
call differs, each as a training makes it:

* ``VS_PUSH_MODE=push``: the Kubeflow SDK's ``update_trainjob_status`` as shipped
  (its 5 s throttle, no retry), to the URL, CA and token the Trainer injected;
* ``VS_PUSH_MODE=pull``: :func:`exporter_lib.update` after :func:`exporter_lib.start`
  (the scraper reads it; the final status goes to the termination message on exit).

Every ``VS_PUSH_EVERY`` seconds (wall clock, fixed schedule) it reports progress, an
ETA and the metrics ``stamp`` (the report's wall time, seconds since the epoch, 3
decimals: the freshness key) and ``loss``.  It ends at the epoch time in the file
``VS_PUSH_END_FILE`` (written by the benchmark once every pod runs; the same for
every TrainJob of a run, so a fault can span every end), at the latest
``VS_PUSH_MAX_SECONDS`` after its start: it makes the final report (progress 100,
ETA 0) and exits 0.  Before exiting it writes
``$VS_PUSH_OUT/<trainjob>.json``: every report's stamp, the wall time of
each call in nanoseconds (``time.perf_counter_ns`` around the call alone), what the
call returned (push: ``True`` for a 200) and the final stamp; after its first report
it creates ``$VS_PUSH_OUT/<trainjob>.up``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path


def _reporter(mode: str) -> Callable[[int, int, dict[str, str]], object]:
    if mode == "push":
        from kubeflow.trainer import update_trainjob_status

        def push(progress: int, eta: int, metrics: dict[str, str]) -> object:
            return update_trainjob_status(progress_percent=progress,
                                          estimated_remaining_seconds=eta,
                                          metrics=dict(metrics))
        return push
    import exporter_lib

    exporter_lib.start()

    def pull(progress: int, eta: int, metrics: dict[str, str]) -> object:
        exporter_lib.update(progress_percentage=progress, estimated_remaining_seconds=eta,
                            metrics=metrics)
        return None
    return pull


def main() -> int:
    mode = os.environ["VS_PUSH_MODE"]
    every = float(os.environ["VS_PUSH_EVERY"])
    end_file = Path(os.environ["VS_PUSH_END_FILE"])
    out = Path(os.environ["VS_PUSH_OUT"])
    job = os.environ.get("VS_PUSH_NAME", "job")
    report = _reporter(mode)
    started = time.time()
    end_at = started + float(os.environ["VS_PUSH_MAX_SECONDS"])
    span = max(end_at - started, every)
    stamps: list[float] = []
    call_ns: list[int] = []
    results: list[object] = []

    def once(progress: int, eta: int) -> float:
        stamp = round(time.time(), 3)
        metrics = {"stamp": f"{stamp:.3f}", "loss": f"{1.0 / (1 + len(stamps)):.6f}"}
        t0 = time.perf_counter_ns()
        result = report(progress, eta, metrics)
        call_ns.append(time.perf_counter_ns() - t0)
        stamps.append(stamp)
        results.append(result)
        return stamp

    # A bounded loop: at most span / every reports, then the final.
    for k in range(int(span / every) + 1):
        with contextlib.suppress(OSError, ValueError):
            end_at = min(end_at, float(end_file.read_text()))
            span = max(end_at - started, every)
        now = time.time()
        if now >= end_at:
            break
        once(min(99, int(100 * (now - started) / span)), max(0, int(end_at - now)))
        if k == 0:  # the benchmark's window starts once every training reported
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{job}.up").touch()
        nxt = started + (k + 1) * every
        time.sleep(max(0.0, min(nxt, end_at) - time.time()))
    final = once(100, 0)
    tmp = out / f".{job}.json.tmp"
    tmp.write_text(json.dumps({"mode": mode, "every": every, "started": started,
                               "stamps": stamps, "call_ns": call_ns,
                               "results": results, "final": final}))
    tmp.replace(out / f"{job}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
