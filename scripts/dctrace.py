#!/usr/bin/env python3
"""A reference decoder of detcheck trace files (docs/trace-format.md, versions 1 to 3).

Usage: python3 scripts/dctrace.py DIR/rank0.dctrace   # prints every entry
It checks the header, the footer and the counts, as detcheck's reader does; in version 2 also
every checksum (CRC-32, zlib's), the environment and tensor-file sections and, in full mode, the
size and md5 of every safetensors file the trace lists. A damaged file raises ValueError naming
the byte offset.
"""
import hashlib
import os
import struct
import sys
import zlib

DTYPES = {1: "f32", 2: "f64", 3: "i64", 4: "u8", 5: "f16", 6: "bf16", 7: "i32", 8: "bool",
          9: "i8", 10: "i16", 11: "u16", 12: "f8e4m3fn", 13: "f8e5m2", 14: "c64", 15: "c128"}
MODES = {1: "md5", 2: "stats", 3: "full"}


def check(ok, offset, what):
    if not ok:
        raise ValueError(f"corrupt at byte {offset}: {what}")


def section(b, at, end, tag):
    """The (count, payload) of the version 2 section of `tag` at [at, end), its checksum checked."""
    check(end - at >= 16, at, "a section is shorter than its framing")
    found, length, count, crc = struct.unpack_from("<B3xIII", b, at)
    check(found == ord(tag), at, f"expected section {tag}, found tag {found:#x}")
    check(length == end - at - 16, at, f"section {tag} says {length} bytes, the footer gives it {end - at - 16}")
    payload = b[at + 16:end]
    check(zlib.crc32(payload, zlib.crc32(b[at:at + 12])) == crc, at, f"checksum of section {tag}")
    return count, payload


def entries(b, pos, end, reclen, names, layouts):
    """Prints the N/L/R entries of b[pos:end]; returns the number of records."""
    records = 0
    while pos < end:
        tag = b[pos]
        if tag == ord("N"):
            length, ident = struct.unpack_from("<HI", b, pos + 2)
            check(ident == len(names) and pos + 8 + length <= end, pos, "name definition")
            names.append(b[pos + 8:pos + 8 + length].decode())
            pos += 8 + length
        elif tag == ord("L"):
            dtype, ndim, ident = struct.unpack_from("<BHI", b, pos + 1)
            check(ident == len(layouts) and pos + 8 + 8 * ndim <= end, pos, "layout definition")
            layouts.append((DTYPES[dtype], struct.unpack_from(f"<{ndim}Q", b, pos + 8)))
            pos += 8 + 8 * ndim
        elif tag == ord("R"):
            check(pos + reclen <= end, pos, "a record runs past its block")
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
        elif tag == ord("P"):  # a shard's placement and position digest, after its record
            reserved, ndim, reserved4 = struct.unpack_from("<BHI", b, pos + 1)
            check(reserved == 0 and reserved4 == 0 and pos + 24 + 24 * ndim <= end, pos, "shard entry")
            dims = struct.unpack_from(f"<{3 * ndim}Q", b, pos + 24)
            glob, offset, extent = dims[:ndim], dims[ndim:2 * ndim], dims[2 * ndim:]
            print(f"shard: global {list(glob)} offset {list(offset)} extent {list(extent)} position {b[pos + 8:pos + 24].hex()}")
            pos += 24 + 24 * ndim
        else:
            raise ValueError(f"unknown tag {tag:#x} at byte {pos}")
    return records


