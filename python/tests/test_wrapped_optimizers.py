"""detcheck.torch.watch with the optimizer wrappers frameworks hand to user code: accelerate's
AcceleratedOptimizer, Lightning's LightningOptimizer, DeepSpeed's engine and ZeRO wrappers.

The first tests use wrappers written here with each real wrapper's structure; the later ones use
the real accelerate, transformers and lightning, and are skipped when those are not installed
(`bash scripts/install-python.sh --frameworks` installs them) unless DETCHECK_REQUIRE_FRAMEWORKS
is set (non-empty): then a missing package fails the test. torch itself is required when
DETCHECK_REQUIRE_FRAMEWORKS or DETCHECK_REQUIRE_TORCH is set, skipped otherwise."""

import pytest
from support import decode, digest_hex, requires, run_python

requires("torch")
import detcheck  # noqa: E402
import detcheck.torch  # noqa: E402
import torch  # noqa: E402


def md5(tensor):
    return digest_hex(tensor.detach().cpu().contiguous().numpy().tobytes())


# --- Wrappers with the structure of the real ones ----------------------------------------------


class AcceleratedLike(torch.optim.Optimizer):
    """accelerate's AcceleratedOptimizer: an Optimizer subclass that never runs
    Optimizer.__init__, holds the torch optimizer in `.optimizer`, and steps it only at the end of
    a gradient-accumulation cycle (`sync_gradients`)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.sync_gradients = True

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def zero_grad(self, set_to_none=None):
        if self.sync_gradients:
            self.optimizer.zero_grad()

    def step(self, closure=None):
        if self.sync_gradients:
            self.optimizer.step(closure)


class LightningLike:
    """Lightning's LightningOptimizer: a plain object that takes a class imitating the wrapped
    optimizer's (isinstance holds), forwards attributes with __getattr__, holds the optimizer in
    `._optimizer` (and `.optimizer`, a property), and steps it with a closure, as the strategy's
    precision plugin does (`optimizer.step(closure=closure)`)."""

    def __init__(self, optimizer):
        self._optimizer = optimizer
        bases = (self.__class__, optimizer.__class__)
        self.__class__ = type("Lightning" + optimizer.__class__.__name__, bases, {})

    @property
    def optimizer(self):
        return self._optimizer

    def step(self, closure=None):
        def do_nothing():
            return None

        return self._optimizer.step(closure=closure or do_nothing)

    def __getattr__(self, item):
        return getattr(self._optimizer, item)


class ZeroLike:
    """DeepSpeed's ZeRO / FP16 / BF16 optimizer wrappers: plain objects (`DeepSpeedOptimizer` is
    `object`) holding the torch optimizer in `.optimizer`; an overflow skips the inner step."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.overflow = False

    def step(self, closure=None):
        if not self.overflow:
            self.optimizer.step()


class EngineLike:
    """DeepSpeed's engine: `.optimizer` is the ZeRO wrapper; `step()` steps it at the end of a
    gradient-accumulation cycle."""

    def __init__(self, optimizer, accumulation=1):
        self.optimizer = ZeroLike(optimizer)
        self.accumulation = accumulation
        self.micro_steps = 0

    def step(self):
        self.micro_steps += 1
        if self.micro_steps % self.accumulation == 0:
            self.optimizer.step()


class DeepSpeedWrapperLike(AcceleratedLike):
    """accelerate's DeepSpeedOptimizerWrapper: `.optimizer` is the engine's optimizer; its own
    `step()` does nothing (the engine steps)."""

    def step(self, closure=None):
        pass


class PartitionedZeroLike:
    """DeepSpeed's ZeRO stage 1 and 2 optimizer (`DeepSpeedZeroOptimizer`): the torch optimizer
    in `.optimizer` updates fp32 copies of the parameters (here the whole of each group: one
    rank), stepped once a parameter group; then the copies are written into the model's
    parameters (the all-gather of the partitions). `param_groups` is the inner optimizer's."""

    def __init__(self, model):
        self.params = list(model.parameters())
        self.masters = [p.detach().clone() for p in self.params]
        half = len(self.masters) // 2
        groups = [{"params": self.masters[:half]}, {"params": self.masters[half:]}]
        self.optimizer = torch.optim.SGD(groups, lr=0.1)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def step(self, closure=None):
        for master, p in zip(self.masters, self.params, strict=True):
            master.grad = p.grad.detach().clone()
        groups = self.optimizer.param_groups
        for group in groups:
            self.optimizer.param_groups = [group]
            self.optimizer.step()
        self.optimizer.param_groups = groups
        with torch.no_grad():
            for master, p in zip(self.masters, self.params, strict=True):
                p.copy_(master)


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def batch(i):
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(100 + i))


