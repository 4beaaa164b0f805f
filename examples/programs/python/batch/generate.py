"""Greedy generation with a tiny GPT-2 (transformers' `GPT2Config`, random init seeded with 0,
nothing downloaded), its prompts fed in batches of `--batch-size`: what a serving loop does.
Each prompt's logits should not depend on the batch it is in; on the CPU they do (a decoding
step is a matrix-vector product alone and a matrix product in a batch), so

    detcheck check --batch-sizes 1,8 -- python generate.py --batch-size {batch}

fails `batch_sizes` at sample 0 in the first attention projection (docs/checks.md).
`--pad-to 8` pads every batch to 8 rows (rows of the pad token whose attention mask is all zero,
which the check knows as padding, no sample): each prompt is then computed in one shape at every
batch size, the fix for shape dependence; on one thread (`--threads 1`) it passes, on two the
threads still split the batch by position. `--batch-invariant` runs the decoding inside
`detcheck.torch.batch_invariant()` (the operators whose rounding follows the batch's shape, one
sample at a time): it passes unpadded, on one thread or two.

    python generate.py [--batch-size N] [--prompts N] [--tokens N] [--pad-to N] [--threads N]
                       [--batch-invariant] [--device cuda]
"""

import argparse
import contextlib

import torch
from transformers import GPT2Config, GPT2LMHeadModel

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--prompts", type=int, default=8)
parser.add_argument("--tokens", type=int, default=4)
parser.add_argument("--device", default="cpu")
parser.add_argument("--pad-to", type=int, default=0)
parser.add_argument("--threads", type=int, default=0)
parser.add_argument("--batch-invariant", action="store_true")
args = parser.parse_args()
if args.threads:
    torch.set_num_threads(args.threads)
invariant = contextlib.nullcontext
if args.batch_invariant:
    import detcheck.torch

    invariant = detcheck.torch.batch_invariant

torch.manual_seed(0)
config = GPT2Config(
    n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0
)
model = GPT2LMHeadModel(config).eval().to(args.device)
prompts = torch.randint(1, 128, (args.prompts, 6)).to(args.device)
for start in range(0, args.prompts, args.batch_size):
    batch = prompts[start : start + args.batch_size]
    mask = torch.ones_like(batch)
    if args.pad_to > len(batch):
        pad = torch.zeros(args.pad_to - len(batch), batch.shape[1], dtype=batch.dtype)
        batch, mask = torch.cat([batch, pad.to(batch.device)]), torch.cat([mask, pad.to(batch.device)])
    with invariant():
        out = model.generate(
            batch,
            attention_mask=mask,
            max_new_tokens=args.tokens,
            min_new_tokens=args.tokens,
            do_sample=False,
            pad_token_id=0,
        )
    for row in out[: min(args.batch_size, args.prompts - start)]:
        print(" ".join(str(t) for t in row[6:].tolist()))
