"""A dataset split by `random_split` before torch is seeded (planted; `--fixed` seeds first):
each run trains on other samples, while every loader fetches the same indices of its part.
Expected cause: data order, at the split's line."""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split


def main():
    # The samples themselves come from a generator of their own, seeded: the same every run.
    made = torch.Generator().manual_seed(1)
    dataset = TensorDataset(
        torch.randn(96, 12, generator=made), torch.randint(0, 3, (96,), generator=made)
    )
    if "--fixed" in sys.argv:
        torch.manual_seed(0)
    train, _ = random_split(dataset, [80, 16])
    torch.manual_seed(0)
    loader = DataLoader(train, batch_size=16, shuffle=True)
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