def names_of(records, step, prefix):
    return [r["name"] for r in records if r["step"] == step and r["name"].startswith(prefix)]


def check_steps(records, model, steps, params_after, grads=None, forwards_per_step=1):
    """One detcheck step per real update: every step has its forward outputs, then every
    gradient, then every parameter, and the parameters are those after that update."""
    names = [n for n, _ in model.named_parameters()]
    assert sorted({r["step"] for r in records}) == list(range(steps))
    for step in range(steps):
        got = [r["name"] for r in records if r["step"] == step]
        assert got.count("fwd/(model)") == forwards_per_step, got
        assert names_of(records, step, "grad/") == ["grad/" + n for n in names], got
        assert names_of(records, step, "param/") == ["param/" + n for n in names], got
        last_fwd = max(i for i, n in enumerate(got) if n.startswith("fwd/"))
        assert got.index("grad/" + names[0]) > last_fwd, got
        for r in records:
            if r["step"] == step and r["name"].startswith("param/"):
                assert r["md5"] == params_after[step][r["name"][6:]], r["name"]
            if grads is not None and r["step"] == step and r["name"].startswith("grad/"):
                assert r["md5"] == grads[step][r["name"][5:]], r["name"]


def snapshot(model, what="param"):
    return {n: md5(p if what == "param" else p.grad) for n, p in model.named_parameters()}


@pytest.mark.parametrize("kind", ["accelerate", "lightning", "deepspeed_zero", "deepspeed_engine"])
def test_wrapper_is_unwrapped_and_steps_once_per_update(tmp_path, kind):
    model, inner = make()
    wrapper = {
        "accelerate": AcceleratedLike,
        "lightning": LightningLike,
        "deepspeed_zero": ZeroLike,
        "deepspeed_engine": EngineLike,
    }[kind](inner)
    assert detcheck.torch._unwrap_optimizer(wrapper) is inner
    if kind == "accelerate":
        # What made watch fail before: the wrapper never ran Optimizer.__init__.
        with pytest.raises(AttributeError, match="_optimizer_step_pre_hooks"):
            wrapper.register_step_pre_hook(lambda *a: None)
    if kind == "lightning":
        assert isinstance(wrapper, torch.optim.SGD)
    params_after, grads = [], []
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        handle = detcheck.torch.watch(model, w, wrapper)
        for i in range(3):
            model(batch(i)).pow(2).mean().backward()
            grads.append(snapshot(model, "grad"))
            wrapper.step()
            inner.zero_grad()
            params_after.append(snapshot(model))
            assert handle.current_step == i + 1
        handle.remove()
    check_steps(decode(tmp_path / "rank0.dctrace"), model, 3, params_after, grads)


def test_accumulation_micro_steps_end_no_step(tmp_path):
    model, inner = make()
    opt = AcceleratedLike(inner)
    params_after = []
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        handle = detcheck.torch.watch(model, w, opt)
        for i in range(6):  # 3 updates of 2 micro-batches
            opt.sync_gradients = i % 2 == 1
            (model(batch(i)).pow(2).mean() / 2).backward()
            opt.step()
            opt.zero_grad()
            assert handle.current_step == (i + 1) // 2
            if opt.sync_gradients:
                params_after.append(snapshot(model))
    check_steps(decode(tmp_path / "rank0.dctrace"), model, 3, params_after, forwards_per_step=2)


