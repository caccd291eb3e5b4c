"""A tiny LightningModule trained with Lightning's default progress bar (TQDMProgressBar).

Environment: ``EPOCHS`` (default 2), ``STEPS`` batches per epoch (default 6),
``SLEEP`` seconds per batch (default 0), ``LIGHTNING_BAR=tqdm`` picks the TQDMProgressBar
(the default is the RichProgressBar when ``rich`` is installed, as here).
"""

import os
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from torch.utils.data import DataLoader, TensorDataset

epochs = int(os.environ.get("EPOCHS", "2"))
steps = int(os.environ.get("STEPS", "6"))
pause = float(os.environ.get("SLEEP", "0"))


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.linear(x).squeeze(1), y)
        self.log("train_loss", loss, prog_bar=True)
        time.sleep(pause)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.linear(x).squeeze(1), y),
                  prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


generator = torch.Generator().manual_seed(0)
x = torch.randn(steps * 4, 4, generator=generator)
data = TensorDataset(x, x.sum(dim=1))
bars = [TQDMProgressBar()] if os.environ.get("LIGHTNING_BAR") == "tqdm" else []
trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                    enable_checkpointing=False, enable_model_summary=False,
                    num_sanity_val_steps=0, callbacks=bars)
trainer.fit(Tiny(), DataLoader(data, batch_size=4), DataLoader(data, batch_size=4))
print("done")
