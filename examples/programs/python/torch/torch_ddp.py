"""A PyTorch DistributedDataParallel program (gloo, CPU) of the user's own under detcheck's
`command` kind (`processes` launcher: detcheck sets RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT, so no torchrun is needed).

`detcheck.torch.watch` records every module's output, every gradient after the allreduce and every
parameter after the optimizer step, each step.

    python3 torch_ddp.py --seed S --steps N [--plant-unseeded-dropout]

`--plant-unseeded-dropout` is the negative control: the dropout masks come from a generator seeded
from OS entropy (`torch.Generator().seed()`), as a forgotten `manual_seed` does in a data
loader worker; `repeat` catches it every time.
"""

import argparse
import sys

import torch
import torch.distributed as dist
from torch import nn

import detcheck
import detcheck.torch


class Net(nn.Module):
    def __init__(self, generator: torch.Generator):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 10)
        self.generator = generator

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        # Dropout drawn from an explicit generator: seeded per (seed, rank) it is reproducible.
        mask = torch.rand(h.shape, generator=self.generator) > 0.2
        return self.fc2(h * mask / 0.8)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--plant-unseeded-dropout", action="store_true")
    args = parser.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    writer = detcheck.TraceWriter.from_env()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)  # the same initial parameters on every rank
    dropout = torch.Generator()
    if args.plant_unseeded_dropout:
        dropout.seed()  # OS entropy: another mask every launch
    else:
        dropout.manual_seed(args.seed * 1000 + rank)
    model = nn.parallel.DistributedDataParallel(Net(dropout))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    watch = detcheck.torch.watch(model, writer, optimizer) if writer is not None else None
    data = torch.Generator().manual_seed(args.seed * 7919 + rank)
    for _ in range(args.steps):
        x = torch.randn(16, 32, generator=data)
        y = torch.randint(0, 10, (16,), generator=data)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    if watch is not None:
        watch.remove()
    if writer is not None:
        writer.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
