"""Tensor digests and statistics computed on the tensor's own device (Triton kernels).

Recording a tensor that lives on a GPU used to mean copying it to the host and hashing it
there. This module computes, on the device and without any host synchronisation (no ``.item()``,
no ``.cpu()``; every size it needs is known on the host from the tensor's shape), the two
things a record holds:

``tree_digest_into(t, out)`` / ``tree_digest(t)``
    the 16-byte *tree digest* of the tensor's canonical bytes, defined below;
``stats_totals_into(t, out)``
    float64 ``[max, min, sum, sum_sq, nan_count, pos_inf_count, neg_inf_count]``.

Both have a batch form (``tree_digests_into``, ``stats_totals_batch_into``) that takes many
tensors in a few launches (one a level of the deepest tree; two a dtype), with the bits each
tensor would get alone: a recorded step's hundreds of records cost a few launches, not two each.

Canonical bytes
    The elements in row-major order, little-endian, no header: for torch
    ``t.contiguous().reshape(-1).view(torch.uint8)``. bool is one byte (0 or 1), complex is
    (real, imag) pairs, float8 is one byte. A conjugate or negative view is resolved first (the
    bytes are those of the values the tensor shows).

The tree digest (exact; the native ``detcheck._detcheck.tensor_digest`` computes the same)
    With C = 4096 bytes (a *chunk*) and md5 as in RFC 1321::

        D(x) = md5(x)                                        if len(x) <= 4096
        D(x) = D(md5(x[0:4096]) || md5(x[4096:8192]) || ...) otherwise

    the last chunk of a level may be shorter; an empty tensor gives md5(b"") =
    d41d8cd98f00b204e9800998ecf8427e. Each level hashes its chunks independently, which is what
    lets a GPU hash them in parallel; the next level is the concatenation of the 16-byte chunk
    digests, until one chunk remains, whose plain md5 is the digest.

Determinism
    Digests are bit-equal to the CPU definition on every device (integer arithmetic only).
    Statistics are reduced in a fixed order (a fixed partition into blocks of a constexpr size,
    one partial per block, then one program that reduces the partials in a fixed order), so they
    are a pure function of the values on a given device with a given Triton; they are not
    bit-equal to the CPU's statistics (a different summation order) and may differ between GPU
    models. max, min and the three counts are exact everywhere; only sum and sum_sq depend on
    the order. The kernels are compiled with FP contraction off (``enable_fp_fusion=False``) so
    the result does not follow Triton's changing default.

Limits
    * Supported dtypes: float32, float64, float16, bfloat16, float8_e4m3fn, float8_e5m2, int64,
      int32, int16, int8, uint8, uint16, bool, complex64, complex128. Others, nested tensors,
      meta tensors and sparse tensors raise ``TypeError``.
    * The kernels run where Triton runs: a CUDA tensor, or any CPU tensor when Triton's
      interpreter is on. ``TRITON_INTERPRET=1`` must be set *before triton is first imported*
      (by anything), hence before this module is: Triton 3.9 reads it when ``@triton.jit``
      decorates a function, i.e. when triton's own library (``tl.sum``, ...) and this module
      are imported. A mix (set between the two imports) raises ``ImportError`` here.
    * A non-contiguous tensor is made contiguous (a copy on its device), so is a byte buffer
      whose address is not a multiple of 4 (a 1- or 2-byte tensor sliced at an odd offset): the
      digest kernel reads whole 64-byte blocks as sixteen aligned uint32 words.
    * Statistics convert on the device where Triton cannot load the dtype directly (float8 ->
      float32, uint16 -> int32, both exact; bool is read as its 0/1 bytes; complex as 2n reals).
    * Sums are accumulated in float64; the counts are float64 sums of 0/1, exact up to 2**53.
"""

import contextlib
import math

import numpy as np
import torch
import triton
import triton.language as tl

from .._detcheck import supported_dtypes

#: Bytes per chunk of the tree digest (fixed by the definition; never change it).
CHUNK_BYTES = 4096
_CHUNK = tl.constexpr(CHUNK_BYTES)  # the same, for the kernel

#: Chunks (lanes) hashed by one program of the digest kernel: one lane per chunk, so a warp of
#: 32 lanes hashes 32 chunks side by side; two warps per program.
DIGEST_CHUNKS_PER_PROGRAM = 64
_DIGEST_NUM_WARPS = 2

