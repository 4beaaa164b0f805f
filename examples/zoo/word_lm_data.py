"""A small corpus in wikitext-2's layout (train.txt, valid.txt, test.txt) for pytorch/examples'
word_language_model, made here so that nothing is downloaded: 200 words, 12 a line, drawn
from a seeded generator (the same bytes every time).

    python word_lm_data.py DIR [--train-lines N]
"""

import argparse
import random
from pathlib import Path


def write_corpus(folder, train_lines=300):
    """Writes the corpus into ``folder`` (created) and returns it."""
    folder = Path(folder)
    words = [f"w{i}" for i in range(200)]
    draw = random.Random(0)
    folder.mkdir(parents=True)
    for name, lines in (("train", train_lines), ("valid", 40), ("test", 40)):
        text = "\n".join(" ".join(draw.choice(words) for _ in range(12)) for _ in range(lines))
        (folder / f"{name}.txt").write_text(text + "\n")
    return folder


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--train-lines", type=int, default=300)
    args = parser.parse_args()
    write_corpus(args.folder, args.train_lines)
