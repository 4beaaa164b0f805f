"""A small MLP written with torch's functional APIs, as msprobe's API-level dumps see a model, for
`python -m detcheck.replay` (python/tests/test_msprobe_align.py): run as the reference ("device
b") and as "device a", whose GELU call is the tanh approximation (`--approximate tanh`: errors
~1e-4 in float32, the size of an approximate activation kernel's). Every other call is the same
on both, so replaying A's calls on B's recorded inputs gives B's outputs to the bit but the
GELU's, which is the call's own error.

    python msprobe_replay.py [--approximate none|tanh] [--msprobe-config CONFIG.json]

`--msprobe-config` turns msprobe's PrecisionDebugger on (its manual workflow: start, forward,
backward, stop, step), for one step.
"""

import argparse

import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--approximate", choices=["none", "tanh"], default="none")
parser.add_argument("--msprobe-config")
args = parser.parse_args()

debugger = None
if args.msprobe_config:
    from msprobe.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(config_path=args.msprobe_config)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Parameter(torch.randn(128, 32) / 32**0.5)
        self.down = torch.nn.Parameter(torch.randn(8, 128) / 128**0.5)

    def forward(self, x):
        h = F.gelu(F.linear(x, self.up), approximate=args.approximate)
        return F.layer_norm(F.linear(h, self.down), (8,))


torch.manual_seed(0)
model = Mlp()
x = torch.randn(64, 32) * 2.0
target = torch.randn(64, 8)
if debugger:
    debugger.start(model)
loss = F.mse_loss(model(x), target)
loss.backward()
if debugger:
    debugger.stop()
    debugger.step()
print(f"loss {loss.item():.6f}")
