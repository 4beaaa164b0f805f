"""Recording a PyTorch model every step: ``detcheck.torch.watch(model, writer, optimizer)``.

What is recorded, per step (the handle's ``current_step``), in this order:

- ``fwd/<module>``: the output of every module of ``model.named_modules()`` each time it runs
  forward, as it runs (``fwd/layer1.0.conv``; the model itself is ``fwd/(model)``). Tensors
  only: a tuple or list output gives ``fwd/<module>.0``, ``.1``, ...; a dict (Hugging Face's
  ``ModelOutput``) gives ``fwd/<module>.<key>`` in its order; anything else is skipped. A module
  that runs twice in a step is recorded twice (detcheck matches the n-th occurrence of a name).
- ``grad/<param>``: when the step ends, the gradient of every parameter of
  ``model.named_parameters()`` that has one, in that order. With an optimizer this happens just
  before ``optimizer.step()`` runs, so under DistributedDataParallel the gradients are the
  allreduced ones (DDP has finished its allreduce when backward returns).
- ``param/<param>`` (only with an optimizer): every parameter that requires a gradient, just
  after ``optimizer.step()``.

A step ends at ``optimizer.step()`` when an optimizer is given, or at ``handle.next_step()``
otherwise (call it after backward); ending a step records the gradients (and the parameters),
then advances ``current_step`` by one. ``handle.step(n)`` sets the step the next records belong
to (a loop with its own counter, a resumed run). Use one of the two ways to end steps, not both.
When ``step()`` is given a closure (``optimizer.step(closure)``, and Lightning's automatic
optimization, which runs forward and backward inside the step), the gradients are recorded when
the closure first returns, not before it runs (LBFGS evaluates it several times: the later
evaluations' ``fwd/*`` belong to the same step).

Wrapped optimizers: ``optimizer`` may be the wrapper a framework hands to user code. ``watch``
hooks the ``torch.optim.Optimizer`` inside it whose ``step()`` does the update
(``_unwrap_optimizer``): an object is used as it is when it is a ``torch.optim.Optimizer`` whose
step hooks are its own (its ``Optimizer.__init__`` ran); otherwise ``watch`` follows its
``._optimizer``, then its ``.optimizer``, at most 8 levels deep, and raises ``TypeError`` naming
the types it went through when it finds none. So these are accepted:

- accelerate's ``AcceleratedOptimizer`` (what ``Accelerator.prepare`` returns and a Hugging Face
  ``Trainer`` hands its callbacks): a ``torch.optim.Optimizer`` subclass that never runs its
  ``__init__``; the torch optimizer is ``.optimizer``. Its ``step()`` calls the inner one only at
  the end of a gradient-accumulation cycle (``sync_gradients``), and, with fp16 and a
  ``GradScaler``, only when the gradients are finite.
- Lightning's ``LightningOptimizer`` (``self.optimizers()`` in a ``LightningModule``) and
  Fabric's ``_FabricOptimizer`` (``fabric.setup``): plain objects whose class is made to
  imitate the optimizer's (``isinstance`` holds, attributes are forwarded); the torch optimizer
  is ``._optimizer``. Their ``step()`` reaches it through the strategy and precision plugin.
- DeepSpeed: the engine (``.optimizer``), its ZeRO, ``BF16_Optimizer`` and ``FP16_Optimizer``
  wrappers (plain objects, ``.optimizer``) and accelerate's ``DeepSpeedOptimizerWrapper``
  (``.optimizer``, the engine's optimizer; its ``step()`` does nothing, ``engine.step()``
  steps). Beware (read from DeepSpeed 0.19.6's source, not run): ZeRO steps the inner optimizer
  once per parameter group (stage 1 and 2) or sub-group (stage 3), on flat fp32 partitions,
  after it has freed the model's gradients, and copies the result into the model afterwards; so
  with ZeRO a ``watch`` with an optimizer counts one step per group, records no ``grad/*`` and
  records ``param/*`` before the copy. Without ZeRO (``FP16_Optimizer``, ``BF16_Optimizer``, a
  plain torch optimizer in the engine) the inner optimizer steps once per update.

Only the inner optimizer is hooked (its own hooks, never torch's global optimizer hooks), so a
step is counted when the update really runs: one ``current_step`` per update. A step the wrapper
skips (a gradient-accumulation micro-batch, an fp16 overflow that ``GradScaler`` skips) ends no
step and records no ``grad/*`` or ``param/*``: its ``fwd/*`` records stay in the step that the
next update ends (with accumulation, one step holds the forward records of all its
micro-batches, told apart by occurrence). Two runs that skip the same updates still line up;
one that skips another update than the other diverges there, as it should.

Replicated records: under DistributedDataParallel with more than one rank (the writer's world
size > 1 and ``model`` a ``DistributedDataParallel``), ``grad/*`` and ``param/*`` are recorded
with ``record_replicated``, since every rank must hold identical bits after the allreduce and the
update; ``fwd/*`` never is (each rank sees its own shard of the batch). ``replicated=True`` or
``False`` overrides the rule (e.g. a model whose gradients are averaged by hand).

Names are those of the module inside a ``DistributedDataParallel`` or ``DataParallel`` wrapper,
so one-rank and multi-rank runs use the same names (``fwd/fc1``, not ``fwd/module.fc1``).

Operator trace: when detcheck re-runs the program to capture one of these records
(``DETCHECK_CAPTURE`` names it) and the record is this writer's rank's, ``watch`` also records
the inputs and outputs of every operator inside that record's module (the forward call, the
backward through the parameter's owner, or the optimizer step) into
``$DETCHECK_CAPTURE_DIR/ops/rank0.dctrace``, so that detcheck can name the first operator where
the two runs part: ``window/in{j}``, ``window/grad_out{j}``, then
``op/{i:04d}/{module}/{func}/in{j}[<source]`` and ``.../out{j}`` (``detcheck._ops`` has the
contract). It changes no value; without such a request nothing is added.

The writer's environment snapshot gets ``torch.version``, and ``torch.cuda`` and
``torch.cudnn`` where torch was built with them (``writer.add_environment``).

Requires torch 2.0 or later (optimizer step hooks). Recording a GPU tensor copies it to the host,
which synchronises the device: the recorded program runs slower, not differently.
"""

