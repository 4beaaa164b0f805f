"""detcheck.torch.watch and torch tensors in TraceWriter.record. Needs torch (skipped without
it, unless DETCHECK_REQUIRE_TORCH is set: CI sets it)."""

import os
import subprocess
import sys
import textwrap

import pytest
from support import dctrace, decode, digest_hex, requires, run_detcheck

requires("torch")
import detcheck  # noqa: E402
import detcheck.torch  # noqa: E402
import torch  # noqa: E402


def md5(tensor):
    t = tensor.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return digest_hex(t.numpy().tobytes())


@pytest.mark.parametrize(
    "dtype, name",
    [
        (torch.float16, "f16"),
        (torch.bfloat16, "bf16"),
        (torch.float32, "f32"),
        (torch.float64, "f64"),
        (torch.int32, "i32"),
        (torch.int64, "i64"),
        (torch.uint8, "u8"),
        (torch.bool, "bool"),
    ],
)
def test_tensor_dtypes(tmp_path, dtype, name):
    gen = torch.Generator().manual_seed(0)
    t = (torch.randn(4, 6, generator=gen) * 50).to(dtype)
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        w.record(0, "t", t)
        w.record(0, "t.T", t.T)
    plain, transposed = decode(tmp_path / "rank0.dctrace")
    assert (plain["dtype"], plain["shape"], plain["md5"]) == (name, [4, 6], md5(t))
    assert (transposed["shape"], transposed["md5"]) == ([6, 4], md5(t.T.contiguous()))


def test_bf16_bytes_are_the_upper_half_of_f32(tmp_path):
    # Values bf16 holds exactly, so the conversion truncates nothing.
    t = torch.tensor([1.0, -2.5, 2.0**100, 0.15625], dtype=torch.float32)
    upper = (t.view(torch.int32) >> 16).to(torch.int16).numpy().astype("<i2").tobytes()
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        w.record(0, "b", t.to(torch.bfloat16))
    [record] = decode(tmp_path / "rank0.dctrace")
    assert record["md5"] == digest_hex(upper)
    assert record["max"] == 2.0**100 and record["min"] == -2.5


def test_requires_grad_and_unsupported(tmp_path):
    p = torch.nn.Parameter(torch.ones(3))
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        w.record(0, "p", p * 2)
        with pytest.raises(
            TypeError, match=r"cannot record `u32`: dtype torch.uint32 is not supported"
        ):
            w.record(0, "u32", torch.zeros(2, dtype=torch.uint32))
        with pytest.raises(TypeError, match=r"cannot record `u64`: dtype torch.uint64"):
            w.record(0, "u64", torch.zeros(2, dtype=torch.uint64))
    [record] = decode(tmp_path / "rank0.dctrace")
    assert record["md5"] == md5(torch.full((3,), 2.0))


class Pair(torch.nn.Module):
    def forward(self, x):
        return x * 2, {"sum": x.sum(1), "note": "text"}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.act = torch.nn.ReLU()
        self.pair = Pair()
        self.fc2 = torch.nn.Linear(8, 2)

    def forward(self, x):
        h = self.act(self.fc1(x))
        h2, extra = self.pair(h)
        return self.fc2(h2) + extra["sum"][:, None]


def train(dir, steps=2, perturb_step=None, optimizer=True, rank=0, world_size=1, mode="stats"):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1) if optimizer else None
    params_after = []
    with detcheck.TraceWriter(dir, rank, world_size, mode) as w:
        handle = detcheck.torch.watch(model, w, opt)
        for step in range(steps):
            gen = torch.Generator().manual_seed(100 + step + (1 if step == perturb_step else 0))
            x = torch.randn(5, 4, generator=gen)
            loss = model(x).pow(2).mean()
            loss.backward()
            if opt is not None:
                opt.step()
                opt.zero_grad()
            else:
                handle.next_step()
                model.zero_grad()
            params_after.append({n: p.detach().clone() for n, p in model.named_parameters()})
        handle.remove()
        model(torch.zeros(1, 4))  # after remove(): nothing recorded
    return decode(dir / f"rank{rank}.dctrace"), params_after, model


