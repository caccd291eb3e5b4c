"""A real Transformers Trainer run (tiny GPT-2 from a config, CPU, synthetic data)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import torch  # required: this test fails (not skips) without torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import exporter_lib
from exporter_lib import api
from exporter_lib.callbacks.transformers import ExporterCallback
from exporter_lib.status import TrainerStatus, metric_value_text


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, 64, (count, 16), generator=generator)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[index], "labels": self.data[index]}


def _trainer(tmp_path: Path, callbacks: list[Any], report_to: Any = "none") -> Trainer:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64,
                                       n_positions=16))
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=24, per_device_train_batch_size=4,
        logging_steps=4, eval_strategy="steps", eval_steps=12, save_strategy="no",
        report_to=report_to, use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    return Trainer(model=model, args=args, train_dataset=Tokens(64), eval_dataset=Tokens(8),
                   callbacks=callbacks)


class Scrape(TrainerCallback):
    """Reads the exporter over HTTP mid-training, as the scraper would."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: list[TrainerStatus] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step in (6, 18):
            request = urllib.request.Request(self.url, headers={"Accept": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as resp:
                self.seen.append(TrainerStatus.from_json(resp.read()))


def test_trainer_with_exporter_callback(exporter: api.Exporter, tmp_path: Path) -> None:
    scrape = Scrape(f"{exporter.url}/metrics")
    trainer = _trainer(tmp_path, [ExporterCallback(), scrape])
    trainer.train()
    status = exporter_lib.current_status()
    assert status is not None
    assert status.progress_percentage == 100 and status.estimated_remaining_seconds == 0
    metrics = status.metrics_dict()
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logged) >= 5
    assert metrics["loss"] == metric_value_text(logged[-1]["loss"])
    evals = [e for e in trainer.state.log_history if "eval_loss" in e]
    assert metrics["eval_loss"] == metric_value_text(evals[-1]["eval_loss"])
    assert [s.progress_percentage for s in scrape.seen] == [25, 75]
    assert scrape.seen[1].estimated_remaining_seconds is not None


def test_transformers_builtin_kubeflow_integration_reports_into_exporter(
        exporter: api.Exporter, tmp_path: Path) -> None:
    url = exporter_lib.enable_push_compat(namespace="ns", name="hf-job")
    assert url is not None
    trainer = _trainer(tmp_path, [], report_to=["kubeflow"])
    trainer.train()
    status = exporter_lib.current_status()
    assert status is not None and status.progress_percentage == 100
    assert json.loads(status.to_json())["estimatedRemainingSeconds"] == 0
