"""A seeded training loop on the CPU whose batches come from a data loader's two worker
processes, under DistributedDataParallel over gloo when launched as several ranks: each rank
computes every value in one process, one operator after another, and gloo's collectives give
the same bits whatever the timing, so recording cannot change what it computes (a loader's
batches arrive in order). `detcheck check` passes it with no unperturbed run, and says why in
`repeat`'s note; `--unperturbed` makes them (docs/checks.md). With `--out-of-order` its loader
hands over batches as its workers finish them (`in_order=False`): their order then depends on
timing, and the check makes its unperturbed runs.

    python synchronous.py [--steps N] [--out-of-order]
    torchrun --nproc_per_node 2 synchronous.py
"""

import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--out-of-order", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 2))
sampler = None
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(model)
    sampler = torch.utils.data.DistributedSampler(data, seed=0)
loader = torch.utils.data.DataLoader(
    data,
    batch_size=8,
    shuffle=sampler is None,
    sampler=sampler,
    num_workers=2,
    in_order=not args.out_of_order,
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in zip(range(args.steps), loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"loss {loss.item():.6f}")
if dist.is_initialized():
    dist.destroy_process_group()