import torch as _torch

from . import _subclasses

#: The tensor types ``_put`` hands to the writer without looking further.
_PLAIN_TYPES = frozenset(_subclasses.PLAIN_TYPES)

__all__ = ["watch", "WatchHandle", "TrainingRecording"]

#: The name of the model's own output.
ROOT = "(model)"

#: What ``watch`` can record (its ``records`` argument): forward outputs (``fwd/*``), gradients
#: (``grad/*``) and parameters after each update (``param/*``).
RECORDS = ("fwd", "grad", "param")


def _unwrap(model):
    wrappers = (_torch.nn.parallel.DistributedDataParallel, _torch.nn.DataParallel)
    if isinstance(model, wrappers):
        return model.module, isinstance(model, _torch.nn.parallel.DistributedDataParallel)
    return model, False


#: How many wrappers ``_unwrap_optimizer`` looks through before it gives up.
_MAX_OPTIMIZER_WRAPPERS = 8

#: The attributes that hold the wrapped optimizer, in the order they are tried: Lightning's
#: ``LightningOptimizer`` and Fabric's ``_FabricOptimizer`` (``_optimizer``), accelerate's
#: ``AcceleratedOptimizer`` and DeepSpeed's engine and ZeRO/FP16/BF16 optimizers (``optimizer``).
_WRAPPED_OPTIMIZER_ATTRS = ("_optimizer", "optimizer")


def _own_step_hooks(obj):
    """Whether ``obj`` is a ``torch.optim.Optimizer`` whose step hooks are its own: its
    ``Optimizer.__init__`` ran, which creates the hook dicts in its instance ``__dict__`` (not
    reached through a forwarding ``__getattr__``, as Lightning's wrapper does) and makes its
    class's ``step`` run them."""
    if not isinstance(obj, _torch.optim.Optimizer):
        return False
    own = getattr(obj, "__dict__", {})
    return isinstance(own.get("_optimizer_step_pre_hooks"), dict) and isinstance(
        own.get("_optimizer_step_post_hooks"), dict
    )


