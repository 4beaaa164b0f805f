"""A PyTorch DistributedDataParallel program (gloo, CPU) of the user's own under detcheck's
`command` kind (`processes` launcher: detcheck sets RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT, so no torchrun is needed; the `torchrun` launcher works too).

`detcheck.torch.watch` records every module's output, every gradient after the allreduce and every
parameter after the optimizer step, each step.

    python3 torch_ddp.py --seed S --steps N [--plant-unseeded-dropout | --plant-numpy-noise |
                                             --plant-entropy-sum]

The clean program passes `repeat`, `replicas` and `world_sizes` [1, 2]: each step draws one global
batch of 16 samples from (seed, step) and rank r trains on its contiguous shard, and the model
computes in float64 on small dyadic numbers (integer inputs and targets, weights rounded to a grid
of 2^-12 after each update, as fixed-point training does, a learning rate of 2^-8), so every sum
is exact and the gradients' bits do not depend on how the batch is split between ranks. Real models are not exact: their gradients change with the split,
which is what detcheck's `world_sizes` check shows (see docs/checks.md).

Negative controls (`repeat` catches each every launch, and names its element and operator):

- `--plant-unseeded-dropout`: dropout masks from a generator seeded from OS entropy
  (`torch.Generator().seed()`), as a forgotten `manual_seed` does in a data loader worker;
- `--plant-numpy-noise`: `block` adds noise from numpy's global generator, which nobody seeded:
  the first differing operator is the `add` whose input came from outside the traced operators;
- `--plant-entropy-sum`: `block` calls a custom operator (`torch.library.custom_op`) that sums
  rows in an order drawn from OS entropy: the operator itself is nondeterministic.
"""

import argparse
import random
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import detcheck
import detcheck.torch

GLOBAL_BATCH = 16


@torch.library.custom_op("detcheck_examples::entropy_sum", mutates_args=())
def entropy_sum(h: torch.Tensor) -> torch.Tensor:
    """The rows of `sin(h)` summed in float32, in an order drawn from OS entropy."""
    rows = list(range(h.shape[0]))
    random.SystemRandom().shuffle(rows)
    terms = torch.sin(h).float()
    total = torch.zeros_like(terms[0])
    for i in rows:
        total = total + terms[i]
    return total.double()


@entropy_sum.register_fake
def _(h):
    return h.new_empty(h.shape[1:])


class Block(nn.Module):
    """A linear layer, and the planted fault of a control."""

    def __init__(self, plant):
        super().__init__()
        self.fc = nn.Linear(32, 64, dtype=torch.float64)
        self.plant = plant

    def forward(self, x):
        h = self.fc(x)
        if self.plant == "numpy-noise":
            # numpy's global generator, never seeded: another draw every launch
            noise = torch.from_numpy(np.random.standard_normal(h.shape))
            h = h + noise
        elif self.plant == "entropy-sum":
            h = h + entropy_sum(h.detach())
        return h


class Net(nn.Module):
    def __init__(self, plant, dropout):
        super().__init__()
        self.block = Block(plant)
        self.head = nn.Linear(64, 10, dtype=torch.float64)
        self.dropout = dropout

    def forward(self, x):
        h = torch.relu(self.block(x))
        if self.dropout is not None:
            mask = torch.rand(h.shape, generator=self.dropout) > 0.5
            h = h * mask * 2.0
        return self.head(h)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=4)
    plant = parser.add_mutually_exclusive_group()
    plant.add_argument("--plant-unseeded-dropout", action="store_true")
    plant.add_argument("--plant-numpy-noise", action="store_true")
    plant.add_argument("--plant-entropy-sum", action="store_true")
    args = parser.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    writer = detcheck.TraceWriter.from_env()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if GLOBAL_BATCH % world:
        raise SystemExit(f"torch_ddp.py: {world} ranks do not divide the batch of {GLOBAL_BATCH}")
    local = GLOBAL_BATCH // world

    dropout = None
    if args.plant_unseeded_dropout:
        dropout = torch.Generator()
        dropout.seed()  # OS entropy: another mask every launch
    fault = "numpy-noise" if args.plant_numpy_noise else None
    fault = "entropy-sum" if args.plant_entropy_sum else fault
    net = Net(fault, dropout)
    # The same initial parameters on every rank and world size: sixteenths in [-2/16, 2/16].
    init = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randint(-2, 3, p.shape, generator=init, dtype=torch.float64) / 16)
    model = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=2**-8)
    # Replicated at every world size (the default rule says so only from 2 ranks), so that the
    # world_sizes check compares the gradients and parameters of 1 rank with those of 2.
    watch = detcheck.torch.watch(model, writer, optimizer, replicated=True)
    for step in range(args.steps):
        data = torch.Generator().manual_seed(args.seed * 7919 + step)
        x = torch.randint(-2, 3, (GLOBAL_BATCH, 32), generator=data, dtype=torch.float64)
        y = torch.randint(-2, 3, (GLOBAL_BATCH, 10), generator=data, dtype=torch.float64)
        shard = slice(rank * local, (rank + 1) * local)
        optimizer.zero_grad()
        # The mean over the local shard; DDP averages over the ranks: the global mean.
        loss = ((model(x[shard]) - y[shard]) ** 2).sum() / local
        loss.backward()
        optimizer.step()
        with torch.no_grad():  # back onto the grid: the next step's sums stay exact
            for p in net.parameters():
                p.copy_(torch.round(p * 4096) / 4096)
    watch.remove()
    if writer is not None:
        writer.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
