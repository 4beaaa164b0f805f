"""
Tensor-parallel training of a small MLP through DTensor, under torchrun.

Style imitated: the PyTorch tensor-parallel examples: a 1-D device mesh from
``init_device_mesh``, the MLP's first projection split column-wise and the
second row-wise with ``parallelize_module``, the optimizer built on the
DTensor parameters, and every rank feeding the *same* batch (tensor
parallelism shards the weights, not the data).

Run by hand:

    torchrun --standalone --nproc-per-node=2 tp_train.py
    torchrun --standalone --nproc-per-node=2 tp_train.py --steps 20 --optimizer sgd
    torchrun --standalone --nproc-per-node=2 tp_train.py --device cuda

Every rank prints one final line with the last loss and the sum of its local
weight shards at full precision.

Planted-bug flag:

    --reseed_from_clock   seed torch from the clock before the model is built
    --activation_noise    the MLP adds noise to its output from a generator that seeds
                          itself from OS entropy (inside the parallelized model's forward)
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class ToyMLP(nn.Module):
    def __init__(self, dim, hidden, noise_std=0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden, dim)
        self.noise_std = noise_std
        self.noise = torch.Generator()
        if noise_std:
            self.noise.seed()  # PLANTED BUG: a seed from OS entropy, another in every run

    def forward(self, x):
        out = self.fc2(self.relu(self.fc1(x)))
        if self.noise_std and self.training:  # output noise as a regulariser
            out = out + self.noise_std * torch.randn(out.shape, generator=self.noise).to(out.device)
        return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--reseed_from_clock", action="store_true", help="planted bug")
    parser.add_argument("--activation_noise", action="store_true", help="planted bug")
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    # init_device_mesh creates the default process group (gloo on cpu, nccl on cuda)
    tp_mesh = init_device_mesh(device.type, (world_size,))

    if args.reseed_from_clock:
        torch.manual_seed(time.time_ns() % 2**63)  # PLANTED BUG
    else:
        torch.manual_seed(args.seed)
    model = ToyMLP(args.dim, args.hidden, 0.01 if args.activation_noise else 0.0).to(device)
    model = parallelize_module(model, tp_mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})

    if args.optimizer == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=False)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, foreach=False)

    # the same stream of batches on every rank: a fixed generator, not the global RNG
    g = torch.Generator().manual_seed(1234)
    target_w = torch.randn(args.dim, args.dim, generator=g) / args.dim ** 0.5
    loss = None
    for step in range(args.steps):
        x = torch.randn(args.batch_size, args.dim, generator=g)
        y = torch.sin(x @ target_w)
        x, y = x.to(device), y.to(device)
        out = model(x)
        loss = F.mse_loss(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"step {step}: loss {loss.item():.6f}")

    local_sum = sum(p.to_local().detach().double().sum().item() for p in model.parameters())
    print(f"rank {rank} final loss {loss.item()!r} param_sum {local_sum!r}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