def test_deepspeed_wrapper_steps_with_the_engine_and_overflow_skips(tmp_path):
    model, inner = make()
    engine = EngineLike(inner, accumulation=2)
    opt = DeepSpeedWrapperLike(engine.optimizer)  # what accelerate hands to user code
    assert detcheck.torch._unwrap_optimizer(opt) is inner
    params_after = []
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        handle = detcheck.torch.watch(model, w, opt)
        for i in range(6):
            model(batch(i)).pow(2).mean().backward()
            opt.step()  # does nothing
            engine.optimizer.overflow = i == 3  # the second update overflows: skipped
            engine.step()
            if i % 2 == 1:
                inner.zero_grad()
                if i != 3:
                    params_after.append(snapshot(model))
        assert handle.current_step == 2
    records = decode(tmp_path / "rank0.dctrace")
    # Step 0: micro-batches 0 and 1; step 1: 2 and 3 (skipped update: no grad/param) and 4, 5.
    check_steps(
        [r for r in records if r["step"] == 0], model, 1, params_after[:1], forwards_per_step=2
    )
    step1 = [r["name"] for r in records if r["step"] == 1]
    assert step1.count("fwd/(model)") == 4
    assert [r["md5"] for r in records if r["step"] == 1 and r["name"].startswith("param/")] == list(
        params_after[1].values()
    )


@pytest.mark.parametrize("engine", [False, True])
def test_a_zero_optimizer_that_steps_once_a_group_ends_one_step_after_its_copy(tmp_path, engine):
    """The inner optimizer steps once a parameter group, and the model's parameters change only
    after it, when the wrapper copies its partition in: one step per wrapper's step, and the
    parameters recorded are the model's after that copy (before, an HF Trainer's two groups made
    two steps of each, with the model's parameters not yet updated: `replicas` failed on TRL's
    ZeRO-2 run at 2 ranks)."""
    model, _ = make()
    zero = PartitionedZeroLike(model)
    stepper = EngineLike.__new__(EngineLike) if engine else zero
    if engine:
        stepper.optimizer, stepper.accumulation, stepper.micro_steps = zero, 1, 0
    inner = zero.optimizer
    params_after = []
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        handle = detcheck.torch.watch(model, w, stepper)
        for i in range(3):
            model(batch(i)).pow(2).mean().backward()
            stepper.step()
            model.zero_grad()
            inner.zero_grad()
            params_after.append(snapshot(model))
            assert handle.current_step == i + 1
        handle.remove()
    records = decode(tmp_path / "rank0.dctrace")
    check_steps(records, model, 3, params_after)


@pytest.mark.parametrize("stage", [2, 3])
def test_a_deepspeed_engine_replicates_below_stage_3_and_is_named_where_it_shards(stage):
    """DeepSpeed's engine (an nn.Module holding the model in `.module`) replicates the parameters
    at ZeRO stages 0-2; at stage 3 it partitions them, and the recorder says so in the trace's
    environment (`detcheck.sharded`), which a `replicas` check with nothing to compare gives as
    its reason (before: "nothing wraps the model for data parallelism")."""
    from detcheck._torch.tensors import sharded_by, unwrap_model

    class DeepSpeedEngine(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def zero_optimization_stage(self):
            return stage

    model, _ = make()
    engine = DeepSpeedEngine(model)
    assert unwrap_model(engine) == (model, stage < 3)
    said = sharded_by(engine)
    assert (said is None) if stage < 3 else ("ZeRO stage 3 partitions the parameters" in said)


def test_step_with_a_closure_records_the_gradients_it_computes(tmp_path):
    # `step(closure)` runs forward and backward inside the step (Lightning's automatic
    # optimization): the gradients are recorded after the closure, not before it.
    model, inner = make()
    opt = LightningLike(inner)
    params_after, grads = [], []
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        handle = detcheck.torch.watch(model, w, opt)
        for i in range(3):

            def closure(i=i):
                inner.zero_grad()
                loss = model(batch(i)).pow(2).mean()
                loss.backward()
                grads.append(snapshot(model, "grad"))
                return loss

            loss = opt.step(closure)
            assert isinstance(loss, torch.Tensor)  # the closure's result comes back
            params_after.append(snapshot(model))
        assert handle.current_step == 3
    check_steps(decode(tmp_path / "rank0.dctrace"), model, 3, params_after, grads)


def test_positional_closure_and_lbfgs(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=3)
    first_grads = []
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        handle = detcheck.torch.watch(model, w, AcceleratedLike(opt))
        for i in range(2):
            calls = []

            def closure(i=i, calls=calls):
                opt.zero_grad()
                loss = model(batch(i)).pow(2).mean()
                loss.backward()
                if not calls:
                    first_grads.append(snapshot(model, "grad"))
                calls.append(1)
                return loss

            opt.step(closure)  # positional
            assert len(calls) > 1  # LBFGS evaluates it several times
        assert handle.current_step == 2
    records = decode(tmp_path / "rank0.dctrace")
    for step in (0, 1):
        got = [r for r in records if r["step"] == step]
        grad = [r for r in got if r["name"].startswith("grad/")]
        # Recorded once, after the first evaluation: that evaluation's gradients.
        assert [r["name"] for r in grad] == ["grad/weight", "grad/bias"]
        assert {r["name"][5:]: r["md5"] for r in grad} == first_grads[step]
        assert [r["name"] for r in got].index("grad/weight") == 1  # after the first fwd only


class IgnoresClosure(torch.optim.Optimizer):
    """An optimizer that takes a closure and never calls it. (Not an SGD subclass calling
    `super().step()`: torch runs the hooks of both `step`s then, twice per update.)"""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])


