#!/usr/bin/env python3
"""What the `batch_sizes` check's recording costs: each sample's rows of a batch's records
(`detcheck._torch.rows.RowsSink`, `DETCHECK_RECORD=rows`) against the same tensors recorded whole,
into a real trace file (issue 56: per-row digests at >= 1 GB/s on one core).

    taskset -c 0 target/venv/bin/python python/bench/rows.py [--rounds 7]

A batch is 64 rows of 4,096 float32 (16 KiB a row, 1 MiB a record); a step is 16 such records
(16 MiB). Each round times, in turn, the records written whole (`TorchSink.put`, one record per
tensor) and sample by sample (`RowsSink`: 64 records a tensor, a sample a step), each from the
writer's creation to the finished file; the figure is MB/s of tensor bytes (10^6 bytes a
second), the median and range over the rounds, and their ratio. Run under `taskset -c 0`, the
writer's threads share one core with the program.
"""

import argparse
import statistics
import tempfile
import time

import detcheck
import torch
from detcheck._torch import rows as _rows
from detcheck._torch.frontend import TorchSink

ROWS, WIDTH, RECORDS, BATCHES = 64, 4096, 16, 4


def record(folder, by_rows, tensors):
    writer = detcheck.TraceWriter(folder, 0, 1, "md5")
    sink = TorchSink(writer, False)
    if by_rows:
        batches = _rows.Batches()
        sink = _rows.RowsSink(sink, writer, batches)
    start = time.perf_counter()
    for b in range(BATCHES):
        if by_rows:
            batches.begin(ROWS)
        for i, t in enumerate(tensors):
            sink.put(b, f"fwd/m{i}", t)
        if by_rows:
            batches.end()
        else:
            sink.end_step()
    sink.close()
    writer.close()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    tensors = [torch.randn(ROWS, WIDTH) for _ in range(RECORDS)]
    nbytes = BATCHES * sum(t.numel() * t.element_size() for t in tensors)
    whole, rows = [], []
    for _ in range(args.rounds):
        for by_rows, into in ((False, whole), (True, rows)):
            with tempfile.TemporaryDirectory() as d:
                into.append(nbytes / record(d, by_rows, tensors) / 1e6)
    for label, xs in (("whole records", whole), ("rows, a sample a step", rows)):
        print(f"{label}: median {statistics.median(xs):.0f} MB/s, {min(xs):.0f}-{max(xs):.0f}")
    ratios = [r / w for r, w in zip(rows, whole)]
    print(
        f"rows / whole: {statistics.median(ratios):.2f}x, {min(ratios):.2f}-{max(ratios):.2f}x"
        f" ({args.rounds} rounds, {nbytes / 1e6:.0f} MB a round)"
    )


if __name__ == "__main__":
    main()
