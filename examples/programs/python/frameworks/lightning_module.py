"""A tiny PyTorch Lightning module trained by `lightning.Trainer`, recorded with
`detcheck.lightning.DetcheckCallback`; DDP on gloo when launched as several ranks (detcheck's
`processes` launcher sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which
Lightning takes as an external launch).

    python3 lightning_module.py [--steps N] [--plant-unseeded-dropout]

The clean program passes `repeat`, `replicas` and `world_sizes` [1, 2]: two samples per update at
every world size (one per rank at 2 ranks; `accumulate_grad_batches=2` at 1), in order (a
`DistributedSampler` without shuffling: Lightning's own would shuffle), and no dropout, so each update's gradient is one addition of two per-sample gradients (scaled by powers
of two) whichever way it is made.

`--plant-unseeded-dropout` is the negative control: dropout on, with torch's generator reseeded
from the clock at every batch; `repeat` catches it.
"""

import argparse
import os
import sys
import time

import lightning.pytorch as pl
import torch
from torch import nn

from detcheck.lightning import DetcheckCallback


class Regressor(pl.LightningModule):
    def __init__(self, dropout, clock_seed):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 1))
        self.clock_seed = clock_seed

    def training_step(self, batch, _):
        if self.clock_seed:  # the planted bug
            torch.manual_seed(time.time_ns() % (1 << 62))
        x, y = batch
        return (self.net(x).squeeze(-1) - y).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=int(os.environ.get("DETCHECK_STEPS", "3")))
    parser.add_argument("--plant-unseeded-dropout", action="store_true")
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if 2 % world:
        raise SystemExit(f"lightning_module.py: runs at 1 or 2 ranks, not {world}")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, generator=g))
    # In order at every world size: rank r takes samples r, r + 2, ... (Lightning's own
    # distributed sampler would shuffle them).
    sampler = None
    if world > 1:
        rank = int(os.environ.get("RANK", "0"))
        sampler = torch.utils.data.DistributedSampler(data, world, rank, shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=1, shuffle=False, sampler=sampler)
    torch.manual_seed(0)
    plant = args.plant_unseeded_dropout
    module = Regressor(0.2 if plant else 0.0, plant)
    trainer = pl.Trainer(
        max_steps=args.steps, accumulate_grad_batches=2 // world, accelerator="cpu",
        devices=world, strategy="ddp" if world > 1 else "auto", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=os.environ.get("DETCHECK_TRACE_DIR", "."), use_distributed_sampler=False,
        callbacks=[DetcheckCallback(replicated=True)],
    )
    trainer.fit(module, loader)
    return 0


if __name__ == "__main__":
    sys.exit(main())
