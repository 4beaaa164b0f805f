"""A Dataset that augments its samples in data-loader workers with a numpy Generator it made
without a seed (planted: `np.random.default_rng()` draws its seed from OS entropy; `--fixed`
gives it one). Expected cause: an unseeded generator, at the line that made it."""

import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Noisy(Dataset):
    def __init__(self, seed):
        self.x = torch.randn(64, 8)
        self.rng = np.random.default_rng(seed)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        noise = self.rng.normal(0, 0.1, size=8).astype(np.float32)
        return self.x[i] + torch.from_numpy(noise)


if __name__ == "__main__":
    torch.manual_seed(0)
    loader = DataLoader(
        Noisy(0 if "--fixed" in sys.argv else None),
        batch_size=8,
        shuffle=True,
        num_workers=2,
        generator=torch.Generator().manual_seed(0),
    )
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in loader:
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
