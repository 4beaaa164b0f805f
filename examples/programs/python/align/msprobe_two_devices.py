"""two_devices.py adapted to msprobe's manual workflow: the same pre-norm MLP, the same devices
and planted bugs, with msprobe's `PrecisionDebugger` calls in the training loop, as msprobe's
documentation asks a user to edit a training script:

    debugger = PrecisionDebugger(config_path="config.json")
    for step in ...:
        debugger.start(model)
        ... forward, loss, backward ...
        debugger.stop()
        debugger.step()
        optimizer.step()

`--msprobe-config CONFIG.json` turns them on (mindstudio-probe installed:
scripts/install-msprobe.sh); without it the program runs plain, so `detcheck run --dump DIR
--mode full -- python msprobe_two_devices.py ...` records the very same runs for comparison
(python/tests/test_msprobe_align.py).

One change besides: each device's kernels of the linear layers and of GELU are single calls
below the APIs that msprobe hooks (`torch.ops.aten.linear` on the reference, four partial
products summed last first on the other device; `torch.ops.aten.gelu`), as a device's fused
kernel is one call whose arithmetic the tools do not see. msprobe names an API call by its name
and its count in the run (`Tensor.__add__.12.forward`) and its compare pairs calls by those
names: a kernel written with other Python APIs on one device would shift the counts of every
later call and pair unrelated tensors; and an approximation passed as an argument
(`F.gelu(x, approximate="tanh")`) is an argument msprobe compares, not a kernel's error.

`--bug unstable_norm` changes the APIs called inside that one LayerNorm (E[x^2] - E[x]^2), so
msprobe pairs the calls after it by count, not by meaning (records after the culprit only).
`--bug gross_scale`: a gross error, one block's up projection doubled on the other device.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--device-kind", choices=["reference", "other"], default="reference")
parser.add_argument(
    "--bug", choices=["none", "unstable_norm", "approx_gelu", "gross_scale"], default="none"
)
parser.add_argument("--bug-block", type=int, default=1)
parser.add_argument("--offset", type=float, default=0.0)
parser.add_argument("--shift", type=float, default=30.0)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--msprobe-config", help="msprobe's config.json: dump with msprobe")
args = parser.parse_args()
other = args.device_kind == "other"


aten = torch.ops.aten


class Dense(nn.Linear):
    def __init__(self, dim_in, dim_out, gross=False):
        super().__init__(dim_in, dim_out)
        self.gross = gross

    def forward(self, x):
        if not other:
            return aten.linear(x, self.weight, self.bias)
        # Another device's kernel: the same product, accumulated in another order.
        parts = zip(aten.chunk(x, 4, -1), aten.chunk(self.weight, 4, -1))
        partial = [aten.matmul(p, aten.t(w)) for p, w in parts]
        out = partial[-1]
        for p in reversed(partial[:-1]):
            out = aten.add(out, p)
        out = aten.add(out, self.bias)
        return aten.mul(out, 2.0) if self.gross else out


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
        return aten.gelu(x, approximate="tanh" if self.approximate else "none")


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
        return x + self.offset


class Block(nn.Module):
    def __init__(self, dim, index):
        super().__init__()
        bug = args.bug if other and index == args.bug_block else "none"
        self.norm = Norm(dim, unstable=bug == "unstable_norm")
        self.up = Dense(dim, 4 * dim, gross=bug == "gross_scale")
        self.act = Gelu(approximate=bug == "approx_gelu")
        self.down = Dense(4 * dim, dim)

    def forward(self, x):
        return x + self.down(self.act(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, dim=64, depth=3):
        super().__init__()
        self.embed = Dense(32, dim)
        self.recenter = Recenter()
        self.blocks = nn.ModuleList(Block(dim, i) for i in range(depth))
        self.head = Dense(dim, 1)
        self.shift = Shift(dim)

    def forward(self, x):
        h = self.shift(self.recenter(self.embed(x)))
        for block in self.blocks:
            h = block(h)
        return self.head(h)


debugger = None
if args.msprobe_config:
    from msprobe.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(config_path=args.msprobe_config)

torch.manual_seed(0)
model = Net()
with torch.no_grad():
    model.embed.bias += args.offset
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
data = torch.randn(args.steps, 64, 32) * 3.0
target = torch.randn(args.steps, 64, 1)
for step in range(args.steps):
    if debugger:
        debugger.start(model)
    out = model(data[step])
    loss = F.mse_loss(out, target[step])
    optimizer.zero_grad()
    loss.backward()
    if debugger:
        debugger.stop()
        debugger.step()
    optimizer.step()
    print(f"step {step} loss {loss.item():.6f}")
