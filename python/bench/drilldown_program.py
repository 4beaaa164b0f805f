"""The program python/bench/drilldown.py checks: an MLP or a small transformer trained a few
steps on the CPU, recorded with ``detcheck.torch.watch``, with unseeded numpy noise planted in one
module deep inside the model (so `repeat` diverges there and detcheck drills down into it).

    python drilldown_program.py --model mlp|transformer --steps N [--seed S]

- ``mlp``: 6 Linear layers of 512 with ReLU, batch 256; the noise is added in ``layers.3``.
- ``transformer``: a 4-block pre-norm decoder (d_model 128, 4 heads, MLP 512, vocabulary 1000,
  sequence 64, batch 8); the noise is added in ``blocks.2.mlp``.
"""

import argparse
import sys

import detcheck
import detcheck.torch
import numpy as np
import torch
from torch import nn


class Noisy(nn.Module):
    """Adds noise from numpy's global generator, which nobody seeded."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        y = self.inner(x)
        return y + torch.from_numpy(np.random.standard_normal(y.shape).astype(np.float32)) * 1e-3


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        layers = [nn.Linear(512, 512) for _ in range(6)]
        layers[3] = Noisy(layers[3])
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, vocab=1000, d=128, heads=4, depth=4, seq=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(depth))
        self.blocks[2].mlp = Noisy(self.blocks[2].mlp)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.norm(x))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["mlp", "transformer"], required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    model = Mlp() if args.model == "mlp" else Transformer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    writer = detcheck.TraceWriter.from_env()
    watch = detcheck.torch.watch(model, writer, optimizer)
    data = torch.Generator().manual_seed(args.seed + 1)
    for _ in range(args.steps):
        if args.model == "mlp":
            x = torch.randn(256, 512, generator=data)
            loss = model(x).square().mean()
        else:
            tokens = torch.randint(0, 1000, (8, 64), generator=data)
            logits = model(tokens)
            loss = nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, 1000), tokens[:, 1:].reshape(-1)
            )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    watch.remove()
    if writer is not None:
        writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
