"""A script that seeds torch from the clock so that "every run explores" (planted; `--fixed`
seeds with a constant). Expected cause: a generator seeded differently in each run, at the
`torch.manual_seed` line."""

import sys
import time

import torch
from torch import nn

seed = 1337 if "--fixed" in sys.argv else time.time_ns() % 2**31
torch.manual_seed(seed)

model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(4):
    x, y = torch.randn(16, 12), torch.randn(16, 1)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
