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


def test_trainer_saves_are_reported_as_checkpoints(exporter: api.Exporter, tmp_path: Path,
                                                   caplog: Any) -> None:
    """Each ``save_steps`` save becomes ``lastCheckpointTime`` (served in JSON and text),
    at the time of the save; the log line the Trainer prints then is the one the log
    source recognises."""
    import logging
    import time

    from scraper.logsource.checkpoint_lines import is_save

    saves: list[float] = []

    class Saves(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            saves.append(time.time())

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64,
                                       n_positions=16))
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=12, per_device_train_batch_size=4,
        save_strategy="steps", save_steps=5, report_to="none", use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, log_level="info")
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(64),
                      callbacks=[ExporterCallback(), Saves()])
    before = time.time()
    with caplog.at_level(logging.INFO, logger="transformers"):
        trainer.train()
    status = exporter_lib.current_status()
    assert status is not None and status.last_checkpoint_time is not None
    assert len(saves) >= 2  # steps 5, 10 (and the last, 12)
    reported = status.last_checkpoint_time.timestamp()
    assert int(before) <= reported <= saves[-1] + 1
    assert reported >= int(saves[-2])  # the last save, not an earlier one
    body = json.loads(urllib.request.urlopen(urllib.request.Request(
        f"{exporter.url}/metrics", headers={"Accept": "application/json"}), timeout=10).read())
    assert body["lastCheckpointTime"] == status.to_wire()["lastCheckpointTime"]
    assert "lastCheckpointTime" not in status.to_api()  # never written to a TrainJob
    from scraper.scrape.exporter import Fresh, parse_text

    text = parse_text(urllib.request.urlopen(f"{exporter.url}/metrics", timeout=10).read())
    assert isinstance(text, Fresh)
    assert text.status.last_checkpoint_time == status.last_checkpoint_time
    printed = [r.getMessage() for r in caplog.records if "checkpoint" in r.getMessage()]
    assert printed and all(is_save(line) for line in printed
                           if line.startswith("Saving model checkpoint")), printed
    assert any(is_save(line) for line in printed), printed
