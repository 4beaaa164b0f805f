"""A MindSpore script whose operator is nondeterministic under a fixed seed (the negative control
of the operator drill-down, docs/mindspore.md): the cell `mix` calls a custom operator
(`ops.Custom`, a Python function run as a MindSpore primitive on the CPU) that sums each row's
terms in float32 in an order drawn from OS entropy, as an atomic-add kernel sums them in the
order its threads arrive. Everything else is seeded (`ms.set_seed`), so two runs part at that
operator, in every pair of runs: detcheck names `fwd/mix`, the primitive `Custom(entropy_sum)`
and the cause "a nondeterministic operator", not a seed.

    python entropy_sum.py [--fixed] [--epochs E]

`--fixed` is the clean twin: the same operator summing in index order.
"""

import argparse
import random

import mindspore as ms
import numpy as np
from mindspore import nn, ops

parser = argparse.ArgumentParser()
parser.add_argument("--fixed", action="store_true")
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

ms.set_seed(1)
ms.set_context(mode=ms.PYNATIVE_MODE)


def entropy_sum(h):
    """Each row's terms summed in float32, in an order drawn from OS entropy (`--fixed`: in
    index order), as a column."""
    order = list(range(h.shape[1]))
    if not args.fixed:
        random.SystemRandom().shuffle(order)
    total = np.zeros(h.shape[0], dtype=np.float32)
    for j in order:
        total = total + h[:, j]
    return total.reshape(-1, 1)


def row_sum_bprop(h, out, dout):
    """The gradient of a row sum: each term gets its row's."""
    return (ops.broadcast_to(dout, h.shape),)


class Mix(nn.Cell):
    """Adds each row's sum to the row: the custom operator inside a cell."""

    def __init__(self):
        super().__init__()
        self.row_sum = ops.Custom(
            entropy_sum,
            out_shape=lambda h: (h[0], 1),
            out_dtype=lambda h: h,
            func_type="pyfunc",
            bprop=row_sum_bprop,
        )

    def construct(self, h):
        return h + 0.01 * self.row_sum(h)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense1 = nn.Dense(16, 64)
        self.mix = Mix()
        self.relu = nn.ReLU()
        self.dense2 = nn.Dense(64, 4)

    def construct(self, x):
        return self.dense2(self.relu(self.mix(self.dense1(x))))


data = np.random.default_rng(1234)
features = data.standard_normal((64, 16)).astype(np.float32)
labels = data.integers(0, 4, size=64).astype(np.int32)

model = Net()
loss_fn = nn.CrossEntropyLoss()
optimizer = nn.SGD(model.trainable_params(), learning_rate=1e-2)
grad_fn = ms.value_and_grad(lambda x, y: loss_fn(model(x), y), None, optimizer.parameters)

for epoch in range(args.epochs):
    for start in range(0, 64, 16):
        x = ms.Tensor(features[start : start + 16])
        y = ms.Tensor(labels[start : start + 16])
        loss, grads = grad_fn(x, y)
        optimizer(grads)
    print(f"epoch {epoch}: loss {loss.asnumpy():.6f}")
