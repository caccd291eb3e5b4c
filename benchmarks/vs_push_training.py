"""The training of ``benchmarks.vs_push``: one loop, reporting through push or pull.

Run as a TrainJob's trainer command (``python benchmarks/vs_push_training.py``) on the
local cluster's runner node: a **real** training process, one per TrainJob.  The same
loop (:class:`Training`) also runs many times in one process in
:mod:`benchmarks.vs_push_farm`; only the report call differs, each as a training
makes it:

* ``VS_PUSH_MODE=push``: the Kubeflow SDK's ``update_trainjob_status`` as shipped (its
  5 s throttle, 5 s timeout, no retry), to the URL, CA and token the Trainer injected;
* ``VS_PUSH_MODE=pull``: :func:`exporter_lib.update` after :func:`exporter_lib.start`
  (the scraper reads it; the final status goes to the termination message on exit).

Every ``VS_PUSH_EVERY`` seconds (wall clock, fixed schedule) it reports: the progress
percentage, one point per ``VS_PUSH_PERCENT_SECONDS`` of its own run (a training of
100 x that length; capped at 99 until the final), counted from a phase of its own
(:func:`percent_phase`: with one clock for the changes and the reports, each
training's points would fall at one fixed place in the SDK's 5 s throttle window for
the whole run, so push's freshness would be that place, not the throttle's spread),
the remaining seconds of that
length, and the metrics ``stamp`` (the report's wall time, seconds since the epoch, 3
decimals: the metrics-freshness key) and ``loss``, which change at every report.  It
ends at the epoch time in the file ``VS_PUSH_END_FILE`` (written by the benchmark; the
same for every TrainJob of a run, so a fault can span every end), at the latest
``VS_PUSH_MAX_SECONDS`` after its start: the final report (progress 100, ETA 0), then
``$VS_PUSH_OUT/<trainjob>.json`` (:meth:`Training.record`).  After its first report it
creates ``$VS_PUSH_OUT/<trainjob>.up``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

#: What a report call returned (the record's ``outcomes``): ``ok`` a push answered 200
#: or a pull update taken; ``throttled`` the SDK's 5 s window (not sent); ``http`` a
#: non-200 answer; ``timeout`` no answer within the SDK's 5 s; ``error`` any other
#: failure to send (refused connection, TLS); ``skipped`` not sent for want of a URL or
#: token.  Diagnostics only: whether a value was delivered is judged by a watch on the
#: TrainJob, the same way for every side (:mod:`benchmarks.vs_push_delivery`).
OUTCOMES = ("ok", "throttled", "http", "timeout", "error", "skipped")

#: Seconds between two reads of the end while a training sleeps between reports.
END_LOOK = 1.0

#: A report call: (progress percentage, remaining seconds, metrics) -> outcome.
Reporter = Callable[[int, int, dict[str, str]], str]


def percent_phase(name: str, percent_seconds: float) -> float:
    """Seconds of progress a training counts as done at its start: a fraction of
    ``percent_seconds`` from the SHA-256 of ``name`` (the same in every run), so the
    trainings' percentage points fall at phases spread over a point's length."""
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    return digest / 2**64 * percent_seconds


class Training:
    """One training's report loop and what it saw of its own report calls.

    ``end_at()`` returns the epoch time the training ends (read at every step);
    ``now`` is the wall clock (``time.time``).  Nothing raises out of :meth:`run`
    except the reporter's own exceptions, which the reporters here never raise.
    """

    def __init__(self, name: str, report: Reporter, *, every: float, percent_seconds: float,
                 end_at: Callable[[], float], out: Path, kind: str) -> None:
        self.name, self.kind = name, kind
        self._report, self._every, self._pct = report, every, percent_seconds
        self._end_at, self._out = end_at, out
        self.started = time.time()
        self._phase = percent_phase(name, percent_seconds)
        self.stamps: list[float] = []
        self.percents: list[int] = []
        self.call_ns: list[int] = []
        self.outcomes: list[str] = []

    def _once(self, progress: int, eta: int) -> None:
        stamp = round(time.time(), 3)
        metrics = {"stamp": f"{stamp:.3f}", "loss": f"{1.0 / (1 + len(self.stamps)):.6f}"}
        t0 = time.perf_counter_ns()
        outcome = self._report(progress, eta, metrics)
        self.call_ns.append(time.perf_counter_ns() - t0)
        self.stamps.append(stamp)
        self.percents.append(progress)
        self.outcomes.append(outcome)

    def run(self) -> None:
        """Report every ``every`` seconds until ``end_at()``, then the final report.

        Bounded: at most ``(end_at() at start - start) / every + 1`` steps."""
        length = 100 * self._pct
        for k in range(int(max(0.0, self._end_at() - self.started) / self._every) + 1):
            now = time.time()
            if now >= self._end_at():
                break
            ran = now - self.started + self._phase
            self._once(min(99, int(ran / self._pct)), max(0, int(length - ran)))
            if k == 0:  # the benchmark's window starts once every training reported
                self._out.mkdir(parents=True, exist_ok=True)
                (self._out / f"{self.name}.up").touch()
            self._sleep_until(self.started + (k + 1) * self._every)
        self._once(100, 0)

    def _sleep_until(self, at: float) -> None:
        """Sleep until the epoch time ``at`` or the end, whichever comes first, the end
        read again every :data:`END_LOOK` seconds: the benchmark brings the end forward
        while a training sleeps (the fault half's end is written as the worker goes
        down), and a training that read it only at its next report would send its final
        up to a report interval late, after the worker is back.  Bounded: at most
        ``(at - now) / END_LOOK + 2`` sleeps."""
        for _ in range(int(max(0.0, at - time.time()) / END_LOOK) + 2):
            left = min(at, self._end_at()) - time.time()
            if left <= 0:
                return
            time.sleep(min(left, END_LOOK))

    def record(self) -> dict[str, object]:
        """What the benchmark reads: ``kind`` (``sdk``, ``sdk-farm``, ``exporter_lib``,
        ``exporter_lib-farm``), ``started`` (epoch s), per report ``stamps`` (epoch s),
        ``percents``, ``call_ns`` (the call's wall time, ``perf_counter_ns``) and
        ``outcomes`` (:data:`OUTCOMES`); the last report is the final (``final``: its
        stamp, ``final_outcome``)."""
        return {"kind": self.kind, "every": self._every, "started": self.started,
                "percent_seconds": self._pct, "stamps": self.stamps,
                "percents": self.percents, "call_ns": self.call_ns,
                "outcomes": self.outcomes, "final": self.stamps[-1] if self.stamps else None,
                "final_outcome": self.outcomes[-1] if self.outcomes else None}

    def write(self) -> None:
        """Write :meth:`record` to ``<out>/<name>.json`` (atomically)."""
        tmp = self._out / f".{self.name}.json.tmp"
        tmp.write_text(json.dumps(self.record()))
        tmp.replace(self._out / f"{self.name}.json")


class _LastWarning(logging.Handler):
    """Keeps the last WARNING the SDK logged: how a False from it is told apart."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.message = record.getMessage()


def sdk_reporter() -> Reporter:
    """The Kubeflow SDK's ``update_trainjob_status`` as a training calls it; the outcome
    from its return value and the warning it logs on a failure (a False without a
    warning is its throttle)."""
    from kubeflow.trainer import update_trainjob_status
    from kubeflow.trainer.backends.kubernetes import utils

    seen = _LastWarning()
    logger = logging.getLogger(utils.__name__)
    logger.addHandler(seen)
    logger.setLevel(logging.WARNING)
    logger.propagate = False

    def push(progress: int, eta: int, metrics: dict[str, str]) -> str:
        seen.message = None
        sent = update_trainjob_status(progress_percent=progress,
                                      estimated_remaining_seconds=eta, metrics=dict(metrics))
        if sent:
            return "ok"
        return classify_failure(seen.message)
    return push


def classify_failure(message: str | None) -> str:
    """An outcome of :data:`OUTCOMES` for a report not sent, from the SDK's warning
    (``None``: it warned nothing, i.e. its throttle)."""
    if message is None:
        return "throttled"
    if message.startswith("Status update failed"):  # its non-200 warning
        return "http"
    return "timeout" if "timed out" in message.lower() else "error"


def exporter_reporter() -> Reporter:
    """:func:`exporter_lib.update` after :func:`exporter_lib.start` (this process's
    exporter, at the pod IP the pod runner gives it)."""
    import exporter_lib

    exporter_lib.start()

    def pull(progress: int, eta: int, metrics: dict[str, str]) -> str:
        exporter_lib.update(progress_percentage=progress, estimated_remaining_seconds=eta,
                            metrics=metrics)
        return "ok"
    return pull


def end_reader(end_file: Path, latest: float) -> Callable[[], float]:
    """``end_at()``: the epoch time in ``end_file`` once written, else ``latest``."""
    def end_at() -> float:
        with contextlib.suppress(OSError, ValueError):
            return min(latest, float(end_file.read_text()))
        return latest
    return end_at


def main() -> int:
    mode = os.environ["VS_PUSH_MODE"]
    out = Path(os.environ["VS_PUSH_OUT"])
    report = sdk_reporter() if mode == "push" else exporter_reporter()
    training = Training(
        os.environ.get("VS_PUSH_NAME", "job"), report,
        every=float(os.environ["VS_PUSH_EVERY"]),
        percent_seconds=float(os.environ["VS_PUSH_PERCENT_SECONDS"]),
        end_at=end_reader(Path(os.environ["VS_PUSH_END_FILE"]),
                          time.time() + float(os.environ["VS_PUSH_MAX_SECONDS"])),
        out=out, kind="sdk" if mode == "push" else "exporter_lib")
    training.run()
    training.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
