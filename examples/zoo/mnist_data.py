"""A small MNIST in torchvision's raw layout (``DIR/MNIST/raw/train-images-idx3-ubyte`` and the
three other idx files) for pytorch/examples' mnist, made here so that nothing is downloaded:
28x28 images of seeded noise, labels 0-9 (the same bytes every time). torchvision finds the
files and does not download.

    python mnist_data.py DIR [--train N] [--test N]
"""

import argparse
import random
import struct
from pathlib import Path


def _idx(path, magic, dims, payload):
    path.write_bytes(struct.pack(">" + "I" * (1 + len(dims)), magic, *dims) + bytes(payload))


def write_mnist(folder, train=256, test=128):
    """Writes the four idx files under ``folder/MNIST/raw`` (created) and returns ``folder``."""
    folder = Path(folder)
    raw = folder / "MNIST" / "raw"
    raw.mkdir(parents=True)
    draw = random.Random(0)
    for prefix, n in (("train", train), ("t10k", test)):
        pixels = [draw.randrange(256) for _ in range(n * 28 * 28)]
        labels = [draw.randrange(10) for _ in range(n)]
        _idx(raw / f"{prefix}-images-idx3-ubyte", 2051, (n, 28, 28), pixels)
        _idx(raw / f"{prefix}-labels-idx1-ubyte", 2049, (n,), labels)
    return folder


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--train", type=int, default=256)
    parser.add_argument("--test", type=int, default=128)
    args = parser.parse_args()
    write_mnist(args.folder, args.train, args.test)
