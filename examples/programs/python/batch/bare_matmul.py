"""A block whose matrix product is its own operator, not a submodule's: `x @ self.weight`, then
a LayerNorm. At batch 1 the product is a matrix-vector product, at 8 a matrix product, so a
sample's rows differ; the first differing record is the LayerNorm's output, whose input already
differed, and the `batch_sizes` drill-down goes on into the block's call, where it names
`aten.mm` with this file's line (docs/checks.md, batch_sizes).

    detcheck check --batch-sizes 1,8 -- python bare_matmul.py --batch-size {batch}
"""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
args = parser.parse_args()


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(256, 256) / 16)
        self.norm = torch.nn.LayerNorm(256)

    def forward(self, x):
        return self.norm(x @ self.weight)


torch.manual_seed(0)
model = Block().eval()
samples = torch.randn(16, 256)
with torch.no_grad():
    for start in range(0, len(samples), args.batch_size):
        out = model(samples[start : start + args.batch_size])
print(float(out.sum()))
