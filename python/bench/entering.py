#!/usr/bin/env python3
"""What the digest of values entering torch costs (docs/causes.md, ``data/outside``): the
overhead.py MLP whose batch enters torch from numpy at every step (``torch.from_numpy`` for the
inputs, ``torch.as_tensor`` for the labels), with torch's functions plain and wrapped
(``_torch.frontend._follow_values_entering``), in one process.

    python python/bench/entering.py [--blocks 40] [--steps 5]

Method: blocks of ``--steps`` training steps alternate between the plain functions and the
wrapped ones (swapped on the ``torch`` module between blocks), so both sides see the same
process, caches and machine load; after each wrapped step the digests are flushed as the
engine does before its next record (into a sink that keeps nothing). Reported: the median step
time of each side, their ratio, and the median of the ratios of neighbouring blocks (each
wrapped block over the plain block before it) with their range; and the cost of one wrapped
call of each function, alone.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import build  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=40, help="blocks per side")
    parser.add_argument("--steps", type=int, default=5, help="steps per block")
    parser.add_argument("--sizes", default="784,1024,1024,10")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--optimizer", default="sgd")
    args = parser.parse_args()
    torch, model, optimizer, x, y = build(args)
    from detcheck._core import evidence as _evidence
    from detcheck._torch import frontend as _torch_frontend

    names = ("tensor", "as_tensor", "from_numpy")
    plain = {n: getattr(torch, n) for n in names}
    _evidence.add_generator("bench", lambda: b"")  # a rank's evidence is on
    _evidence.attach(lambda name, array, where: None)
    _torch_frontend._follow_values_entering()
    wrapped = {n: getattr(torch, n) for n in names}
    loss_fn = torch.nn.CrossEntropyLoss()
    x_numpy, y_numpy = x.numpy(), y.numpy()

    def step():
        optimizer.zero_grad()
        xb, yb = torch.from_numpy(x_numpy), torch.as_tensor(y_numpy)
        loss_fn(model(xb), yb).backward()
        _evidence.flush_outside()
        optimizer.step()

    def use(functions):
        for n, f in functions.items():
            setattr(torch, n, f)

    for _ in range(5):
        step()
    times = {"plain": [], "wrapped": []}
    block_ratios = []
    for _ in range(args.blocks):
        medians = {}
        for side, functions in (("plain", plain), ("wrapped", wrapped)):
            use(functions)
            block = []
            for _ in range(args.steps):
                t = time.perf_counter()
                step()
                block.append(time.perf_counter() - t)
            times[side] += block
            medians[side] = statistics.median(block)
        block_ratios.append(medians["wrapped"] / medians["plain"])
    p, w = statistics.median(times["plain"]), statistics.median(times["wrapped"])
    print(
        f"MLP {args.sizes.replace(',', '-')}, batch {args.batch} from numpy; "
        f"{args.blocks} blocks x {args.steps} steps a side"
    )
    print(f"plain {p * 1e3:.2f} ms/step, wrapped {w * 1e3:.2f} ms/step: {w / p:.4f}x")
    block_ratios.sort()
    print(
        f"neighbouring blocks: median {statistics.median(block_ratios):.4f}x, "
        f"range {block_ratios[0]:.4f}-{block_ratios[-1]:.4f}"
    )
    calls = {
        "torch.tensor(3.0)": lambda: torch.tensor(3.0),
        "torch.as_tensor(labels)": lambda: torch.as_tensor(y_numpy),
        "torch.from_numpy(inputs)": lambda: torch.from_numpy(x_numpy),
    }
    for label, call in calls.items():
        cost = {}
        for side, functions in (("plain", plain), ("wrapped", wrapped)):
            use(functions)
            best = float("inf")
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(1000):
                    call()
                best = min(best, (time.perf_counter() - t) / 1000)
                _evidence.flush_outside()
            cost[side] = best
        extra = (cost["wrapped"] - cost["plain"]) * 1e6
        print(f"{label}: {cost['plain'] * 1e6:.1f} us plain, +{extra:.1f} us wrapped")
    use(plain)


if __name__ == "__main__":
    main()
