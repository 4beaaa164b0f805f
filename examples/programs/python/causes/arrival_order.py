"""Data-parallel training whose gradients are averaged by hand: rank 0 takes the other ranks'
gradients in the order they arrive (`dist.recv` without `src`), adds them, and sends the mean
back (planted: floating-point addition is not associative, so the sum follows the arrival
order; `--fixed` receives from rank 1, 2, ... in turn). Run at 3 ranks or more. Expected
cause: a collective or reduction order."""

import sys

import torch
import torch.distributed as dist
from torch import nn


def average_gradients(model, rank, world):
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    if rank == 0:
        total = flat.clone()
        incoming = torch.empty_like(flat)
        for source in range(1, world):
            if "--fixed" in sys.argv:
                dist.recv(incoming, src=source)
            else:
                dist.recv(incoming)
            total += incoming
        flat = total / world
    else:
        dist.send(flat, dst=0)
    dist.broadcast(flat, src=0)
    offset = 0
    for p in model.parameters():
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
generator = torch.Generator().manual_seed(1000 + rank)
for step in range(5):
    x = torch.randn(16, 32, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    average_gradients(model, rank, world)
    optimizer.step()
dist.destroy_process_group()
