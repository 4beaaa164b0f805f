"""Tensor-parallel inference by hand, as Megatron's MLP splits it: a column-parallel linear
layer, then a row-parallel one whose partial products every rank sums with `all_reduce`. Each
rank holds a shard of each weight (a plain tensor, no DTensor), so nothing marks a record as
replicated; the row-parallel output after the all-reduce is what every rank holds alike, and the
`world_sizes` check compares it with the 1-rank model's. It differs: the all-reduce splits the
row-parallel layer's sum over its 1024 inputs in two and adds the halves, where one rank's matmul
sums them in its own blocking. The report names the all-reduce and this line.

`--fixed-order` is the fix: the sum is split into 8 fixed chunks at every world size, each rank
computes its chunks' partial products, `all_gather` brings every chunk's to every rank, and each
rank adds them in chunk order; at 1 rank the same 8 chunks are added in the same order, so the
output is bitwise the same at 1, 2, 4 and 8 ranks. It costs an all-gather of 8/world partial
products per rank instead of one all-reduce, and a chunked matmul.

    detcheck check --checks world_sizes --world-sizes 1,2,4 -- python tp_infer.py
    detcheck check --checks world_sizes --world-sizes 1,2,4 -- python tp_infer.py --fixed-order
"""
import os
import sys
import torch
import torch.distributed as dist

world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))
fixed_order = "--fixed-order" in sys.argv[1:]
if world > 1:
    dist.init_process_group("gloo")
torch.manual_seed(0)
D, H, CHUNKS = 64, 1024, 8
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
        if fixed_order:
            return self.fixed_order(h)
        y = h @ self.weight.t()
        if world > 1:
            dist.all_reduce(y)
        return y

    def fixed_order(self, h):
        width = H // CHUNKS
        local = [
            h[:, c * width:(c + 1) * width] @ self.weight[:, c * width:(c + 1) * width].t()
            for c in range(CHUNKS // world)
        ]
        parts = torch.stack(local)
        if world > 1:
            gathered = [torch.empty_like(parts) for _ in range(world)]
            dist.all_gather(gathered, parts)
            parts = torch.cat(gathered)
        y = parts[0].clone()
        for part in parts[1:]:
            y = y + part
        return y


model = torch.nn.Sequential(ColumnParallel(), RowParallel()).eval()
x = torch.randn(8, D, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    for _ in range(3):
        out = model(x)
print(out.sum().item())
