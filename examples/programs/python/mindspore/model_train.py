"""A MindSpore script that trains through the high-level API, as its users write it:
`Model(net, loss_fn, optimizer)` and `model.train(epochs, dataset)` (TrainOneStepCell and
WithLossCell inside), in PyNative mode by default or graph mode with `--graph`. It never
imports detcheck (docs/mindspore.md: what each mode records).

    python model_train.py [--graph] [--seed clock|none|N] [--epochs E]
"""

import argparse
import time

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.train import LossMonitor, Model

parser = argparse.ArgumentParser()
parser.add_argument("--graph", action="store_true")
parser.add_argument("--seed", default="1")
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

if args.seed == "clock":
    ms.set_seed(int(time.time() * 1e6) % 2**31)
elif args.seed != "none":
    ms.set_seed(int(args.seed))
ms.set_context(mode=ms.GRAPH_MODE if args.graph else ms.PYNATIVE_MODE)


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense1 = nn.Dense(16, 32)
        self.relu = nn.ReLU()
        self.dense2 = nn.Dense(32, 4)

    def construct(self, x):
        return self.dense2(self.relu(self.dense1(x)))


rng = np.random.default_rng(1234)
features = rng.standard_normal((64, 16)).astype(np.float32)
labels = rng.integers(0, 4, size=64).astype(np.int32)
dataset = ds.NumpySlicesDataset({"x": features, "y": labels}, shuffle=True).batch(16)

net = MLP()
loss_fn = nn.CrossEntropyLoss()
optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
model = Model(net, loss_fn=loss_fn, optimizer=optimizer)
model.train(args.epochs, dataset, callbacks=[LossMonitor(4)], dataset_sink_mode=False)
