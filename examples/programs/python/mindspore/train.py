"""A MindSpore training script as its users write it (PyNative): an nn.Cell MLP, a
NumpySlicesDataset with shuffle and batch, ms.value_and_grad and nn.Adam, seeded with
ms.set_seed. It never imports detcheck: `detcheck check --ranks 1 -- python train.py` records
it through the start-up hook (docs/mindspore.md).

    python train.py [--seed clock|none|N] [--epochs E]

`--seed clock` (a seed from the clock) and `--seed none` (no seed at all) are the negative
controls of examples/programs/python/mindspore/*.json.
"""

import argparse
import time

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn

parser = argparse.ArgumentParser()
parser.add_argument("--seed", default="1")
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

if args.seed == "clock":
    ms.set_seed(int(time.time() * 1e6) % 2**31)
elif args.seed != "none":
    ms.set_seed(int(args.seed))

ms.set_context(mode=ms.PYNATIVE_MODE)


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense1 = nn.Dense(16, 32)
        self.relu = nn.ReLU()
        self.dense2 = nn.Dense(32, 4)

    def construct(self, x):
        return self.dense2(self.relu(self.dense1(x)))


# A fixed data set (its own generator); the order it is read in is the dataset's shuffle.
rng = np.random.default_rng(1234)
features = rng.standard_normal((64, 16)).astype(np.float32)
labels = rng.integers(0, 4, size=64).astype(np.int32)
dataset = ds.NumpySlicesDataset({"x": features, "y": labels}, shuffle=True)
dataset = dataset.batch(16)

model = MLP()
loss_fn = nn.CrossEntropyLoss()
optimizer = nn.Adam(model.trainable_params(), learning_rate=1e-2)


def forward_fn(x, y):
    logits = model(x)
    return loss_fn(logits, y), logits


grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)


def train_step(x, y):
    (loss, _), grads = grad_fn(x, y)
    optimizer(grads)
    return loss


for epoch in range(args.epochs):
    for x, y in dataset.create_tuple_iterator():
        loss = train_step(x, y)
    print(f"epoch {epoch}: loss {loss.asnumpy():.6f}")