#: Elements per tile of the statistics kernel, and tiles per program: one program turns
#: STATS_TILE * STATS_TILES_PER_PROGRAM consecutive elements into one partial. These, the
#: finishing program's lanes and the warps per program (which shape tl.sum's tree) are all part
#: of the reduction order: changing one changes sum and sum_sq in their last bits.
STATS_TILE = 1024
STATS_TILES_PER_PROGRAM = 8
#: Lanes of the single program that reduces the partials.
STATS_FINISH_TILE = 1024
#: 8 warps: 4 elements a thread per tile (one 16-byte load for float32), so the float64
#: accumulators leave room for several programs per SM.
_STATS_NUM_WARPS = 8

#: The seven totals, in the order ``stats_totals_into`` writes them.
STATS_FIELDS = ("max", "min", "sum", "sum_sq", "nan_count", "pos_inf_count", "neg_inf_count")

# RFC 1321 tables: K[i] = floor(|sin(i + 1)| * 2**32), the per-step left rotations and the
# message word each step reads (its index in the 16-word block).
_MD5_K = tl.constexpr(tuple(int(abs(math.sin(i + 1)) * 2**32) & 0xFFFFFFFF for i in range(64)))
_MD5_SHIFT = tl.constexpr(
    (7, 12, 17, 22) * 4 + (5, 9, 14, 20) * 4 + (4, 11, 16, 23) * 4 + (6, 10, 15, 21) * 4
)
_MD5_WORD = tl.constexpr(
    tuple(range(16))
    + tuple((5 * i + 1) % 16 for i in range(16))
    + tuple((3 * i + 5) % 16 for i in range(16))
    + tuple((7 * i) % 16 for i in range(16))
)


def _dtypes(*names):
    # getattr: an older torch without uint16 or float8 simply does not list them.
    return tuple(getattr(torch, name) for name in names if hasattr(torch, name))


#: The dtypes both functions accept.
SUPPORTED_DTYPES = _dtypes(*supported_dtypes())


# ---------------------------------------------------------------------------------------------
# MD5 of every 4096-byte chunk: one level of the tree digest.
# ---------------------------------------------------------------------------------------------


@triton.jit
def _md5_compress(a, b, c, d, words):
    """The 64 MD5 steps over one 64-byte block (``words``: 16 uint32 tensors, one per message
    word, each a vector over the lanes); returns the block's contribution to (a, b, c, d).

    All values are uint32: additions wrap modulo 2**32 (by design, so they are written
    ``tl.add(..., sanitize_overflow=False)``, not ``+``, whose overflow check Triton's interpreter
    would evaluate: three times the work) and >> is a logical shift,
    so the rotation needs no mask. The round functions are RFC 1321's F, G, H, I in forms with
    fewer operations (F = d ^ (b & (c ^ d)), G = c ^ (d & (b ^ c))). Nothing here calls a
    helper: Triton's interpreter pays dearly for each call, and this runs 64 times a block."""
    for i in tl.static_range(64):
        if i < 16:
            f = d ^ (b & (c ^ d))
        elif i < 32:
            f = c ^ (d & (b ^ c))
        elif i < 48:
            f = b ^ c ^ d
        else:
            f = c ^ (b | ~d)
        key = tl.add(words[_MD5_WORD[i]], _MD5_K[i], sanitize_overflow=False)
        x = tl.add(tl.add(a, f, sanitize_overflow=False), key, sanitize_overflow=False)
        rotated = (x << _MD5_SHIFT[i]) | (x >> (32 - _MD5_SHIFT[i]))
        a, b, c, d = d, tl.add(b, rotated, sanitize_overflow=False), b, c
    return a, b, c, d


@triton.jit
def _aligned_words(block_ptr, mask):
    """The 16 little-endian uint32 words of a full 64-byte block at ``block_ptr`` (uint32*,
    4-byte aligned), a vector over the lanes."""
    return (
        tl.load(block_ptr + 0, mask=mask, other=0),
        tl.load(block_ptr + 1, mask=mask, other=0),
        tl.load(block_ptr + 2, mask=mask, other=0),
        tl.load(block_ptr + 3, mask=mask, other=0),
        tl.load(block_ptr + 4, mask=mask, other=0),
        tl.load(block_ptr + 5, mask=mask, other=0),
        tl.load(block_ptr + 6, mask=mask, other=0),
        tl.load(block_ptr + 7, mask=mask, other=0),
        tl.load(block_ptr + 8, mask=mask, other=0),
        tl.load(block_ptr + 9, mask=mask, other=0),
        tl.load(block_ptr + 10, mask=mask, other=0),
        tl.load(block_ptr + 11, mask=mask, other=0),
        tl.load(block_ptr + 12, mask=mask, other=0),
        tl.load(block_ptr + 13, mask=mask, other=0),
        tl.load(block_ptr + 14, mask=mask, other=0),
        tl.load(block_ptr + 15, mask=mask, other=0),
    )