def test_watch_names_steps_and_order(tmp_path):
    records, params_after, model = train(tmp_path)
    step0 = [r["name"] for r in records if r["step"] == 0]
    fwd = ["fwd/fc1", "fwd/act", "fwd/pair.0", "fwd/pair.1.sum", "fwd/fc2", "fwd/(model)"]
    names = [n for n, _ in model.named_parameters()]
    assert step0 == fwd + ["grad/" + n for n in names] + ["param/" + n for n in names]
    assert {r["step"] for r in records} == {0, 1}
    assert not any(r["replicated"] for r in records)
    for r in records:
        if r["name"].startswith("param/"):
            assert r["md5"] == md5(params_after[r["step"]][r["name"][6:]]), r


def test_watch_adds_torch_versions_to_the_environment(tmp_path):
    train(tmp_path)
    out = dctrace(tmp_path / "rank0.dctrace")
    assert f"environment: torch.version={torch.__version__}" in out, out
    if torch.version.cuda is not None:
        assert f"environment: torch.cuda={torch.version.cuda}" in out, out


def test_watch_without_optimizer_next_step(tmp_path):
    records, _, model = train(tmp_path, optimizer=False)
    names = [n for n, _ in model.named_parameters()]
    for step in (0, 1):
        got = [r["name"] for r in records if r["step"] == step and not r["name"].startswith("fwd/")]
        assert got == ["grad/" + n for n in names]


def test_watch_step_and_context_manager(tmp_path):
    model = torch.nn.Linear(2, 2)
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        with detcheck.torch.watch(model, w, start_step=5) as handle:
            assert handle.current_step == 5
            model(torch.ones(1, 2))
            handle.step(9)
            model(torch.ones(1, 2))
        model(torch.ones(1, 2))  # removed by the with block
    records = decode(tmp_path / "rank0.dctrace")
    assert [(r["step"], r["name"]) for r in records] == [(5, "fwd/(model)"), (9, "fwd/(model)")]


def test_watch_runs_compare(tmp_path, detcheck_bin):
    train(tmp_path / "a")
    train(tmp_path / "b")
    train(tmp_path / "c", perturb_step=1)
    run_detcheck(detcheck_bin, "compare", tmp_path / "a", tmp_path / "b", code=0)
    out = run_detcheck(detcheck_bin, "compare", tmp_path / "a", tmp_path / "c", code=1).out
    assert "first divergence: step 1 rank 0 seq 0 `fwd/fc1`" in out, out


