"""An Oxford-IIIT Pet style image folder for accelerate's cv_example.py, and the pretrained
weights its `timm.create_model("resnet50d", pretrained=True)` loads, both made here so that
nothing is downloaded.

    python pet_images.py IMAGES --hf-home DIR [--breeds N] [--per-breed N]

IMAGES gets `<breed>_<i>.jpg` files (the dataset's naming: cv_example.py reads the label from the
name), 64x64 pictures of seeded noise. DIR becomes a Hugging Face cache (`HF_HOME`) that holds
`timm/resnet50d.ra2_in1k`'s `model.safetensors` as the hub would lay it out, with weights of
timm's own random initialisation (seeded): run the program with `HF_HOME=DIR HF_HUB_OFFLINE=1`.
The same bytes every time.
"""

import argparse
from pathlib import Path

import numpy as np
import PIL.Image

BREEDS = ["Abyssinian", "Bengal", "beagle", "boxer", "chihuahua", "pug", "Persian", "samoyed"]
#: The revision the cache says `main` is (any 40 hex digits: nothing is fetched).
REVISION = "0" * 40


def write_images(folder, breeds, per_breed):
    folder.mkdir(parents=True, exist_ok=True)
    draw = np.random.default_rng(0)
    for breed in BREEDS[:breeds]:
        for i in range(1, per_breed + 1):
            pixels = draw.integers(0, 256, (64, 64, 3), dtype=np.uint8)
            PIL.Image.fromarray(pixels).save(folder / f"{breed}_{i}.jpg", quality=90)


def write_weights(hf_home):
    import safetensors.torch
    import timm
    import torch

    torch.manual_seed(0)
    model = timm.create_model("resnet50d", pretrained=False)
    repo = model.pretrained_cfg["hf_hub_id"]  # timm/resnet50d.ra2_in1k
    cached = Path(hf_home) / "hub" / ("models--" + repo.replace("/", "--"))
    snapshot = cached / "snapshots" / REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (cached / "refs").mkdir(exist_ok=True)
    (cached / "refs" / "main").write_text(REVISION)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    safetensors.torch.save_file(state, snapshot / "model.safetensors")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("images", type=Path)
    parser.add_argument("--hf-home", type=Path, required=True)
    parser.add_argument("--breeds", type=int, default=4)
    parser.add_argument("--per-breed", type=int, default=40)
    args = parser.parse_args()
    write_images(args.images, args.breeds, args.per_breed)
    write_weights(args.hf_home)


if __name__ == "__main__":
    main()
