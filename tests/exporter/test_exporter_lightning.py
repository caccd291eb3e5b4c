"""A real PyTorch Lightning fit with the exporter callback (tiny model, CPU)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl  # required: this test fails (not skips) without lightning
import pytest
import torch

import exporter_lib
from exporter_lib import api
from exporter_lib.callbacks.lightning import ExporterCallback


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_lightning_fit_reports(exporter: api.Exporter, tmp_path: Path) -> None:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path),
                         callbacks=[ExporterCallback(metrics_every_n_steps=4)])
    trainer.fit(Tiny(), loader, loader)
    status = exporter_lib.current_status()
    assert status is not None
    assert status.progress_percentage == 100 and status.estimated_remaining_seconds == 0
    metrics = status.metrics_dict()
    assert float(metrics["val_loss"]) == trainer.callback_metrics["val_loss"].item()
    assert "train_loss" in metrics


def test_lightning_checkpoint_saves_are_reported(exporter: api.Exporter, tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A ``ModelCheckpoint`` saving each epoch: ``lastCheckpointTime`` is the last save's
    time (whole seconds), and the line ``verbose=True`` prints is one the log source
    recognises."""
    import logging
    import time

    from lightning.pytorch.callbacks import ModelCheckpoint

    from scraper.logsource.checkpoint_lines import is_save

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    saving = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), monitor="val_loss", save_top_k=-1,
                             verbose=True)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path),
                         callbacks=[saving, ExporterCallback(metrics_every_n_steps=4)])
    before = time.time()
    with caplog.at_level(logging.INFO, logger="lightning"):
        trainer.fit(Tiny(), loader, loader)
    status = exporter_lib.current_status()
    assert status is not None and status.last_checkpoint_time is not None
    files = sorted((tmp_path / "ckpt").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    assert len(files) == 2
    reported = status.last_checkpoint_time.timestamp()
    # Lightning calls the hook as it builds the checkpoint, just before the file write.
    assert int(before) <= reported <= files[-1].stat().st_mtime
    assert reported >= int(files[0].stat().st_mtime)
    lines = [r.getMessage() for r in caplog.records if "saving model" in r.getMessage()]
    assert lines and all(is_save(line) for line in lines), lines
