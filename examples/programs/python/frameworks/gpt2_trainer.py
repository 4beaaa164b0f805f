"""A tiny GPT-2 (from a config: nothing downloaded) trained by a Hugging Face `Trainer`, recorded
with `detcheck.hf.DetcheckCallback`; DistributedDataParallel on gloo when launched as several
ranks (detcheck's `processes` launcher sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT).

    python3 gpt2_trainer.py [--steps N] [--plant-unseeded-dropout]

The clean program passes `repeat`, `replicas` and `world_sizes` [1, 2]: the global batch is two
sequences per update at every world size (one per rank at 2 ranks; two micro-batches of gradient
accumulation at 1), taken in order (`train_sampling_strategy="sequential"`), and dropout is off.
Each update's gradient is then one addition of two per-sequence gradients, whether autograd
accumulates it or gloo's allreduce sums it (scaled by powers of two, which round nothing), so
its bits do not depend on the world size. With more ranks or more micro-batches the order of the
additions would differ, and so would the bits.

`--plant-unseeded-dropout` is the negative control: dropout on, with torch's generator reseeded
from the clock at every step (as a forgotten seed in a callback does); `repeat` catches it.
"""

import argparse
import os
import sys
from pathlib import Path

from detcheck.hf import DetcheckCallback

# The model, the data and the Trainer are the unmodified script's (which never imports detcheck).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unmodified"))
from gpt2_trainer import make_trainer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=int(os.environ.get("DETCHECK_STEPS", "3")))
    parser.add_argument("--plant-unseeded-dropout", action="store_true")
    args = parser.parse_args()
    callbacks = [DetcheckCallback(replicated=True)]
    make_trainer(args.steps, args.plant_unseeded_dropout, callbacks).train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
