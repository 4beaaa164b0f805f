"""A tiny GPT-2 (from a config: nothing downloaded) trained by a Hugging Face `Trainer`: a plain
script that knows nothing of detcheck. detcheck records it without a change, at 1 rank or at 2
under torchrun (DistributedDataParallel on gloo):

    detcheck check --ranks 2 --launcher torchrun -- python gpt2_trainer.py

It asks the Trainer for `--max-steps` updates (100); detcheck ends it after `--steps`.

The clean script is reproducible: seeded, its sequences taken in order, dropout off. Two
sequences make each update at every world size (one per rank at 2 ranks; two micro-batches of
gradient accumulation at 1), so each update's gradient is one addition of two per-sequence
gradients, whichever adds them.

`--clock-dropout` is the negative control: dropout on, with torch's generator reseeded from the
clock at every step by a callback of the script's own (a seed forgotten in a callback).
"""

import argparse
import os
import tempfile
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

SEQUENCES, LENGTH, VOCAB = 32, 16, 128


class ClockSeed(TrainerCallback):
    """The planted bug: torch's generator reseeded from the clock before every step."""

    def on_step_begin(self, args, state, control, **kwargs):
        torch.manual_seed(time.time_ns() % (1 << 62))


def make_trainer(max_steps, clock_dropout, callbacks=()):
    """The Trainer of this script (examples/programs/python/frameworks/gpt2_trainer.py adds
    detcheck's callback to the same one)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if 2 % world:
        raise SystemExit(f"gpt2_trainer.py: runs at 1 or 2 ranks, not {world}")
    dropout = 0.1 if clock_dropout else 0.0
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    tokens = torch.randint(0, VOCAB, (SEQUENCES, LENGTH), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": t, "labels": t} for t in tokens]
    work = os.path.join(tempfile.gettempdir(), f"gpt2-work-{os.getpid()}")
    training = TrainingArguments(
        output_dir=work, max_steps=max_steps, per_device_train_batch_size=1,
        gradient_accumulation_steps=2 // world, train_sampling_strategy="sequential",
        learning_rate=1e-3, use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", seed=0, dataloader_num_workers=0,
    )
    callbacks = list(callbacks) + ([ClockSeed()] if clock_dropout else [])
    torch.set_num_threads(1)
    return Trainer(model=model, args=training, train_dataset=data, callbacks=callbacks)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--clock-dropout", action="store_true")
    args = parser.parse_args()
    make_trainer(args.max_steps, args.clock_dropout).train()


if __name__ == "__main__":
    main()
