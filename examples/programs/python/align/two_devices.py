"""A small pre-norm MLP trained for a few steps, written as a port to a new device is: the same
script run on "the reference" and on "another device" (B and A of `detcheck compare --align`).

Another device (`--device-kind other`) accumulates its matrix products in another order (each
layer sums four partial products, last first), so every tensor differs from the reference's in
its last bits; `--autocast` runs the other device in bfloat16 autocast. Planted bugs, on the
other device only (`--bug`):

- `unstable_norm`: a LayerNorm whose variance is E[x^2] - E[x]^2 (cancellation on the residual
  stream's offset, `--shift`), in one block;
- `approx_gelu`: an activation kernel that approximates GELU (errors ~1e-4 in float32);
- none: the pair is aligned, though not one tensor is bitwise equal.

`--offset 1000` gives the activations a large common offset (a large bias of the first layer)
that the next module subtracts again: ill-conditioned but correct, never a culprit.
`--between KIND` puts code between two modules, before the recentring module, on both devices:
`offset` adds 1000 (`h + 1000.0`), `residual` adds a skip path whose bias is 1000
(`h + self.skip(x)`), `functional` moves the values to about 1000 with a functional call
(`torch.lerp`), `inplace` adds 1000 in place (`h.add_(1000.0)`): the recentring module that
follows is ill-conditioned but correct, and its error comes from that code, which no module's
output holds. `--bug-block N` chooses the block of the bug (depth). `--device cuda` runs it on a GPU (the
reference's CPU run against it is a real pair of devices), `--tf32` with TF32 matrix products. The recorder records it unmodified:
`detcheck run --dump A --mode full -- python two_devices.py --device-kind other ...`.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--device-kind", choices=["reference", "other"], default="reference")
parser.add_argument("--bug", choices=["none", "unstable_norm", "approx_gelu"], default="none")
parser.add_argument("--bug-block", type=int, default=1)
parser.add_argument("--autocast", action="store_true")
parser.add_argument("--offset", type=float, default=0.0)
parser.add_argument("--shift", type=float, default=30.0)
parser.add_argument(
    "--between", choices=["none", "offset", "residual", "functional", "inplace"], default="none"
)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--device", default="cpu", help="where to run: cpu, cuda (a real second device)")
parser.add_argument("--tf32", action="store_true", help="on cuda: TF32 matrix products")
args = parser.parse_args()
other = args.device_kind == "other"


class Dense(nn.Linear):
    def forward(self, x):
        if not other:
            return F.linear(x, self.weight, self.bias)
        # Another device's kernel: the same product, accumulated in another order.
        parts = zip(x.chunk(4, dim=-1), self.weight.chunk(4, dim=-1))
        partial = [p @ w.t() for p, w in parts]
        out = partial[-1]
        for p in reversed(partial[:-1]):
            out = out + p
        return out + self.bias.to(out.dtype)  # as nn.Linear under autocast: bf16 out


class Norm(nn.Module):
    def __init__(self, dim, unstable=False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.unstable = unstable

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        if self.unstable:
            var = (x * x).mean(-1, keepdim=True) - mean * mean
        else:
            var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * self.weight + self.bias


class Gelu(nn.Module):
    def __init__(self, approximate=False):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, approximate="tanh" if self.approximate else "none")


class Recenter(nn.Module):
    """Subtracts each row's mean: correct, and ill-conditioned on offset activations."""

    def forward(self, x):
        return x - x.mean(-1, keepdim=True)


class Shift(nn.Module):
    """The residual stream's learned common offset (large activations, as large models grow)."""

    def __init__(self, dim):
        super().__init__()
        self.offset = nn.Parameter(torch.full((dim,), args.shift))

    def forward(self, x):
        return x + self.offset.to(x.dtype)


class Block(nn.Module):
    def __init__(self, dim, index):
        super().__init__()
        bug = args.bug if other and index == args.bug_block else "none"
        self.norm = Norm(dim, unstable=bug == "unstable_norm")
        self.up = Dense(dim, 4 * dim)
        self.act = Gelu(approximate=bug == "approx_gelu")
        self.down = Dense(4 * dim, dim)

    def forward(self, x):
        return x + self.down(self.act(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, dim=64, depth=3):
        super().__init__()
        self.embed = Dense(32, dim)
        self.skip = Dense(32, dim) if args.between == "residual" else None
        self.recenter = Recenter()
        self.blocks = nn.ModuleList(Block(dim, i) for i in range(depth))
        self.final = Norm(dim)
        self.head = Dense(dim, 1)
        self.shift = Shift(dim)

    def forward(self, x):
        h = self.embed(x)
        if args.between == "offset":
            h = h + 1000.0
        elif args.between == "residual":
            h = h + self.skip(x)
        elif args.between == "functional":
            h = torch.lerp(h, torch.full_like(h, 2000.0), 0.5)
        elif args.between == "inplace":
            h.add_(1000.0)
        h = self.shift(self.recenter(h))
        for block in self.blocks:
            h = block(h)
        return self.head(self.final(h))


torch.backends.cuda.matmul.allow_tf32 = args.tf32
torch.backends.cudnn.allow_tf32 = args.tf32
torch.manual_seed(0)
model = Net()
with torch.no_grad():
    model.embed.bias += args.offset
    if model.skip is not None:
        model.skip.bias += 1000.0
# Initialised and drawn on the CPU, then moved: both devices start from the same bits.
data = torch.randn(args.steps, 64, 32) * 3.0
target = torch.randn(args.steps, 64, 1)
model, data, target = model.to(args.device), data.to(args.device), target.to(args.device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
kind = "cuda" if args.device.startswith("cuda") else "cpu"
for step in range(args.steps):
    with torch.autocast(kind, dtype=torch.bfloat16, enabled=args.autocast and other):
        out = model(data[step])
    loss = F.mse_loss(out.float(), target[step])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.6f}")
