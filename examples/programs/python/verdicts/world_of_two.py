"""A data-parallel script that asks for a world of two ranks itself (issue 54): its rank comes
from RANK, its world size is written in the call, as in scripts started by hand once per rank.

    RANK=0 python world_of_two.py & RANK=1 python world_of_two.py
    torchrun --nproc-per-node 2 world_of_two.py

Checked as `detcheck check -- python world_of_two.py`, detcheck starts one rank, and nobody
starts the other: the call would wait for it until a timeout. It fails at once instead, with
the command to run (python/tests/test_launchers.py).
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

torch.manual_seed(0)
dist.init_process_group("gloo", rank=int(os.environ.get("RANK", "0")), world_size=2)
model = DistributedDataParallel(torch.nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.ones(3, 4) * (dist.get_rank() + 1)
for _ in range(3):
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
dist.destroy_process_group()
