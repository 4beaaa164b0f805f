"""
FSDP1 (``FullyShardedDataParallel``) training of a small MLP classifier under torchrun.

Style imitated: the classic FSDP tutorials and the trainers built on them: the model is
wrapped once with ``FullyShardedDataParallel``, an ``auto_wrap_policy`` (size based) wraps its
larger layers in their own units, ``ShardingStrategy.FULL_SHARD``, the optimizer is built on
the wrapped model's parameters (flat parameters by default; the original parameters with
``--use_orig_params``, as accelerate and Lightning set it), a ``DistributedSampler`` splits the
data, and the process group is destroyed at the end.

Run by hand:

    torchrun --standalone --nproc-per-node=2 fsdp1_train.py
    torchrun --standalone --nproc-per-node=2 fsdp1_train.py --use_orig_params
    torchrun --standalone --nproc-per-node=2 fsdp1_train.py --device cuda

Every rank prints one final line with its last loss and the sum of its local shards.

Planted-bug flag:

    --reseed_from_clock   seed torch from the clock before the model is built
    --activation_noise    the classifier adds noise to its logits from a generator that seeds
                          itself from OS entropy (inside the wrapped model's forward)
"""

import argparse
import functools
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Classifier(nn.Module):
    def __init__(self, features=32, hidden=128, classes=8, noise_std=0.0):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, classes)
        self.dropout = nn.Dropout(0.1)
        self.noise_std = noise_std
        self.noise = torch.Generator()
        if noise_std:
            self.noise.seed()  # PLANTED BUG: a seed from OS entropy, another in every run

    def forward(self, x):
        x = self.dropout(F.relu(self.fc1(x)))
        x = F.relu(self.fc2(x))
        logits = self.head(x)
        if self.noise_std and self.training:  # label-smoothing-like logit noise
            noise = torch.randn(logits.shape, generator=self.noise).to(logits.device)
            logits = logits + self.noise_std * noise
        return logits


def main():
    parser = argparse.ArgumentParser(description="FSDP1 training of a small classifier")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--use_orig_params", action="store_true")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--reseed_from_clock", action="store_true")
    parser.add_argument("--activation_noise", action="store_true")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank = dist.get_rank()

    torch.manual_seed(42)
    g = torch.Generator().manual_seed(7)
    features = torch.randn(256, 32, generator=g)
    labels = torch.randint(0, 8, (256,), generator=g)
    dataset = TensorDataset(features, labels)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    if args.reseed_from_clock:
        torch.manual_seed(time.time_ns() % 2**63)
    model = Classifier(noise_std=0.01 if args.activation_noise else 0.0)
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=2000)
    model = FSDP(model, auto_wrap_policy=policy, sharding_strategy=ShardingStrategy.FULL_SHARD,
                 device_id=device, use_orig_params=args.use_orig_params)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    loss = torch.zeros(())
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
    total = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"rank {rank}: loss {loss.item()!r} param_sum {total!r}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
