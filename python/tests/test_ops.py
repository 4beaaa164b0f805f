"""The operator trace of detcheck.torch.watch (detcheck/_torch/ops.py): a re-run asked to capture a
record of watch also writes `<DETCHECK_CAPTURE_DIR>/ops/rank0.dctrace`, the inputs and outputs of
every operator inside that record's module. Needs torch (skipped without it, unless
DETCHECK_REQUIRE_TORCH is set: CI sets it)."""

import re

import pytest
from support import decode, requires

requires("torch")
import detcheck  # noqa: E402
import detcheck._torch.ops  # noqa: E402
import detcheck.torch  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import _get_current_dispatch_mode  # noqa: E402

#: The requested step.
STEP = 1

OP = re.compile(
    r"^op/(?P<i>\d{4})/(?P<module>[^/]+)/(?P<func>[^/]+)/(?P<io>in|out)(?P<j>\d+)"
    r"(<(?P<source>op\d+\.out\d+|in\d+|grad_out\d+|scalar))?$"
)


@torch.library.custom_op("detcheck_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


twice.register_autograd(lambda ctx, grad: grad * 2)


class Net(torch.nn.Module):
    """`act` runs twice a step: `fwd/act` has occurrences 0 and 1."""

    def __init__(self, custom=False):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.act = torch.nn.ReLU()
        self.block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
        self.fc2 = torch.nn.Linear(8, 2)
        self.custom = custom

    def forward(self, x):
        h = self.block(self.act(self.fc1(x)))
        if self.custom:
            h = twice(h)
        return self.fc2(self.act(h))


class BnNet(torch.nn.Module):
    """A ResNet stem: batch norm, then an in-place ReLU on its output."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.relu = torch.nn.ReLU(inplace=True)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.relu(self.bn(self.fc(x))))


class Two(torch.nn.Module):
    """A module of its own parameter with two outputs."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 8)
        self.weight = torch.nn.Parameter(torch.ones(8))

    def forward(self, x):
        h = self.fc(x)
        return h * self.weight, {"scaled": h * 3, "note": "text"}


class TwoNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.two = Two()
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x):
        a, extra = self.two(x)
        return self.head(torch.tanh(a) + extra["scaled"])


class Scaled(torch.nn.Module):
    """A parameter of the model itself: its owner is `(model)`."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)
        self.scale = torch.nn.Parameter(torch.full((2,), 0.5))

    def forward(self, x):
        return self.fc(x) * self.scale


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """Each test as a process of its own: no window opened yet, no capture request."""
    monkeypatch.setattr(detcheck._torch.ops, "_opened", False)
    monkeypatch.delenv("DETCHECK_CAPTURE", raising=False)
    monkeypatch.delenv("DETCHECK_CAPTURE_DIR", raising=False)


def train(
    monkeypatch, out, request=None, rank=0, model_class=Net, optimizer=True, fresh=True, **kw
):
    """Two steps of `model_class` under watch, asked to capture `request` (`(rank, step,
    occurrence, name)` or None) into `out / "capture"`, as a new process (`fresh`: no window
    opened yet); returns the program's records, the handle and the model."""
    if fresh:
        monkeypatch.setattr(detcheck._torch.ops, "_opened", False)
    if request is not None:
        monkeypatch.setenv("DETCHECK_CAPTURE", ":".join(str(part) for part in request))
        monkeypatch.setenv("DETCHECK_CAPTURE_DIR", str(out / "capture"))
    torch.manual_seed(0)
    model = model_class(**kw)
    opt = torch.optim.SGD(model.parameters(), lr=0.1) if optimizer else None
    with detcheck.TraceWriter(out / "run", rank, rank + 1) as w:
        handle = detcheck.torch.watch(model, w, opt)
        for step in range(2):
            x = torch.randn(5, 4, generator=torch.Generator().manual_seed(100 + step))
            model(x).pow(2).mean().backward()
            if opt is not None:
                opt.step()
                opt.zero_grad()
            else:
                handle.next_step()
                model.zero_grad()
    assert _get_current_dispatch_mode() is None
    return decode(out / "run" / f"rank{rank}.dctrace"), handle, model


