"""A module that adds a value read from the clock inside its forward (planted; `--fixed` adds
a constant). Expected cause: a value from outside torch, at its operator."""

import sys
import time

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        jitter = 0.0 if "--fixed" in sys.argv else (time.perf_counter_ns() % 1000) * 1e-9
        return torch.relu(self.fc(x)) + torch.tensor(jitter)


torch.manual_seed(0)
model = nn.Sequential(Block(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(4):
    x = torch.randn(8, 16)
    loss = model(x).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