@triton.jit
def _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, J: tl.constexpr):
    """Word ``J`` of the padded-message block that starts at byte ``block_pos`` of the chunk:
    the chunk's bytes before ``chunk_len``, then 0x80, then zeros; in the final block, words 14
    and 15 are the message length in bits (64-bit little-endian; below 2**32 as chunks are at
    most 4096 bytes). Assembled from masked byte loads, so any length and alignment works."""
    word = tl.full(chunk_len.shape, 0, tl.uint32)
    for k in tl.static_range(4):
        pos = block_pos + (4 * J + k)
        byte = tl.load(chunk_ptr + pos, mask=mask & (pos < chunk_len), other=0).to(tl.uint32)
        byte = tl.where(pos == chunk_len, 0x80, byte)
        word = word | (byte << (8 * k))
    if J == 14:
        word = tl.where(is_final_block, (chunk_len * 8).to(tl.uint32), word)
    if J == 15:
        word = tl.where(is_final_block, 0, word)
    return word


@triton.jit
def _padded_words(chunk_ptr, chunk_len, block_pos, is_final_block, mask):
    return (
        _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, 0),
        _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, 1),
        _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, 2),
        _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, 3),
        _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, 4),
        _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, 5),
        _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, 6),
        _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, 7),
        _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, 8),
        _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, 9),
        _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, 10),
        _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, 11),
        _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, 12),
        _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, 13),
        _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, 14),
        _padded_word(chunk_ptr, chunk_len, block_pos, is_final_block, mask, 15),
    )


