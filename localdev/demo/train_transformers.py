"""A real Hugging Face Transformers ``Trainer`` run on CPU, reported three ways.

A tiny GPT-2 built from a config (random weights, nothing downloaded) learns a
synthetic, repetitive token sequence.  How progress is reported is chosen with
``--report``:

* ``callback`` (default): :class:`exporter_lib.callbacks.transformers.ExporterCallback`;
* ``sdk``: a callback that calls the Kubeflow SDK's ``update_trainjob_status``
  (the push design's client), pointed at this process's exporter by
  :func:`exporter_lib.enable_push_compat`;
* ``builtin``: Transformers' own Kubeflow integration (``report_to="kubeflow"``),
  likewise pointed at the exporter.

Every loss the Trainer logs is appended to ``--log-file`` (JSON lines) so a test
can compare it with what lands in the TrainJob.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import exporter_lib


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=256, help="training sequences")
    parser.add_argument("--report", choices=("callback", "sdk", "builtin"), default="callback")
    parser.add_argument("--logging-steps", type=int, default=4)
    parser.add_argument("--log-file", type=Path, help="append each logged entry here as JSON")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-seconds", type=float, default=0.0,
                        help="sleep this long after each training step (a floor on the "
                             "run's length, whatever the machine's speed)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed

    from localdev.demo.toy_training import counting_rows, log_to_file, sequences, tiny_gpt2

    set_seed(args.seed)
    model = tiny_gpt2()
    tokens = counting_rows(args.samples + 32)

    callbacks: list[Any] = [log_to_file(args.log_file)]
    if args.step_seconds > 0:
        callbacks.append(_pace(TrainerCallback, args.step_seconds))
    report_to: list[str] = []
    exporter_lib.start()
    if args.report == "callback":
        from exporter_lib.callbacks.transformers import ExporterCallback

        callbacks.append(ExporterCallback())
    else:
        # The push clients find the exporter through KUBEFLOW_TRAINER_SERVER_URL/_TOKEN.
        exporter_lib.enable_push_compat()
        if args.report == "sdk":
            callbacks.append(_sdk_callback(TrainerCallback))
        else:
            report_to = ["kubeflow"]

    with tempfile.TemporaryDirectory() as out_dir:
        trainer = Trainer(
            model=model,
            args=TrainingArguments(
                output_dir=out_dir, num_train_epochs=args.epochs, per_device_train_batch_size=8,
                per_device_eval_batch_size=16, learning_rate=5e-3,
                logging_steps=args.logging_steps, eval_strategy="epoch", save_strategy="no",
                report_to=report_to, use_cpu=True, disable_tqdm=True, seed=args.seed,
                dataloader_num_workers=0,
            ),
            train_dataset=sequences(tokens[: args.samples]),
            eval_dataset=sequences(tokens[args.samples:]),
            callbacks=callbacks,
        )
        trainer.train()
    return 0


def _pace(base: type, seconds: float) -> Any:
    """A TrainerCallback that sleeps ``seconds`` after each step: tests that act while
    a training runs (stop a server at 20 %) need a run longer than a push interval even
    on a fast, idle machine."""

    class Pace(base):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            time.sleep(seconds)

    return Pace()


def _sdk_callback(base: type) -> Any:
    """A TrainerCallback that reports with the Kubeflow SDK's push client."""
    from kubeflow.trainer.backends.kubernetes.utils import update_trainjob_status

    class SdkReporter(base):  # type: ignore[misc]
        last_metrics: dict[str, float | int | str] = {}

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
                   **kwargs: Any) -> None:
            total = state.max_steps or 1
            numeric = {k: v for k, v in (logs or {}).items()
                       if isinstance(v, int | float) and k in {"loss", "eval_loss"}}
            self.last_metrics = {**self.last_metrics, **numeric}
            update_trainjob_status(
                progress_percent=min(100, state.global_step * 100 // total),
                metrics=self.last_metrics or None,
            )

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # The SDK drops calls within 5 s of the last one (its throttle); the final
            # update must not be dropped, so try again until it is sent (bounded).
            deadline = time.monotonic() + 10.0
            while not update_trainjob_status(progress_percent=100, estimated_remaining_seconds=0,
                                             metrics=self.last_metrics or None):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)

    return SdkReporter()


if __name__ == "__main__":
    sys.exit(main())
