"""A Lightning program that starts its own ranks, as Lightning's docs write one: `Trainer(
accelerator="cpu", devices=2, strategy="ddp")`, run as `python lightning_devices.py`. Lightning
starts rank 1 itself (its subprocess launcher re-runs this script); under detcheck that process
joins the process group as rank 1 and is recorded as rank 1 (issue 54: before, it was not
recorded, never stopped at `--steps`, and rank 0 waited for it until the timeout).
"""

import lightning.pytorch as pl
import torch
from torch import nn


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, _):
        x, y = batch
        return (self.net(x).squeeze(-1) - y).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-2)


if __name__ == "__main__":
    pl.seed_everything(0)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    trainer = pl.Trainer(max_steps=4, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Regressor(), loader)
