"""A Transformers training with no progress code at all: the zero-code case.

Only ``torch`` and ``transformers`` (and the demo's toy model and data,
:mod:`localdev.demo.toy_training`): no ``exporter_lib``, no Kubeflow SDK, and
``report_to`` left at its default.  Transformers 5.x adds its built-in Kubeflow
integration by itself whenever ``KUBEFLOW_TRAINER_SERVER_URL`` is set
(``TrainingArguments.__post_init__``), so in a pod of the zero-code runtime
overlay (``charts/runtime-overlays/zero-code``) it pushes to the exporter sidecar.

A tiny GPT-2 built from a config (random weights, nothing downloaded) learns a
synthetic sequence on CPU.  ``--log-file`` appends every logged entry (JSON lines)
so a test can compare the losses with what lands in the TrainJob; that callback
only writes a file, as any training script's logging might.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=256, help="training sequences")
    parser.add_argument("--logging-steps", type=int, default=4)
    parser.add_argument("--log-file", type=Path, help="append each logged entry here as JSON")
    args = parser.parse_args(argv)

    from transformers import Trainer, TrainingArguments, set_seed

    from localdev.demo.toy_training import counting_rows, log_to_file, sequences, tiny_gpt2

    set_seed(0)
    model = tiny_gpt2()
    rows = counting_rows(args.samples)

    with tempfile.TemporaryDirectory() as out_dir:
        training_args = TrainingArguments(
            output_dir=out_dir, num_train_epochs=args.epochs, per_device_train_batch_size=8,
            learning_rate=5e-3, logging_steps=args.logging_steps, save_strategy="no",
            use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
        print(f"report_to={training_args.report_to}", flush=True)
        Trainer(model=model, args=training_args, train_dataset=sequences(rows),
                callbacks=[log_to_file(args.log_file)]).train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
