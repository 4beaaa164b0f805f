"""The dtypes GPU training uses (int8, int16, uint16, float8_e4m3fn, float8_e5m2, complex64,
complex128) recorded through detcheck.TraceWriter and read back by the independent decoder
(scripts/dctrace.py): names, shapes, md5 of the canonical bytes (hashlib of the bytes torch or
numpy hold), statistics; and the tensors detcheck cannot record (meta, nested) refused with a
TypeError that names the record. The numpy tests run everywhere; the torch ones where torch is
installed."""

import math

import detcheck
import numpy as np
import pytest
from support import decode, digest_hex, requires, run_detcheck

try:
    import torch  # for the helpers below; each torch test asks for it with `requires`
except ImportError:  # pragma: no cover - torch is too large for CI
    torch = None  # type: ignore[assignment]


def write(dir, records, mode="stats"):
    with detcheck.TraceWriter(dir, 0, 1, mode) as w:
        for step, name, array in records:
            w.record(step, name, array)
    return dir / "rank0.dctrace"


def torch_bytes(t):
    """The canonical bytes of a torch tensor: its values' bytes, row-major (every dtype viewed
    as uint8, which numpy has)."""
    t = t.detach().cpu().resolve_conj().resolve_neg().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


# ---------------------------------------------------------------------------------------------
# numpy arrays: read in place through the buffer protocol
# ---------------------------------------------------------------------------------------------

NUMPY = {
    "int8": ("i8", np.array([[-128, -1, 0], [1, 7, 127]], dtype=np.int8)),
    "int16": ("i16", np.array([[-32768, -300, 0], [1, 300, 32767]], dtype=np.int16)),
    "uint16": ("u16", np.array([[0, 1, 300], [40000, 65534, 65535]], dtype=np.uint16)),
    "complex64": ("c64", np.array([[1.5 - 2j, 0.25 + 3j, -1], [0, 3 + 4j, 1j]], np.complex64)),
    "complex128": ("c128", np.array([[1.5 - 2j, 0.1 + 3j, -1], [0, 3 + 4j, 1j]], np.complex128)),
}


@pytest.mark.parametrize("dtype", sorted(NUMPY))
def test_numpy_arrays_of_new_dtypes(tmp_path, dtype):
    name, array = NUMPY[dtype]
    path = write(tmp_path, [(0, "x", array), (0, "strided", array[:, ::2])])
    [whole, strided] = decode(path)
    assert (whole["dtype"], whole["shape"]) == (name, [2, 3])
    assert whole["md5"] == digest_hex(array.tobytes())
    # A strided view is copied to row-major order first.
    assert (strided["dtype"], strided["shape"]) == (name, [2, 2])
    assert strided["md5"] == digest_hex(np.ascontiguousarray(array[:, ::2]).tobytes())
    if array.dtype.kind == "c":
        # Complex: the L2 norm of the whole tensor only.
        assert not {"max", "min", "mean"} & whole.keys()
        assert whole["norm"] == pytest.approx(float(np.linalg.norm(array.astype(np.complex128))))
    else:
        values = array.astype(np.float64)
        assert (whole["max"], whole["min"]) == (values.max(), values.min())
        assert whole["mean"] == pytest.approx(values.mean())
        assert whole["norm"] == pytest.approx(float(np.linalg.norm(values)))


def test_big_endian_and_python_side_conversions(tmp_path):
    little = np.array([1.5 - 2j, 3 + 4j], dtype="<c8")
    big = little.astype(">c8")
    shorts = np.array([-2, 258], dtype=">i2")
    path = write(tmp_path, [(0, "big", big), (0, "shorts", shorts)])
    [c, s] = decode(path)
    # Each part is swapped on its own: the canonical bytes are the little-endian array's.
    assert (c["dtype"], c["md5"]) == ("c64", digest_hex(little.tobytes()))
    assert s["md5"] == digest_hex(shorts.astype("<i2").tobytes())


# ---------------------------------------------------------------------------------------------
# torch tensors: converted by detcheck._core.arrays
# ---------------------------------------------------------------------------------------------


def torch_samples():
    g = torch.Generator().manual_seed(0)
    floats = torch.randn(4, 6, generator=g) * 20
    # Every 8-bit float code, NaN and (e5m2) infinities included, as a 16 x 16 tensor.
    codes = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    return {
        "i8": torch.randint(-128, 128, (4, 6), generator=g, dtype=torch.int64).to(torch.int8),
        "i16": torch.randint(-32768, 32768, (4, 6), generator=g).to(torch.int16),
        "u16": torch.randint(0, 65536, (4, 6), generator=g).to(torch.int32).to(torch.uint16),
        "f8e4m3fn": codes.view(torch.float8_e4m3fn),
        "f8e5m2": codes.view(torch.float8_e5m2),
        "f8e4m3fn_finite": floats.clamp(-448, 448).to(torch.float8_e4m3fn),
        "c64": torch.complex(floats, -floats.flip(0)),
        "c128": torch.complex(floats.double(), floats.double() * 0.5),
    }