def assert_unhooked(model):
    """Only watch's own hooks are left: a forward hook on every module, held by detcheck
    (``MODULE_HOOKS``), none in the modules themselves."""
    from detcheck._torch.tensors import MODULE_HOOKS

    for _, module in model.named_modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
        assert len(MODULE_HOOKS._post[id(module)][1]) == 1
        assert id(module) not in MODULE_HOOKS._pre
    for _, param in model.named_parameters():
        assert not param._post_accumulate_grad_hooks


def ops_file(out):
    return out / "capture" / "ops" / "rank0.dctrace"


def trace(out):
    """The operator trace's records; checks the grammar of every name and the numbering."""
    records = decode(ops_file(out))
    assert records and {r["step"] for r in records} == {STEP}
    seen = -1
    for r in records:
        if r["name"].startswith("window/"):
            assert seen == -1, r["name"]  # window inputs first
            assert re.fullmatch(r"window/(in|grad_out)\d+", r["name"]), r["name"]
            continue
        m = OP.match(r["name"])
        assert m, r["name"]
        i = int(m["i"])
        assert i >= seen, r["name"]
        seen = i
        if m["source"] and m["source"].startswith("op"):
            assert int(m["source"][2:].split(".")[0]) < i, r["name"]
    return records


def ops(records):
    """`{i: (module, func, [names])}` of the operator records."""
    out = {}
    for r in records:
        m = OP.match(r["name"])
        if m:
            out.setdefault(int(m["i"]), (m["module"], m["func"], []))[2].append(r["name"])
    return out


def md5_of(records, name, step=STEP, occurrence=0):
    return [r["md5"] for r in records if r["step"] == step and r["name"] == name][occurrence]


def test_forward_window_of_the_model(monkeypatch, tmp_path):
    program, handle, model = train(monkeypatch, tmp_path, (0, STEP, 0, "fwd/(model)"))
    records = trace(tmp_path)
    names = [r["name"] for r in records]
    assert names[0] == "window/in0"
    assert not any(n.startswith("window/") for n in names[1:])
    by_op = ops(records)
    assert sorted(by_op) == list(range(len(by_op)))  # every operator numbered, in order
    # fc1 is `t` then `addmm` (bias, input, weight.t()), whose input is the window's.
    calls = [(module, func) for module, func, _ in by_op.values()]
    assert calls[:3] == [
        ("fc1", "aten.t.default"),
        ("fc1", "aten.addmm.default"),
        ("act", "aten.relu.default"),
    ]
    assert by_op[1][2] == [
        "op/0001/fc1/aten.addmm.default/in0",
        "op/0001/fc1/aten.addmm.default/in1<in0",
        "op/0001/fc1/aten.addmm.default/in2<op0.out0",
        "op/0001/fc1/aten.addmm.default/out0",
    ]
    assert by_op[2][2] == [
        "op/0002/act/aten.relu.default/in0<op1.out0",
        "op/0002/act/aten.relu.default/out0",
    ]
    assert {module for module, _ in calls} == {"fc1", "act", "block.0", "block.1", "fc2"}
    # The values are the program's: the window's input is the batch, the last output the model's.
    assert records[-1]["md5"] == md5_of(program, "fwd/(model)")
    fc1_out = md5_of(program, "fwd/fc1")
    assert next(r for r in records if r["name"].endswith("addmm.default/out0"))["md5"] == fc1_out
    assert_unhooked(model)
    handle.remove()
    for _, module in model.named_modules():
        assert not module._forward_hooks and not module._forward_pre_hooks


