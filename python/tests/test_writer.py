"""detcheck.TraceWriter: files read back by the independent decoder and by `detcheck compare`,
digests equal to hashlib's, the launch environment, context-manager semantics, conversions and
errors."""

import json
import os
import re
import subprocess
import sys

import detcheck
import numpy as np
import pytest
from support import dctrace, decode, digest_hex, run_detcheck

DTYPES = {
    "float16": "f16",
    "float32": "f32",
    "float64": "f64",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "bool": "bool",
}

LAUNCH_VARS = (
    "DETCHECK_TRACE_DIR",
    "DETCHECK_WORLD_SIZE",
    "DETCHECK_RANK",
    "DETCHECK_MODE",
    "DETCHECK_LAUNCH",
    "DETCHECK_SEED",
    "DETCHECK_STEPS",
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "DETCHECK_CAPTURE",
    "DETCHECK_CAPTURE_DIR",
)


@pytest.fixture
def no_launch(monkeypatch):
    """An environment as outside detcheck (no launch variable), whatever the caller's."""
    for var in LAUNCH_VARS:
        # Set, then deleted: `delenv` alone misses a variable that native code set in the C
        # environment behind `os.environ` (an MPI library that Lightning's import initialised
        # sets PMIX_RANK so), and the writer reads the C environment.
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    return monkeypatch