def test_torch_tensors_of_new_dtypes_are_recorded_and_read_back(tmp_path):
    requires("torch")
    samples = torch_samples()
    path = write(tmp_path, [(0, name, t) for name, t in samples.items()])
    records = {r["name"]: r for r in decode(path)}
    assert set(records) == set(samples)
    for name, t in samples.items():
        r = records[name]
        assert r["dtype"] == name.split("_")[0], name
        assert r["shape"] == list(t.shape), name
        assert r["md5"] == digest_hex(torch_bytes(t)), name
    # Integers: exact statistics (uint16 values above 32767 are not read as negative).
    for name in ("i8", "i16", "u16"):
        values = samples[name].to(torch.float64)
        r = records[name]
        assert (r["max"], r["min"]) == (values.max().item(), values.min().item()), name
        assert r["mean"] == pytest.approx(values.mean().item()), name
        assert r["norm"] == pytest.approx(torch.linalg.norm(values).item()), name
    assert records["u16"]["max"] > 32767
    # 8-bit floats: torch's values. All 256 codes: e4m3fn has NaN (max and min skip it, mean and
    # norm are NaN), e5m2 has infinities too.
    e4 = records["f8e4m3fn"]
    assert (e4["max"], e4["min"]) == (448.0, -448.0)
    assert math.isnan(e4["mean"]) and math.isnan(e4["norm"])
    e5 = records["f8e5m2"]
    assert (e5["max"], e5["min"]) == (math.inf, -math.inf)
    finite = samples["f8e4m3fn_finite"].to(torch.float64)
    r = records["f8e4m3fn_finite"]
    assert (r["max"], r["min"]) == (finite.max().item(), finite.min().item())
    assert r["mean"] == pytest.approx(finite.mean().item())
    assert r["norm"] == pytest.approx(torch.linalg.norm(finite).item())
    # Complex: the L2 norm of the complex tensor, and no max, min or mean.
    for name in ("c64", "c128"):
        r = records[name]
        assert not {"max", "min", "mean"} & r.keys(), name
        want = torch.linalg.norm(samples[name].to(torch.complex128)).item()
        assert r["norm"] == pytest.approx(want), name


def test_views_of_new_dtypes_record_the_values_they_show(tmp_path):
    requires("torch")
    z = torch.complex(torch.arange(6.0), torch.arange(6.0) - 2.5)
    f8 = torch.arange(40, dtype=torch.uint8).view(torch.float8_e5m2).reshape(5, 8)
    u16 = torch.arange(60000, 60012, dtype=torch.int32).to(torch.uint16).reshape(3, 4)
    records = [
        (0, "conj", z.conj()),  # a lazily conjugated view: its values, not the storage's
        (0, "neg", z.conj().imag),  # a negated view (real dtype)
        (0, "f8_strided", f8[:, ::3]),
        (0, "u16_t", u16.t()),
    ]
    path = write(tmp_path, records)
    got = decode(path)
    assert [r["name"] for r in got] == [name for _, name, _ in records]
    for (_, name, t), r in zip(records, got):
        assert r["name"] == name
        assert r["md5"] == digest_hex(torch_bytes(t)), name
    assert got[0]["md5"] != digest_hex(torch_bytes(z))
    assert got[1]["dtype"] == "f32"


def test_identical_and_different_traces_of_new_dtypes_compare_so(tmp_path, detcheck_bin):
    requires("torch")
    samples = torch_samples()
    a = write(tmp_path / "a", [(0, n, t) for n, t in samples.items()]).parent
    b = write(tmp_path / "b", [(0, n, t) for n, t in samples.items()]).parent
    run_detcheck(detcheck_bin, "compare", a, b, code=0)
    changed = dict(samples)
    bits = samples["f8e4m3fn_finite"].view(torch.uint8).clone()
    bits[2, 3] ^= 1
    changed["f8e4m3fn_finite"] = bits.view(torch.float8_e4m3fn)
    c = write(tmp_path / "c", [(0, n, t) for n, t in changed.items()]).parent
    differ = run_detcheck(detcheck_bin, "compare", a, c)
    assert differ.code != 0, differ.out
    assert "f8e4m3fn_finite" in differ.out, differ.out


def test_full_mode_holds_new_dtypes_but_not_complex128(tmp_path):
    requires("torch")
    samples = {k: v for k, v in torch_samples().items() if k != "c128"}
    path = write(tmp_path / "ok", [(0, n, t) for n, t in samples.items()], mode="full")
    assert len(decode(path)) == len(samples)
    # safetensors has no complex128: the writer fails with the tensor and the dtype named.
    with pytest.raises(detcheck.DetcheckError, match="dtype c128 has no safetensors dtype"):
        write(tmp_path / "bad", [(0, "z", torch.zeros(2, dtype=torch.complex128))], mode="full")


# ---------------------------------------------------------------------------------------------
# Tensors without values to record
# ---------------------------------------------------------------------------------------------


def test_meta_tensors_are_refused_with_the_record_named(tmp_path):
    requires("torch")
    meta = [torch.empty(3, 4, device="meta"), torch.empty(2, dtype=torch.int8, device="meta")]
    message = r"cannot record `weights`: it is a meta tensor \(no values\)"
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        for t in meta:
            with pytest.raises(TypeError, match=message):
                w.record(0, "weights", t)
        w.record(0, "ok", torch.ones(2))
    assert [r["name"] for r in decode(tmp_path / "rank0.dctrace")] == ["ok"]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_nested_tensors_are_refused_with_the_record_named(tmp_path):
    requires("torch")
    parts = [torch.ones(2, 3), torch.zeros(4, 3)]
    nested = [torch.nested.nested_tensor(parts)]
    try:
        nested.append(torch.nested.nested_tensor(parts, layout=torch.jagged))
    except (RuntimeError, TypeError, ValueError):  # pragma: no cover - an older torch
        pass
    message = r"cannot record `batch`: it is a nested tensor \(record its components\)"
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        for t in nested:
            with pytest.raises(TypeError, match=message):
                w.record(0, "batch", t)
        # Its components are ordinary tensors.
        for i, part in enumerate(nested[0].unbind()):
            w.record(0, f"batch.{i}", part)
    assert [r["name"] for r in decode(tmp_path / "rank0.dctrace")] == ["batch.0", "batch.1"]
