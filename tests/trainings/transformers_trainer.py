"""The Transformers ``Trainer`` on a tiny torch model: its tqdm bar, logged dicts, eval bar.

Environment: ``STEPS`` (max_steps, default 12), ``SLEEP`` seconds per step (default 0),
``EVAL_STEPS`` (default 6), ``OUTPUT_DIR`` (default a temporary directory), ``PRINT_LOG``
a file that gets ``{"t": unix time, "progress": percent}`` per logged dict (the freshness
benchmark's reference; the Trainer prints the dict and ends the bar's line then).
"""

import json
import os
import tempfile
import time

import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

steps = int(os.environ.get("STEPS", "12"))
pause = float(os.environ.get("SLEEP", "0"))
eval_steps = int(os.environ.get("EVAL_STEPS", "6"))


class Pairs(Dataset):
    def __init__(self, n: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=generator)
        self.y = (self.x.sum(dim=1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i]}


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x, labels=None):
        logits = self.linear(x)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


class Slow(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(pause)


class PrintLog(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        with open(os.environ["PRINT_LOG"], "a") as handle:
            entry = {"t": time.time(), "progress": 100 * state.global_step // state.max_steps}
            if logs and isinstance(logs.get("loss"), float):
                # As ProgressCallback prints it (f"{v:.4g}", transformers/trainer_callback.py).
                entry["loss"] = f"{logs['loss']:.4g}"
            handle.write(json.dumps(entry) + "\n")


args = TrainingArguments(
    output_dir=os.environ.get("OUTPUT_DIR") or tempfile.mkdtemp(), max_steps=steps,
    per_device_train_batch_size=4, per_device_eval_batch_size=4, logging_steps=1,
    eval_strategy="steps", eval_steps=eval_steps, save_strategy="no", report_to=[],
    use_cpu=True, disable_tqdm=False, dataloader_num_workers=0)
trainer = Trainer(model=Tiny(), args=args, train_dataset=Pairs(64), eval_dataset=Pairs(16),
                  callbacks=([Slow()] if pause else [])
                  + ([PrintLog()] if "PRINT_LOG" in os.environ else []))
trainer.train()
print("done")