def sample(dtype, shape=(3, 5), seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.startswith("float"):
        return (rng.standard_normal(shape) * 10).astype(dtype)
    if dtype == "uint8":
        return rng.integers(0, 256, size=shape).astype(np.uint8)
    return rng.integers(-1000, 1000, size=shape).astype(dtype)


def write(dir, records, rank=0, world_size=1, mode="stats"):
    with detcheck.TraceWriter(dir, rank, world_size, mode) as w:
        for step, name, array in records:
            w.record(step, name, array)
    return dir / f"rank{rank}.dctrace"


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_md5_is_hashlib_of_tobytes(tmp_path, dtype):
    array = sample(dtype)
    path = write(tmp_path, [(0, "x", array)])
    [record] = decode(path)
    assert record["md5"] == digest_hex(array.tobytes())
    assert record["dtype"] == DTYPES[dtype]
    assert record["shape"] == [3, 5]


def test_stats_are_the_arrays(tmp_path):
    array = np.array([[1.5, -2.0], [4.0, 0.5]], dtype=np.float32)
    path = write(tmp_path, [(0, "x", array)])
    [record] = decode(path)
    assert record["max"] == 4.0 and record["min"] == -2.0
    assert record["mean"] == pytest.approx(1.0)
    assert record["norm"] == pytest.approx(float(np.linalg.norm(array)))


def test_records_steps_names_and_replicated(tmp_path):
    a = sample("float32")
    with detcheck.TraceWriter(tmp_path, 1, 2, "md5") as w:
        assert (w.rank, w.world_size, w.mode, w.num_records) == (1, 2, "md5", 0)
        w.record(0, "a", a)
        w.record_replicated(0, "loss", np.float32(0.25))
        w.record(1, "a", a)
        assert w.num_records == 3
    records = decode(tmp_path / "rank1.dctrace")
    assert [(r["step"], r["seq"], r["name"], r["replicated"]) for r in records] == [
        (0, 0, "a", False),
        (0, 1, "loss", True),
        (1, 0, "a", False),
    ]
    assert records[1]["shape"] == [] and records[1]["dtype"] == "f32"


def test_inputs_without_numpy_arrays(tmp_path):
    data = bytes(range(10))
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        w.record(0, "bytes", data)
        w.record(0, "memoryview", memoryview(bytearray(data)))
        w.record(0, "floats", memoryview(np.arange(4, dtype="<f8")).cast("B").cast("d"))
        w.record(0, "python_float", 0.5)
        w.record(0, "python_int", 7)
        w.record(0, "python_bool", True)
    records = decode(tmp_path / "rank0.dctrace")
    md5 = digest_hex(data)
    assert records[0]["md5"] == records[1]["md5"] == md5
    assert records[0]["dtype"] == "u8" and records[0]["shape"] == [10]
    assert records[2]["md5"] == digest_hex(np.arange(4, dtype="<f8").tobytes())
    assert [r["dtype"] for r in records[3:]] == ["f64", "i64", "bool"]
    assert records[3]["md5"] == digest_hex(np.float64(0.5).tobytes())
    assert records[4]["md5"] == digest_hex(np.int64(7).tobytes())


class ArrayLike:
    """Only `__array__`: no buffer."""

    def __init__(self, array):
        self.array = array

    def __array__(self, dtype=None, copy=None):
        return self.array


def test_non_contiguous_big_endian_and_array_likes(tmp_path):
    base = sample("float64", (6, 8))
    views = {
        "transposed": base.T,
        "strided": base[::2, 1::3],
        "fortran": np.asfortranarray(base),
        "big_endian": base.astype(">f8"),
        "array_like": ArrayLike(base[:, ::2]),
        "negative_stride": base[::-1],
    }
    write(tmp_path, [(0, name, v) for name, v in views.items()])
    records = {r["name"]: r for r in decode(tmp_path / "rank0.dctrace")}
    for name, v in views.items():
        canonical = np.ascontiguousarray(np.asarray(v), dtype="<f8")
        assert records[name]["md5"] == digest_hex(canonical.tobytes()), name
        assert records[name]["shape"] == list(canonical.shape), name


def test_int_formats_of_the_platform(tmp_path):
    # numpy exports int64 as 'l' on Linux and 'q' elsewhere; int32 as 'i'; both must map.
    arrays = [
        np.arange(5, dtype=np.int64),
        np.arange(5, dtype=np.intc),
        np.arange(5, dtype=np.longlong),
    ]
    write(tmp_path, [(0, f"i{n}", a) for n, a in enumerate(arrays)])
    records = decode(tmp_path / "rank0.dctrace")
    assert [r["dtype"] for r in records] == ["i64", "i32", "i64"]


def test_zero_size_and_scalar(tmp_path):
    write(
        tmp_path, [(0, "empty", np.zeros((0, 4), np.float32)), (0, "scalar", np.array(3, np.int32))]
    )
    empty, scalar = decode(tmp_path / "rank0.dctrace")
    assert empty["shape"] == [0, 4] and empty["md5"] == digest_hex(b"")
    assert scalar["shape"] == [] and scalar["md5"] == digest_hex(np.int32(3).tobytes())


@pytest.mark.parametrize(
    "array, dtype",
    [
        (np.zeros(3, np.uint64), "uint64"),
        (np.zeros(3, np.uint32), "uint32"),
        (np.array(["a"]), "<U1"),
        (np.zeros(2, "datetime64[s]"), "datetime64[s]"),
    ],
)
def test_unsupported_dtype_is_a_type_error(tmp_path, array, dtype):
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        expected = re.escape(f"cannot record `grad/fc1.weight`: dtype {dtype} is not supported")
        with pytest.raises(TypeError, match=expected):
            w.record(0, "grad/fc1.weight", array)
        assert w.num_records == 0


def test_bool_bytes_must_be_0_or_1(tmp_path):
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        with pytest.raises(ValueError, match="cannot record `b`: bool element 0 is the byte 2"):
            w.record(0, "b", np.frombuffer(b"\x02\x00", dtype=bool))
        with pytest.raises(OverflowError):
            w.record(-1, "b", np.zeros(2))


def test_not_an_array_is_a_type_error(tmp_path):
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        for bad in ([1.0, 2.0], "text", None, object()):
            with pytest.raises(TypeError, match="cannot record `x`: expected an array"):
                w.record(0, "x", bad)


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown dump mode `sha`"):
        detcheck.TraceWriter(tmp_path, 0, 1, "sha")
    with pytest.raises(ValueError, match="rank 2 does not fit world size 2"):
        detcheck.TraceWriter(tmp_path, 2, 2)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError, match="cannot create folder"):
        detcheck.TraceWriter(blocker / "sub", 0, 1)
    w = detcheck.TraceWriter(tmp_path, 0, 1)
    w.record(3, "a", np.zeros(2))
    with pytest.raises(detcheck.DetcheckError, match="record `a` of step 2 comes after step 3"):
        w.record(2, "a", np.zeros(2))
    assert issubclass(detcheck.DetcheckError, RuntimeError)
    w.close()
    with pytest.raises(ValueError, match="cannot record `b`: the trace writer of rank 0 is closed"):
        w.record(4, "b", np.zeros(2))


