"""Two ranks that train different models (issue 53): each rank seeds torch with its own rank,
and nothing wraps the model for data parallelism, as pytorch/examples' imagenet does on a CPU.
Both runs of each rank are identical, so `repeat` holds; `replicas` has nothing replicated to
compare and must say so (n/a: "the ranks train different models"), never pass.

    torchrun --nproc-per-node 2 ranks_apart.py
"""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.ones(3, 4) * (rank + 1)
for step in range(3):
    loss = model(x).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} of {os.environ['WORLD_SIZE']}: loss {loss.item():.6f}")
