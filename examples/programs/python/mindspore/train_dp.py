"""A data-parallel MindSpore training script as its users write it (PyNative, on the CPU):
`mindspore.communication.init()`, `set_auto_parallel_context(parallel_mode=DATA_PARALLEL,
gradients_mean=True)`, an nn.Cell MLP, a NumpySlicesDataset sharded with num_shards/shard_id,
ms.value_and_grad, nn.DistributedGradReducer (the allreduce of the gradients) and nn.Adam,
seeded with ms.set_seed. It never imports detcheck; MindSpore's launcher starts its ranks:

    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --join=True train_dp.py
    detcheck check --ranks 2 --launcher msrun -- python train_dp.py      # (docs/mindspore.md)

    python train_dp.py [--seed clock|N] [--epochs E]

`--seed clock` (a seed from the clock, in each rank) is the negative control of
control_dp_clock_seed.json.
"""

import argparse
import time

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init

parser = argparse.ArgumentParser()
parser.add_argument("--seed", default="1")
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

ms.set_context(mode=ms.PYNATIVE_MODE)
init()
rank, world_size = get_rank(), get_group_size()
if args.seed == "clock":
    ms.set_seed(int(time.time() * 1e6) % 2**31)
else:
    ms.set_seed(int(args.seed))
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense1 = nn.Dense(16, 32)
        self.relu = nn.ReLU()
        self.dense2 = nn.Dense(32, 4)

    def construct(self, x):
        return self.dense2(self.relu(self.dense1(x)))


# A fixed data set (its own generator); each rank reads its shard, in the dataset's shuffle.
data = np.random.default_rng(1234)
features = data.standard_normal((64, 16)).astype(np.float32)
labels = data.integers(0, 4, size=64).astype(np.int32)
dataset = ds.NumpySlicesDataset(
    {"x": features, "y": labels}, shuffle=True, num_shards=world_size, shard_id=rank
)
dataset = dataset.batch(8)

model = MLP()
loss_fn = nn.CrossEntropyLoss()
optimizer = nn.Adam(model.trainable_params(), learning_rate=1e-2)


def forward_fn(x, y):
    return loss_fn(model(x), y)


grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters)
grad_reducer = nn.DistributedGradReducer(optimizer.parameters)


def train_step(x, y):
    loss, grads = grad_fn(x, y)
    grads = grad_reducer(grads)
    optimizer(grads)
    return loss


for epoch in range(args.epochs):
    for x, y in dataset.create_tuple_iterator():
        loss = train_step(x, y)
    print(f"rank {rank}: epoch {epoch}: loss {loss.asnumpy():.6f}")