def test_a_closure_never_called_still_records_the_gradients(tmp_path):
    model, _ = make()
    opt = IgnoresClosure(model.parameters(), lr=0.1)
    params_after, grads = [], []
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        detcheck.torch.watch(model, w, opt)
        for i in range(2):
            opt.zero_grad()
            model(batch(i)).pow(2).mean().backward()
            grads.append(snapshot(model, "grad"))
            opt.step(lambda: None)
            params_after.append(snapshot(model))
    check_steps(decode(tmp_path / "rank0.dctrace"), model, 2, params_after, grads)


@pytest.mark.parametrize(
    "thing, named",
    [
        (object, "builtins.object"),
        (lambda: "adam", "builtins.str"),
        (lambda: ZeroLike("adam"), r"ZeroLike, whose \.optimizer is a builtins\.str"),
        # Half built: its forwarding __getattr__ recurses without `_optimizer`.
        (lambda: LightningLike.__new__(LightningLike), "LightningLike"),
    ],
    ids=["object", "str", "wrapping-a-str", "broken-forwarding"],
)
def test_nonsense_raises_a_type_error_naming_the_type(tmp_path, thing, named):
    model, _ = make()
    thing = thing()
    for writer in (None, detcheck.TraceWriter(tmp_path, 0, 1)):
        with pytest.raises(TypeError, match=f"cannot hook the optimizer: a .*{named}"):
            detcheck.torch.watch(model, writer, thing)
        if writer is not None:
            writer.close()


def test_wrappers_nested_too_deep(tmp_path):
    _, inner = make()
    obj = inner
    for _ in range(detcheck._torch.frontend.MAX_OPTIMIZER_WRAPPERS):
        obj = ZeroLike(obj)
    assert detcheck.torch._unwrap_optimizer(obj) is inner
    too_deep = r"ZeroLike, whose \.optimizer is a torch\.optim\.sgd\.SGD, \.\.\.; found no"
    with pytest.raises(TypeError, match=too_deep):
        detcheck.torch._unwrap_optimizer(ZeroLike(obj))


class Lookahead(torch.optim.Optimizer):
    """A proper Optimizer (its __init__ ran) that also holds another in `.optimizer`: its own
    step is the update, so it is hooked itself."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        super().__init__(optimizer.param_groups, optimizer.defaults)

    def step(self, closure=None):
        self.optimizer.step(closure)
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    p.mul_(0.5)


def test_a_proper_optimizer_is_hooked_itself(tmp_path):
    model, inner = make()
    opt = Lookahead(inner)
    assert detcheck.torch._unwrap_optimizer(opt) is opt
    params_after = []
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        detcheck.torch.watch(model, w, opt)
        for i in range(2):
            model(batch(i)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            params_after.append(snapshot(model))
    check_steps(decode(tmp_path / "rank0.dctrace"), model, 2, params_after)


# --- The real frameworks -------------------------------------------------------------------------


ACCELERATE_PROGRAM = """
    import json, sys, torch, detcheck, detcheck.torch
    from accelerate import Accelerator
    out = sys.argv[1]

    def md5(t):
        return detcheck._detcheck.tensor_digest(t.detach().contiguous().numpy()).hex()

    acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    try:
        opt.register_step_pre_hook(lambda *a: None)
        unhookable = False
    except AttributeError:
        unhookable = True
    seen = {"type": type(opt).__module__ + "." + type(opt).__qualname__, "unhookable": unhookable,
            "inner_is_optimizer": detcheck.torch._unwrap_optimizer(opt) is opt.optimizer,
            "steps": [], "params": [], "grads": []}
    with detcheck.TraceWriter(out, 0, 1) as w:
        handle = detcheck.torch.watch(model, w, opt)
        for i in range(6):
            with acc.accumulate(model):
                x = torch.randn(5, 4, generator=torch.Generator().manual_seed(100 + i))
                acc.backward(model(x).pow(2).mean())
                if acc.sync_gradients:
                    seen["grads"].append({n: md5(p.grad) for n, p in model.named_parameters()})
                opt.step()
                opt.zero_grad()
            seen["steps"].append(handle.current_step)
            if acc.sync_gradients:
                seen["params"].append({n: md5(p) for n, p in model.named_parameters()})
        handle.remove()
    print(json.dumps(seen))
