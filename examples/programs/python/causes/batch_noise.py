"""A hand-written loop that adds numpy noise to each batch before it enters torch (planted: the
noise's generator is seeded from the clock, so each run draws other noise; `--fixed` gives it a
constant seed). Expected cause: a value from outside torch, at the line where the noisy batch
enters torch (outside any module)."""

import sys
import time

import numpy as np
import torch
from torch import nn

torch.manual_seed(0)
data = np.linspace(-1, 1, 64 * 16, dtype=np.float32).reshape(64, 16)
targets = data.sum(axis=1, keepdims=True)
noise = np.random.default_rng(0 if "--fixed" in sys.argv else time.time_ns())

model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for start in range(0, len(data), 8):
    batch = data[start : start + 8] + noise.normal(0, 0.01, (8, 16)).astype(np.float32)
    x = torch.from_numpy(batch)
    y = torch.from_numpy(targets[start : start + 8])
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