def test_close_is_idempotent_and_finishes(tmp_path):
    w = detcheck.TraceWriter(tmp_path, 0, 1)
    w.record(0, "a", np.ones(3))
    assert not (tmp_path / "rank0.dctrace").exists()
    w.close()
    w.close()
    assert w.closed and os.path.samefile(w.path, tmp_path / "rank0.dctrace")
    assert len(decode(w.path)) == 1
    assert sorted(os.listdir(tmp_path)) == ["rank0.dctrace"]


def test_exception_in_with_leaves_no_file(tmp_path):
    with pytest.raises(KeyError):
        with detcheck.TraceWriter(tmp_path, 0, 1) as w:
            w.record(0, "a", np.ones(3))
            raise KeyError("boom")
    assert w.closed
    assert os.listdir(tmp_path) == []


def test_abort_and_drop_leave_no_file(tmp_path):
    w = detcheck.TraceWriter(tmp_path / "a", 0, 1)
    w.record(0, "a", np.ones(3))
    w.abort()
    assert os.listdir(tmp_path / "a") == []
    w = detcheck.TraceWriter(tmp_path / "b", 0, 1)
    w.record(0, "a", np.ones(3))
    del w
    assert os.listdir(tmp_path / "b") == []


def test_a_crashed_program_leaves_no_trace(tmp_path):
    code = (
        "import detcheck, numpy as np, os\n"
        f"w = detcheck.TraceWriter({str(tmp_path)!r}, 0, 1)\n"
        "w.record(0, 'a', np.ones(3))\n"
        "os._exit(3)\n"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 3
    assert not (tmp_path / "rank0.dctrace").exists()


def test_full_mode_writes_safetensors(tmp_path):
    a = sample("float32")
    write(tmp_path, [(0, "a", a), (1, "a", a + 1)], mode="full")
    assert (tmp_path / "rank0" / "step0.safetensors").exists()
    assert (tmp_path / "rank0" / "step1.safetensors").exists()


def test_large_arrays_release_the_gil(tmp_path):
    # Above the GIL-release threshold, from two threads at once, on two writers.
    import threading

    big = sample("float32", (1 << 20,))
    errors = []

    def run(rank):
        try:
            with detcheck.TraceWriter(tmp_path, rank, 2) as w:
                for step in range(4):
                    w.record(step, "big", big)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    md5 = digest_hex(big.tobytes())
    for rank in range(2):
        assert {r["md5"] for r in decode(tmp_path / f"rank{rank}.dctrace")} == {md5}


def test_from_env_outside_detcheck(no_launch):
    assert detcheck.TraceWriter.from_env() is None
    assert detcheck.TraceWriter.from_env_for_rank(0) is None


def test_from_env_under_a_launch(tmp_path, no_launch):
    no_launch.setenv("DETCHECK_TRACE_DIR", str(tmp_path))
    no_launch.setenv("DETCHECK_WORLD_SIZE", "4")
    no_launch.setenv("DETCHECK_MODE", "md5")
    no_launch.setenv("RANK", "2")  # torchrun's
    w = detcheck.TraceWriter.from_env()
    assert (w.rank, w.world_size, w.mode) == (2, 4, "md5")
    w.record(0, "a", np.ones(2))
    w.close()
    assert os.listdir(tmp_path) == ["rank2.dctrace"]
    no_launch.setenv("DETCHECK_RANK", "3")
    with detcheck.TraceWriter.from_env() as w:
        assert w.rank == 3
    # The `none` launcher: one process, every rank.
    no_launch.delenv("DETCHECK_RANK")
    no_launch.delenv("RANK")
    with pytest.raises(detcheck.DetcheckError, match="from_env_for_rank"):
        detcheck.TraceWriter.from_env()
    with detcheck.TraceWriter.from_env_for_rank(1) as w:
        assert (w.rank, w.world_size) == (1, 4)
    with pytest.raises(ValueError, match="rank 4 does not fit"):
        detcheck.TraceWriter.from_env_for_rank(4)
    no_launch.setenv("DETCHECK_MODE", "sha")
    with pytest.raises(detcheck.DetcheckError, match="DETCHECK_MODE"):
        detcheck.TraceWriter.from_env_for_rank(0)


def read_safetensors(path):
    """The tensors of a safetensors file: {name: (dtype, shape, bytes)} (read here, not by
    detcheck: 8-byte header length, JSON header, data)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    return {
        name: (t["dtype"], t["shape"], data[t["data_offsets"][0] : t["data_offsets"][1]])
        for name, t in header.items()
        if name != "__metadata__"
    }


@pytest.mark.parametrize("mode", ["md5", "stats", "full"])
def test_the_writer_keeps_the_record_a_rerun_captures(tmp_path, no_launch, mode):
    """A re-run's capture request (DETCHECK_CAPTURE) is honoured in every mode, through the
    background thread: the k-th record of the name at the step, and only it, is kept."""
    no_launch.setenv("DETCHECK_TRACE_DIR", str(tmp_path / "trace"))
    no_launch.setenv("DETCHECK_WORLD_SIZE", "2")
    no_launch.setenv("DETCHECK_RANK", "1")
    no_launch.setenv("DETCHECK_MODE", mode)
    no_launch.setenv("DETCHECK_CAPTURE", "1:2:1:grad/a:b")  # a name with a colon
    no_launch.setenv("DETCHECK_CAPTURE_DIR", str(tmp_path / "capture"))
    arrays = {}
    with detcheck.TraceWriter.from_env() as w:
        for step in range(4):
            for k in range(3):
                arrays[step, k] = sample("float32", (3, 4), seed=10 * step + k)
                w.record(step, "grad/a:b", arrays[step, k])
                w.record(step, "other", arrays[step, k][::-1])  # strided: the conversion path
    assert os.listdir(tmp_path / "capture") == ["rank1.capture.safetensors"]
    ((dtype, shape, data),) = read_safetensors(
        tmp_path / "capture" / "rank1.capture.safetensors"
    ).values()
    assert (dtype, shape, data) == ("F32", [3, 4], arrays[2, 1].tobytes())
    # another rank's writer keeps nothing
    no_launch.setenv("DETCHECK_CAPTURE", "0:2:1:grad/a:b")
    no_launch.setenv("DETCHECK_CAPTURE_DIR", str(tmp_path / "capture0"))
    no_launch.setenv("DETCHECK_TRACE_DIR", str(tmp_path / "trace0"))
    with detcheck.TraceWriter.from_env() as w:
        w.record(2, "grad/a:b", arrays[2, 1])
    assert not (tmp_path / "capture0").exists()


def test_compare_identical_and_different_dumps(tmp_path, detcheck_bin):
    def dump(dir, perturb):
        for rank in range(2):
            records = []
            for step in range(3):
                w = sample("float32", (4, 4), seed=10 * step + rank)
                if perturb and step == 1 and rank == 1:
                    w = w.copy()
                    w[2, 3] = np.nextafter(w[2, 3], np.float32(np.inf))
                records.append((step, "fc1.weight", w))
                records.append((step, "mask", w > 0))
            write(dir, records, rank=rank, world_size=2)

    dump(tmp_path / "a", False)
    dump(tmp_path / "b", False)
    dump(tmp_path / "c", True)
    run_detcheck(detcheck_bin, "compare", tmp_path / "a", tmp_path / "b", code=0)
    out = run_detcheck(detcheck_bin, "compare", tmp_path / "a", tmp_path / "c", code=1).out
    assert "first divergence: step 1 rank 1 seq 0 `fc1.weight`" in out, out


def test_environment_entries_are_written_and_compared(tmp_path, detcheck_bin):
    for name, value in (("a", "2.5.1"), ("b", "2.6.0")):
        with detcheck.TraceWriter(tmp_path / name, 0, 1) as w:
            w.add_environment("torch.version", value)
            w.record(0, "x", np.arange(3, dtype=np.float32))
            w.add_environment("late.entry", "after a record")  # until close()
            with pytest.raises(ValueError, match="must not be empty"):
                w.add_environment("", "x")
        with pytest.raises(ValueError, match="closed"):
            w.add_environment("k", "v")
    out = dctrace(tmp_path / "a" / "rank0.dctrace")
    assert "environment: torch.version=2.5.1" in out, out
    assert "environment: late.entry=after a record" in out, out
    assert "environment: detcheck.version=" in out, out
    out = run_detcheck(detcheck_bin, "compare", tmp_path / "a", tmp_path / "b", code=0).out
    assert "environment differs (A -> B):\n  torch.version: 2.5.1 -> 2.6.0 (rank 0)" in out, out


M64 = 2**64 - 1


def _mix(x):
    x ^= x >> 33
    x = x * 0xFF51AFD7ED558CCD & M64
    x ^= x >> 33
    x = x * 0xC4CEB9FE1A85EC53 & M64
    return x ^ (x >> 33)


def position_digest(elements, first):
    """docs/trace-format.md's position digest of 4-byte elements at global indices from
    ``first`` (lanes as little-endian bytes, in hex)."""
    lanes = []
    for seed in (0x243F6A8885A308D3, 0x13198A2E03707344):
        total = 0
        for j, e in enumerate(elements):
            total += _mix(int.from_bytes(e, "little") ^ _mix((first + j) ^ seed))
        lanes.append((total & M64).to_bytes(8, "little"))
    return (lanes[0] + lanes[1]).hex()


def test_a_shard_is_written_with_its_placement_and_position_digest(tmp_path):
    # Rows 2..4 of a global f32[4, 3]: the digest is of global indices 6..12, and the two
    # shards' digests add up to the whole tensor's.
    whole = np.arange(12, dtype=np.float32).reshape(4, 3)
    with detcheck.TraceWriter(tmp_path, 1, 2, "md5") as w:
        w.record_sharded(0, "w", whole[2:], [4, 3], [2, 0], [2, 3])
        with pytest.raises(detcheck.DetcheckError, match="runs past the global size 4"):
            w.record_sharded(0, "bad", whole[2:], [4, 3], [3, 0], [2, 3])
    text = dctrace(tmp_path / "rank1.dctrace")
    elements = [whole.tobytes()[4 * i : 4 * i + 4] for i in range(12)]
    expected = position_digest(elements[6:], 6)
    assert f"shard: global [4, 3] offset [2, 0] extent [2, 3] position {expected}" in text, text
    assert [r["name"] for r in decode(tmp_path / "rank1.dctrace")] == ["w"]
    # The two halves' digests add up, lane by lane, to the whole tensor's.
    halves = [bytes.fromhex(position_digest(elements[:6], 0)), bytes.fromhex(expected)]
    summed = b"".join(
        (sum(int.from_bytes(h[k : k + 8], "little") for h in halves) & M64).to_bytes(8, "little")
        for k in (0, 8)
    )
    assert summed.hex() == position_digest(elements, 0)


def test_the_writer_declares_what_it_takes_and_a_writer_of_ones_own_takes_records_alone(tmp_path):
    """The native writer's capabilities are declared (its class's ``CAPABILITIES``), each with
    the methods it names; a writer that declares nothing takes ``record`` and
    ``record_replicated`` alone, whatever methods it has (issue 55: declared, not probed)."""
    from detcheck._core.contract import capabilities

    methods = {
        "digested": ["record_digested", "_record_later", "_fill", "needs_tensor"],
        "environment": ["add_environment"],
        "lent": ["_record_lent"],
        "sharded": ["record_sharded"],
    }
    assert set(detcheck.TraceWriter.CAPABILITIES) == set(methods)
    with detcheck.TraceWriter(tmp_path, 0, 1) as writer:
        assert capabilities(writer) == set(methods)
        for capability, names in methods.items():
            for name in names:
                assert callable(getattr(writer, name)), (capability, name)

    class OwnWriter:
        def record(self, step, name, array):
            pass

        def record_replicated(self, step, name, array):
            pass

        def record_digested(self, *args):  # a method of that name declares nothing
            pass

    assert capabilities(OwnWriter()) == frozenset()
    assert capabilities(None) == frozenset()
