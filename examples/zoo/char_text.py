"""A character-level text corpus for the zoo's language models (nanoGPT's `shakespeare_char`,
minGPT's chargpt), made here so that nothing is downloaded: lines drawn by a seeded generator
from the words of Python's own `this` module (the Zen of Python), the same bytes every time,
after one line that holds the characters of chargpt's sampling prompt ("O God, O God!").

    python char_text.py FILE [--chars N]

nanoGPT: write `data/shakespeare_char/input.txt`, then run the vendored
`data/shakespeare_char/prepare.py` as its README says (it downloads only when `input.txt` is
missing). minGPT's chargpt reads `input.txt` from its working directory.
"""

import argparse
import codecs
import contextlib
import io
import random
from pathlib import Path


def zen_words():
    """The Zen of Python's words, in order (the module prints it, ROT13-encoded in its source)."""
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return codecs.decode(this.s, "rot13").split()


def write_text(path, chars=200_000):
    words = zen_words()
    draw = random.Random(0)
    lines = ["O God, O God!"]
    size = len(lines[0]) + 1
    while size < chars:
        line = " ".join(draw.choice(words) for _ in range(draw.randrange(4, 13)))
        lines.append(line)
        size += len(line) + 1
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines)[:chars] + "\n")
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--chars", type=int, default=200_000)
    args = parser.parse_args()
    write_text(args.file, args.chars)
