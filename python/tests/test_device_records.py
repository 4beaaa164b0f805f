"""``detcheck.torch.watch(..., device_digests=True)``: records whose digests come from the device
kernels (``detcheck._torch.device``) held in the writer's order and filled once a step
(``detcheck._torch.device_records``), against the host path record by record.

On a machine without CUDA the kernels run in Triton's interpreter on CPU tensors
(``TRITON_INTERPRET=1``, set by conftest.py before anything imports Triton); with CUDA the model
runs on the GPU. Each test also checks which path its records took (``Spy``): the host path
gives the same trace, so without that a silent fallback to it would pass. torch and Triton are
required where DETCHECK_REQUIRE_TORCH is set (scripts/install-python.sh --torch installs both)."""

import pytest
from support import decode, requires, run_detcheck

# Its module-scoped dumps are made once: every test of the module on one pytest-xdist worker
# (CI runs `--dist loadgroup`), not once per worker.
pytestmark = pytest.mark.xdist_group("device_records")

requires("torch")
import torch  # noqa: E402

requires("triton")

import detcheck  # noqa: E402
import detcheck.torch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class Spy:
    """A writer that hands everything to ``writer`` and counts how ``watch``'s records came:
    ``held``, places held for a digest computed on the device (``_record_later``), and
    ``filled`` (``_fill``, the digests given later); ``from_host``, records given with their
    values (``record``, ``record_replicated``). It takes what the writer it wraps takes, and
    says so: a writer's capabilities are declared by its class, never probed."""

    CAPABILITIES = detcheck.TraceWriter.CAPABILITIES

    def __init__(self, writer):
        self._writer = writer
        self.held = self.filled = self.from_host = 0

    def _record_later(self, *args, **kwargs):
        self.held += 1
        return self._writer._record_later(*args, **kwargs)

    def _fill(self, *args, **kwargs):
        self.filled += 1
        return self._writer._fill(*args, **kwargs)

    def record(self, *args, **kwargs):
        self.from_host += 1
        return self._writer.record(*args, **kwargs)

    def record_replicated(self, *args, **kwargs):
        self.from_host += 1
        return self._writer.record_replicated(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._writer, name)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # 4 KiB and more per record on purpose: the tree digest's levels, not only plain md5.
        self.fc1 = torch.nn.Linear(64, 96)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(96, 8)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def train(folder, device_digests, mode="stats", steps=2, own_records=False, records=None):
    """Trains ``Net`` for ``steps`` steps recorded into ``folder``; returns the trace's records,
    after checking which path watch's records took: all through the device kernels where
    ``device_digests`` and the mode allows it (not full mode), else all from the host. Two steps
    by default: step 0's digests are handed over when step 1 ends, step 1's when the writer
    closes, the two ways a device record reaches the file (a step costs tens of seconds in
    Triton's interpreter)."""
    torch.manual_seed(0)
    model = Net().to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs = {} if records is None else {"records": records}
    with detcheck.TraceWriter(folder, 0, 1, mode) as w:
        spy = Spy(w)
        detcheck.torch.watch(model, spy, opt, device_digests=device_digests, **kwargs)
        for step in range(steps):
            gen = torch.Generator().manual_seed(100 + step)
            x = torch.randn(40, 64, generator=gen).to(DEVICE)
            loss = model(x).pow(2).mean()
            if own_records:
                # The program's own record, between device records of the same step.
                w.record(step, "loss", loss.detach().cpu())
            loss.backward()
            opt.step()
            opt.zero_grad()
        # No remove(): closing the writer hands over what the device still holds.
    got = decode(folder / "rank0.dctrace")
    watched = len(got) - (steps if own_records else 0)
    assert watched > 0, got
    if device_digests and mode != "full":
        assert (spy.held, spy.filled, spy.from_host) == (watched, watched, 0), (
            f"of {watched} records, {spy.held} were held for a device digest, {spy.filled} "
            f"filled, {spy.from_host} given from the host: the device path did not run"
        )
    else:
        assert (spy.held, spy.from_host) == (0, watched), (spy.held, spy.from_host, watched)
    return got


def key(r):
    return (r["step"], r["seq"], r["name"], r["dtype"], tuple(r["shape"]), r["md5"])


@pytest.fixture(scope="module")
def stats_traces(tmp_path_factory):
    """One host and one device training (stats mode, with the program's own records between
    watch's), shared by the tests below: a device step costs tens of seconds in Triton's
    interpreter. Returns the two trace folders and their records."""
    folder = tmp_path_factory.mktemp("stats")
    host = train(folder / "host", device_digests=False, own_records=True)
    device = train(folder / "device", device_digests=True, own_records=True)
    return folder, host, device


def test_device_digests_are_the_host_paths_record_by_record(stats_traces):
    _, host, device = stats_traces
    assert [key(r) for r in device] == [key(r) for r in host]
    assert len(host) == 2 * (4 + 4 + 4 + 1)  # 4 modules, 4 gradients, 4 parameters, a loss
    assert any(r["shape"] == [96, 64] for r in host)  # 24 KiB: two digest levels
    for h, d in zip(host, device):
        # Summed in another order on the device: equal to rounding, never bit-compared.
        for field in ("max", "min"):
            assert d[field] == h[field], (h["name"], field)
        for field in ("mean", "norm"):
            assert d[field] == pytest.approx(h[field], rel=1e-9, abs=1e-12), (h["name"], field)


