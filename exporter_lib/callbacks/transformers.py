"""Hugging Face Transformers ``TrainerCallback`` reporting into the exporter.

    from exporter_lib.callbacks.transformers import ExporterCallback
    trainer = Trainer(..., callbacks=[ExporterCallback()])

* progress: ``state.global_step / state.max_steps`` through a
  :class:`~exporter_lib.ProgressTracker` (which also estimates the remaining time;
  a resumed run starts at the checkpoint's ``global_step``);
* metrics: every scalar of ``on_log`` (``loss``, ``learning_rate``, ``grad_norm``,
  ``epoch``...) and ``on_evaluate`` (``eval_*``), names as Transformers gives them;
* checkpoints: each save (``on_save``, after the checkpoint is written) is reported
  through :func:`exporter_lib.checkpoint_saved`;
* on train end: progress 100 and 0 seconds remaining when ``global_step``
  reached ``max_steps`` (an interrupted run keeps its last progress).

Only the world-process-zero reports (``state.is_world_process_zero``).

Raises:
    ImportError: on import, when ``transformers`` is not installed.
"""

from __future__ import annotations

from typing import Any

from exporter_lib import api
from exporter_lib.callbacks._common import scalar_metrics
from exporter_lib.tracker import ProgressTracker

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "exporter_lib.callbacks.transformers needs the 'transformers' package") from exc


class ExporterCallback(TrainerCallback):
    """Reports a Transformers ``Trainer``'s progress and logged metrics.

    Args:
        start_server: call :func:`exporter_lib.start` at train begin (idempotent).
        port: port for that start (default: ``$TRAINJOB_EXPORTER_PORT`` or 28080).
    """

    def __init__(self, *, start_server: bool = True, port: int | None = None) -> None:
        self._start_server = start_server
        self._port = port
        self.tracker: ProgressTracker | None = None

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        if self._start_server:
            api.start(port=self._port)
        self.tracker = ProgressTracker(state.max_steps, initial_step=state.global_step,
                                       report=api.update)
        self.tracker.start()
        api.update(progress_percentage=self.tracker.progress_percentage)

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        if self.tracker is not None and state.is_world_process_zero:
            self.tracker.total_steps = state.max_steps
            self.tracker.step(state.global_step)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if state.is_world_process_zero and logs:
            api.update(metrics=scalar_metrics(logs))

    def on_evaluate(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, metrics: dict[str, Any] | None = None,
                    **kwargs: Any) -> None:
        if state.is_world_process_zero and metrics:
            api.update(metrics=scalar_metrics(metrics))

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        # Transformers calls on_save after the checkpoint directory is written.
        if state.is_world_process_zero:
            api.checkpoint_saved()

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        if state.max_steps and state.global_step >= state.max_steps:
            api.update(progress_percentage=100, estimated_remaining_seconds=0)
        elif self.tracker is not None:
            api.update(progress_percentage=self.tracker.progress_percentage)
