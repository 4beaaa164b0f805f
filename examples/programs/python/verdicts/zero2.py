"""A DeepSpeed ZeRO job as DeepSpeed's getting-started guide writes one (issue 53):
`deepspeed.initialize` with a ZeRO stage, `engine.backward(loss)`, `engine.step()`; on the
CPU its accelerator runs on gloo. Each rank draws other data; ZeRO stages 0-2 keep every
parameter on every rank, updated alike, so `replicas` compares them (stage 2 partitions the
gradients away from `.grad`: none is recorded); stage 3 partitions the parameters too (every
one here, as a large model's: DeepSpeed keeps parameters below its persistence threshold, 100k
elements by default, whole on every rank), so each rank's records are its own partitions.

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 zero2.py [--stage S]
    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 zero2.py [--stage S]
"""

import argparse

import deepspeed
import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--stage", type=int, default=2)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--local_rank", type=int, default=-1)  # given by the `deepspeed` launcher
args = parser.parse_args()

deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
config = {
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
    "zero_optimization": {"stage": args.stage},
}
if args.stage == 3:
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
engine, optimizer, _, _ = deepspeed.initialize(
    model=model, model_parameters=model.parameters(), config=config
)
data = torch.Generator().manual_seed(engine.global_rank)
for step in range(args.steps):
    x = torch.randn(4, 16, generator=data)
    y = torch.randn(4, 4, generator=data)
    loss = ((engine(x) - y) ** 2).mean()
    engine.backward(loss)
    engine.step()
print(f"rank {engine.global_rank}: loss {loss.item():.6f}")
