"""Both writers on one TrainJob: upstream's push status server and this project's scraper.

On a push cluster (:class:`localdev.cluster.stack.Cluster` ``push=True``) a
TrainJob runs ``localdev.demo.train_transformers --report callback``: a real
Transformers ``Trainer`` with exporter_lib's ``ExporterCallback`` (pull: the
scraper scrapes the exporter and applies as ``trainjob-scraper``) and, because the
Trainer injected ``KUBEFLOW_TRAINER_SERVER_URL``, Transformers' own
``KubeflowCallback`` (push: at most every 5 s to the Trainer's status server, which
applies as ``trainer-status`` with ForceOwnership).  Nothing is staged: both
writers run as shipped.  Used by ``tests/e2e/test_push_coexistence.py`` and
``benchmarks/push_coexistence.py``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from localdev.cluster import trainjobs
from localdev.cluster.owners import Write, owner_changes, writes, writes_per_minute
from localdev.cluster.stack import Cluster
from tests.helpers.stack import python_command, recording, scraper

TRAINER_COMPONENT = "trainer-controller-manager"
TRAINING_TIMEOUT_SECONDS = 600.0
#: How long the watch goes on after the TrainJob finished (late writes, flapping).
SETTLE_SECONDS = 15.0
#: With the status server down: how long the final status may take to arrive.
FINAL_TIMEOUT_SECONDS = 60.0


@dataclass
class Run:
    """What the watch saw of one TrainJob with both writers."""

    name: str
    versions: list[dict[str, Any]]
    seen_at: list[datetime]
    finished_at: datetime | None
    """The trainer container's ``state.terminated.finishedAt``."""
    exit_code: int | None
    final_while_down: dict[str, Any] | None = None
    """The trainerStatus held once the pod ended while the status server was down."""
    down: tuple[datetime, datetime] | None = None
    """When the Trainer (its status server) was stopped and started again (this clock)."""
    scraper_log: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def history(self) -> list[Write]:
        return writes(self.versions, self.seen_at)

    @property
    def owner_changes(self) -> list[Write]:
        return owner_changes(self.history)

    @property
    def writes_per_minute(self) -> dict[str, float]:
        return writes_per_minute(self.history)

    @property
    def held(self) -> dict[str, Any] | None:
        """The trainerStatus of the last version seen."""
        return (self.versions[-1].get("status") or {}).get("trainerStatus") \
            if self.versions else None


def _terminated(api: client.ApiClient, namespace: str, name: str) -> Any:
    for pod in trainjobs.pods(api, namespace, name):
        for status in pod.status.container_statuses or []:
            if status.name == "node" and status.state.terminated is not None:
                return status.state.terminated
    return None


def run_both_writers(cluster: Cluster, api: client.ApiClient, namespace: str, workdir: Path,
                     *, name: str = "both", epochs: int = 2, samples: int = 256,
                     down_at_progress: int | None = None,
                     scraper_options: Sequence[str] = (),
                     scraper_env: dict[str, str] | None = None) -> Run:
    """Run one training with both writers and watch its TrainJob; return what was seen.

    ``down_at_progress``: once the TrainJob stores at least that progress, stop the
    Trainer controller (with it the status server) until the pod ended and the
    final status arrived (or :data:`FINAL_TIMEOUT_SECONDS` passed), then start it
    again.  ``scraper_options``/``scraper_env`` go to the scraper's command line and
    environment (e.g. a ``PYTHONPATH`` with another version of the scraper).

    Raises:
        TimeoutError: the TrainJob did not finish within :data:`TRAINING_TIMEOUT_SECONDS`.
    """
    log_file = workdir / f"{name}-training-log.jsonl"
    command = python_command("localdev.demo.train_transformers", "--report", "callback",
                             "--epochs", str(epochs), "--samples", str(samples),
                             "--logging-steps", "2", "--log-file", str(log_file),
                             # 64 steps of at least 0.25 s: pushes (one per 5 s at most)
                             # show progress below 100 before the end on any machine.
                             "--step-seconds", "0.25")
    finished_at: datetime | None = None
    exit_code: int | None = None
    final_while_down = None
    down = None
    with scraper(cluster, namespace, workdir, scraper_options, scraper_env) as child, \
            recording(api, namespace, name) as recorder:
        trainjobs.create(api, trainjobs.trainjob_body(namespace, name, command=command,
                                                      env={"PYTHONUNBUFFERED": "1"}))
        if down_at_progress is not None:
            recorder.wait_for(lambda o: o.status is not None
                              and (o.status.progress_percentage or 0) >= down_at_progress,
                              TRAINING_TIMEOUT_SECONDS, f"progress {down_at_progress}")
            stopped = datetime.now().astimezone()
            cluster.stop_component(TRAINER_COMPONENT)
            try:
                deadline = time.monotonic() + TRAINING_TIMEOUT_SECONDS
                while _terminated(api, namespace, name) is None:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"the pod of {name} did not end")
                    time.sleep(0.5)
                deadline = time.monotonic() + FINAL_TIMEOUT_SECONDS
                while time.monotonic() < deadline:
                    held = (trainjobs.get(api, namespace, name).get("status") or {}).get(
                        "trainerStatus")
                    final_while_down = held
                    if held and held.get("progressPercentage") == 100:
                        break
                    time.sleep(0.5)
            finally:
                cluster.start_component(TRAINER_COMPONENT)
            down = (stopped, datetime.now().astimezone())
        trainjobs.wait_finished(api, namespace, name, TRAINING_TIMEOUT_SECONDS)
        ended = _terminated(api, namespace, name)
        if ended is not None:
            finished_at, exit_code = ended.finished_at, ended.exit_code
        time.sleep(SETTLE_SECONDS)
        seen = list(recorder.seen)
        scraper_log = child.log_tail(60)
    return Run(name=name, versions=[o.raw for o in seen], seen_at=[o.seen_at for o in seen],
               finished_at=finished_at, exit_code=exit_code, final_while_down=final_while_down,
               down=down, scraper_log=scraper_log)
