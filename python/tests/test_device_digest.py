"""detcheck._torch.device: the tree digest and statistics totals computed by Triton kernels.

On a machine with CUDA the kernels run on the GPU; elsewhere they run in Triton's interpreter
on CPU tensors (TRITON_INTERPRET=1, set by conftest.py before triton is first imported: Triton 3.9
reads it when ``@triton.jit`` decorates, i.e. at import). Digests are compared bit for bit with
the pure-Python definition (``tree_digest_ref``) and, once the native module has it, with
``detcheck._detcheck.tensor_digest``; statistics with a float64 reference (max, min and counts
exactly, sum and sum_sq within a tolerance: the order differs) and with themselves (two calls
give the same bits).

The interpreter walks each 4096-byte chunk's 64 MD5 blocks one after another (about a second
per chunk-deep level), so inputs above a chunk are few and chosen: the byte-length boundaries
on uint8, one two-chunk input per dtype, one three-level input (1 MiB + 37 bytes)."""

import hashlib
import math
import os
import subprocess
import sys
import textwrap

import pytest
from support import requires, tree_digest

requires("torch")
import torch  # noqa: E402

requires("triton")  # imported after conftest.py set TRITON_INTERPRET (on a machine without CUDA)

import detcheck._detcheck as native  # noqa: E402
from detcheck._torch import device as _device  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

ALL_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.uint16,
    torch.bool,
    torch.complex64,
    torch.complex128,
]


#: The full tier (docs/testing.md): on the CPU, Triton's interpreter takes ~4 s a 4 KiB chunk, so
#: CI digests one dtype of each width and kind (every dtype's bytes reach the same kernel) and the
#: byte lengths around each padding case and chunk boundary once; a GPU run takes them all.
FULL_DIGEST = pytest.mark.full(covered_by="test_device_digest.py::test_digest_every_dtype")
FULL_LENGTHS = pytest.mark.full(covered_by="test_device_digest.py::test_digest_byte_lengths")
CI_DTYPES = {torch.float32, torch.bfloat16, torch.float8_e5m2, torch.int64, torch.bool}


def dtype_params(full_mark=None):
    """ALL_DTYPES as parameters: those not in CI_DTYPES with ``full_mark``."""
    return [
        pytest.param(d, marks=() if full_mark is None or d in CI_DTYPES else full_mark)
        for d in ALL_DTYPES
    ]


def expected_digest(b: bytes) -> bytes:
    """``tree_digest(b)`` (the definition, in Python), checked against the native (Rust)
    implementation."""
    want = tree_digest(b)
    assert bytes(native.tensor_digest(b)) == want, "the native tensor_digest disagrees"
    return want


def reference_bytes(t) -> bytes:
    """The canonical bytes of ``t`` computed apart from detcheck._torch.device: numpy's C-order
    bytes, through a same-size integer view for the dtypes numpy lacks."""
    t = t.detach().cpu().resolve_conj()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    elif t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        t = t.view(torch.uint8)
    return t.numpy().tobytes(order="C")