def _qualname(obj):
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _unwrap_optimizer(optimizer):
    """The ``torch.optim.Optimizer`` inside ``optimizer`` whose ``step()`` does the update, on
    which ``watch`` registers its step hooks.

    ``optimizer`` itself when its step hooks are its own (``_own_step_hooks``: a torch optimizer,
    or a subclass that ran ``Optimizer.__init__``); otherwise the wrapped object, found in
    ``._optimizer`` then ``.optimizer`` (``_WRAPPED_OPTIMIZER_ATTRS``), checked the same way, at
    most ``_MAX_OPTIMIZER_WRAPPERS`` levels deep. accelerate's ``AcceleratedOptimizer`` (an
    ``Optimizer`` subclass that never runs ``__init__``), Lightning's ``LightningOptimizer``
    (a plain object that imitates the optimizer's class and forwards its attributes) and
    DeepSpeed's wrappers are such wrappers. Their ``step()`` calls the inner one's, where the
    hooks fire, or skips it (an accumulation micro-batch, an fp16 overflow): then no hook fires.

    Raises ``TypeError`` naming the types it went through when no such optimizer is found.
    """
    path = _qualname(optimizer)
    obj = optimizer
    for _ in range(_MAX_OPTIMIZER_WRAPPERS + 1):
        if _own_step_hooks(obj):
            return obj
        inner = None
        for attr in _WRAPPED_OPTIMIZER_ATTRS:
            try:
                candidate = getattr(obj, attr, None)
            except Exception:  # a property or forwarding __getattr__ that fails: no wrapper there
                candidate = None
            if candidate is not None and candidate is not obj:
                inner = candidate
                path += f", whose .{attr} is a {_qualname(inner)}"
                break
        if inner is None:
            break
        obj = inner
    else:
        path += ", ..."
    if not hasattr(_torch.optim.Optimizer, "register_step_pre_hook"):
        raise TypeError(
            "detcheck.torch.watch needs torch 2.0 or later with an optimizer "
            "(Optimizer.register_step_pre_hook)"
        )
    raise TypeError(
        f"detcheck.torch.watch cannot hook the optimizer: a {path}; found no torch.optim.Optimizer "
        f"with its own step hooks in it (following `._optimizer` or `.optimizer`, at most "
        f"{_MAX_OPTIMIZER_WRAPPERS} wrappers deep). Pass the torch.optim.Optimizer whose step() "
        "updates the parameters, or no optimizer and call handle.next_step()"
    )


def _closure_of(optimizer, args, kwargs):
    """Where ``optimizer.step``'s closure is in a step pre-hook's ``(args, kwargs)`` (``args``
    starts with the optimizer itself): ``("kw", None)``, ``("arg", index)`` or ``None``."""
    if callable(kwargs.get("closure")):
        return ("kw", None)
    first = 1 if args and args[0] is optimizer else 0
    if len(args) > first and callable(args[first]):
        return ("arg", first)
    return None


#: Dtypes whose CPU tensors the writer reads in place through numpy (bfloat16 has no numpy
#: dtype: it goes through ``detcheck._arrays``, as tensors on other devices do).
_NUMPY_DTYPES = frozenset(
    [
        _torch.float16,
        _torch.float32,
        _torch.float64,
        _torch.int32,
        _torch.int64,
        _torch.uint8,
        _torch.bool,
    ]
)


def _host(tensor):
    """What to hand the writer for ``tensor``: a numpy view of its memory (no copy) for a dense
    CPU tensor of a numpy dtype, so the writer reads it through the buffer protocol without
    calling back into Python; otherwise the tensor itself (the writer converts it)."""
    if tensor.is_cpu and tensor.dtype in _NUMPY_DTYPES and tensor.layout is _torch.strided:
        try:
            return tensor.detach().numpy()
        except (RuntimeError, TypeError):  # a tensor numpy cannot view (a negative-bit view)
            pass
    return tensor


