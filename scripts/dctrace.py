#!/usr/bin/env python3
"""A reference decoder of detcheck trace files (docs/trace-format.md, version 1).

Usage: python3 scripts/dctrace.py DIR/rank0.dctrace   # prints every entry
It checks the header, the footer and the counts, as detcheck's reader does.
"""
import struct
import sys

DTYPES = {1: "f32", 2: "f64", 3: "i64", 4: "u8", 5: "f16", 6: "bf16", 7: "i32", 8: "bool"}
MODES = {1: "md5", 2: "stats", 3: "full"}


def read(path):
    b = open(path, "rb").read()
    assert b[:8] == b"DCTRACE\0", "not a detcheck trace"
    version, mode, _, rank, world, reclen = struct.unpack_from("<HBBIII", b, 8)
    assert version == 1, f"version {version}"
    print(f"header: version {version}, mode {MODES[mode]}, rank {rank} of {world}, records of {reclen} bytes")
    end = len(b) - 40
    tag, nrec, nnames, nlayouts, offset = struct.unpack_from("<B7xQIIQ", b, end)
    assert tag == ord("E") and b[end + 32:] == b"DCTREND\0" and offset == end, "truncated: no valid footer"
    names, layouts, records, pos = [], [], 0, 32
    while pos < end:
        tag = b[pos]
        if tag == ord("N"):
            length, ident = struct.unpack_from("<HI", b, pos + 2)
            assert ident == len(names)
            names.append(b[pos + 8:pos + 8 + length].decode())
            pos += 8 + length
        elif tag == ord("L"):
            dtype, ndim, ident = struct.unpack_from("<BHI", b, pos + 1)
            assert ident == len(layouts)
            layouts.append((DTYPES[dtype], struct.unpack_from(f"<{ndim}Q", b, pos + 8)))
            pos += 8 + 8 * ndim
        elif tag == ord("R"):
            flags, name, step, seq, layout = struct.unpack_from("<BxxIQII", b, pos + 1)
            md5 = b[pos + 24:pos + 40].hex()
            dtype, shape = layouts[layout]
            line = f"step {step} seq {seq} {names[name]} {dtype}{list(shape)} md5 {md5}"
            if flags & 1:
                line += " replicated"
            if reclen == 104:
                mask = b[pos + 40]
                stats = struct.unpack_from("<4d", b, pos + 48)
                nan, pinf, ninf = struct.unpack_from("<3Q", b, pos + 80)
                shown = [f"{k} {v!r}" for i, (k, v) in enumerate(zip(["max", "min", "mean", "norm"], stats)) if mask >> i & 1]
                line += " " + " ".join(shown) + f" nan {nan} +inf {pinf} -inf {ninf}"
            print(line)
            records += 1
            pos += reclen
        else:
            raise ValueError(f"unknown tag {tag:#x} at byte {pos}")
    assert (records, len(names), len(layouts)) == (nrec, nnames, nlayouts), "counts differ from the footer"
    print(f"footer: {records} records, {len(names)} names, {len(layouts)} layouts")


if __name__ == "__main__":
    for path in sys.argv[1:]:
        read(path)