def random_tensor(dtype, count, seed=0):
    """``count`` elements of ``dtype`` made of random bytes (every bit pattern, NaN payloads
    included), bool as random 0/1."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=g, dtype=torch.uint8).bool()
    itemsize = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (count * itemsize,), generator=g, dtype=torch.uint8)
    return raw.view(dtype)


def device_digest(t) -> bytes:
    """``tree_digest(t)`` as bytes; on a GPU, any host synchronisation inside is an error."""
    if DEVICE == "cuda":
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = _device.tree_digest(t)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    else:
        out = _device.tree_digest(t)
    assert out.dtype == torch.uint8 and out.shape == (16,) and out.device == t.device
    return bytes(out.cpu().tolist())


def device_stats(t):
    """``stats_totals(t)`` as a CPU float64 tensor; on a GPU, any host sync is an error."""
    if DEVICE == "cuda":
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = _device.stats_totals(t)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    else:
        out = _device.stats_totals(t)
    assert out.dtype == torch.float64 and out.shape == (7,) and out.device == t.device
    return out.cpu()


def test_runs_where_expected():
    # No GPU: the interpreter; a GPU: compiled kernels.
    assert _device.INTERPRETED == (DEVICE == "cpu")


def test_kernels_compile_for_h100():
    # The interpreter accepts some code the compiler does not: compile every kernel for sm_90
    # (no GPU needed; Triton's own ptxas), in a fresh interpreter without TRITON_INTERPRET.
    script = textwrap.dedent(
        """
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from detcheck._torch import device as dv

        assert not dv.INTERPRETED
        h100 = GPUTarget("cuda", 90, 32)

        def build(kernel, signature, constexprs, num_warps):
            source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
            options = {"num_warps": num_warps, "enable_fp_fusion": False}
            return triton.compile(source, target=h100, options=options)

        # One variant (about 7 s: 128 unrolled MD5 steps).
        build(dv._md5_chunks_kernel,
              {"table_ptr": "*i64", "n_programs": "i32", "CHUNKS": "constexpr"},
              {"CHUNKS": dv.DIGEST_CHUNKS_PER_PROGRAM}, dv._DIGEST_NUM_WARPS)
        import torch
        for element in (torch.float32, torch.bfloat16, torch.int64, torch.uint8):
            # A float, its widening, signed, unsigned.
            build(dv._stats_partials_kernel,
                  {"table_ptr": "*i64", "partials_ptr": "*fp64", "n_programs": "i32",
                   "DTYPE": "constexpr", "TILE": "constexpr", "TILES": "constexpr"},
                  {"DTYPE": dv._triton_dtype(element), "TILE": dv.STATS_TILE,
                   "TILES": dv.STATS_TILES_PER_PROGRAM},
                  dv._STATS_NUM_WARPS)
        build(dv._stats_finish_kernel,
              {"table_ptr": "*i64", "partials_ptr": "*fp64", "n_outs": "i32",
               "n_programs": "i32", "TILE": "constexpr"},
              {"TILE": dv.STATS_FINISH_TILE}, dv._STATS_NUM_WARPS)
        print("compiled")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "0"  # silences Triton 3.9's warning; the launches set it
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and "compiled" in done.stdout, done.stdout + done.stderr


def test_reference_definition():
    # The reference itself, on values fixed by the definition.
    assert tree_digest(b"").hex() == "d41d8cd98f00b204e9800998ecf8427e"
    assert tree_digest(b"a" * 4096) == hashlib.md5(b"a" * 4096).digest()
    two = b"a" * 4097
    level = hashlib.md5(b"a" * 4096).digest() + hashlib.md5(b"a").digest()
    assert tree_digest(two) == hashlib.md5(level).digest()


@pytest.mark.parametrize(
    "n_bytes",
    [0, 1, 55, 56, 63, 64, 65, 4097, 8193]
    + [pytest.param(n, marks=FULL_LENGTHS) for n in (4095, 4096, 8192, 12345)],
)
def test_digest_byte_lengths(n_bytes):
    # Every MD5 padding case (55/56 remaining bytes: one or two padding blocks), every chunk
    # boundary; the kernel sees bytes only, so uint8 stands for every dtype here.
    t = random_tensor(torch.uint8, n_bytes, seed=n_bytes)
    assert device_digest(t.to(DEVICE)) == expected_digest(reference_bytes(t))


def test_digest_empty_is_md5_of_nothing():
    for dtype in (torch.float32, torch.uint8, torch.complex128):
        t = torch.empty((0, 3), dtype=dtype, device=DEVICE)
        assert device_digest(t).hex() == "d41d8cd98f00b204e9800998ecf8427e"


# The full tier: one_batch digests a tree of three levels beside others.
@pytest.mark.full(covered_by="test_device_digest.py::test_one_batch_digests_every_tensor_as_alone")
def test_digest_three_levels():
    # 1 MiB + 37 bytes: 257 chunks (five programs of 64 lanes, the last with one), whose 4112
    # bytes of digests make two chunks, whose 32 bytes make the digest.
    t = random_tensor(torch.uint8, (1 << 20) + 37, seed=7)
    assert device_digest(t.to(DEVICE)) == expected_digest(reference_bytes(t))


