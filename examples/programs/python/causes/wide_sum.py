"""A regression head trained on the sum of a wide activation (planted: nothing in the script;
the bug is where it runs). torch splits a large sum over its CPU threads, so the order of the
additions follows the thread count: run with OMP_NUM_THREADS=1 on one machine and 2 on
another, the two runs differ. Expected cause, from `detcheck compare` of the two runs' dumps
(`detcheck run --dump DIR -- python wide_sum.py`): an environment difference, naming
OMP_NUM_THREADS. Its clean twin is the same thread count on both sides."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 16384), nn.Tanh())
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.randn(64, 256)
for step in range(3):
    loss = (model(data).sum() / 1e4 - 1.0) ** 2
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
