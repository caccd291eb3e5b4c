"""A tiny LightningModule trained with Lightning's default progress bar (TQDMProgressBar).

Environment: ``EPOCHS`` (default 2), ``STEPS`` batches per epoch (default 6),
``SLEEP`` seconds per batch (default 0).
"""

import os
import time

import lightning as L
import torch
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
trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                    enable_checkpointing=False, enable_model_summary=False,
                    num_sanity_val_steps=0)
trainer.fit(Tiny(), DataLoader(data, batch_size=4), DataLoader(data, batch_size=4))
print("done")