def test_one_batch_digests_every_tensor_as_alone():
    # tree_digests_into hashes every level of every tree in one launch a level: trees of one,
    # two and three levels side by side (one leaves the batch after level 0, another after
    # level 1), an empty tensor, a misaligned view, two programs of one buffer, mixed dtypes.
    sizes = [(1 << 20) + 37, 0, 1, 56, 4096, 4097, 64 * 4096 + 3, 12345]
    tensors = [random_tensor(torch.uint8, n, seed=20 + n).to(DEVICE) for n in sizes]
    tensors.append(random_tensor(torch.int8, 300, seed=9).to(DEVICE)[1:])
    tensors.append(random_tensor(torch.complex64, 700, seed=4).to(DEVICE).conj())
    tensors.append(random_tensor(torch.bfloat16, 3, seed=2).to(DEVICE))
    outs = torch.full((len(tensors) + 1, 16), 0xAB, dtype=torch.uint8, device=DEVICE)
    if DEVICE == "cuda":
        torch.cuda.set_sync_debug_mode("error")
    try:
        _device.tree_digests_into(tensors, list(outs[:-1]))
    finally:
        if DEVICE == "cuda":
            torch.cuda.set_sync_debug_mode("default")
    got = outs.cpu()
    for i, t in enumerate(tensors):
        want = expected_digest(reference_bytes(t.resolve_conj()))
        assert bytes(got[i].tolist()) == want, (i, t.shape, t.dtype)
    assert (got[-1] == 0xAB).all()  # nothing written past the outs
    _device.tree_digests_into([], [])  # nothing to do
    with pytest.raises(ValueError, match="2 tensors but 1 outs"):
        _device.tree_digests_into(tensors[:2], list(outs[:1]))
    with pytest.raises(ValueError, match="16 adjacent bytes"):
        _device.tree_digests_into(tensors[:1], [outs.view(-1)[0:32:2]])


