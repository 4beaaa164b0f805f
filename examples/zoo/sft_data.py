"""A tiny causal language model and a text dataset for TRL's `trl/scripts/sft.py`, made here so
that nothing is downloaded.

    python sft_data.py MODEL DATA [--rows N]

MODEL becomes what `--model_name_or_path` reads: a GPT-2 of 2 layers (64 wide), its weights
initialised from `torch.manual_seed(0)` and saved as safetensors, and a word-level tokenizer
(`tokenizers`, fitted on the dataset's words) with its end-of-text and padding tokens. DATA
becomes what `--dataset_name` reads: `train.jsonl`, N rows of `{"text": ...}` (the column SFT's
language modelling trains on), sentences drawn by a seeded generator from the words of the Zen
of Python (`import this`). The same bytes every time.
"""

import argparse
import json
import random
from pathlib import Path

from char_text import zen_words


def sentences(rows):
    words = zen_words()
    draw = random.Random(0)
    return [" ".join(draw.choice(words) for _ in range(draw.randint(8, 24))) for _ in range(rows)]


def write_data(folder, texts):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.jsonl", "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")


def write_model(folder, texts):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    special = ["<|pad|>", "<|endoftext|>", "<|unk|>"]
    tokenizer = Tokenizer(models.WordLevel(unk_token="<|unk|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=special))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<|pad|>",
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        unk_token="<|unk|>",
    )
    fast.save_pretrained(folder)
    config = GPT2Config(
        vocab_size=len(fast),
        n_positions=64,
        n_embd=64,
        n_layer=2,
        n_head=2,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("data", type=Path)
    parser.add_argument("--rows", type=int, default=64)
    args = parser.parse_args()
    texts = sentences(args.rows)
    write_data(args.data, texts)
    write_model(args.model, texts)


if __name__ == "__main__":
    main()