@triton.jit(do_not_specialize=["n_programs"])
def _md5_chunks_kernel(table_ptr, n_programs, CHUNKS: tl.constexpr):
    """Hashes up to CHUNKS consecutive 4096-byte chunks of one buffer. Program ``pid`` reads its
    row of ``table`` (int64, three columns of ``n_programs``: ``src``, ``n_bytes``, ``dst``, the
    first two and the last addresses): ``dst[16 i : 16 i + 16] = md5(src[4096 i : min(4096
    (i + 1), n_bytes)])`` for every chunk ``i < min(CHUNKS, ceil(n_bytes / 4096))``, and one
    chunk of length 0 when ``n_bytes`` is 0.

    One launch hashes many buffers (every record of a batch, one level of their trees): what
    costs is the launch and a chunk's 65 dependent block steps, not the bytes, so a record
    alone would pay both for its 16 bytes of digest. Lanes are chunks, each walking its chunk's
    64-byte blocks in order. ``src`` must be 4-byte aligned (full blocks are read as uint32
    words); ``dst`` need not be (bytes are stored one by one, 16 per chunk, which is nothing
    next to the 4096 read)."""
    pid = tl.program_id(0)
    src_addr = tl.load(table_ptr + pid)
    n_bytes = tl.load(table_ptr + n_programs + pid)
    dst_addr = tl.load(table_ptr + 2 * n_programs + pid)
    lane = tl.arange(0, CHUNKS).to(tl.int64)
    chunk_start = lane * _CHUNK
    is_chunk = (chunk_start < n_bytes) | (lane == 0)
    # Bytes in each lane's chunk (0 for lanes past the end, whose stores are masked off).
    chunk_len = tl.minimum(tl.maximum(n_bytes - chunk_start, 0), _CHUNK).to(tl.int32)
    chunk_ptr = src_addr.to(tl.pointer_type(tl.uint8)) + chunk_start

    a = tl.full([CHUNKS], 0x67452301, tl.uint32)
    b = tl.full([CHUNKS], 0xEFCDAB89, tl.uint32)
    c = tl.full([CHUNKS], 0x98BADCFE, tl.uint32)
    d = tl.full([CHUNKS], 0x10325476, tl.uint32)

    # The full 64-byte blocks: 64 for every chunk but the buffer's last, read as aligned words.
    # Only a program holding the last chunk has lanes with fewer; they sit out (masked) once
    # their blocks are done. The loop runs as long as the program's longest lane, its first
    # (computed as a scalar: no cross-lane reduction).
    full_blocks = chunk_len // 64
    most_full_blocks = tl.minimum(tl.maximum(n_bytes, 0), _CHUNK) // 64
    for block in range(0, most_full_blocks):
        in_block = block < full_blocks
        words = _aligned_words((chunk_ptr + block * 64).to(tl.pointer_type(tl.uint32)), in_block)
        da, db, dc, dd = _md5_compress(a, b, c, d, words)
        a = tl.where(in_block, tl.add(a, da, sanitize_overflow=False), a)
        b = tl.where(in_block, tl.add(b, db, sanitize_overflow=False), b)
        c = tl.where(in_block, tl.add(c, dc, sanitize_overflow=False), c)
        d = tl.where(in_block, tl.add(d, dd, sanitize_overflow=False), d)

    # The padding: the remaining chunk_len % 64 bytes, 0x80, zeros and the 8-byte bit length
    # fill one block when at most 55 bytes remain, two otherwise.
    tail_blocks = tl.where(chunk_len % 64 < 56, 1, 2)
    for tail in range(0, 2):
        in_block = tail < tail_blocks
        block_pos = (full_blocks + tail) * 64
        words = _padded_words(chunk_ptr, chunk_len, block_pos, tail == tail_blocks - 1, in_block)
        da, db, dc, dd = _md5_compress(a, b, c, d, words)
        a = tl.where(in_block, tl.add(a, da, sanitize_overflow=False), a)
        b = tl.where(in_block, tl.add(b, db, sanitize_overflow=False), b)
        c = tl.where(in_block, tl.add(c, dc, sanitize_overflow=False), c)
        d = tl.where(in_block, tl.add(d, dd, sanitize_overflow=False), d)

    # The digest is a, b, c, d, each little-endian.
    digest_ptr = dst_addr.to(tl.pointer_type(tl.uint8)) + lane * 16
    for k in tl.static_range(4):
        shift = 8 * k
        tl.store(digest_ptr + k, ((a >> shift) & 0xFF).to(tl.uint8), mask=is_chunk)
        tl.store(digest_ptr + 4 + k, ((b >> shift) & 0xFF).to(tl.uint8), mask=is_chunk)
        tl.store(digest_ptr + 8 + k, ((c >> shift) & 0xFF).to(tl.uint8), mask=is_chunk)
        tl.store(digest_ptr + 12 + k, ((d >> shift) & 0xFF).to(tl.uint8), mask=is_chunk)


# ---------------------------------------------------------------------------------------------
# Statistics totals: per-program partials, then one program reducing them in a fixed order.
# ---------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["n_programs"])
def _stats_partials_kernel(
    table_ptr, partials_ptr, n_programs, DTYPE: tl.constexpr, TILE: tl.constexpr,
    TILES: tl.constexpr,
):  # fmt: skip
    """Partial totals of the TILE * TILES elements (fewer at a tensor's end) of program ``pid``
    into ``partials[field * n_programs + pid]`` (fields in STATS_FIELDS order). Program ``pid``
    reads its row of ``table`` (int64, two columns of ``n_programs``): the address of its first
    element (of type DTYPE) and the number of its tensor's elements from there on. One launch
    takes every tensor of a batch of one DTYPE; a tensor's partials are those a launch of its own
    would give (the same elements per program, lane by lane in the same order)."""
    pid = tl.program_id(0)
    x_ptr = tl.load(table_ptr + pid).to(tl.pointer_type(DTYPE))
    n = tl.load(table_ptr + n_programs + pid)
    lanes = tl.arange(0, TILE)
    top = tl.full([TILE], float("-inf"), tl.float64)
    bottom = tl.full([TILE], float("inf"), tl.float64)
    total = tl.zeros([TILE], tl.float64)
    total_sq = tl.zeros([TILE], tl.float64)
    nans = tl.zeros([TILE], tl.int32)  # at most TILES a lane
    pos_infs = tl.zeros([TILE], tl.int32)
    neg_infs = tl.zeros([TILE], tl.int32)
    for tile in range(0, TILES):
        offsets = tile * TILE + lanes.to(tl.int64)
        present = offsets < n
        x = tl.load(x_ptr + offsets, mask=present, other=0).to(tl.float64)
        is_nan = present & (x != x)
        is_pos_inf = present & (x == float("inf"))
        is_neg_inf = present & (x == float("-inf"))
        finite = present & (x == x) & (x != float("inf")) & (x != float("-inf"))
        top = tl.maximum(top, tl.where(finite, x, float("-inf")))
        bottom = tl.minimum(bottom, tl.where(finite, x, float("inf")))
        x = tl.where(finite, x, 0.0)
        total += x
        total_sq += x * x
        nans += is_nan.to(tl.int32)
        pos_infs += is_pos_inf.to(tl.int32)
        neg_infs += is_neg_inf.to(tl.int32)
    field = partials_ptr + pid
    tl.store(field, tl.max(top, axis=0))
    tl.store(field + n_programs, tl.min(bottom, axis=0))
    tl.store(field + 2 * n_programs, tl.sum(total, axis=0))
    tl.store(field + 3 * n_programs, tl.sum(total_sq, axis=0))
    tl.store(field + 4 * n_programs, tl.sum(nans, axis=0).to(tl.float64))
    tl.store(field + 5 * n_programs, tl.sum(pos_infs, axis=0).to(tl.float64))
    tl.store(field + 6 * n_programs, tl.sum(neg_infs, axis=0).to(tl.float64))