DDP_PROGRAM = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist, detcheck, detcheck.torch
    rank, world, store, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with detcheck.TraceWriter(out, rank, world) as w:
        handle = detcheck.torch.watch(model, w, opt)
        assert handle.replicated
        for step in range(2):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(10 * step + rank))
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    dist.destroy_process_group()
    """
)


def two_ranks(tmp_path, source):
    """The decoded records of each of two processes running ``source`` as ranks 0 and 1 of a
    gloo group (its arguments: rank, world size, store file, dump folder)."""
    program = tmp_path / "ddp.py"
    program.write_text(source)
    store, out = tmp_path / "store", tmp_path / "dump"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen([sys.executable, str(program), str(r), "2", str(store), str(out)], env=env)
        for r in range(2)
    ]
    assert [p.wait(timeout=240) for p in procs] == [0, 0]
    return [decode(out / f"rank{r}.dctrace") for r in range(2)]


def test_watch_ddp_records_replicated_gradients(tmp_path):
    requires("gloo")
    ranks = two_ranks(tmp_path, DDP_PROGRAM)
    # Both ranks recorded the same records, 2 steps of them: the loop below compares them all.
    names = [[(r["step"], r["name"]) for r in records] for records in ranks]
    assert names[0] == names[1], f"{len(names[0])} and {len(names[1])} records"
    assert {step for step, _ in names[0]} == {0, 1}, names[0]
    for r0, r1 in zip(*ranks):
        assert r0["name"] == r1["name"]
        if r0["name"].startswith(("grad/", "param/")):
            assert r0["replicated"] and r1["replicated"], r0
            assert r0["md5"] == r1["md5"], r0["name"]
        else:
            # Each rank's own shard of the batch: forward outputs are its own.
            assert not r0["replicated"]
            assert r0["md5"] != r1["md5"], r0["name"]
    names = {r["name"] for r in ranks[0]}
    assert "grad/0.weight" in names and "fwd/(model)" in names  # no `module.` prefix


def hooks(model, opt):
    """Every hook that could record `model` and `opt`: on each module, each parameter, the
    optimizer, and torch's global module and optimizer hooks (by kind, a list of counts)."""
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim

    found = {}
    for kind in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
        found[kind] = [len(getattr(m, kind)) for m in model.modules()]
    found["param"] = [
        len(p._post_accumulate_grad_hooks or {}) + len(p._backward_hooks or {})
        for p in model.parameters()
    ]
    found["optimizer"] = [len(opt._optimizer_step_pre_hooks), len(opt._optimizer_step_post_hooks)]
    found["global"] = [
        len(nn_module._global_forward_hooks),
        len(nn_module._global_forward_pre_hooks),
        len(optim._global_optimizer_pre_hooks),
        len(optim._global_optimizer_post_hooks),
    ]
    return found


def test_watch_without_a_writer_records_nothing():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = hooks(model, opt)
    assert all(n == 0 for kind, counts in before.items() if kind != "global" for n in counts)
    handle = detcheck.torch.watch(model, None, opt)
    # Nothing could record: watch added no hook anywhere (a hook that runs and finds no writer
    # would still cost every forward, and record where a writer appears).
    assert hooks(model, opt) == before, "watch without a writer added hooks"
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    handle.next_step()
    assert handle.current_step == 1  # only next_step counts: no hooks on the optimizer
    handle.remove()
    assert hooks(model, opt) == before


def _is_cow(tensor):
    return torch._C._is_cow_tensor(tensor)


@pytest.mark.parametrize("mode", ["md5", "stats"])
def test_a_module_output_is_lent_and_may_change_at_once(tmp_path, mode):
    # A fresh result of autograd's operators is recorded with no copy: a copy-on-write
    # snapshot the writer's thread reads (detcheck._torch.tensors.lendable). The program may write
    # into it as soon as `put` returns, and may drop it, and the record is still of the values
    # it had; writes through the tensor still reach its views. 80 MiB in all: beyond what the
    # writer holds in flight (64 MiB), so `put` waits for room too.
    from detcheck._torch.frontend import TorchSink

    assert getattr(torch, "_lazy_clone", None) is not None, "CI's torch has a copy-on-write clone"
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 1024, generator=gen, requires_grad=True)
    want, kept = [], []
    with detcheck.TraceWriter(tmp_path, 0, 1, mode) as w:
        sink = TorchSink(w, None)
        for i in range(80):
            out = x * (i + 1)
            want.append((md5(out), float(out.detach().max()), float(out.detach().min())))
            sink.put(0, f"fwd/{i}", out)
            assert _is_cow(out), "a module's output is lent, not copied"
            view = out[:3]
            with torch.no_grad():
                out.mul_(-1)  # the program's next write: it gets memory of its own
            assert torch.equal(view, out[:3]), "a write still reaches the tensor's views"
            if i % 2:
                kept.append(out)  # half are kept alive, half dropped at once
    records = decode(tmp_path / "rank0.dctrace")
    assert len(records) == 80
    for r, (digest, hi, lo) in zip(records, want):
        assert r["md5"] == digest, r
        if mode == "stats":
            assert (r["max"], r["min"]) == (hi, lo), r