# The full tier (docs/testing.md): the device's md5 digests are checked in CI on every dtype and
# batch (test_device_digest.py), the device records' place and values in stats mode (above).
@pytest.mark.full(covered_by="test_device_digest.py::test_one_batch_digests_every_tensor_as_alone")
@pytest.mark.parametrize("batch_bytes", ["step", "record"])
def test_md5_mode_digests_on_the_device_too(tmp_path, monkeypatch, batch_bytes):
    # One step: its digests are handed over when the writer closes (the stats traces above
    # also hand step 0's over when step 1 ends). Batches of a step (all its snapshots digested
    # when it ends) and of a record (a batch full at once: digested as it is recorded).
    from detcheck._torch import device_records as _device_records

    if batch_bytes == "record":
        monkeypatch.setattr(_device_records, "_BATCH_BYTES", 1)
    host = train(tmp_path / "host", device_digests=False, mode="md5", steps=1)
    device = train(tmp_path / "device", device_digests=True, mode="md5", steps=1)
    assert [key(r) for r in device] == [key(r) for r in host]
    assert len(host) == 4 + 4 + 4


def test_the_programs_own_records_keep_their_place(stats_traces):
    _, _, device = stats_traces
    assert [r["name"] for r in device if r["step"] == 1][:5] == [
        "fwd/fc1",
        "fwd/act",
        "fwd/fc2",
        "fwd/(model)",
        "loss",
    ]


def test_device_traces_compare_identical_with_host_traces(stats_traces, detcheck_bin):
    folder, _, _ = stats_traces
    run_detcheck(detcheck_bin, "compare", folder / "host", folder / "device", code=0)


def test_records_picks_what_is_recorded(tmp_path):
    device = train(tmp_path / "d", device_digests=True, records=("grad",), steps=1)
    assert {r["name"].split("/")[0] for r in device} == {"grad"}
    with pytest.raises(ValueError, match="unknown kind"):
        detcheck.torch.watch(Net(), None, records=("fwd", "outputs"))


def test_full_mode_records_go_through_the_host(tmp_path):
    # Full mode writes every tensor: the writer needs the bytes, so no record is digested on the
    # device, and the trace is the host path's.
    host = train(tmp_path / "host", device_digests=False, mode="full")
    device = train(tmp_path / "device", device_digests=True, mode="full")
    assert [key(r) for r in device] == [key(r) for r in host]
    assert len(host) == 2 * (4 + 4 + 4)


def test_a_place_never_filled_fails_the_file(tmp_path):
    w = detcheck.TraceWriter(tmp_path, 0, 1, "md5")
    token = w._record_later(0, "x", "float32", [3])
    w.record(0, "y", torch.zeros(2).numpy())
    with pytest.raises(detcheck.DetcheckError, match="`x` \\(step 0\\) still waited"):
        w.close()
    assert not (tmp_path / "rank0.dctrace").exists()
    assert token == 0


def test_fill_checks_its_token_and_digest(tmp_path):
    with detcheck.TraceWriter(tmp_path, 0, 1, "stats") as w:
        token = w._record_later(0, "x", "float32", [2])
        with pytest.raises(ValueError, match="16 bytes"):
            w._fill(token, b"short")
        with pytest.raises(ValueError, match="token 7"):
            w._fill(7, bytes(16))
        w._fill(token, bytes(range(16)), (2.0, 1.0, 3.0, 5.0, 0, 0, 0))
    (record,) = decode(tmp_path / "rank0.dctrace")
    assert record["md5"] == bytes(range(16)).hex()
    assert (record["max"], record["min"], record["mean"]) == (2.0, 1.0, 1.5)
    assert record["norm"] == pytest.approx(5.0**0.5)


def test_record_digested_writes_what_it_is_given(tmp_path):
    digest = detcheck._detcheck.tensor_digest(torch.arange(2000, dtype=torch.float32).numpy())
    with detcheck.TraceWriter(tmp_path / "a", 0, 1, "md5") as w:
        w.record_digested(0, "x", "float32", [2000], digest)
    with detcheck.TraceWriter(tmp_path / "b", 0, 1, "md5") as w:
        w.record(0, "x", torch.arange(2000, dtype=torch.float32).numpy())
    a, b = decode(tmp_path / "a" / "rank0.dctrace"), decode(tmp_path / "b" / "rank0.dctrace")
    assert [key(r) for r in a] == [key(r) for r in b]
    # Full mode writes every tensor: a digest alone fails the file, which is not left behind.
    w = detcheck.TraceWriter(tmp_path / "c", 0, 1, "full")
    w.record_digested(0, "x", "float32", [2000], digest)
    with pytest.raises(detcheck.DetcheckError, match="must be written with its tensor"):
        w.close()
    assert not (tmp_path / "c" / "rank0.dctrace").exists()