@pytest.mark.parametrize(
    "dtype", dtype_params(FULL_DIGEST), ids=lambda d: str(d).replace("torch.", "")
)
def test_digest_every_dtype(dtype):
    itemsize = torch.empty(0, dtype=dtype).element_size()
    # 0, 1 and 3 elements, and one element past a chunk (two chunks, the second partial).
    for count in (0, 1, 3, 4096 // itemsize + 1):
        t = random_tensor(dtype, count, seed=count)
        assert device_digest(t.to(DEVICE)) == expected_digest(reference_bytes(t)), count


def test_digest_zero_dim():
    t = torch.tensor(1.5, dtype=torch.float64)
    assert device_digest(t.to(DEVICE)) == expected_digest(reference_bytes(t))


def test_digest_non_contiguous_is_that_of_the_contiguous_copy():
    base = random_tensor(torch.float32, 13 * 29, seed=3).reshape(13, 29).to(DEVICE)
    for view in (base.t(), base[:, ::2], base[5:30:3, 1:]):
        assert not view.is_contiguous()
        want = expected_digest(reference_bytes(view.contiguous()))
        assert device_digest(view) == want


def test_digest_conjugate_view_is_that_of_its_values():
    z = random_tensor(torch.complex64, 20, seed=5).to(DEVICE)
    view = z.conj()
    assert view.is_conj()
    assert device_digest(view) == expected_digest(reference_bytes(view.resolve_conj()))


def test_digest_misaligned_storage_offset():
    # x[1:] of an int8 tensor starts at an odd address: the kernel's word loads need 4-byte
    # alignment, so the bytes are copied; an aligned slice is read in place.
    base = random_tensor(torch.int8, 300, seed=11).to(DEVICE)
    for start in (1, 2, 3):
        view = base[start:]
        assert view.data_ptr() % 4 != 0
        assert _device.canonical_bytes(view).data_ptr() % 4 == 0
        assert device_digest(view) == expected_digest(reference_bytes(view))
    aligned = base[4:]
    assert _device.canonical_bytes(aligned).data_ptr() == aligned.data_ptr()
    halves = random_tensor(torch.int16, 70, seed=12).to(DEVICE)[1:]  # 2 bytes past alignment
    assert device_digest(halves) == expected_digest(reference_bytes(halves))


def test_digest_into_a_slice_writes_only_its_bytes():
    t = random_tensor(torch.float64, 100, seed=13).to(DEVICE)
    want = expected_digest(reference_bytes(t))
    buffer = torch.full((48,), 0xAB, dtype=torch.uint8, device=DEVICE)
    _device.tree_digest_into(t, buffer[5:21])  # an odd offset: byte stores need no alignment
    got = buffer.cpu()
    assert bytes(got[5:21].tolist()) == want
    assert (got[:5] == 0xAB).all() and (got[21:] == 0xAB).all()
    # A strided `out` (its 16 bytes not adjacent) is written through a temporary.
    buffer.fill_(0xCD)
    _device.tree_digest_into(t, buffer[1:33:2])
    got = buffer.cpu()
    assert bytes(got[1:33:2].tolist()) == want
    assert (got[0:33:2] == 0xCD).all() and (got[33:] == 0xCD).all()
    # Another shape of 16 elements: row-major, in place when contiguous, else via a temporary.
    square = torch.zeros((8, 8), dtype=torch.uint8, device=DEVICE)
    _device.tree_digest_into(t, square[2:4].view(4, 4))
    _device.tree_digest_into(t, square[4:8, 2:6])
    got = square.cpu()
    assert bytes(got[2:4].reshape(-1).tolist()) == want
    assert bytes(got[4:8, 2:6].reshape(-1).tolist()) == want
    assert got[:2].eq(0).all() and got[4:, :2].eq(0).all() and got[4:, 6:].eq(0).all()


def test_digest_rejects_what_it_cannot_digest():
    with pytest.raises(TypeError, match="meta tensor: it has no values"):
        _device.tree_digest(torch.empty(4, device="meta"))
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    with pytest.raises(TypeError, match="nested tensor"):
        _device.tree_digest(nested)
    with pytest.raises(TypeError, match="sparse"):
        _device.tree_digest(torch.eye(3).to_sparse())
    with pytest.raises(TypeError, match="dtype torch.uint32"):
        _device.tree_digest(torch.zeros(3, dtype=torch.uint32, device=DEVICE))
    with pytest.raises(TypeError, match="a list"):
        _device.tree_digest([1, 2, 3])
    t = torch.zeros(3, device=DEVICE)
    with pytest.raises(TypeError, match="uint8 tensor of 16 elements"):
        _device.tree_digest_into(t, torch.empty(16, dtype=torch.int8, device=DEVICE))
    with pytest.raises(TypeError, match="meta tensor"):
        _device.stats_totals(torch.empty(4, device="meta"))


# ---------------------------------------------------------------------------------------------
# Statistics totals.
# ---------------------------------------------------------------------------------------------


def reference_stats(t):
    """The seven totals in float64 on the CPU (NaN and inf left out of the first four), and the
    sum of magnitudes (the scale of the summation error)."""
    t = t.detach().cpu().resolve_conj()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.uint16:
        t = t.to(torch.int32)
    values = t.reshape(-1).to(torch.float64)
    finite = values[torch.isfinite(values)]
    totals = [
        finite.max().item() if finite.numel() else -math.inf,
        finite.min().item() if finite.numel() else math.inf,
        finite.sum().item(),
        (finite * finite).sum().item(),
        float(torch.isnan(values).sum().item()),
        float((values == math.inf).sum().item()),
        float((values == -math.inf).sum().item()),
    ]
    return totals, finite.abs().sum().item()


def assert_stats(got, t):
    want, magnitude = reference_stats(t)
    got = got.tolist()
    # max, min and the counts do not depend on the order: exact.
    assert got[0:2] == want[0:2] and got[4:] == want[4:], (got, want)
    # The sums do: within a few ulps of the sum of magnitudes (sum_sq's terms are all >= 0).
    assert abs(got[2] - want[2]) <= 1e-12 * magnitude, (got, want)
    assert abs(got[3] - want[3]) <= 1e-12 * want[3], (got, want)


def stats_values(dtype, count, seed=0):
    """Values of ``dtype`` with a spread (negative where the dtype has them)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(count, generator=g, dtype=torch.float64) * 40
    if dtype.is_complex:
        return torch.complex(x, torch.flip(x, [0]) * 0.5).to(dtype)
    if dtype == torch.bool:
        return x > 0
    if dtype in (torch.uint8, torch.uint16):
        return x.abs().to(torch.int32).to(dtype)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_stats_every_dtype(dtype):
    # 0, 1, one tile boundary off and a few programs' worth (the second pass then has several
    # partials to reduce).
    for count in (0, 1, 1023, 1025, 8193, 20000):
        t = stats_values(dtype, count, seed=count)
        assert_stats(device_stats(t.to(DEVICE)), t)


def test_stats_partials_beyond_one_finishing_tile(monkeypatch):
    # More partials than the finishing program has lanes (over 8 M elements with the real
    # sizes; here its lanes shrink to 2): each lane takes several, in order.
    monkeypatch.setattr(_device, "STATS_FINISH_TILE", 2)
    t = stats_values(torch.float64, 5 * 8192 + 3, seed=6)  # 6 partials, 3 a lane
    t[-1] = math.inf
    t[3] = math.nan
    t[5 * 8192 - 1] = -math.inf
    assert_stats(device_stats(t.to(DEVICE)), t)


def test_one_batch_of_statistics_is_every_tensor_alone():
    # stats_totals_batch_into: the partials of every tensor of a dtype in one launch, every
    # finish in one: the bits of stats_totals alone, for mixed dtypes (bool and complex
    # converted), empty tensors, several programs, a misaligned view, outs with a stride.
    tensors = [
        stats_values(torch.float32, n, seed=40 + n) for n in (0, 1, 1023, 8193, 3 * 8192 + 5)
    ]
    tensors += [
        stats_values(torch.bfloat16, 20000, seed=3),
        stats_values(torch.int64, 9000, seed=4),
        stats_values(torch.float32, 300, seed=5)[1:],
        torch.tensor([True, False, True]),
        stats_values(torch.complex64, 700, seed=6),
    ]
    tensors[2][5] = math.nan
    tensors[4][8192] = -math.inf
    tensors = [t.to(DEVICE) for t in tensors]
    alone = [device_stats(t) for t in tensors]
    outs = torch.full((len(tensors) + 1, 14), 9.0, dtype=torch.float64, device=DEVICE)
    if DEVICE == "cuda":
        torch.cuda.set_sync_debug_mode("error")
    try:
        _device.stats_totals_batch_into(tensors, [row[::2] for row in outs[:-1]])
    finally:
        if DEVICE == "cuda":
            torch.cuda.set_sync_debug_mode("default")
    got = outs.cpu()
    for i, t in enumerate(tensors):
        assert torch.equal(got[i, ::2].view(torch.int64), alone[i].view(torch.int64)), (i, t.dtype)
        assert (got[i, 1::2] == 9.0).all()
    assert (got[-1] == 9.0).all()  # nothing written past the outs
    _device.stats_totals_batch_into([], [])  # nothing to do
    with pytest.raises(ValueError, match="2 tensors but 1 outs"):
        _device.stats_totals_batch_into(tensors[:2], list(outs[:1, :7]))


def test_stats_empty():
    got = device_stats(torch.empty((0, 4), dtype=torch.float32, device=DEVICE))
    assert got.tolist() == [-math.inf, math.inf, 0.0, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "places",
    [
        [0],
        [19999],
        [1023, 1024, 1025],  # around a tile boundary
        [8191, 8192],  # around a program boundary
        list(range(0, 20000, 97)),
    ],
)
def test_stats_nan_and_inf_placements(places):
    t = stats_values(torch.float32, 20000, seed=1)
    for i, place in enumerate(places):
        t[place] = (math.nan, math.inf, -math.inf)[i % 3]
    assert_stats(device_stats(t.to(DEVICE)), t)


def test_stats_nothing_finite():
    t = torch.tensor([math.nan, math.inf, -math.inf, math.nan], dtype=torch.float16)
    got = device_stats(t.to(DEVICE))
    assert got.tolist() == [-math.inf, math.inf, 0.0, 0.0, 2.0, 1.0, 1.0]


def test_stats_large_integers_are_rounded_to_nearest():
    big = 2**62 + 2**9 + 1  # nearest float64: 2**62 + 2**10
    t = torch.tensor([big, -big, 3], dtype=torch.int64)
    got = device_stats(t.to(DEVICE))
    assert got[0].item() == float(big) == 2.0**62 + 2.0**10
    assert got[1].item() == -float(big)


def test_stats_deterministic():
    # Two calls give the same bits; so does another layout of the same values (the canonical
    # order is what is reduced).
    t = stats_values(torch.float32, 100_000, seed=2).reshape(250, 400).to(DEVICE)
    first = device_stats(t)
    second = device_stats(t)
    assert torch.equal(first.view(torch.int64), second.view(torch.int64))
    strided = t.t().contiguous().t()
    assert not strided.is_contiguous()
    assert torch.equal(device_stats(strided).view(torch.int64), first.view(torch.int64))
    assert_stats(first, t)


def test_stats_into_a_strided_view():
    t = stats_values(torch.bfloat16, 3000, seed=4).to(DEVICE)
    buffer = torch.full((20,), 9.0, dtype=torch.float64, device=DEVICE)
    _device.stats_totals_into(t, buffer[3:17:2])
    got = buffer.cpu()
    assert_stats(got[3:17:2], t)
    untouched = torch.ones(20, dtype=torch.bool)
    untouched[3:17:2] = False
    assert (got[untouched] == 9.0).all()
    with pytest.raises(TypeError, match="float64 tensor of 7 elements"):
        _device.stats_totals_into(t, torch.empty(7, dtype=torch.float32, device=DEVICE))