def test_forward_window_of_a_nested_module_and_an_occurrence(monkeypatch, tmp_path):
    program, _, _ = train(monkeypatch, tmp_path / "a", (0, STEP, 0, "fwd/block"))
    records = trace(tmp_path / "a")
    assert records[0]["name"] == "window/in0"
    assert records[0]["md5"] == md5_of(program, "fwd/act")  # block's input: act's output
    calls = [(module, func) for module, func, _ in ops(records).values()]
    assert calls[:3] == [
        ("block.0", "aten.t.default"),
        ("block.0", "aten.addmm.default"),
        ("block.1", "aten.tanh.default"),
    ]
    assert {module for module, _ in calls} == {"block.0", "block.1"}  # only block's operators
    tanh_out = next(r for r in records if r["name"].endswith("tanh.default/out0"))
    assert tanh_out["md5"] == md5_of(program, "fwd/block")
    # `fwd/act` occurrence 1: act's second call in step 1, on block's output.
    train(monkeypatch, tmp_path / "b", (0, STEP, 1, "fwd/act"))
    records = trace(tmp_path / "b")
    assert records[0]["md5"] == md5_of(program, "fwd/block")
    assert records[1]["name"] == "op/0000/act/aten.relu.default/in0<in0"
    assert {module for module, _, _ in ops(records).values()} == {"act"}
    relu_out = next(r for r in records if r["name"] == "op/0000/act/aten.relu.default/out0")
    assert relu_out["md5"] == md5_of(program, "fwd/act", occurrence=1)
    # A suffix of the record (a tuple output's `.0`) names the same module's window.
    train(monkeypatch, tmp_path / "c", (0, STEP, 0, "fwd/block.1.0"))
    assert {m for m, _, _ in ops(trace(tmp_path / "c")).values()} == {"block.1"}


def test_backward_window(monkeypatch, tmp_path):
    program, _, model = train(monkeypatch, tmp_path, (0, STEP, 0, "grad/block.0.weight"))
    records = trace(tmp_path)
    assert records[0]["name"] == "window/grad_out0"
    by_op = ops(records)
    assert {module for module, _, _ in by_op.values()} == {"block.0"}  # the owner's label
    funcs = [func for _, func, _ in by_op.values()]
    assert "aten.mm.default" in funcs and "aten.t.default" in funcs
    assert any(n.endswith("<grad_out0") for _, _, names in by_op.values() for n in names)
    # The gradient the program records is an output of the window's operators.
    outputs = {r["md5"] for r in records if "/out" in r["name"]}
    assert md5_of(program, "grad/block.0.weight") in outputs
    assert_unhooked(model)


def test_backward_window_of_the_model_without_optimizer(monkeypatch, tmp_path):
    program, _, model = train(monkeypatch, tmp_path, (0, STEP, 0, "grad/fc2.bias"), optimizer=False)
    assert_unhooked(model)
    records = trace(tmp_path)
    assert records[0]["name"] == "window/grad_out0"
    assert {module for module, _, _ in ops(records).values()} == {"fc2"}
    assert md5_of(program, "grad/fc2.bias") in {r["md5"] for r in records if "/out" in r["name"]}


def test_backward_window_under_an_in_place_relu(monkeypatch, tmp_path):
    # A full backward hook on `bn` would make ReLU(inplace=True) raise; the window must not.
    program, _, _ = train(monkeypatch, tmp_path, (0, STEP, 0, "grad/bn.weight"), model_class=BnNet)
    records = trace(tmp_path)
    funcs = {func for module, func, _ in ops(records).values()}
    assert "aten.native_batch_norm_backward.default" in funcs
    assert {module for module, _, _ in ops(records).values()} == {"bn"}
    assert md5_of(program, "grad/bn.weight") in {r["md5"] for r in records if "/out" in r["name"]}


def test_backward_window_of_a_module_with_two_outputs(monkeypatch, tmp_path):
    train(monkeypatch, tmp_path, (0, STEP, 0, "grad/two.weight"), model_class=TwoNet)
    records = trace(tmp_path)
    assert [r["name"] for r in records[:2]] == ["window/grad_out0", "window/grad_out1"]
    assert {module for module, _, _ in ops(records).values()} == {"two"}
    # The window opens once both gradients have arrived (the backward of `h * 3`, whose came
    # first, already ran): the backward of `h * weight` and what follows.
    funcs = [(func, names[0]) for _, func, names in ops(records).values()]
    assert funcs[:2] == [
        ("aten.mul.Tensor", "op/0000/two/aten.mul.Tensor/in0<grad_out0"),
        ("aten.mul.Tensor", "op/0001/two/aten.mul.Tensor/in0<grad_out0"),
    ]


