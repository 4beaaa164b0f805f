"""A plain PyTorch DistributedDataParallel training script (gloo, CPU) that knows nothing of
detcheck: no import, no writer, no hook. detcheck records it without a change:

    detcheck check --ranks 2 --steps 3 --checks repeat,replicas,world_sizes --world-sizes 1,2 \
        -- python ddp_train.py

It runs under any launcher that sets the usual variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT: detcheck's `processes` launcher, torchrun), or alone as one process. It trains for
`--epochs` epochs (many steps); detcheck ends it after `--steps` optimizer steps.

The clean script is reproducible at any world size: it seeds torch, its DistributedSampler
splits each global batch of 4 samples between the ranks, its DataLoader has 2 workers, and the
model computes in float64 on small dyadic numbers (integer data, weights on a grid of 2^-12, a
learning rate of 2^-8), so every sum is exact and a gradient does not depend on how the batch is
split. Real models are not exact (see docs/checks.md, the world_sizes check).

Negative controls, each a bug a real script has:

- `--reseed-from-clock`: `torch.manual_seed(time.time_ns())` before the model is made, as a
  script that wants "fresh randomness" does: the initial weights change every launch;
- `--set-order`: the model adds a correction summed in float32 over named terms in the
  iteration order of a `set` of names, which depends on PYTHONHASHSEED: caught by default,
  fixed by `detcheck check --deterministic` (which pins PYTHONHASHSEED).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

GLOBAL_BATCH = 4
SAMPLES = 64
#: The named terms of the `--set-order` correction and their weights.
TERMS = {"alpha": 0.1, "beta": 0.2, "gamma": 0.3, "delta": 0.4,
         "epsilon": 0.5, "zeta": 0.6, "eta": 0.7, "theta": 0.8}


class Samples(Dataset):
    """Integer features and targets, drawn once from a fixed seed."""

    def __init__(self):
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randint(-2, 3, (SAMPLES, 16), generator=g, dtype=torch.float64)
        self.y = torch.randint(-2, 3, (SAMPLES, 4), generator=g, dtype=torch.float64)

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Net(nn.Module):
    def __init__(self, set_order):
        super().__init__()
        self.fc1 = nn.Linear(16, 32, dtype=torch.float64)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(32, 4, dtype=torch.float64)
        self.set_order = set_order

    def forward(self, x):
        out = self.fc2(self.act(self.fc1(x)))
        if self.set_order:
            correction = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
            for name in set(TERMS):  # PYTHONHASHSEED decides this order
                correction = correction + out.float() * TERMS[name]
            out = out + correction.double() * 2**-10
        return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (NCCL; one GPU per rank)")
    control = parser.add_mutually_exclusive_group()
    control.add_argument("--reseed-from-clock", action="store_true")
    control.add_argument("--set-order", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    # torchrun sets RANK; mpirun sets its own (Open MPI's, or MPICH's PMI_RANK).
    rank = int(next((os.environ[v] for v in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
                     if v in os.environ), "0"))
    cuda = args.device == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else None
    distributed = "MASTER_ADDR" in os.environ
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)

    if args.reseed_from_clock:
        torch.manual_seed(time.time_ns())
    net = Net(args.set_order)
    with torch.no_grad():  # sixteenths in [-2/16, 2/16]: every later sum is exact
        for p in net.parameters():
            p.copy_(torch.randint(-2, 3, p.shape, dtype=torch.float64) / 16)
    if cuda:
        net = net.to(device)
    model = nn.parallel.DistributedDataParallel(net) if distributed else net
    optimizer = torch.optim.SGD(model.parameters(), lr=2**-8)
    data = Samples()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=GLOBAL_BATCH // world, sampler=sampler,
                        num_workers=args.workers)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            if cuda:
                x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = ((model(x) - y) ** 2).sum() / len(x)
            loss.backward()
            optimizer.step()
            with torch.no_grad():  # back onto the grid: the next step's sums stay exact
                for p in net.parameters():
                    p.copy_(torch.round(p * 4096) / 4096)
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.6f}", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