"""


def test_real_accelerate_prepare_with_gradient_accumulation(tmp_path):
    requires("accelerate")
    seen = run_python(tmp_path, ACCELERATE_PROGRAM, tmp_path / "dump")
    assert seen["type"] == "accelerate.optimizer.AcceleratedOptimizer"
    assert seen["unhookable"] and seen["inner_is_optimizer"]
    assert seen["steps"] == [0, 1, 1, 2, 2, 3]  # one step per update, every second micro-batch
    model, _ = make()
    check_steps(
        decode(tmp_path / "dump" / "rank0.dctrace"),
        model,
        3,
        seen["params"],
        seen["grads"],
        forwards_per_step=2,
    )


ACCELERATE_OVERFLOW_PROGRAM = """
    import json, sys, torch, detcheck, detcheck.torch
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    out = sys.argv[1]
    Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    # What Accelerator(mixed_precision="fp16") builds on a GPU: the wrapper with a GradScaler.
    opt = AcceleratedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), device_placement=False,
                               scaler=torch.amp.GradScaler("cpu"))
    seen = {"steps": [], "skipped": []}
    with detcheck.TraceWriter(out, 0, 1) as w:
        handle = detcheck.torch.watch(model, w, opt)
        for i in range(3):
            x = torch.randn(5, 4, generator=torch.Generator().manual_seed(100 + i))
            loss = model(x).pow(2).mean()
            if i == 1:
                loss = loss * float("inf")  # non-finite gradients: GradScaler skips the update
            opt.scaler.scale(loss).backward()
            opt.step()
            opt.zero_grad()
            seen["steps"].append(handle.current_step)
            seen["skipped"].append(opt.step_was_skipped)
    print(json.dumps(seen))
