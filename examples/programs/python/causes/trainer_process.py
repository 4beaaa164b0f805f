"""A model trained first in a process the script starts itself, sharing the model's memory
(Hogwild's way), then by the script (planted: the trainer process seeds itself with its process
id; `--fixed` seeds it with 0). The recording sees the model only when the script's own
training begins, after the process changed it. Expected cause: unrecorded processes, at the
line that started the process."""

import os
import sys

import torch
import torch.multiprocessing as mp
from torch import nn


def warm_up(model, fixed):
    torch.manual_seed(0 if fixed else os.getpid())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(8, 6)).pow(2).mean().backward()
        optimizer.step()


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 1))
    model.share_memory()
    trainer = mp.get_context("spawn").Process(target=warm_up, args=(model, "--fixed" in sys.argv))
    trainer.start()
    trainer.join()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        optimizer.zero_grad()
        model(torch.randn(8, 6)).pow(2).mean().backward()
        optimizer.step()


if __name__ == "__main__":
    main()