def test_what_is_not_lent_is_copied(tmp_path):
    # Handed over one at a time (`put`, a module output's rule), parameters, gradients, views,
    # small tensors and tensors on numpy's memory are copied (no copy-on-write is made of them:
    # a pointer taken of them earlier, a numpy view, must keep seeing their writes), and
    # recorded as they were. (A step's gradients and parameters, handed over together, have
    # a rule of their own: the test below.)
    import numpy as np
    from detcheck._torch.frontend import TorchSink

    layer = torch.nn.Linear(512, 512)
    layer(torch.randn(4, 512)).sum().backward()
    big = torch.randn(256, 1024, requires_grad=True) * 2
    from_numpy = torch.from_numpy(np.ones((256, 1024), np.float32))
    cases = {
        "param": layer.weight,
        "grad": layer.weight.grad,
        "view": big[:128],
        "small": big[:1] * 1,
        "numpy": from_numpy,
        "no_grad": big.detach() * 1,
    }
    alias = layer.weight.detach().numpy()  # a numpy view of a parameter, taken before
    want = {n: md5(t) for n, t in cases.items()}
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        sink = TorchSink(w, None)
        for name, t in cases.items():
            sink.put(0, name, t)
            assert not _is_cow(t), f"{name} must be copied, not lent"
            with torch.no_grad():
                t.add_(1)
    assert alias[0, 0] == float(layer.weight.detach()[0, 0]), (
        "the numpy view still sees the parameter"
    )
    got = {r["name"]: r["md5"] for r in decode(tmp_path / "rank0.dctrace")}
    assert got == want


def test_a_steps_gradients_and_parameters_are_lent_unless_something_else_holds_them(
    tmp_path, monkeypatch
):
    # A step's gradients and parameters are lent (no copy) when every reference to their
    # memory is a tensor the recorder sees (detcheck._torch.tensors.lendable's second rule), and
    # copied when a numpy array or a DLPack alias of it exists: those would stop following the
    # tensor if torch gave it memory of its own. Lent or copied, the records and the training
    # are the same as unrecorded.
    import detcheck._torch.tensors as tensors
    import numpy as np

    assert tensors._USE_COUNT is not None, "CI's torch counts a storage's references"

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(256, 256)
            self.b = torch.nn.Linear(256, 256)  # a numpy view of its weight is kept
            self.c = torch.nn.Linear(256, 256)  # a DLPack alias of its weight is kept
            self.d = torch.nn.Linear(256, 256)

        def forward(self, x):
            return self.d(self.c(self.b(self.a(x).relu()).relu()).relu())

    def train(dir, lend_state):
        monkeypatch.setattr(tensors, "_USE_COUNT", tensors._USE_COUNT if lend_state else None)
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        viewed = model.b.weight.detach().numpy()
        aliased = np.from_dlpack(model.c.weight.detach())
        writer = detcheck.TraceWriter(dir, 0, 1, "stats") if dir else None
        handle = detcheck.torch.watch(model, writer, optimizer=opt) if dir else None

        def seen():
            # The numpy view and the DLPack alias still see the parameter's every write.
            assert np.array_equal(viewed, model.b.weight.detach().numpy())
            assert np.array_equal(aliased, model.c.weight.detach().numpy())
            # Lent when recorded (after the update; the gradients before it): copy-on-write
            # until the next write, which the snapshot's release leaves a plain write.
            return {
                name: (_is_cow(p), _is_cow(p.grad))
                for name, p in model.named_parameters()
                if name.endswith("weight")
            }

        lent = _train(model, opt, (16, 256), seen)
        if dir:
            handle.remove()
            writer.close()
        return [p.detach().clone() for p in model.parameters()], lent

    real = tensors._USE_COUNT
    params, lent = train(tmp_path / "lent", True)
    if_lent = {"a.weight": (True, True), "b.weight": (False, True)}
    if_lent.update({"c.weight": (False, True), "d.weight": (True, True)})
    assert lent == [if_lent] * 3
    monkeypatch.setattr(tensors, "_USE_COUNT", real)
    copied, never = train(tmp_path / "copied", False)
    assert never == [{n: (False, False) for n in if_lent}] * 3
    unrecorded, _ = train(None, True)
    records = decode(tmp_path / "lent" / "rank0.dctrace")
    assert records == decode(tmp_path / "copied" / "rank0.dctrace")
    assert len(records) == 3 * (5 + 8 + 8)  # a step: 5 outputs, 8 gradients, 8 parameters
    assert all(torch.equal(a, b) for a, b in zip(params, unrecorded))
    assert all(torch.equal(a, b) for a, b in zip(copied, unrecorded))


