"""A Cora-shaped citation graph for pytorch/examples' gat (its `./cora/cora.content` and
`cora.cites`, the files it downloads when they are missing): made here, so nothing is
downloaded.

    python cora_data.py FOLDER [--nodes N] [--features F]

`cora.content`: one line a paper, its id, F binary word features and its class (one of Cora's
7 subject names); `cora.cites`: one line a citation, `cited citing`. Deterministic: numpy's
generator seeded with 0; papers cite mostly within their class.
"""

import argparse
from pathlib import Path

import numpy as np

CLASSES = (
    "Case_Based",
    "Genetic_Algorithms",
    "Neural_Networks",
    "Probabilistic_Methods",
    "Reinforcement_Learning",
    "Rule_Learning",
    "Theory",
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--features", type=int, default=256)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    ids = 1000 + rng.permutation(args.nodes * 10)[: args.nodes]
    labels = rng.integers(0, len(CLASSES), args.nodes)
    # Each class favours its own eighth of the words.
    favoured = (np.arange(args.features) * len(CLASSES)) // args.features
    lines = []
    for paper, label in zip(ids, labels):
        p = np.where(favoured == label, 0.12, 0.02)
        words = (rng.random(args.features) < p).astype(int)
        lines.append(" ".join([str(paper), *map(str, words), CLASSES[label]]))
    (folder / "cora.content").write_text("\n".join(lines) + "\n")
    cites = []
    for k in range(args.nodes * 2):
        a = rng.integers(args.nodes)
        same = np.flatnonzero(labels == labels[a])
        b = rng.choice(same) if rng.random() < 0.8 else rng.integers(args.nodes)
        if a != b:
            cites.append(f"{ids[b]} {ids[a]}")
    (folder / "cora.cites").write_text("\n".join(cites) + "\n")


if __name__ == "__main__":
    main()
