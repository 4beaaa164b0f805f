"""Shared helpers: the repository's root, the independent decoder (scripts/dctrace.py) and the
`detcheck` binary (built once per session with `cargo build --release --bin detcheck`, or
$DETCHECK_BIN)."""

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Triton's interpreter (TRITON_INTERPRET=1) runs detcheck._device's kernels on CPU tensors where
# there is no GPU. Triton reads the variable when it is first imported (its own library is
# decorated then), so it is set here, before any test module can import it.
if "triton" not in sys.modules:
    try:
        import torch

        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
    except ImportError:
        pass

ROOT = Path(__file__).resolve().parents[2]
DCTRACE = ROOT / "scripts" / "dctrace.py"

_RECORD = re.compile(
    r"^step (?P<step>\d+) seq (?P<seq>\d+) (?P<name>\S+) (?P<dtype>\w+)\[(?P<shape>[^\]]*)\] "
    r"md5 (?P<md5>[0-9a-f]{32})(?P<rest>.*)$"
)


def tree_digest(data):
    """A record's digest of ``data``, by its definition (docs/trace-format.md, "The digest"):
    md5 of each 4096-byte chunk, concatenated, again, until one chunk remains, whose plain md5
    is the digest (plain md5 for at most 4096 bytes)."""
    b = bytes(data)
    while len(b) > 4096:
        b = b"".join(hashlib.md5(b[i : i + 4096]).digest() for i in range(0, len(b), 4096))
    return hashlib.md5(b).digest()


def digest_hex(data):
    """``tree_digest(data)`` as the trace decoder prints it."""
    return tree_digest(data).hex()


def decode(path):
    """The records of a trace file as dicts, read by scripts/dctrace.py (not by detcheck)."""
    out = subprocess.run(
        [sys.executable, str(DCTRACE), str(path)], capture_output=True, text=True, check=True
    ).stdout
    records = []
    for line in out.splitlines():
        m = _RECORD.match(line)
        if not m:
            continue
        rest = m["rest"].split()
        record = {
            "step": int(m["step"]),
            "seq": int(m["seq"]),
            "name": m["name"],
            "dtype": m["dtype"],
            "shape": [int(d) for d in m["shape"].split(",") if d.strip()],
            "md5": m["md5"],
            "replicated": "replicated" in rest,
        }
        for key in ("max", "min", "mean", "norm"):
            if key in rest:
                record[key] = float(rest[rest.index(key) + 1])
        records.append(record)
    header = out.splitlines()[0]
    assert header.startswith("header:"), out
    return records


@pytest.fixture(scope="session")
def detcheck_bin():
    """The path of the `detcheck` binary."""
    if os.environ.get("DETCHECK_BIN"):
        return os.environ["DETCHECK_BIN"]
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--bin", "detcheck"], cwd=ROOT, check=True
    )
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target.is_absolute():
        target = ROOT / target
    return str(target / "release" / "detcheck")


def compare(detcheck_bin, a, b):
    """`detcheck compare A B`: (exit code, output)."""
    done = subprocess.run(
        [detcheck_bin, "compare", str(a), str(b)], capture_output=True, text=True, timeout=120
    )
    return done.returncode, done.stdout + done.stderr
