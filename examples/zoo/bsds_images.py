"""Writes a small BSDS300-style folder, ``ROOT/BSDS300/images/{train,test}/<id>.jpg``, of
481x321 pictures from a seeded generator (smooth colour fields: noise at 1/8 scale, resized),
for the zoo's pytorch/examples super_resolution, whose ``data.py`` downloads BSDS300 only when
that folder is missing (nothing downloaded).

    python bsds_images.py ROOT [--train N] [--test N]
"""

import argparse
import os

import numpy as np
from PIL import Image


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--train", type=int, default=16)
    parser.add_argument("--test", type=int, default=4)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for split, count in (("train", args.train), ("test", args.test)):
        folder = os.path.join(args.root, "BSDS300", "images", split)
        os.makedirs(folder, exist_ok=True)
        for i in range(count):
            small = rng.integers(0, 256, size=(41, 61, 3), dtype=np.uint8)
            picture = Image.fromarray(small).resize((481, 321), Image.BICUBIC)
            picture.save(os.path.join(folder, f"{100007 + 1000 * i}.jpg"), quality=90)


if __name__ == "__main__":
    main()
