"""A Dataset that augments its samples in data-loader workers with numpy's global generator,
each worker reseeded in `worker_init_fn` (planted: `np.random.seed()` without a value, a common
fix for workers that draw identical augmentations, takes its seed from OS entropy; `--fixed`
seeds each worker from its torch seed, PyTorch's recipe). Expected cause: data values (the
loader fetched the same samples)."""

import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Jitter(Dataset):
    def __init__(self):
        self.x = torch.randn(64, 8)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        noise = np.random.normal(0, 0.1, size=8).astype(np.float32)
        return self.x[i] + torch.from_numpy(noise)


def reseed(worker_id):
    if "--fixed" in sys.argv:
        np.random.seed(torch.initial_seed() % 2**32)
    else:
        np.random.seed()


if __name__ == "__main__":
    torch.manual_seed(0)
    loader = DataLoader(
        Jitter(),
        batch_size=8,
        shuffle=True,
        num_workers=2,
        worker_init_fn=reseed,
        generator=torch.Generator().manual_seed(0),
    )
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in loader:
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