def _dense_with_values(tensor):
    """Whether a plain tensor's values are its strided memory (not quantized, meta, nested or
    sparse): then the writer reads it as it is."""
    return tensor.layout is _torch.strided and not (
        tensor.is_quantized or tensor.is_meta or tensor.is_nested
    )


def _inert(*args, **kwargs):
    """What a hook of detcheck's becomes in a copy of the model: nothing."""
    return None


def _inert_hook():
    return _inert


class _Hook:
    """A hook detcheck attaches to a user's module, optimizer or tensor. It pickles, and
    deep-copies, to ``_inert``: ``torch.save(model)``, ``copy.deepcopy(model)`` and pickling
    for multiprocessing work while the model is recorded, and the copy records nothing."""

    __slots__ = ("_fn",)

    def __init__(self, fn):
        self._fn = fn

    def __call__(self, *args, **kwargs):
        return self._fn(*args, **kwargs)

    def __reduce__(self):
        return (_inert_hook, ())

    def __deepcopy__(self, memo):
        return _inert


def _leaves(name, value, depth=0):
    """``(name, tensor)`` of every tensor in a module's output, in order."""
    if isinstance(value, _torch.Tensor):
        yield name, value
    elif depth >= 8:
        return
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from _leaves(f"{name}.{i}", item, depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(f"{name}.{key}", item, depth + 1)


def model_loss(output):
    """The loss a model's output carries (a Hugging Face ``ModelOutput``'s ``loss``, a dict's
    ``"loss"``), or ``None``."""
    if isinstance(output, dict):
        loss = output.get("loss")
    else:
        loss = getattr(output, "loss", None)
    return loss if isinstance(loss, _torch.Tensor) else None


class WatchHandle:
    """The hooks of one ``watch``: the step counter, ``next_step()``, ``step(n)``, ``remove()``.

    Also a context manager that removes the hooks when the block ends.

    The zero-change recorder (``detcheck._auto``) makes its records with this same class, with
    three options ``watch`` leaves off: ``inputs`` (``in/(model).N``: the model's tensor
    arguments, then its keyword arguments by name, each call), ``loss`` (``loss``: what
    ``model_loss`` finds in the model's output, each call) and ``updates="caller"`` (the caller
    calls ``_before_update`` and ``_after_update`` from torch's global optimizer hooks, instead
    of hooks on one optimizer).
    """

    def __init__(
        self,
        model,
        writer,
        optimizer,
        replicated,
        start,
        *,
        inputs=False,
        loss=False,
        updates=None,
        device_digests=None,
        records=RECORDS,
    ):
        self._model = model
        self._writer = writer
        #: ``True``, ``False`` or ``None`` (on for CUDA tensors where Triton runs).
        self._device_digests = device_digests
        #: The ``DeviceRecords`` once a tensor went to the device kernels (``_put``).
        self._device = None
        unknown = set(records) - set(RECORDS)
        if unknown:
            raise ValueError(
                f"records: unknown kind(s) {sorted(unknown)}; the kinds are {list(RECORDS)}"
            )
        self._records = frozenset(records)
        self._optimizer = optimizer
        #: Whether ``optimizer.step()`` ends steps: hooks on ``optimizer``, or the caller's.
        self._updates = optimizer is not None or updates == "caller"
        self._replicated = replicated
        self._step = start
        self._hooks = []
        #: The operator trace of a capture request (``detcheck._ops``), or ``None``.
        self._ops = None
        #: A step whose closure has not returned yet: the gradients are still to be recorded.
        self._pending_update = False
        params = list(model.named_parameters())
        self._params = params
        self._grad_labels = [("grad/" + name, p) for name, p in params]
        self._param_labels = [("param/" + name, p) for name, p in params]
        if writer is None:
            return  # outside detcheck (`TraceWriter.from_env()` gave None): record nothing
        if _capture_requested():
            from . import _ops

            self._ops = _ops.plan(self, model, writer, self._updates)
        if device_digests and not hasattr(writer, "record_digested"):
            raise TypeError(
                "device_digests=True needs a detcheck.TraceWriter (record_digested), not a "
                f"{type(writer).__name__}"
            )
        #: Names already noted in the environment (a skipped record, a sharded tensor).
        self._noted = set()
        if inputs:
            self._hooks.append(
                model.register_forward_pre_hook(
                    _Hook(self._paused(self._record_inputs)), with_kwargs=True
                )
            )
        for name, module in model.named_modules() if "fwd" in self._records else ():
            label = "fwd/" + (name if name else ROOT)
            self._hooks.append(module.register_forward_hook(_Hook(self._forward_hook(label))))
        if loss:
            self._hooks.append(model.register_forward_hook(_Hook(self._paused(self._record_loss))))
        if optimizer is not None:
            # `optimizer` is the unwrapped torch optimizer (`watch` calls `_unwrap_optimizer`).
            self._hooks.append(optimizer.register_step_pre_hook(_Hook(self._before_update)))
            self._hooks.append(optimizer.register_step_post_hook(_Hook(self._after_update)))

    @property
    def current_step(self):
        """The step the next records belong to."""
        return self._step

    @property
    def replicated(self):
        """Whether ``grad/*`` and ``param/*`` are recorded as replicated."""
        return self._replicated

    def step(self, n):
        """The records that follow belong to step ``n``."""
        if n < 0:
            raise ValueError(f"step {n} is negative")
        if self._ops is not None and int(n) != self._step:
            self._ops.step_ends()
        if self._device is not None and int(n) != self._step:
            self._device.end_step()
        self._step = int(n)

    def next_step(self):
        """Ends the step (without an optimizer): records ``grad/*``, then advances the step."""
        if self._ops is not None:
            self._ops.step_ends()
        self._record_grads()
        self._step += 1
        if self._device is not None:
            self._device.end_step()

    def remove(self):
        """Detaches every hook; nothing more is recorded (records still on a device are handed
        to the writer). Removing twice does nothing."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._ops is not None:
            self._ops.remove()
        if self._device is not None:
            self._device.close()
            self._device = None

    def _put(self, step, name, tensor, replicated=False, state=False):
        """Hands one record to the writer (``_put_plain``), a tensor subclass through its data
        (``detcheck._subclasses``); ``state``: a gradient or parameter, whose DTensor
        placements decide ``replicated``. Never raises into the program: a tensor with no values to
        record, or a failure to record one, is skipped with one note in the trace's environment
        (``detcheck.skipped/<name>``); a sharded tensor is noted once (``detcheck.tensor/<name>``)."""
        try:
            if type(tensor) not in _PLAIN_TYPES or not _dense_with_values(tensor):
                found = _subclasses.plain(tensor)
                if found.note is not None:
                    self._note("detcheck.tensor/", name, found.note)
                if found.replicated is not None and state:
                    # A gradient's or parameter's placements say whether its ranks hold the
                    # same values (a one-rank world always does), whatever the wrapper.
                    replicated = found.replicated or getattr(self._writer, "world_size", 1) == 1
                tensor = found.tensor
            self._put_plain(step, name, tensor, replicated)
        except _subclasses.Unrecordable as e:
            self._note("detcheck.skipped/", name, str(e))
        except ImportError:
            raise  # device_digests=True without Triton: the caller's request cannot be met
        except Exception as e:
            self._note("detcheck.skipped/", name, f"recording it failed: {type(e).__name__}: {e}")

    def _note(self, prefix, name, text):
        """One environment entry per record name (what ``_put`` skipped or how it recorded it)."""
        key = prefix + name
        if key in self._noted:
            return
        self._noted.add(key)
        try:
            self._writer.add_environment(key, text() if callable(text) else text)
        except Exception:
            pass

    def _put_plain(self, step, name, tensor, replicated):
        """Hands one plain tensor to the writer: through the device kernels (``DeviceRecords``)
        for a tensor they run on, when device digests are on; otherwise from the host."""
        if self._device_digests is not False and tensor.device.type != "cpu":
            self._start_device_records()
        elif self._device_digests and self._device is None:
            self._start_device_records()  # CPU tensors under Triton's interpreter (tests)
        if self._device is not None:
            self._device.record(step, name, tensor, replicated, lambda: _host(tensor))
        elif replicated:
            self._writer.record_replicated(step, name, _host(tensor))
        else:
            self._writer.record(step, name, _host(tensor))

    def _start_device_records(self):
        if self._device is not None or not hasattr(self._writer, "record_digested"):
            return
        try:
            from ._device_records import DeviceRecords

            self._device = DeviceRecords(self._writer, run_on_cpu=bool(self._device_digests))
        except ImportError as e:  # no Triton: the host path, unless asked for explicitly
            if self._device_digests:
                raise ImportError(f"device_digests=True needs Triton: {e}") from e
            self._device_digests = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    def _forward_hook(self, label):
        put = self._put
        tensor_type = _torch.Tensor

        def hook(module, inputs, output):
            if isinstance(output, tensor_type):  # the common case, without the generator
                put(self._step, label, output)
                return
            for name, tensor in _leaves(label, output):
                put(self._step, name, tensor)

        return self._paused(hook)

    def _paused(self, hook):
        """``hook``, made invisible to an operator-trace window: watch's own ``detach()`` is no
        operator of the model."""
        if self._ops is None:
            return hook
        tracer = self._ops.tracer

        def paused_hook(*args):
            tracer.paused += 1
            try:
                return hook(*args)
            finally:
                tracer.paused -= 1

        return paused_hook

    def _record_inputs(self, module, args, kwargs):
        for name, tensor in _leaves(f"in/{ROOT}", tuple(args)):
            self._put(self._step, name, tensor)
        for name, tensor in _leaves(f"in/{ROOT}", kwargs):
            self._put(self._step, name, tensor)
        return None

    def _record_loss(self, module, args, output):
        loss = model_loss(output)
        if loss is not None:
            self._put(self._step, "loss", loss.detach())

    def _record_grads(self):
        if self._writer is None or "grad" not in self._records:
            return
        step = self._step
        for label, param in self._grad_labels:
            grad = param.grad
            if grad is not None:
                self._put(step, label, grad, self._replicated, state=True)

    def _end_backward(self):
        """The step's forward and backward are over, its update is next: records the gradients."""
        self._pending_update = False
        if self._ops is not None:
            self._ops.step_ends()
        self._record_grads()
        if self._ops is not None:
            self._ops.before_update()

    def _before_update(self, optimizer, args, kwargs):
        where = _closure_of(optimizer, args, kwargs)
        if where is None:
            self._end_backward()
            return None
        # `step(closure)` runs forward and backward inside the step (Lightning's automatic
        # optimization, LBFGS): the gradients exist once the closure has returned.
        kind, index = where
        closure = kwargs["closure"] if kind == "kw" else args[index]
        self._pending_update = True

        def closure_then_record(*a, **kw):
            result = closure(*a, **kw)
            if self._pending_update:
                self._end_backward()
            return result

        if kind == "kw":
            return args, {**kwargs, "closure": closure_then_record}
        return (*args[:index], closure_then_record, *args[index + 1 :]), kwargs

    def _after_update(self, optimizer, args, kwargs):
        if self._pending_update:  # an optimizer that never called its closure
            self._end_backward()
        if self._ops is not None:
            self._ops.after_update()
        step = self._step
        if "param" in self._records:
            for label, param in self._param_labels:
                if param.requires_grad:
                    self._put(step, label, param, self._replicated, state=True)
        self._step += 1
        if self._device is not None:
            self._device.end_step()


class TrainingRecording:
    """What a training framework's callback holds while training runs (``detcheck.hf``,
    ``detcheck.lightning``): the writer (the one given, or the launch's ``TraceWriter.from_env()``,
    opened when training starts and closed when it ends), ``watch``'s handle, the ``loss``
    records, and any hook the callback adds (removed at the end)."""

    def __init__(self, writer=None, replicated=None):
        self._given = writer
        self._replicated = replicated
        self._hooks = []
        #: The writer while training runs (``None`` outside detcheck).
        self.writer = None
        #: ``watch``'s handle while training runs.
        self.handle = None

    def start(self, model, optimizer, step):
        """Opens the writer and watches ``model`` and ``optimizer`` from step ``step``."""
        from ._detcheck import TraceWriter

        self.writer = self._given if self._given is not None else TraceWriter.from_env()
        self.handle = watch(
            model, self.writer, optimizer, replicated=self._replicated, start_step=step
        )

    def add_hook(self, hook):
        """A hook the callback registered, removed by ``stop``."""
        self._hooks.append(hook)

    def record_loss(self, step, loss):
        """Records ``loss`` (a tensor, or ``None``: nothing) as ``loss`` at ``step``."""
        if self.writer is not None and loss is not None:
            self.writer.record(step, "loss", _host(loss.detach()))

    def stop(self):
        """Removes the hooks; closes the writer it opened (a given one stays open)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        if self.writer is not None and self._given is None:
            self.writer.close()
        self.writer = None


def _program_records(why):
    """The program records itself: the zero-change recorder, if this process runs one, stands
    down (its writer, if it opened one, is dropped unfinished), so nothing is recorded twice."""
    import sys

    auto = sys.modules.get("detcheck._auto")
    if auto is not None:
        auto.stand_down(why)


def _capture_requested():
    """Whether this process was asked to capture a record (``DETCHECK_CAPTURE`` and
    ``DETCHECK_CAPTURE_DIR``, read by the native module: their format lives in Rust)."""
    from ._detcheck import capture_request

    return capture_request() is not None


def _add_versions(writer):
    """Adds torch's, CUDA's and cuDNN's versions to the writer's environment snapshot (those
    available), so ``detcheck compare`` shows when two runs used different ones."""
    if writer is None or not hasattr(writer, "add_environment"):
        return
    versions = {"torch.version": _torch.__version__, "torch.cuda": _torch.version.cuda}
    cudnn = getattr(_torch.backends, "cudnn", None)
    if cudnn is not None and cudnn.is_available():
        versions["torch.cudnn"] = cudnn.version()
    for key, value in versions.items():
        if value is not None:
            writer.add_environment(key, str(value))


def watch(
    model,
    writer,
    optimizer=None,
    *,
    replicated=None,
    start_step=0,
    device_digests=None,
    records=RECORDS,
):
    """Records ``model``'s forward outputs, gradients and (with ``optimizer``) parameters into
    ``writer`` every step, as this module's documentation describes; returns a ``WatchHandle``.

    ``writer`` is a ``detcheck.TraceWriter`` (or anything with its ``record``,
    ``record_replicated`` and ``world_size``), or ``None`` (what ``TraceWriter.from_env()`` gives
    outside detcheck): then nothing is hooked or recorded, and the handle only counts steps. ``replicated``: ``None`` for the rule above
    (DistributedDataParallel and world size > 1), or ``True``/``False``. ``start_step``: the
    first step's number. ``device_digests``: ``None`` (the default) computes the digests and
    statistics of CUDA tensors on their GPU (``detcheck._device``'s Triton kernels, read by the
    host once a step: no copy, no synchronisation per record) when Triton imports, else copies
    them to the host as before; ``True`` requires it (``ImportError`` without Triton; under
    ``TRITON_INTERPRET=1`` CPU tensors go through the kernels too); ``False`` always copies.
    ``records``: which of ``"fwd"``, ``"grad"``, ``"param"`` to record (all by default).
    ``optimizer`` may be a framework's wrapper (accelerate, Lightning,
    DeepSpeed): the ``torch.optim.Optimizer`` inside it is hooked (``_unwrap_optimizer``; a
    ``TypeError`` when there is none), also when ``writer`` is ``None``, so a program that passes
    an unusable object fails by hand too.
    """
    if optimizer is not None:
        optimizer = _unwrap_optimizer(optimizer)
    _program_records("the program calls detcheck.torch.watch")
    inner, is_ddp = _unwrap(model)
    _add_versions(writer)
    if replicated is None:
        replicated = is_ddp and getattr(writer, "world_size", 1) > 1
    if start_step < 0:
        raise ValueError(f"start_step {start_step} is negative")
    return WatchHandle(
        inner,
        writer,
        optimizer,
        bool(replicated),
        int(start_step),
        device_digests=device_digests,
        records=records,
    )
