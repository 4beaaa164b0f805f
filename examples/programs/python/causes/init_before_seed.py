"""A script that builds its model, then seeds torch (planted: the initialisation draws from an
unseeded generator; `--fixed` seeds first). Expected cause: initial parameters differ."""

import sys

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 20), nn.GELU(), nn.Linear(20, 10))
        self.head = nn.Linear(10, 1)

    def forward(self, x):
        return self.head(self.body(x))


if "--fixed" in sys.argv:
    torch.manual_seed(1234)
net = Net()
torch.manual_seed(1234)
opt = torch.optim.Adam(net.parameters(), lr=3e-4)
for it in range(5):
    x = torch.randn(32, 10)
    loss = net(x).pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