@triton.jit(do_not_specialize=["n_outs", "n_programs"])
def _stats_finish_kernel(table_ptr, partials_ptr, n_outs, n_programs, TILE: tl.constexpr):
    """Program ``pid`` finishes one tensor: its row of ``table`` (int64, four columns of
    ``n_outs``) gives its first partial, its number of partials ``count``, and the address and
    stride (in float64 elements) of its ``out``; ``out[field * stride]`` = the reduction of
    ``partials[field * n_programs + first + i]`` over ``i < count``: lane l takes partials l,
    l + TILE, l + 2 TILE, ... in order, then the lanes are reduced by the fixed tree of tl.max /
    tl.min / tl.sum. One program a tensor, so no order depends on timing."""
    pid = tl.program_id(0)
    first = tl.load(table_ptr + pid)
    count = tl.load(table_ptr + n_outs + pid)
    out_ptr = tl.load(table_ptr + 2 * n_outs + pid).to(tl.pointer_type(tl.float64))
    out_stride = tl.load(table_ptr + 3 * n_outs + pid)
    lanes = tl.arange(0, TILE).to(tl.int64)
    top = tl.full([TILE], float("-inf"), tl.float64)
    bottom = tl.full([TILE], float("inf"), tl.float64)
    total = tl.zeros([TILE], tl.float64)
    total_sq = tl.zeros([TILE], tl.float64)
    nans = tl.zeros([TILE], tl.float64)
    pos_infs = tl.zeros([TILE], tl.float64)
    neg_infs = tl.zeros([TILE], tl.float64)
    for start in range(0, count, TILE):
        index = start + lanes
        present = index < count
        field = partials_ptr + first + index
        top = tl.maximum(top, tl.load(field, mask=present, other=float("-inf")))
        bottom = tl.minimum(bottom, tl.load(field + n_programs, mask=present, other=float("inf")))
        total += tl.load(field + 2 * n_programs, mask=present, other=0.0)
        total_sq += tl.load(field + 3 * n_programs, mask=present, other=0.0)
        nans += tl.load(field + 4 * n_programs, mask=present, other=0.0)
        pos_infs += tl.load(field + 5 * n_programs, mask=present, other=0.0)
        neg_infs += tl.load(field + 6 * n_programs, mask=present, other=0.0)
    tl.store(out_ptr, tl.max(top, axis=0))
    tl.store(out_ptr + out_stride, tl.min(bottom, axis=0))
    tl.store(out_ptr + 2 * out_stride, tl.sum(total, axis=0))
    tl.store(out_ptr + 3 * out_stride, tl.sum(total_sq, axis=0))
    tl.store(out_ptr + 4 * out_stride, tl.sum(nans, axis=0))
    tl.store(out_ptr + 5 * out_stride, tl.sum(pos_infs, axis=0))
    tl.store(out_ptr + 6 * out_stride, tl.sum(neg_infs, axis=0))


# ---------------------------------------------------------------------------------------------
# Host side: checks, canonical views and launches (sizes only; nothing waits for the device).
# ---------------------------------------------------------------------------------------------


def _interpreted(function):
    return not isinstance(function, triton.runtime.jit.JITFunction)


