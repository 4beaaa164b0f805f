"""
FSDP2 (``fully_shard``) training of a tiny transformer under torchrun.

Style imitated: the per-parameter-sharding FSDP2 examples: every transformer
block is wrapped with ``fully_shard`` and then the root module, the optimizer
is built on the sharded (DTensor) parameters, each rank trains on its own
slice of the data, and the process group is destroyed at the end.

Every rank builds the same initial weights from the same seed before
sharding (FSDP2 keeps each rank's own shard of its own local init).

Run by hand:

    torchrun --standalone --nproc-per-node=2 fsdp2_train.py
    torchrun --standalone --nproc-per-node=2 fsdp2_train.py --steps 20
    torchrun --standalone --nproc-per-node=2 fsdp2_train.py --device cuda

Every rank prints one final line with its last local loss and the sum of its
local parameter shards at full precision.

With ``--same_batch`` every rank trains on the same full batch, so the
global tensors (parameters, gradients, AdamW state) are bitwise the same at
every world size: on gloo, FSDP2 divides each rank's gradient by 2 before the
reduce-scatter at world size 2 (its pre-divide factor; no post-divide), and
g/2 + g/2 = g exactly (powers of two, no rounding). The intra-op threads must
be pinned too (``OMP_NUM_THREADS=1``, as the scenario does): torchrun sets it to 1
only for more than one process, and with two threads at world size 1 LayerNorm's
backward sums its weight gradient in another split (measured: step 0's
``norm1.weight`` gradient differs). The ``world_sizes`` check puts the shards of
every rank together and compares them with world size 1.

Planted-bug flags:

    --reseed_from_clock   seed torch from the clock before the model is built
    --noisy_block N       block N adds activation noise from a generator that seeds
                          itself from OS entropy (inside a sharded block's forward)
    --perturb_shard       at world size > 1, the last rank adds 1e-3 to the first
                          element of its shard of the output layer's weight
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch < 2.6
    from torch.distributed._composable.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, dim, n_heads, noise_std=0.0):
        super().__init__()
        self.noise_std = noise_std
        self.noise = torch.Generator()
        if noise_std:
            self.noise.seed()  # PLANTED BUG: a seed from OS entropy, another in every run
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, n_heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, mask):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        x = x + self.mlp(self.norm2(x))
        if self.noise_std and self.training:  # activation noise as a regulariser
            x = x + self.noise_std * torch.randn(x.shape, generator=self.noise).to(x.device)
        return x


class TinyTransformer(nn.Module):
    def __init__(self, vocab, dim, n_layers, n_heads, seq_len, noisy_block=None):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq_len, dim) * 0.02)
        self.layers = nn.ModuleList(
            [Block(dim, n_heads, 0.01 if i == noisy_block else 0.0) for i in range(n_layers)]
        )
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, idx):
        t = idx.size(1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=idx.device), diagonal=1)
        x = self.tok(idx) + self.pos[:t]
        for layer in self.layers:
            x = layer(x, mask)
        return self.out(self.norm(x))


def make_data(n, seq_len, vocab, seed):
    """A synthetic copy-with-offset task, the same tensor on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (n, seq_len + 1), generator=g)
    x[:, 1:] = (x[:, :-1] + 3) % vocab  # next token is predictable from the current one
    x[:, ::4] = torch.randint(0, vocab, x[:, ::4].shape, generator=g)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch_size", type=int, default=8, help="per rank")
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq_len", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--same_batch", action="store_true", help="every rank: the full batch")
    parser.add_argument("--reseed_from_clock", action="store_true", help="planted bug")
    parser.add_argument("--noisy_block", type=int, default=None, help="planted bug")
    parser.add_argument("--perturb_shard", action="store_true", help="planted bug")
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    mesh = init_device_mesh(device.type, (world_size,))

    if args.reseed_from_clock:
        torch.manual_seed(time.time_ns() % 2**63)  # PLANTED BUG
    else:
        torch.manual_seed(args.seed)
    model = TinyTransformer(
        args.vocab, args.dim, args.layers, args.heads, args.seq_len, args.noisy_block
    ).to(device)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if args.perturb_shard and world_size > 1 and rank == world_size - 1:
        with torch.no_grad():
            model.out.weight.to_local().view(-1)[0] += 1e-3  # PLANTED BUG
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    if args.same_batch:
        # every rank trains on the same full batch: the same global math at any world size
        n_total = args.steps * args.batch_size
        inputs, targets = make_data(n_total, args.seq_len, args.vocab, seed=1234)
        inputs = inputs.view(args.steps, args.batch_size, -1)
        targets = targets.view(args.steps, args.batch_size, -1)
    else:
        n_total = args.steps * args.batch_size * world_size
        inputs, targets = make_data(n_total, args.seq_len, args.vocab, seed=1234)
        # each rank takes a disjoint slice of every global batch
        inputs = inputs.view(args.steps, world_size, args.batch_size, -1)[:, rank]
        targets = targets.view(args.steps, world_size, args.batch_size, -1)[:, rank]

    model.train()
    loss = None
    for step in range(args.steps):
        x, y = inputs[step].to(device), targets[step].to(device)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), y.reshape(-1))
        loss.backward()
        optim.step()
        optim.zero_grad()
        if rank == 0:
            print(f"step {step}: loss {loss.item():.4f}")

    local_sum = sum(p.to_local().detach().double().sum().item() for p in model.parameters())
    print(f"rank {rank} final loss {loss.item()!r} param_sum {local_sum!r}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
