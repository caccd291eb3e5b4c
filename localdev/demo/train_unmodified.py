"""A Transformers training with no progress code at all: the zero-code case.

Only ``torch`` and ``transformers``: no ``exporter_lib``, no Kubeflow SDK, and
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
import json
import sys
import tempfile
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=256, help="training sequences")
    parser.add_argument("--logging-steps", type=int, default=4)
    parser.add_argument("--log-file", type=Path, help="append each logged entry here as JSON")
    args = parser.parse_args(argv)

    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        set_seed,
    )

    set_seed(0)
    seq_len, vocab = 32, 64
    model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=seq_len, n_embd=32,
                                       n_layer=2, n_head=2))
    starts = torch.randint(0, vocab, (args.samples, 1))
    rows = (starts + torch.arange(seq_len)) % vocab

    class Sequences(torch.utils.data.Dataset[dict[str, Any]]):
        def __len__(self) -> int:
            return len(rows)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": rows[i], "labels": rows[i]}

    log_file = args.log_file

    class LogToFile(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
                   **kwargs: Any) -> None:
            if log_file is not None and logs:
                with log_file.open("a") as out:
                    out.write(json.dumps({"step": state.global_step, **logs}) + "\n")

    with tempfile.TemporaryDirectory() as out_dir:
        training_args = TrainingArguments(
            output_dir=out_dir, num_train_epochs=args.epochs, per_device_train_batch_size=8,
            learning_rate=5e-3, logging_steps=args.logging_steps, save_strategy="no",
            use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
        print(f"report_to={training_args.report_to}", flush=True)
        Trainer(model=model, args=training_args, train_dataset=Sequences(),
                callbacks=[LogToFile()]).train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