#: Whether the kernels run in Triton's interpreter (decided when this module was imported).
INTERPRETED = _interpreted(_md5_chunks_kernel)
if INTERPRETED != _interpreted(tl.sum):
    # Triton's own library (tl.sum, tl.max, ...) is decorated when triton is imported, these
    # kernels when this module is: a kernel of one kind cannot call functions of the other.
    raise ImportError(
        "TRITON_INTERPRET changed between the first `import triton` and `import "
        "detcheck._torch.device`: set it (or not) before anything imports triton"
    )


def _check_tensor(t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"cannot {what} a {type(t).__name__}: a torch.Tensor is needed")
    if t.is_nested:
        raise TypeError(
            f"cannot {what} a nested tensor: it has no single row-major layout "
            "(do it for each component, `t.unbind()`)"
        )
    if t.is_meta:
        raise TypeError(f"cannot {what} a meta tensor: it has no values")
    if t.layout != torch.strided:
        raise TypeError(f"cannot {what} a {t.layout} tensor: make it dense first (`t.to_dense()`)")
    if t.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(dtype).replace("torch.", "") for dtype in SUPPORTED_DTYPES)
        raise TypeError(f"cannot {what} a tensor of dtype {t.dtype}: supported are {names}")
    if t.device.type == "cpu" and not INTERPRETED:
        raise ValueError(
            f"cannot {what} a CPU tensor on the device: the Triton kernels need a GPU tensor "
            "(or TRITON_INTERPRET=1 set before triton is first imported)"
        )
    # The values the tensor shows: a lazily conjugated or negated view is resolved (a copy).
    return t.detach().resolve_conj().resolve_neg()


def _check_out(out, dtype, numel, t, what):
    if not isinstance(out, torch.Tensor) or out.dtype != dtype or out.numel() != numel:
        raise TypeError(f"{what} needs `out` to be a {dtype} tensor of {numel} elements")
    if out.device != t.device:
        raise ValueError(f"`out` is on {out.device}, the tensor on {t.device}")


def canonical_bytes(t: torch.Tensor) -> torch.Tensor:
    """The canonical bytes of ``t`` as a contiguous uint8 tensor on its device whose address is
    a multiple of 4 (a view when ``t`` already is one, otherwise a copy)."""
    t = _check_tensor(t, "digest")
    data = t.contiguous().reshape(-1).view(torch.uint8)
    # The digest kernel reads full blocks as aligned uint32 words: a 1- or 2-byte tensor sliced
    # at an odd offset (x[1:]) is copied to a fresh allocation (always aligned).
    if data.data_ptr() % 4 != 0:
        data = data.clone()
    return data


def _on(device):
    """Triton launches on the *current* CUDA device and its current stream: make it the
    tensor's (the stream is then the one torch's own work on that device is queued on)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _triton_dtype(dtype):
    """Triton's name for a dtype ``_stats_values`` gives (a float, a signed or an unsigned int)."""
    return getattr(tl, str(dtype).removeprefix("torch."))


def _device_table(columns, device):
    """An int64 table (columns one after another) on ``device``, through pinned memory and the
    current stream: no host synchronisation."""
    table = torch.from_numpy(np.concatenate(columns).astype(np.int64))
    if device.type == "cuda":
        table = table.pin_memory().to(device, non_blocking=True)
    return table


#: Bytes of a buffer hashed by one program of the digest kernel.
_PROGRAM_BYTES = CHUNK_BYTES * DIGEST_CHUNKS_PER_PROGRAM