def test_parameters_in_shared_memory_stay_shared_while_recorded(tmp_path):
    # Hogwild training: the parameters live in shared memory that other processes update. A
    # snapshot would move a parameter to memory of its own at its next write, out of their
    # reach: torch refuses to snapshot shared memory, and detcheck copies those.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    model.share_memory()
    where = [p.data_ptr() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        handle = detcheck.torch.watch(model, w, optimizer=opt)
        _train(model, opt, (8, 256))
        handle.remove()
    assert all(p.is_shared() and not _is_cow(p) for p in model.parameters())
    assert [p.data_ptr() for p in model.parameters()] == where
    assert len(decode(tmp_path / "rank0.dctrace")) == 3 * (4 + 4 + 4)


def test_views_of_one_buffer_are_lent_only_with_all_their_siblings(tmp_path):
    # Gradients that are views of one flat buffer (FSDP2's reduce-scatter output, a bucket)
    # hold it together: lent when all of them are recorded together (their small ones too, so
    # that none is read through numpy, which would copy the whole buffer), copied when one of
    # them is not among the tensors seen: it is a holder the recorder cannot account for.
    from detcheck._torch.frontend import TorchSink

    flat = torch.randn(3 * 256 * 256 + 16)
    weights = [flat[i * 65536 : (i + 1) * 65536].view(256, 256) for i in range(3)]
    bias = flat[3 * 65536 :]
    want = [md5(t) for t in (*weights, bias)]
    with detcheck.TraceWriter(tmp_path / "all", 0, 1) as w:
        sink = TorchSink(w, None)
        items = [(f"grad/w{i}", t) for i, t in enumerate(weights)] + [("grad/bias", bias)]
        sink.put_state(0, items, False)
        assert _is_cow(flat), "every view of the buffer is recorded: the buffer is lent"
    with torch.no_grad():
        flat.add_(1)  # the program's next write reaches every view
    assert torch.equal(bias, flat[3 * 65536 :])
    got = [r["md5"] for r in decode(tmp_path / "all" / "rank0.dctrace")]
    assert got == want

    flat2 = torch.randn(2 * 65536)
    first, second = flat2[:65536], flat2[65536:]
    with detcheck.TraceWriter(tmp_path / "some", 0, 1) as w:
        TorchSink(w, None).put_state(0, [("grad/first", first)], False)
        assert not _is_cow(flat2), "a view not recorded with it holds the buffer: copied"
    assert second.numel() == 65536


def test_fsdp2_gradient_and_parameter_shards_are_lent(tmp_path, monkeypatch):
    # FSDP2's shards (DTensor parameters whose local tensors FSDP2 holds twice more, gradients
    # that are views of one reduce-scatter buffer): lent, counted with FSDP2's own holders
    # (detcheck._torch.subclasses.shard_holders); the records and the training are those of a copy.
    import detcheck._torch.tensors as tensors
    import torch.distributed as dist

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard

    def train(dir, lend_state):
        monkeypatch.setattr(tensors, "_USE_COUNT", real if lend_state else None)
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 128)
        )
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        writer = detcheck.TraceWriter(dir, 0, 1, "md5")
        handle = detcheck.torch.watch(model, writer, optimizer=opt)
        lent = _train(
            model,
            opt,
            (8, 128),
            lambda: [
                (_is_cow(p.to_local()), _is_cow(p.grad.to_local())) for p in model.parameters()
            ],
        )
        handle.remove()
        writer.close()
        return [p.full_tensor().clone() for p in model.parameters()], lent

    real = tensors._USE_COUNT
    assert real is not None, "CI's torch counts a storage's references"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        params, lent = train(tmp_path / "lent", True)
        copied, never = train(tmp_path / "copied", False)
    finally:
        dist.destroy_process_group()
    # Weights (128 KiB) lent; biases too small to lend on their own storage, but a bias's
    # gradient shares the weight's reduce-scatter buffer, lent already: lent with it.
    assert lent == [[(True, True), (False, True), (True, True), (False, True)]] * 3
    assert never == [[(False, False)] * 4] * 3
    records = decode(tmp_path / "lent" / "rank0.dctrace")
    assert records == decode(tmp_path / "copied" / "rank0.dctrace")
    assert {r["name"] for r in records} >= {"grad/0.weight", "param/2.bias"}
    assert all(torch.equal(a, b) for a, b in zip(params, copied))


