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
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from detcheck.hf import DetcheckCallback

SEQUENCES, LENGTH, VOCAB = 32, 16, 128


class ClockSeed(TrainerCallback):
    """The planted bug: torch's generator reseeded from the clock before every step."""

    def on_step_begin(self, args, state, control, **kwargs):
        torch.manual_seed(time.time_ns() % (1 << 62))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=int(os.environ.get("DETCHECK_STEPS", "3")))
    parser.add_argument("--plant-unseeded-dropout", action="store_true")
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if 2 % world:
        raise SystemExit(f"gpt2_trainer.py: runs at 1 or 2 ranks, not {world}")
    dropout = 0.1 if args.plant_unseeded_dropout else 0.0
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    tokens = torch.randint(0, VOCAB, (SEQUENCES, LENGTH), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": t, "labels": t} for t in tokens]
    work = os.environ.get("DETCHECK_TRACE_DIR", "/tmp") + f"/gpt2-work-{os.environ.get('RANK', '0')}"
    training = TrainingArguments(
        output_dir=work, max_steps=args.steps, per_device_train_batch_size=1,
        gradient_accumulation_steps=2 // world, train_sampling_strategy="sequential",
        learning_rate=1e-3, use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", seed=0, dataloader_num_workers=0,
    )
    callbacks = [DetcheckCallback(replicated=True)]
    if args.plant_unseeded_dropout:
        callbacks.append(ClockSeed())
    torch.set_num_threads(1)
    Trainer(model=model, args=training, train_dataset=data, callbacks=callbacks).train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
