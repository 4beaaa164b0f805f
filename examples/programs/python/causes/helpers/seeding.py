"""A seeding helper of the program's own, as minGPT's `mingpt/utils.py` `set_seed`."""

import random

import torch


def set_seed(seed):
    random.seed(seed)
    torch.manual_seed(seed)