def _digest_levels(addresses, sizes, finals, scratch):
    """The digest kernel's table for every level of the trees of buffers at ``addresses`` (int64
    arrays, bytes) of ``sizes`` whose digests go to ``finals``: a list of ``(src, n_bytes, dst)``
    arrays, one row per program, a level per entry. A buffer of at most 4096 bytes is hashed into
    its final place; a longer one into ``scratch(n)`` (a new device buffer of n bytes, returned
    by address), whose chunk digests are the buffer of the next level."""
    levels = []
    while addresses.size:
        chunks = np.maximum(1, -(-sizes // CHUNK_BYTES))
        final = sizes <= CHUNK_BYTES
        programs = -(-chunks // DIGEST_CHUNKS_PER_PROGRAM)
        owner = np.repeat(np.arange(addresses.size), programs)
        index = np.arange(owner.size) - (np.cumsum(programs) - programs)[owner]
        # The digests of the longer buffers' chunks, one after another in one scratch buffer.
        inner_chunks = np.where(final, 0, chunks)
        total = int(inner_chunks.sum())
        base = np.cumsum(inner_chunks) - inner_chunks
        if total:
            base = base * 16 + scratch(16 * total)
        dst = np.where(
            final[owner], finals[owner], base[owner] + index * (16 * DIGEST_CHUNKS_PER_PROGRAM)
        )
        levels.append(
            (addresses[owner] + index * _PROGRAM_BYTES, sizes[owner] - index * _PROGRAM_BYTES, dst)
        )
        inner = ~final
        addresses, sizes, finals = base[inner], 16 * chunks[inner], finals[inner]
    return levels


def tree_digests_into(tensors, outs) -> None:
    """Write the tree digest of each tensor of ``tensors`` into the ``out`` beside it (uint8, 16
    contiguous elements, on the tensors' device, which must be one device). One launch per
    level of the deepest tree, whatever the number of tensors (a 4 KiB record has one level, a
    1 GiB record four): the launches and each chunk's chain of block steps are paid once for
    the batch, not once a record. No host synchronisation: the table of addresses goes to the
    device through pinned memory, on the current stream."""
    datas = [canonical_bytes(t) for t in tensors]
    if len(datas) != len(outs):
        raise ValueError(f"tree_digests_into: {len(datas)} tensors but {len(outs)} outs")
    if not datas:
        return
    device = datas[0].device
    for data, out in zip(datas, outs):
        if data.device != device:
            raise ValueError(f"tree_digests_into: tensors on {device} and on {data.device}")
        _check_out(out, torch.uint8, 16, data, "tree_digests_into")
        if not out.is_contiguous():
            raise ValueError("tree_digests_into needs each `out` to be 16 adjacent bytes")
    scratch = []

    def allocate(n_bytes):
        scratch.append(torch.empty(n_bytes, dtype=torch.uint8, device=device))
        return scratch[-1].data_ptr()

    with _on(device):
        levels = _digest_levels(
            np.array([d.data_ptr() for d in datas], dtype=np.int64),
            np.array([d.numel() for d in datas], dtype=np.int64),
            np.array([o.data_ptr() for o in outs], dtype=np.int64),
            allocate,
        )
        table = _device_table([np.concatenate(level) for level in levels], device)
        offset = 0
        for src, _, _ in levels:
            _md5_chunks_kernel[(src.size,)](
                table[offset:], src.size, CHUNKS=DIGEST_CHUNKS_PER_PROGRAM,
                num_warps=_DIGEST_NUM_WARPS,
            )  # fmt: skip
            offset += 3 * src.size
    # `datas`, `scratch` and `table` go back to the allocator now: on the stream the kernels
    # were queued on, so no later work reuses them before the kernels are done.


def tree_digest_into(t: torch.Tensor, out: torch.Tensor) -> None:
    """Write the 16-byte tree digest of ``t``'s canonical bytes into ``out`` (uint8, 16
    elements, on ``t``'s device; it may be a view into a larger buffer, only its 16 bytes are
    written). One kernel launch per level of the tree; no host synchronisation."""
    data = canonical_bytes(t)
    _check_out(out, torch.uint8, 16, data, "tree_digest_into")
    # The final level writes straight into `out` (byte stores: any address will do) unless its
    # 16 bytes are not adjacent.
    final = out if out.is_contiguous() else torch.empty(16, dtype=torch.uint8, device=out.device)
    tree_digests_into([data], [final])
    if final is not out:
        out.copy_(final.view(out.shape))


def tree_digest(t: torch.Tensor) -> torch.Tensor:
    """The tree digest of ``t``: a uint8 tensor of 16 elements on ``t``'s device."""
    device = t.device if isinstance(t, torch.Tensor) else None  # not a tensor: raises below
    out = torch.empty(16, dtype=torch.uint8, device=device)
    tree_digest_into(t, out)
    return out


_FLOAT8_DTYPES = _dtypes("float8_e4m3fn", "float8_e5m2")


def _stats_values(t):
    """``t``'s values as a flat, contiguous tensor of a dtype the statistics kernel loads, in
    canonical order. Conversions stay on the device and are exact."""
    t = _check_tensor(t, "compute statistics of")
    if t.is_complex():
        t = torch.view_as_real(t)  # (real, imag) pairs: 2n reals, in canonical byte order
    if t.dtype in _FLOAT8_DTYPES:
        t = t.to(torch.float32)
    elif t.dtype == torch.bool:
        t = t.view(torch.uint8)  # the 0/1 bytes themselves
    elif t.dtype == getattr(torch, "uint16", None):
        t = t.to(torch.int32)
    return t.contiguous().reshape(-1)


def stats_totals_batch_into(tensors, outs) -> None:
    """``stats_totals_into(t, out)`` for each tensor of ``tensors`` and the ``out`` beside it
    (on the tensors' device, which must be one device), with the same bits, in two launches per
    dtype of values in the batch (a GPT-2 step's records: two dtypes) rather than two a tensor:
    the partials of every tensor of a dtype in one launch, then every tensor's finish in one."""
    values = [_stats_values(t) for t in tensors]
    if len(values) != len(outs):
        raise ValueError(f"stats_totals_batch_into: {len(values)} tensors but {len(outs)} outs")
    if not values:
        return
    device = values[0].device
    finals = []
    for v, out in zip(values, outs):
        if v.device != device:
            raise ValueError(f"stats_totals_batch_into: tensors on {device} and on {v.device}")
        _check_out(out, torch.float64, 7, v, "stats_totals_into")
        # The finish kernel stores with a stride: a 1-D `out` is written in place whatever its
        # stride; another shape only when contiguous, or through a temporary.
        if out.dim() == 1 or out.is_contiguous():
            finals.append((out, out.stride(0) if out.dim() == 1 else 1))
        else:
            finals.append((torch.empty(7, dtype=torch.float64, device=device), 1))
    per_program = STATS_TILE * STATS_TILES_PER_PROGRAM
    groups: dict[torch.dtype, list[int]] = {}
    for index, v in enumerate(values):
        groups.setdefault(v.dtype, []).append(index)
    # `values`, each group's `partials` and tables go back to the allocator when they are
    # dropped: on the stream the kernels were queued on, so no later work reuses them before
    # the kernels are done.
    with _on(device):
        for dtype, members in groups.items():
            sizes = np.array([values[i].numel() for i in members], dtype=np.int64)
            programs = np.maximum(1, -(-sizes // per_program))
            n_programs = int(programs.sum())
            owner = np.repeat(np.arange(len(members)), programs)
            first = np.cumsum(programs) - programs
            index = np.arange(n_programs) - first[owner]
            starts = np.array([values[i].data_ptr() for i in members], dtype=np.int64)
            element = values[members[0]].element_size()
            rows = _device_table(
                [starts[owner] + index * per_program * element, sizes[owner] - index * per_program],
                device,
            )
            partials = torch.empty(7 * n_programs, dtype=torch.float64, device=device)
            finish = _device_table(
                [
                    first,
                    programs,
                    np.array([finals[i][0].data_ptr() for i in members], dtype=np.int64),
                    np.array([finals[i][1] for i in members], dtype=np.int64),
                ],
                device,
            )
            _stats_partials_kernel[(n_programs,)](
                rows, partials, n_programs, DTYPE=_triton_dtype(dtype), TILE=STATS_TILE,
                TILES=STATS_TILES_PER_PROGRAM, num_warps=_STATS_NUM_WARPS, enable_fp_fusion=False,
            )  # fmt: skip
            _stats_finish_kernel[(len(members),)](
                finish, partials, len(members), n_programs, TILE=STATS_FINISH_TILE,
                num_warps=_STATS_NUM_WARPS, enable_fp_fusion=False,
            )  # fmt: skip
    for (final, _), out in zip(finals, outs):
        if final is not out:
            out.copy_(final.view(out.shape))


def stats_totals_into(t: torch.Tensor, out: torch.Tensor) -> None:
    """Write float64 ``[max, min, sum, sum_sq, nan_count, pos_inf_count, neg_inf_count]`` of
    ``t`` into ``out`` (float64, 7 elements, on ``t``'s device, any stride). max, min, sum and
    sum_sq are over the finite elements converted to float64 (max = -inf, min = +inf, sums 0.0
    when there is none). Fixed reduction order, no host synchronisation."""
    stats_totals_batch_into([t], [out])


def stats_totals(t: torch.Tensor) -> torch.Tensor:
    """``stats_totals_into`` into a new float64 tensor of 7 elements on ``t``'s device."""
    device = t.device if isinstance(t, torch.Tensor) else None  # not a tensor: raises below
    out = torch.empty(7, dtype=torch.float64, device=device)
    stats_totals_into(t, out)
    return out
