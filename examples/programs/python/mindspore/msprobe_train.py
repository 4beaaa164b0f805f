"""A MindSpore training script with msprobe's manual workflow, as msprobe's documentation asks a
user to edit a script to dump it (seed 004: compare two devices' runs API by API):

    debugger = PrecisionDebugger(config_path="config.json")
    for step in ...:
        debugger.start(model)
        ... forward, loss, gradients, optimizer ...
        debugger.stop()
        debugger.step()

`--msprobe-config CONFIG.json` turns the dump on (mindstudio-probe installed:
scripts/install-msprobe.sh --mindspore); without it the program runs plain. `--bug
approx_gelu` gives block `--bug-block` (default 1) the tanh approximation of GELU, as an
approximate kernel on another device would; `--bug noise` adds a value from the clock inside
that block's up projection (a run that does not repeat).

msprobe 26.2 computes each tensor's L2 norm with `mint.norm`, whose kernel (LinalgVectorNorm)
MindSpore 2.10 does not have on the CPU: its dump fails there ("The kernel LinalgVectorNorm
unregistered"). With `--msprobe-config`, the script first gives `mint.norm` a CPU
implementation (the square root of the sum of squares, in the tensor's dtype); everything else
msprobe writes is its own (docs/mindspore.md).
"""

import argparse
import time

import mindspore as ms
import numpy as np
from mindspore import nn, ops

parser = argparse.ArgumentParser()
parser.add_argument("--bug", choices=["none", "approx_gelu", "noise"], default="none")
parser.add_argument("--bug-block", type=int, default=1)
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--msprobe-config", help="msprobe's config.json: dump with msprobe")
args = parser.parse_args()

ms.set_seed(1)
ms.set_context(mode=ms.PYNATIVE_MODE)


class Up(nn.Dense):
    def __init__(self, dim_in, dim_out, noisy=False):
        super().__init__(dim_in, dim_out)
        self.noisy = noisy

    def construct(self, x):
        out = super().construct(x)
        if self.noisy:  # a value from outside: the clock's last digits
            out = out + float(time.perf_counter_ns() % 1000) * 1e-6
        return out


class Block(nn.Cell):
    def __init__(self, dim, hidden, index):
        super().__init__()
        buggy = index == args.bug_block
        self.up = Up(dim, hidden, noisy=buggy and args.bug == "noise")
        self.act = nn.GELU(approximate=buggy and args.bug == "approx_gelu")
        self.down = nn.Dense(hidden, dim)

    def construct(self, x):
        return x + self.down(self.act(self.up(x)))


class Model(nn.Cell):
    def __init__(self):
        super().__init__()
        self.blocks = nn.CellList([Block(16, 32, i) for i in range(3)])
        self.head = nn.Dense(16, 1)

    def construct(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


model = Model()
loss_fn = nn.MSELoss()
optimizer = nn.Adam(model.trainable_params(), learning_rate=1e-3)


def forward_fn(x, y):
    return loss_fn(model(x), y)


grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters)

debugger = None
if args.msprobe_config:
    from mindspore import mint

    def cpu_norm(data, *rest, **kwargs):
        return ops.sqrt(ops.reduce_sum(data * data))

    mint.norm = cpu_norm
    from msprobe.mindspore import PrecisionDebugger

    debugger = PrecisionDebugger(config_path=args.msprobe_config)

rng = np.random.default_rng(0)
for step in range(args.steps):
    x = ms.Tensor(rng.standard_normal((8, 16)).astype(np.float32))
    y = ms.Tensor(rng.standard_normal((8, 1)).astype(np.float32))
    if debugger is not None:
        debugger.start(model)
    loss, grads = grad_fn(x, y)
    optimizer(grads)
    if debugger is not None:
        debugger.stop()
        debugger.step()
    print(f"step {step} loss {float(loss.asnumpy()):.6f}")
