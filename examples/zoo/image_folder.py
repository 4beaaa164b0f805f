"""Writes a small ImageNet-style folder, ``ROOT/{train,val}/class<k>/<i>.JPEG``, of random
images from a seeded generator (nothing downloaded), for the zoo's mindcv (its ``--dataset
imagenet`` reads such a folder with MindSpore's ``ImageFolderDataset``).

    python image_folder.py ROOT [--train N] [--classes K]
"""

import argparse
import os

import numpy as np
from PIL import Image


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--train", type=int, default=16, help="images per class in train/")
    parser.add_argument("--classes", type=int, default=4)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for split, count in (("train", args.train), ("val", 4)):
        for k in range(args.classes):
            folder = os.path.join(args.root, split, f"class{k}")
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                pixels = rng.integers(0, 256, size=(40, 40, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(os.path.join(folder, f"{i}.JPEG"), quality=90)


if __name__ == "__main__":
    main()
