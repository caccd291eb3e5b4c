"""Push and pull on the same TrainJob, on upstream's real status server (RULE.md).

One real Transformers training reports both ways at once (``tests/helpers/coexistence.py``):
Transformers' ``KubeflowCallback`` pushes to Trainer v2.3.0's status server (field
manager ``trainer-status``, ForceOwnership) and exporter_lib's callback is scraped
by the scraper (``trainjob-scraper``).  Asserted, from every version a watch saw
and its ``managedFields``:

* no oscillation (rule 2): once ``trainer-status`` writes, the scraper makes no
  progress write while it stays live; the owners of trainerStatus never return to
  an earlier set except for a final status;
* a final nobody else delivered is delivered (rule 4): with the status server
  down across the training's end, the final status arrives from the termination
  message, and stays once the Trainer is back.

What is not real: kwok and the pod runner stand in for the kubelet and container runtime.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from kubernetes import client

from localdev.cluster.owners import PUSH_MANAGER, SCRAPER_MANAGER, Write
from localdev.cluster.stack import Cluster
from scraper.config import ScraperSettings
from tests.helpers.coexistence import Run, run_both_writers


def _is_final(write: Write) -> bool:
    return (write.status or {}).get("progressPercentage") == 100


def _describe(run: Run) -> str:
    rows = [f"{w.at:%H:%M:%S.%f} {w.writer} {sorted(w.owners)} "
            f"{(w.status or {}).get('progressPercentage')}" for w in run.history]
    return "\n".join([*rows, "--- scraper log", run.scraper_log])


#: The scraper's default --other-writer-grace (the tests run it at its defaults).
OTHER_WRITER_GRACE_SECONDS = float(ScraperSettings.model_fields["other_writer_grace"].default)
GRACE_SLACK_SECONDS = 5.0


def _push_live_at(history: list[Write], at: datetime) -> bool:
    pushes = [w.at for w in history if w.writer == PUSH_MANAGER and w.at <= at]
    return bool(pushes) and (at - max(pushes)).total_seconds() < (
        OTHER_WRITER_GRACE_SECONDS - GRACE_SLACK_SECONDS)


def _assert_no_oscillation(run: Run) -> None:
    history = run.history
    first_push = next((i for i, w in enumerate(history) if w.writer == PUSH_MANAGER), None)
    assert first_push is not None, "the status server never wrote:\n" + _describe(run)
    # While the push writer is live (its last write younger than the scraper's
    # --other-writer-grace) the scraper writes finals only.  A push writer silent for the
    # grace is not live: under load a training with its status server down can take
    # longer than that between two percentages, and the scraper then rightly takes over.
    # The slack covers the watch's delivery times against the writers' own clocks.
    late = [w for w in history[first_push:] if w.writer == SCRAPER_MANAGER
            and not _is_final(w) and _push_live_at(history, w.at)]
    assert late == [], "the scraper wrote progress over a live push writer:\n" + _describe(run)
    # Owner sets never come back, except for a final.
    progress_owners = [w.owners for w in run.owner_changes if not _is_final(w)]
    assert len(progress_owners) == len(set(progress_owners)), (
        "owners of trainerStatus alternated:\n" + _describe(run))


def test_both_writers_never_alternate_and_the_final_is_held(
        push_stack: Cluster, push_api: client.ApiClient, push_namespace: str,
        tmp_path: Path) -> None:
    run = run_both_writers(push_stack, push_api, push_namespace, tmp_path, epochs=2,
                           samples=256)
    assert run.exit_code == 0, _describe(run)
    _assert_no_oscillation(run)
    held = run.held
    assert held is not None and held["progressPercentage"] == 100, _describe(run)


def test_final_arrives_from_the_termination_message_while_the_status_server_is_down(
        push_stack: Cluster, push_api: client.ApiClient, push_namespace: str,
        tmp_path: Path) -> None:
    run = run_both_writers(push_stack, push_api, push_namespace, tmp_path, name="down",
                           epochs=2, samples=256, down_at_progress=20)
    assert run.exit_code == 0, _describe(run)
    assert run.down is not None
    # Delivered while the status server was still down: by the scraper.
    final = run.final_while_down
    assert final is not None and final["progressPercentage"] == 100, _describe(run)
    delivery = next(w for w in run.history if w.status == final)
    assert delivery.writer == SCRAPER_MANAGER and delivery.at < run.down[1], _describe(run)
    _assert_no_oscillation(run)
    # The Trainer came back and completed the TrainJob: the final stayed.
    assert run.held is not None and run.held["progressPercentage"] == 100, _describe(run)