def test_an_aborted_writer_lets_its_lent_tensors_go(tmp_path):
    # Lent snapshots still in flight when the writer aborts (an exception in its `with`) are
    # let go with it: no file is left, and the program's tensors are still its own.
    from detcheck._torch.frontend import TorchSink

    x = torch.randn(512, 512, requires_grad=True)
    outs = []
    with pytest.raises(ValueError):
        with detcheck.TraceWriter(tmp_path, 0, 1) as w:
            sink = TorchSink(w, None)
            for i in range(8):
                outs.append(x * i)
                sink.put(0, f"fwd/{i}", outs[-1])
            raise ValueError("the program failed")
    assert not list(tmp_path.iterdir())
    with torch.no_grad():
        for i, out in enumerate(outs):
            out.add_(1)
            assert torch.equal(out, x.detach() * i + 1)


def _train(model, opt, shape, seen=lambda: None, steps=3):
    """``steps`` updates of ``model`` on seeded batches of ``shape`` (the same in every run),
    minimizing their outputs' mean square; ``seen()`` after each update, its answers returned."""
    answers = []
    for step in range(steps):
        gen = torch.Generator().manual_seed(step)
        loss = model(torch.randn(*shape, generator=gen)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        answers.append(seen())
    return answers


def test_lending_changes_no_record_and_no_training(tmp_path, monkeypatch):
    # A CNN whose outputs are written in place right after they are recorded (ReLU(inplace)
    # after BatchNorm, an in-place residual): lent and copied, the traces are the same bytes'
    # records, and the training is the same as unrecorded.
    import detcheck._torch.tensors as tensors

    assert tensors._LAZY_CLONE is not None, "CI's torch has a copy-on-write clone"

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 32, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(32)
            self.relu = torch.nn.ReLU(inplace=True)
            self.conv2 = torch.nn.Conv2d(32, 32, 3, padding=1)
            self.head = torch.nn.Linear(32 * 16 * 16, 10)

        def forward(self, x):
            y = self.relu(self.bn(self.conv(x)))
            z = self.conv2(y)
            z += y
            return self.head(z.relu_().flatten(1))

    def train(dir, lend):
        monkeypatch.setattr(tensors, "_LAZY_CLONE", tensors._LAZY_CLONE if lend else None)
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        writer = detcheck.TraceWriter(dir, 0, 1, "stats") if dir else None
        handle = detcheck.torch.watch(model, writer, optimizer=opt) if dir else None
        _train(model, opt, (16, 3, 16, 16))
        if dir:
            handle.remove()
            writer.close()
        return [p.detach().clone() for p in model.parameters()]

    real = tensors._LAZY_CLONE
    lent = train(tmp_path / "lent", True)
    monkeypatch.setattr(tensors, "_LAZY_CLONE", real)
    copied = train(tmp_path / "copied", False)
    unrecorded = train(None, True)
    records = decode(tmp_path / "lent" / "rank0.dctrace")
    assert records == decode(tmp_path / "copied" / "rank0.dctrace")
    assert len(records) == 3 * (6 + 8 + 8)  # a step: 6 outputs, 8 gradients, 8 parameters
    assert all(torch.equal(a, b) for a, b in zip(lent, unrecorded))
    assert all(torch.equal(a, b) for a, b in zip(copied, unrecorded))


NO_SYNC_PROGRAM = DDP_PROGRAM.replace("range(2)", "range(3)").replace(
    "        model(x).pow(2).mean().backward()\n        opt.step()\n",
    "        if step == 0:  # LocalSGD's way: an update from the rank's own gradients\n"
    "            with model.no_sync():\n"
    "                model(x).pow(2).mean().backward()\n"
    "                opt.step()\n"
    "        elif step == 1:  # the same, the update after the block\n"
    "            with model.no_sync():\n"
    "                model(x).pow(2).mean().backward()\n"
    "            opt.step()\n"
    "        else:\n"
    "            model(x).pow(2).mean().backward()\n"
    "            opt.step()\n",
)


def test_a_step_updated_inside_no_sync_records_its_gradients_as_the_ranks_own(tmp_path):
    """DDP's `no_sync()` (accelerate's `LocalSGD` holds it for its whole loop and averages the
    parameters every k steps): each rank's update is made from its own gradients, so that
    step's gradients and parameters are no replicas (they were, and `replicas` failed a correct
    program), also where the update runs after the block; the next synced step's are again."""
    requires("gloo")
    assert NO_SYNC_PROGRAM != DDP_PROGRAM
    ranks = two_ranks(tmp_path, NO_SYNC_PROGRAM)
    state = [(r0, r1) for r0, r1 in zip(*ranks) if r0["name"].startswith(("grad/", "param/"))]
    assert {r0["step"] for r0, _ in state} == {0, 1, 2}, state
    for r0, r1 in state:
        if r0["step"] < 2:
            assert not r0["replicated"] and not r1["replicated"], r0
            assert r0["md5"] != r1["md5"], r0["name"]
        else:
            assert r0["replicated"] and r1["replicated"], r0


def test_a_collective_the_program_leaves_running_is_noted_and_a_librarys_is_not(
    tmp_path, monkeypatch
):
    """A collective started with `async_op=True` runs on gloo's threads beside the program: a
    tensor read before its `wait()` is a race that recording can hide, so the program's own such
    call is noted (`site:async_collective`) and its run is not claimed synchronous (it keeps
    `repeat`'s unperturbed runs, docs/checks.md); a waited call, or a library's own asynchronous
    call (DDP's, FSDP's: they wait where they must), is not noted."""
    requires("gloo")
    import torch.distributed as dist
    from detcheck._core import evidence as ev
    from detcheck._torch import frontend

    for name in frontend._MAY_RUN_BESIDE + frontend._ALWAYS_BESIDE:
        if hasattr(dist, name):
            monkeypatch.setattr(dist, name, getattr(dist, name))  # restored after the test
    monkeypatch.setattr(ev, "_facts", {})
    frontend._note_collectives_left_running()
    store = f"file://{tmp_path / 'store'}"
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    try:
        t = torch.ones(4)
        dist.all_reduce(t)
        library = os.path.join(ev._PACKAGES[0], "somelib", "sync.py")
        code = compile("dist.all_reduce(t, async_op=True).wait()", library, "exec")
        exec(code, {"dist": dist, "t": t})
        assert frontend.ASYNC_COLLECTIVE not in ev.facts(), ev.facts()
        line = sys._getframe().f_lineno + 1
        dist.all_reduce(t, async_op=True).wait()
        noted = ev.facts()[frontend.ASYNC_COLLECTIVE]
        assert noted.endswith(f"test_torch.py:{line}"), noted
        assert frontend.synchronous() is None
    finally:
        dist.destroy_process_group()
