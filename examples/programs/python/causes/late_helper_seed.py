"""A script that builds its model, then seeds through a helper of its own (planted, as minGPT's
chargpt with `set_seed` moved below `model = GPT(...)`; `--fixed` seeds first). Expected cause:
initial parameters, whose fix names the line that built the model and the script's own call of
the helper, the helper's line after it (`late_helper_seed.py:15, in helpers/seeding.py:10`)."""

import sys

import torch
from helpers.seeding import set_seed
from torch import nn

if "--fixed" in sys.argv:
    set_seed(3407)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
set_seed(3407)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
