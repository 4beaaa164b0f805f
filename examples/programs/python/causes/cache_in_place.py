"""A script that standardises its cached features in place (planted: it opens the cache
`features.npy`, larger than 4 MiB, as a writable memory map, so every run rewrites the file the
next run reads; `--fixed` opens it read-only and standardises a copy). Expected cause: a file an
earlier run left. The test writes `features.npy` beside the script (`python cache_in_place.py
--make-cache` does too)."""

import sys

import numpy as np
import torch
from torch import nn

if "--make-cache" in sys.argv:
    rng = np.random.default_rng(0)
    np.save("features.npy", rng.standard_normal((4096, 320)).astype(np.float32) * 3.0 + 1.0)
    sys.exit(0)

if "--fixed" in sys.argv:
    features = np.load("features.npy", mmap_mode="r")
    features = (features - features.mean(axis=0)) / features.std(axis=0)
else:
    features = np.load("features.npy", mmap_mode="r+")
    features -= features.mean(axis=0)  # writes through to the file
    features /= features.std(axis=0)
    features[:] = features * 0.5 + 0.25  # a "calibration" that changes the file on every run

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(320, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for start in range(0, 256, 64):
    x = torch.from_numpy(np.ascontiguousarray(features[start : start + 64]))
    loss = model(x).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
