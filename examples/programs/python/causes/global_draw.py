"""Rows put in order by numpy's global generator before anything seeds it (planted: the program
seeds numpy and torch only afterwards, as a Hugging Face Trainer does; `--fixed` seeds first),
the way `datasets`' `shuffle()` without a seed derives its order: each run trains on the rows
in another order, while every loader fetches the same indices. Expected cause: an unseeded
generator, at the line that drew from it."""

import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    made = torch.Generator().manual_seed(1)
    features = torch.randn(96, 12, generator=made)
    labels = torch.randint(0, 3, (96,), generator=made)
    if "--fixed" in sys.argv:
        np.random.seed(0)
    order = torch.from_numpy(np.random.permutation(len(features)))
    dataset = TensorDataset(features[order], labels[order])
    np.random.seed(0)
    torch.manual_seed(0)
    loader = DataLoader(dataset, batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for inputs, targets in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()


if __name__ == "__main__":
    main()
