"""A hand-written loop that shuffles its samples with Python's `random` (planted: never seeded;
`--fixed` seeds it). Expected cause: an unseeded random generator (Python's `random`)."""

import random
import sys

import torch
from torch import nn

if "--fixed" in sys.argv:
    random.seed(0)
torch.manual_seed(0)
samples = [(torch.randn(16), torch.randn(1)) for _ in range(64)]
random.shuffle(samples)

model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for start in range(0, len(samples), 8):
    batch = samples[start : start + 8]
    x = torch.stack([s[0] for s in batch])
    y = torch.stack([s[1] for s in batch])
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
