"""Progress exporter for Kubeflow TrainJobs, imported by training code.

    import exporter_lib

    exporter_lib.start()                      # serves :28080/metrics in a daemon thread
    exporter_lib.update(progress_percentage=40, estimated_remaining_seconds=600,
                        metrics={"loss": 0.25})

Needs only ``prometheus-client``, ``pydantic`` and ``h11``; the framework callbacks live in
``exporter_lib.callbacks.{transformers,lightning,keras}`` and import their framework
only when used.  See ``docs/exporter.md``.
"""

from exporter_lib.api import (
    DEFAULT_PORT,
    Exporter,
    checkpoint_saved,
    current_status,
    enable_push_compat,
    get_exporter,
    start,
    stop,
    update,
)
from exporter_lib.status import Metric, StatusError, TrainerStatus
from exporter_lib.tracker import ProgressTracker

__all__ = [
    "DEFAULT_PORT",
    "Exporter",
    "Metric",
    "ProgressTracker",
    "StatusError",
    "TrainerStatus",
    "checkpoint_saved",
    "current_status",
    "enable_push_compat",
    "get_exporter",
    "start",
    "stop",
    "update",
]
