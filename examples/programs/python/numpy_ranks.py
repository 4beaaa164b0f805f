"""A numpy program of the user's own under detcheck's `command` kind (`processes` launcher).

Each rank fits a linear model to its shard of a synthetic dataset for a few steps and records the
shard, its gradient and its weights with detcheck's Python writer; outside detcheck it runs and
records nothing.

    python3 numpy_ranks.py --seed S --steps N [--plant-set-order]

`--plant-set-order` is the negative control: the gradient is accumulated feature group by feature
group in the iteration order of a `set` of names, which depends on PYTHONHASHSEED. detcheck gives
every launch another PYTHONHASHSEED, so `repeat` catches it every time.
"""

import argparse
import sys

import numpy as np

import detcheck

GROUPS = ["age", "bmi", "height", "income", "score", "visits", "weight", "zone"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--plant-set-order", action="store_true")
    args = parser.parse_args()

    writer = detcheck.TraceWriter.from_env()
    if writer is None:
        print("numpy_ranks: not launched by detcheck: nothing recorded", file=sys.stderr)
    rank = writer.rank if writer is not None else 0
    features = 4 * len(GROUPS)
    weights = np.zeros(features, dtype=np.float32)
    with writer if writer is not None else _Nothing() as w:
        for step in range(args.steps):
            rng = np.random.default_rng([args.seed, rank, step])
            x = rng.standard_normal((64, features)).astype(np.float32)
            y = (x @ np.linspace(-1, 1, features, dtype=np.float32)).astype(np.float32)
            residual = x @ weights - y
            grad = np.zeros(features, dtype=np.float32)
            order = set(GROUPS) if args.plant_set_order else GROUPS
            for name in order:
                g = GROUPS.index(name)
                cols = slice(4 * g, 4 * g + 4)
                # float32 accumulation over the rows, group by group
                grad[cols] += (x[:, cols] * residual[:, None]).sum(axis=0, dtype=np.float32)
            # The groups' gradients folded into one 4-vector, in `order`: float32 addition is not
            # associative, so the order shows in the bits.
            mix = np.zeros(4, dtype=np.float32)
            for name in order:
                g = GROUPS.index(name)
                mix += grad[4 * g : 4 * g + 4]
            weights -= np.float32(0.01) * grad
            if w is not None:
                w.record(step, "shard/x", x)
                w.record(step, "grad", grad)
                w.record(step, "grad/mix", mix)
                w.record(step, "weights", weights)
    return 0


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