def test_backward_window_of_a_parameter_of_the_model(monkeypatch, tmp_path):
    program, _, _ = train(monkeypatch, tmp_path, (0, STEP, 0, "grad/scale"), model_class=Scaled)
    records = trace(tmp_path)
    assert records[0]["name"] == "window/grad_out0"  # the gradient of the model's output
    assert {module for module, _, _ in ops(records).values()} == {"(model)"}
    assert md5_of(program, "grad/scale") in {r["md5"] for r in records if "/out" in r["name"]}


def test_optimizer_window(monkeypatch, tmp_path):
    program, _, model = train(monkeypatch, tmp_path, (0, STEP, 0, "param/fc1.bias"))
    assert_unhooked(model)
    records = trace(tmp_path)
    assert not any(r["name"].startswith("window/") for r in records)
    by_op = ops(records)
    assert {module for module, _, _ in by_op.values()} == {"(optimizer)"}
    assert "aten.add_.Tensor" in {func for _, func, _ in by_op.values()}
    # SGD updates every parameter in place: the updated values are the operators' outputs.
    outputs = {r["md5"] for r in records if "/out" in r["name"]}
    for name, _ in model.named_parameters():
        assert md5_of(program, "param/" + name) in outputs, name


def test_custom_op(monkeypatch, tmp_path):
    train(monkeypatch, tmp_path, (0, STEP, 0, "fwd/(model)"), custom=True)
    by_op = ops(trace(tmp_path))
    [tanh] = [i for i, (_, func, _) in by_op.items() if func == "aten.tanh.default"]
    [i] = [i for i, (_, func, _) in by_op.items() if func == "detcheck_test.twice.default"]
    # One operator, called in the model's own forward on tanh's output; the operators of its
    # implementation (`x * 2`) run inside it and are not traced.
    assert by_op[i][2] == [
        f"op/{i:04d}/(model)/detcheck_test.twice.default/in0<op{tanh}.out0",
        f"op/{i:04d}/(model)/detcheck_test.twice.default/out0",
    ]
    assert "aten.mul.Tensor" not in {func for _, func, _ in by_op.values()}
    assert by_op[i + 1][2][0] == f"op/{i + 1:04d}/act/aten.relu.default/in0<op{i}.out0"


@pytest.mark.parametrize(
    "rank, name",
    [
        (1, "fwd/(model)"),  # another rank's record
        (0, "fwd/nothing"),
        (0, "grad/nothing"),
        (0, "param/nothing"),
        (0, "loss"),
        (0, "fwdx/(model)"),
    ],
)
def test_no_trace_for_another_rank_or_name(monkeypatch, tmp_path, rank, name):
    _, handle, model = train(monkeypatch, tmp_path, (rank, STEP, 0, name))
    assert handle._recording._ops is None
    assert not (tmp_path / "capture").exists()
    assert_unhooked(model)


def test_no_param_window_without_optimizer(monkeypatch, tmp_path):
    _, handle, _ = train(monkeypatch, tmp_path, (0, STEP, 0, "param/fc1.bias"), optimizer=False)
    assert handle._recording._ops is None and not ops_file(tmp_path).exists()


def test_a_request_of_a_step_that_never_comes(monkeypatch, tmp_path):
    _, handle, model = train(monkeypatch, tmp_path / "a", (0, 7, 0, "grad/fc1.weight"))
    handle.remove()
    for _, module in model.named_modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    _, _, model = train(monkeypatch, tmp_path / "b", (0, STEP, 5, "fwd/fc1"))  # runs once a step
    assert_unhooked(model)  # step 1 is over: its window cannot come
    assert not ops_file(tmp_path / "a").exists() and not ops_file(tmp_path / "b").exists()


def test_one_window_per_process(monkeypatch, tmp_path):
    train(monkeypatch, tmp_path / "a", (0, STEP, 0, "fwd/fc1"))
    assert ops_file(tmp_path / "a").exists()
    _, _, model = train(monkeypatch, tmp_path / "b", (0, STEP, 0, "grad/fc1.weight"), fresh=False)
    assert not ops_file(tmp_path / "b").exists()
    assert_unhooked(model)


