#!/usr/bin/env python3
"""What the fix `detcheck.torch.batch_invariant()` costs: a tiny GPT-2's greedy decoding of 8
prompts in one batch of 8 (transformers' `GPT2Config`, random init, nothing downloaded; the
model of examples/programs/python/batch/generate.py), plain and inside the mode, in turn.

    target/venv/bin/python python/bench/batch_invariant.py [--rounds 7] [--threads N]

Each round times the two, interleaved; the figure is the median of each and of their ratio
(mode / plain), with the ranges. The mode computes matrix products a row at a time, so the cost
grows with the rows of a batch (8 prompts of 6 tokens: 48 rows in the prefill, 8 a decoding
step).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import detcheck.torch
import torch

# The tests' tiny GPT-2 (python/tests/support: transformers' GPT2Config, random init seeded
# with 0), the model of examples/programs/python/batch/generate.py too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import tiny_gpt2  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, prompts = tiny_gpt2()
    mask = torch.ones_like(prompts)

    def decode():
        return model.generate(
            prompts,
            attention_mask=mask,
            max_new_tokens=4,
            min_new_tokens=4,
            do_sample=False,
            pad_token_id=0,
        )

    def timed(inside):
        start = time.perf_counter()
        with torch.no_grad():
            if inside:
                with detcheck.torch.batch_invariant():
                    decode()
            else:
                decode()
        return time.perf_counter() - start

    timed(False), timed(True)  # warm up both
    plain, mode = [], []
    for _ in range(args.rounds):
        plain.append(timed(False))
        mode.append(timed(True))
    ratios = [m / p for m, p in zip(mode, plain)]
    med = statistics.median
    print(f"threads {torch.get_num_threads()}, {args.rounds} rounds")
    print(f"plain {med(plain) * 1e3:.1f} ms ({min(plain) * 1e3:.1f}-{max(plain) * 1e3:.1f})")
    print(f"batch_invariant {med(mode) * 1e3:.1f} ms ({min(mode) * 1e3:.1f}-{max(mode) * 1e3:.1f})")
    print(f"ratio {med(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x)")


if __name__ == "__main__":
    main()
