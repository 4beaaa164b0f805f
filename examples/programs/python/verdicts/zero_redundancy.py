"""torch's ZeroRedundancyOptimizer, which steps a torch optimizer inside its own step and then
broadcasts each rank's updated partition: two torch optimizers step per update, each with its own
step hooks. The zero-change recorder ends one step per update, at the outer one's hook (before,
each update made two steps). Four updates of a linear layer, any number of ranks on gloo.

    python zero_redundancy.py
    torchrun --nproc-per-node 2 zero_redundancy.py
"""

import os

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
dist.init_process_group("gloo", rank=rank, world_size=world)
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
data = torch.Generator().manual_seed(rank)
for _ in range(4):
    model(torch.randn(3, 4, generator=data)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
