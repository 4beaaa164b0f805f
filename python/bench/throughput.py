#!/usr/bin/env python3
"""Throughput of the Python writer against the Rust writer, on the same tensors.

    target/venv/bin/python python/bench/throughput.py [--mode stats] [--repeats 5] [--steps 2]

For each case (a set of tensors), both sides record every tensor at each of `--steps` steps into
a fresh trace file, timed from creating the writer to finishing the file (footer, fsync,
rename): the Python side with `detcheck.TraceWriter.record` on numpy arrays, the Rust side with
`TraceWriter::record` on owned `Tensor`s of the same bytes (python/examples/writer_throughput.rs,
built with `cargo build --release`; the tensors reach it through a safetensors file, loaded
before the clock starts). Runs alternate Rust, Python, Rust, ...; the figure is the median of
`--repeats` runs, in MB/s (10^6 bytes of tensor data per second), and the ratio Python / Rust.
"""

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import detcheck
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "python" / "Cargo.toml"

MIB = 1 << 20

#: name -> list of (dtype, shape); about 64 MiB per step, except `small`.
CASES = {
    "large (4 x 16 MiB f32)": [("float32", (4 * MIB,))] * 4,
    "medium (64 x 1 MiB f32)": [("float32", (MIB // 4,))] * 64,
    "small (1024 x 16 KiB f32)": [("float32", (64, 64))] * 1024,
    "mixed dtypes (6 x 8 MiB)": [
        ("float16", (4 * MIB,)),
        ("float64", (MIB,)),
        ("int64", (MIB,)),
        ("int32", (2 * MIB,)),
        ("uint8", (8 * MIB,)),
        ("bool", (8 * MIB,)),
    ],
}

SAFETENSORS_DTYPES = {
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "int32": "I32",
    "int64": "I64",
    "uint8": "U8",
    "bool": "BOOL",
}


def make_tensors(spec, seed=0):
    rng = np.random.default_rng(seed)
    tensors = []
    for i, (dtype, shape) in enumerate(spec):
        if dtype == "bool":
            a = rng.integers(0, 2, size=shape).astype(bool)
        elif dtype.startswith("float"):
            a = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
        else:
            a = rng.integers(-1000, 1000, size=shape).astype(dtype)
        tensors.append((f"t{i:05d}", a))
    return tensors


def write_safetensors(path, tensors):
    header, offset = {}, 0
    for name, a in tensors:
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[a.dtype.name],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        offset += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, a in tensors:
            f.write(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes())


def rust_binary():
    subprocess.run(
        [
            "cargo",
            "build",
            "--release",
            "--quiet",
            "--manifest-path",
            str(MANIFEST),
            "--example",
            "writer_throughput",
        ],
        check=True,
    )
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "python" / "target"))
    return target / "release" / "examples" / "writer_throughput"


def run_rust(binary, tensors_file, mode, steps):
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run(
            [str(binary), str(tensors_file), d, mode, str(steps)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    result = json.loads(out)
    return result["seconds"], result["bytes"]


def run_python(tensors, mode, steps):
    with tempfile.TemporaryDirectory() as d:
        start = time.perf_counter()
        w = detcheck.TraceWriter(d, 0, 1, mode)
        for step in range(steps):
            for name, a in tensors:
                w.record(step, name, a)
        w.close()
        seconds = time.perf_counter() - start
    return seconds, sum(a.nbytes for _, a in tensors) * steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="stats", choices=["md5", "stats", "full"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--case", action="append", help="substring of a case's name")
    args = parser.parse_args()

    binary = rust_binary()
    print(
        f"mode {args.mode}, {args.steps} steps per run, median of {args.repeats} runs "
        f"(MB/s = 10^6 bytes of tensor data per second)"
    )
    print(f"{'case':<28} {'Python MB/s':>12} {'Rust MB/s':>10} {'ratio':>6}")
    ratios = []
    for case, spec in CASES.items():
        if args.case and not any(c in case for c in args.case):
            continue
        tensors = make_tensors(spec)
        with tempfile.TemporaryDirectory() as d:
            tensors_file = Path(d) / "tensors.safetensors"
            write_safetensors(tensors_file, tensors)
            run_python(tensors, args.mode, 1)  # warm up: page in, import paths
            python_rates, rust_rates = [], []
            for _ in range(args.repeats):
                seconds, nbytes = run_rust(binary, tensors_file, args.mode, args.steps)
                rust_rates.append(nbytes / seconds / 1e6)
                seconds, nbytes = run_python(tensors, args.mode, args.steps)
                python_rates.append(nbytes / seconds / 1e6)
        py, rs = statistics.median(python_rates), statistics.median(rust_rates)
        ratios.append(py / rs)
        print(f"{case:<28} {py:>12.0f} {rs:>10.0f} {py / rs:>5.2f}x", flush=True)
    if ratios:
        print(f"lowest ratio {min(ratios):.2f}x (target >= 0.9x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
