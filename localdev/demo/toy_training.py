"""The demo's toy training pieces, shared by its training scripts (torch/transformers).

A tiny GPT-2 built from a config (random weights, nothing downloaded; 2 layers, 32
wide, vocabulary 64, sequences of 32 tokens) and sequences that count up modulo the
vocabulary from a random start (learnable), plus a callback that appends every logged
entry to a JSON-lines file, so tests can compare losses with what lands in the
TrainJob.  Nothing here reports progress: that is each script's own choice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SEQ_LEN = 32
VOCAB = 64


def tiny_gpt2() -> Any:
    """A ``GPT2LMHeadModel`` from a config (seed it first with ``set_seed``)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ_LEN, n_embd=32,
                                      n_layer=2, n_head=2))


def counting_rows(count: int) -> Any:
    """``count`` token rows (a ``torch.Tensor`` of shape ``(count, SEQ_LEN)``)."""
    import torch

    starts = torch.randint(0, VOCAB, (count, 1))
    return (starts + torch.arange(SEQ_LEN)) % VOCAB


def sequences(rows: Any) -> Any:
    """A ``torch.utils.data.Dataset`` of ``{"input_ids", "labels"}`` over ``rows``."""
    import torch

    class Sequences(torch.utils.data.Dataset[dict[str, Any]]):
        def __len__(self) -> int:
            return len(rows)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": rows[i], "labels": rows[i]}

    return Sequences()


def log_to_file(log_file: Path | None) -> Any:
    """A ``TrainerCallback`` appending ``{"step": ..., **logs}`` lines to ``log_file``."""
    from transformers import TrainerCallback

    class LogToFile(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
                   **kwargs: Any) -> None:
            if log_file is not None and logs:
                with log_file.open("a") as out:
                    out.write(json.dumps({"step": state.global_step, **logs}) + "\n")

    return LogToFile()