@pytest.mark.parametrize(
    "name",
    ["fwd/(model)", "fwd/block.1", "grad/fc1.weight", "grad/block.0.bias", "param/fc2.weight"],
)
def test_the_tracer_changes_no_value_and_is_deterministic(monkeypatch, tmp_path, name):
    plain, _, _ = train(monkeypatch, tmp_path / "plain", custom=True)
    traced, _, _ = train(monkeypatch, tmp_path / "a", (0, STEP, 0, name), custom=True)
    key = [(r["step"], r["name"], r["md5"]) for r in plain]
    assert [(r["step"], r["name"], r["md5"]) for r in traced] == key
    train(monkeypatch, tmp_path / "b", (0, STEP, 0, name), custom=True)
    a, b = trace(tmp_path / "a"), trace(tmp_path / "b")
    assert [(r["name"], r["md5"]) for r in a] == [(r["name"], r["md5"]) for r in b]


class Dropped(torch.nn.Module):
    """Dropout as torch runs it: `empty_like` (uninitialised memory), then `bernoulli_` fills it."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc(x)
        mask = torch.empty_like(h).bernoulli_(0.5)
        return h * mask


def test_an_allocation_is_not_traced_until_written(monkeypatch, tmp_path):
    """`empty_like`'s output is whatever the memory held: it is not recorded, nor used as an
    input before an operator wrote it; `bernoulli_`'s output (the same tensor, written) is."""
    train(monkeypatch, tmp_path, (0, STEP, 0, "fwd/(model)"), model_class=Dropped)
    by_op = ops(trace(tmp_path))
    [empty] = [i for i, (_, f, _) in by_op.items() if f == "aten.empty_like.default"]
    assert by_op[empty][2] == [
        f"op/{empty:04d}/(model)/aten.empty_like.default/in0<op{empty - 1}.out0"
    ]
    bernoulli = empty + 1
    assert by_op[bernoulli][1] == "aten.bernoulli_.float"
    assert by_op[bernoulli][2] == [f"op/{bernoulli:04d}/(model)/aten.bernoulli_.float/out0"]
    mul = bernoulli + 1
    assert by_op[mul][2][1] == f"op/{mul:04d}/(model)/aten.mul.Tensor/in1<op{bernoulli}.out0"


def test_record_names_are_made_by_the_one_grammar_and_bad_parts_are_refused():
    # The grammar lives in Rust (compare/operator.rs: operator_record_name, parsed by `parse`);
    # the tracer only calls it. Pinned here as the tracer sees it.
    from detcheck._detcheck import operator_record_name, window_record_name

    def name(port, index, source=None):
        return operator_record_name(7, "block.fc", "aten.addmm.default", port, index, source)

    assert name("out", 0) == "op/0007/block.fc/aten.addmm.default/out0"
    assert name("in", 1) == "op/0007/block.fc/aten.addmm.default/in1"
    assert name("in", 2, ("op", 3, 1)).endswith("/in2<op3.out1")
    assert name("in", 2, ("in", 0, None)).endswith("/in2<in0")
    assert name("in", 2, ("grad_out", 4, None)).endswith("/in2<grad_out4")
    assert name("in", 3, ("scalar", None, None)).endswith("/in3<scalar")
    assert window_record_name("grad_out", 2) == "window/grad_out2"
    assert window_record_name("out", 0) == "window/out0"  # `detcheck run --inside`
    for source in [("op", 1, None), ("x", 1, None), ("scalar", 1, None)]:
        with pytest.raises(ValueError, match="operator_record_name: source"):
            name("in", 0, source)
    with pytest.raises(ValueError, match="an output has no source"):
        name("out", 0, ("op", 1, 1))
    with pytest.raises(ValueError, match='port "inout"'):
        name("inout", 0)
    with pytest.raises(ValueError, match='kind "grad"'):
        window_record_name("grad", 0)
