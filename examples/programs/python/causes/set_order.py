"""A multi-task model whose forward sums its heads' losses in the iteration order of a set of
task names (planted: a set of strings follows PYTHONHASHSEED; `--fixed` sorts them). Expected
cause: hash order."""

import sys

import torch
from torch import nn


class MultiTask(nn.Module):
    def __init__(self, tasks):
        super().__init__()
        self.trunk = nn.Linear(8, 16)
        self.heads = nn.ModuleDict({t: nn.Linear(16, 1) for t in tasks})

    def forward(self, x):
        h = torch.tanh(self.trunk(x))
        tasks = sorted(self.heads) if "--fixed" in sys.argv else set(self.heads)
        total = torch.zeros(())
        for t in tasks:
            total = total + self.heads[t](h).pow(2).mean() * 1e-3
        return total


torch.manual_seed(0)
model = MultiTask(["price", "volume", "spread", "depth", "skew"])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randn(40, 8)
for step in range(5):
    loss = model(data[step * 8 : step * 8 + 8])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