"""


def test_real_accelerate_skipped_fp16_step_ends_no_step(tmp_path):
    requires("accelerate")
    seen = run_python(tmp_path, ACCELERATE_OVERFLOW_PROGRAM, tmp_path / "dump")
    assert seen["skipped"] == [False, True, False]
    assert seen["steps"] == [1, 1, 2]
    records = decode(tmp_path / "dump" / "rank0.dctrace")
    assert [r["name"] for r in records if r["step"] == 1] == [
        "fwd/(model)",
        "fwd/(model)",
        "grad/weight",
        "grad/bias",
        "param/weight",
        "param/bias",
    ]


TRAINER_PROGRAM = """
    import json, sys, torch, detcheck, detcheck.torch
    from transformers import Trainer, TrainerCallback, TrainingArguments
    out, tmp = sys.argv[1], sys.argv[2]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)

        def forward(self, x, labels=None):
            return {"loss": (self.fc(x).squeeze(-1) - labels).pow(2).mean()}

    class Watch(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            seen["type"] = type(optimizer).__module__ + "." + type(optimizer).__qualname__
            self.handle = detcheck.torch.watch(model, writer, optimizer)

        def on_step_end(self, args, state, control, **kwargs):
            seen["steps"].append([state.global_step, self.handle.current_step])

    seen = {"steps": []}
    data = [{"x": torch.randn(4, generator=torch.Generator().manual_seed(i)),
             "labels": torch.tensor(float(i % 3))} for i in range(16)]
    args = TrainingArguments(output_dir=tmp, max_steps=3, per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, use_cpu=True, report_to=[],
                             save_strategy="no", logging_strategy="no", seed=0,
                             dataloader_num_workers=0)
    with detcheck.TraceWriter(out, 0, 1) as writer:
        Trainer(model=Model(), args=args, train_dataset=data, callbacks=[Watch()]).train()
    print(json.dumps(seen))
"""


def test_real_transformers_trainer_callback(tmp_path):
    # The report of issue 25: a Trainer callback passing the optimizer it is handed.
    requires("transformers")
    requires("accelerate")
    seen = run_python(tmp_path, TRAINER_PROGRAM, tmp_path / "dump", tmp_path / "trainer")
    assert seen["type"] == "accelerate.optimizer.AcceleratedOptimizer"
    assert seen["steps"] == [[1, 1], [2, 2], [3, 3]]  # Trainer's global_step == detcheck's
    records = decode(tmp_path / "dump" / "rank0.dctrace")
    for step in range(3):
        got = [r["name"] for r in records if r["step"] == step]
        assert got == ["fwd/fc", "fwd/(model).loss"] * 2 + [
            "grad/fc.weight",
            "grad/fc.bias",
            "param/fc.weight",
            "param/fc.bias",
        ], got


def lightning_module(automatic, out, seen):
    pl = requires("lightning.pytorch")

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1)
            )
            self.automatic_optimization = automatic

        def forward(self, x):
            return self.net(x)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def on_train_start(self):
            opt = self.optimizers()
            seen["type"] = type(opt).__mro__[1].__module__ + "." + type(opt).__mro__[1].__qualname__
            seen["isinstance"] = isinstance(opt, torch.optim.SGD)
            seen["inner"] = detcheck.torch._unwrap_optimizer(opt) is opt._optimizer
            self.writer = detcheck.TraceWriter(out, 0, 1)
            self.handle = detcheck.torch.watch(self, self.writer, opt)

        def training_step(self, batch, batch_idx):
            (x,) = batch
            loss = self(x).pow(2).mean()
            if automatic:
                return loss
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            seen["grads"].append({n: md5(p.grad) for n, p in self.named_parameters()})
            opt.step()
            return None

        def on_before_optimizer_step(self, optimizer):
            if automatic:  # after backward, before the update (inside the step's closure)
                seen["grads"].append({n: md5(p.grad) for n, p in self.named_parameters()})

        def on_train_batch_end(self, outputs, batch, batch_idx):
            seen["steps"].append(self.handle.current_step)
            if len(seen["steps"]) % (2 if automatic else 1) == 0:
                seen["params"].append({n: md5(p) for n, p in self.named_parameters()})

        def on_train_end(self):
            self.handle.remove()
            self.writer.close()

    return pl, Module()


@pytest.mark.parametrize("automatic", [True, False], ids=["automatic", "manual"])
def test_real_lightning_optimizer(tmp_path, automatic):
    seen = {"steps": [], "params": [], "grads": []}
    pl, module = lightning_module(automatic, tmp_path / "dump", seen)
    xs = torch.randn(12, 4, generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs), batch_size=3)
    trainer = pl.Trainer(
        max_steps=2 if automatic else 3,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=2 if automatic else 1,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, loader)
    assert seen["type"] == "lightning.pytorch.core.optimizer.LightningOptimizer"
    assert seen["isinstance"] and seen["inner"]
    records = decode(tmp_path / "dump" / "rank0.dctrace")
    if automatic:
        # Two micro-batches per update; the update's closure runs the second one's forward and
        # backward inside optimizer.step(): its gradients are recorded after that backward.
        assert seen["steps"] == [0, 1, 1, 2]
        check_steps(records, module, 2, seen["params"], seen["grads"], forwards_per_step=2)
    else:
        assert seen["steps"] == [1, 2, 3]
        check_steps(records, module, 3, seen["params"], seen["grads"])


def test_real_fabric_optimizer(tmp_path):
    lightning = requires("lightning")
    fabric = lightning.Fabric(accelerator="cpu", devices=1)
    model, inner = make()
    wrapped_model, opt = fabric.setup(model, inner)
    assert type(opt).__mro__[1].__qualname__ == "_FabricOptimizer"
    assert detcheck.torch._unwrap_optimizer(opt) is inner
    params_after, grads = [], []
    with detcheck.TraceWriter(tmp_path, 0, 1) as w:
        handle = detcheck.torch.watch(model, w, opt)  # the module inside fabric's wrapper
        for i in range(3):
            opt.zero_grad()
            fabric.backward(wrapped_model(batch(i)).pow(2).mean())
            grads.append(snapshot(model, "grad"))
            opt.step()
            params_after.append(snapshot(model))
        assert handle.current_step == 3
    check_steps(decode(tmp_path / "rank0.dctrace"), model, 3, params_after, grads)
