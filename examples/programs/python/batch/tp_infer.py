"""Tensor-parallel inference by hand, as Megatron's MLP splits it: a column-parallel linear
layer, then a row-parallel one whose partial products every rank sums with `all_reduce`. Each
rank holds a shard of each weight (a plain tensor, no DTensor), so nothing marks a record as
replicated at 2 ranks, while at 1 rank every parameter is trivially. The output at 2 ranks is
not bitwise the output at 1 (the all-reduce splits the row-parallel sum in two), which the
`world_sizes` check cannot see yet (issue 56, item 4): it is n/a, with the reason, rather than
a failure on parameter shards compared against whole parameters.

    detcheck check --checks world_sizes --world-sizes 1,2 -- python tp_infer.py
"""
import os
import torch
import torch.distributed as dist

world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))
if world > 1:
    dist.init_process_group("gloo")
torch.manual_seed(0)
D, H = 64, 256
w1, w2 = torch.randn(H, D) / 8, torch.randn(D, H) / 16


class ColumnParallel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        shard = H // world
        self.weight = torch.nn.Parameter(w1[rank * shard:(rank + 1) * shard].clone())

    def forward(self, x):
        return torch.nn.functional.gelu(x @ self.weight.t())


class RowParallel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        shard = H // world
        self.weight = torch.nn.Parameter(w2[:, rank * shard:(rank + 1) * shard].clone())

    def forward(self, h):
        y = h @ self.weight.t()
        if world > 1:
            dist.all_reduce(y)
        return y


model = torch.nn.Sequential(ColumnParallel(), RowParallel()).eval()
x = torch.randn(8, D, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    for _ in range(3):
        out = model(x)
print(out.sum().item())