def read(path):
    b = open(path, "rb").read()
    assert b[:8] == b"DCTRACE\0", "not a detcheck trace"
    version, mode, checksum, rank, world, reclen = struct.unpack_from("<HBBIII", b, 8)
    assert version in (1, 2, 3), f"version {version}"
    # Version 3 adds the records' digest (byte 28): 2 is the md5 tree; 1 and 2 carry plain md5.
    digest = {1: "md5", 2: "md5-tree-4k"}.get(b[28]) if version == 3 else "md5"
    assert digest is not None, f"unknown digest code {b[28]}"
    if version == 1:
        header_len, footer_len = 32, 40
        print(f"header: version {version}, mode {MODES[mode]}, rank {rank} of {world}, records of {reclen} bytes")
    else:
        header_len, footer_len = 64, 64
        check(zlib.crc32(b[:60]) == struct.unpack_from("<I", b, 60)[0], 0, "header checksum")
        check(checksum == 1 and struct.unpack_from("<I", b, 24)[0] == 64, 11, "header fields")
        print(f"header: version {version}, mode {MODES[mode]}, rank {rank} of {world}, records of {reclen} bytes, "
              f"run id {b[32:48].hex()}" + (f", digest {digest}" if version == 3 else ""))
    end = len(b) - footer_len
    names, layouts, records = [], [], 0
    if version == 1:
        tag, nrec, nnames, nlayouts, offset = struct.unpack_from("<B7xQIIQ", b, end)
        assert tag == ord("E") and b[end + 32:] == b"DCTREND\0" and offset == end, "truncated: no valid footer"
        records = entries(b, header_len, end, reclen, names, layouts)
    else:
        assert b[end + 56:] == b"DCTREND\0", "truncated: no valid footer"
        tag, nblocks, nrec, nnames, nlayouts, offset, env_at, files_at, crc = struct.unpack_from("<B3xIQIIQQQ4xI", b, end)
        check(zlib.crc32(b[end + 56:], zlib.crc32(b[end:end + 52])) == crc, end, "footer checksum")
        check(tag == ord("E") and offset == end, end, "footer offset")
        check(header_len <= env_at <= files_at <= end, end, "section offsets")
        pos, blocks = header_len, 0
        while pos < env_at:
            block_end = pos + 16 + struct.unpack_from("<I", b, pos + 4)[0]
            check(block_end <= env_at, pos, "a block runs past the environment section")
            count, payload = section(b, pos, block_end, "B")
            got = entries(b, pos + 16, pos + 16 + len(payload), reclen, names, layouts)
            check(got == count, pos, f"the block says {count} records, holds {got}")
            records += got
            blocks += 1
            pos += 16 + len(payload)
        check(blocks == nblocks, end, f"the footer counts {nblocks} blocks, the file holds {blocks}")
        count, payload = section(b, env_at, files_at, "V")
        p, keys = 0, []
        for _ in range(count):
            klen, vlen = struct.unpack_from("<HH", payload, p)
            key = payload[p + 4:p + 4 + klen].decode()
            value = payload[p + 4 + klen:p + 4 + klen + vlen].decode()
            keys.append(key)
            print(f"environment: {key}={value}")
            p += 4 + klen + vlen
        check(p == len(payload) and keys == sorted(set(keys), key=str.encode), env_at, "environment entries")
        count, payload = section(b, files_at, end, "T")
        check(len(payload) == 32 * count, files_at, "tensor-file entries")
        folder = os.path.join(os.path.dirname(path), f"rank{rank}")
        for i in range(count):
            step, size = struct.unpack_from("<QQ", payload, 32 * i)
            md5 = payload[32 * i + 16:32 * i + 32].hex()
            print(f"tensor file: rank{rank}/step{step}.safetensors, {size} bytes, md5 {md5}")
            tensors = os.path.join(folder, f"step{step}.safetensors")
            data = open(tensors, "rb").read()  # FileNotFoundError names a deleted file
            if len(data) != size or hashlib.md5(data).hexdigest() != md5:
                raise ValueError(f"{tensors}: {len(data)} bytes, md5 {hashlib.md5(data).hexdigest()}, "
                                 f"but the trace lists {size} bytes, md5 {md5}")
    assert (records, len(names), len(layouts)) == (nrec, nnames, nlayouts), "counts differ from the footer"
    print(f"footer: {records} records, {len(names)} names, {len(layouts)} layouts")


if __name__ == "__main__":
    for path in sys.argv[1:]:
        read(path)
