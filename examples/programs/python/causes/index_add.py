"""Rows pooled into buckets by `index_add_` inside a module (a segment sum, as message passing
in a graph network does). On CUDA the sum adds with float atomics in whatever order the GPU
runs them, so two runs of this seeded program differ. Expected cause there: a nondeterministic
operator (`aten::index_add_`), fixed by `torch.use_deterministic_algorithms(True)`. On the CPU
`index_add_` adds in index order: the program repeats (the control).

    python index_add.py [--device cuda] [--steps 3]
"""

import argparse

import torch
from torch import nn


class Pool(nn.Module):
    """Sums the rows of `x` into `buckets` rows, row i into bucket `index[i]`."""

    def __init__(self, buckets):
        super().__init__()
        self.buckets = buckets

    def forward(self, x, index):
        out = torch.zeros(self.buckets, x.shape[1], device=x.device, dtype=x.dtype)
        return out.index_add_(0, index, x)


class Net(nn.Module):
    def __init__(self, buckets):
        super().__init__()
        self.embed = nn.Linear(32, 64)
        self.pool = Pool(buckets)
        self.head = nn.Linear(64, 1)

    def forward(self, x, index):
        return self.head(torch.tanh(self.pool(self.embed(x), index)))


parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cpu")
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()

torch.manual_seed(0)
buckets = 64
model = Net(buckets).to(args.device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    # Many rows a bucket: on a GPU, thousands of atomic adds land on each output element.
    x = torch.randn(1 << 16, 32, device=args.device)
    index = torch.randint(0, buckets, (1 << 16,), device=args.device)
    loss = model(x, index).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step}: loss {loss.item():.6f}")
