"""The writer's own thread: records are copied, hashed there (several at once in SIMD lanes) and
written in order; `flush()`; the limit on bytes in flight; a writer used across fork."""

import os

import detcheck
import numpy as np
import pytest
from support import decode, digest_hex, requires


def arrays(seed=0):
    """Every length from 0 to 300 bytes, and larger ones around the block and lane sizes."""
    rng = np.random.default_rng(seed)
    out = [rng.integers(0, 256, size=n, dtype=np.uint8) for n in range(301)]
    for n in (4096, 65536 + 7, 1 << 20, 3 * 64 * 1024 + 55, 100_003):
        out.append(rng.integers(0, 256, size=n, dtype=np.uint8))
    out.append(rng.standard_normal((256, 1024), dtype=np.float32))
    return out


@pytest.mark.parametrize("lanes", ["16", "8", "0"])
@pytest.mark.parametrize("mode", ["md5", "stats"])
def test_md5_of_every_length_on_every_lane_width(tmp_path, monkeypatch, lanes, mode):
    # DETCHECK_MD5_LANES caps the lanes (16: AVX-512, 8: AVX2, 0: md-5 one by one), read when
    # the writer starts; a CPU without the instructions falls back to what it has.
    monkeypatch.setenv("DETCHECK_MD5_LANES", lanes)
    data = arrays()
    with detcheck.TraceWriter(tmp_path, 0, 1, mode) as w:
        for step in range(2):
            for i, a in enumerate(data):
                w.record(step, f"a{i}", a)
    records = decode(tmp_path / "rank0.dctrace")
    assert len(records) == 2 * len(data)
    for r in records:
        i = int(r["name"][1:])
        assert r["md5"] == digest_hex(data[i].tobytes()), r
        assert r["seq"] == i
    if mode == "stats":
        big = data[-1]
        r = records[-1]
        assert r["max"] == float(big.max()) and r["min"] == float(big.min())


def test_the_array_may_change_once_record_returns(tmp_path):
    a = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: copied with the GIL released
    small = np.arange(10, dtype=np.int64)
    want = digest_hex(a.tobytes()), digest_hex(small.tobytes())
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        w.record(0, "a", a)
        w.record(0, "small", small)
        a[:] = -1
        small[:] = -1
    got = [r["md5"] for r in decode(tmp_path / "rank0.dctrace")]
    assert tuple(got) == want


def test_flush_waits_and_recording_goes_on(tmp_path):
    w = detcheck.TraceWriter(tmp_path, 0, 1)
    w.record(0, "a", np.ones(1000))
    w.flush()
    w.flush()
    w.record(1, "a", np.zeros(1000))
    assert w.num_records == 2
    w.close()
    w.flush()  # closed: nothing to wait for
    assert [r["step"] for r in decode(w.path)] == [0, 1]


def test_more_than_the_limit_in_flight(tmp_path):
    # 64 MiB may wait for the thread; these 96 MiB make `record` wait for room at least once,
    # and an array larger than the limit goes alone.
    big = np.random.default_rng(1).integers(0, 256, size=80 << 20, dtype=np.uint8)
    mid = big[: 8 << 20]
    with detcheck.TraceWriter(tmp_path, 0, 1, "md5") as w:
        w.record(0, "mid0", mid)
        w.record(0, "big", big)
        w.record(0, "mid1", mid)
    records = decode(tmp_path / "rank0.dctrace")
    assert [r["name"] for r in records] == ["mid0", "big", "mid1"]
    assert records[1]["md5"] == digest_hex(big.tobytes())
    assert records[2]["md5"] == digest_hex(mid.tobytes())


def test_a_write_failure_is_raised_by_a_later_call(tmp_path):
    # The file cannot be finished when its folder is gone: close() raises OSError, and
    # nothing is left.
    folder = tmp_path / "gone"
    w = detcheck.TraceWriter(folder, 0, 1)
    w.record(0, "a", np.ones(3))
    for f in os.listdir(folder):
        os.unlink(folder / f)
    os.rmdir(folder)
    with pytest.raises(OSError):
        w.close()
    assert w.closed
    assert not folder.exists()


def test_a_writer_cannot_be_used_across_fork(tmp_path):
    requires("fork")
    w = detcheck.TraceWriter(tmp_path, 0, 1)
    w.record(0, "a", np.ones(3))
    pid = os.fork()
    if pid == 0:  # the child: the writer's thread is the parent's
        code = 1
        try:
            w.record(0, "b", np.ones(3))
        except detcheck.DetcheckError as e:
            code = 0 if "cannot be used across fork" in str(e) else 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    w.record(0, "c", np.ones(3))
    w.close()
    assert [r["name"] for r in decode(w.path)] == ["a", "c"]


def test_a_writer_idle_past_its_polling_still_takes_records(tmp_path):
    # The thread looks for records on its own for a while, then sleeps on the queue: a record
    # after a pause longer than that (POLL_FOR, 100 ms) wakes it, and nothing is lost.
    import time

    with detcheck.TraceWriter(tmp_path, 0, 1, "md5") as w:
        w.record(0, "before", np.arange(10.0))
        w.flush()
        time.sleep(0.3)
        w.record(0, "after", np.arange(20.0))
        w.flush()
        time.sleep(0.3)
        w.record(1, "last", np.arange(5.0))
    records = decode(w.path)
    assert [r["name"] for r in records] == ["before", "after", "last"]
    assert records[1]["md5"] == digest_hex(np.arange(20.0).tobytes())
