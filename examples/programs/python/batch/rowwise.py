"""An inference loop over a model of row-wise operations only (no reduction across rows, no
kernel whose tiling depends on the batch): each sample's outputs are the same bits in a batch
of any size, so

    detcheck check --batch-sizes 1,3,8 -- python rowwise.py --batch-size {batch}

passes `batch_sizes`, every sample's records compared (docs/checks.md). The negative control
of generate.py.

    python rowwise.py [--batch-size N] [--samples N]
"""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--samples", type=int, default=24)
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.LayerNorm(33), torch.nn.Tanh(), torch.nn.Softmax(dim=-1))
model.eval()
samples = torch.randn(args.samples, 33)
with torch.no_grad():
    for start in range(0, args.samples, args.batch_size):
        out = model(samples[start : start + args.batch_size])
        print(out.argmax(dim=-1).tolist())
