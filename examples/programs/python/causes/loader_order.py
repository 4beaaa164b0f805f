"""A DataLoader whose shuffle draws from a generator seeded with the process id (planted;
`--fixed` seeds it with 0). Expected cause: a generator seeded differently (the loader's own),
at the DataLoader's line, where the generator is made. (A sampler or split drawn before the
generator is seeded, data order: split_order.py.)"""

import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(96, 12), torch.randint(0, 3, (96,)))
    seed = 0 if "--fixed" in sys.argv else os.getpid()
    loader = DataLoader(
        dataset, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )
    model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(2):
        for inputs, labels in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
