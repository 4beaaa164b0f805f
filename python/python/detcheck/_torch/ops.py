"""The operator trace of ``detcheck.torch.watch``: every operator inside one record's module,
so that detcheck can name the first operator where two runs part.

When two runs diverge at a record of ``watch`` (``fwd/...``, ``grad/...``, ``param/...``),
detcheck re-runs the program asked to capture that record (``DETCHECK_CAPTURE`` =
``RANK:STEP:OCCURRENCE:NAME``, ``DETCHECK_CAPTURE_DIR`` = ``DIR``, read once, in Rust, by
``detcheck._detcheck.capture_request()`` when ``watch`` is called). ``watch`` then also records,
inside that record's module only, the inputs and outputs of every operator that runs (a
``TorchDispatchMode``: aten operators and custom operators registered with ``torch.library``) into
``DIR/ops/rank0.dctrace``; detcheck compares the two sides' operator traces and names the first
operator whose output differs.

Contract (detcheck's Rust side parses these names):

- Active only when there is a request, ``watch`` has a writer, ``writer.rank`` is the request's
  rank, and the requested name is one that ``watch`` makes: ``fwd/<label>`` or
  ``fwd/<label>.<suffix>`` (the longest module label that fits), ``grad/<param>``, or (with an
  optimizer) ``param/<param>``. Otherwise nothing changes: no hook is added.
- The file: ``TraceWriter(DIR/ops, 0, 1, mode="stats")`` (a world of one rank, rank 0, whatever
  the program's rank), created when the window opens and closed when it closes; every record is
  at the requested step. At most one window per process.
- ``detcheck run --inside`` (``inside_request()``: ``DETCHECK_CAPTURE_OPS=full``), forward
  windows only: the file is in ``mode="full"``, each call's text is in its environment
  (``site:call:{i}``: ``_call_text``), and the window's outputs close it (``window/out{j}``,
  tensor ``j`` of ``tree_flatten(output)``). With a folder to replay from
  (``DETCHECK_REPLAY_INPUTS``, another ``--inside`` trace), the module's tensor inputs are that
  trace's ``window/in{j}`` (``_replayed``), or, when they do not fit, its own, with why in
  ``site:replay:error``.
- Records, in order. First the window's inputs: ``window/in{j}`` (forward window: tensor ``j`` of
  ``tree_flatten((args, kwargs))`` of the module call) or ``window/grad_out{j}`` (backward window:
  the gradient of tensor ``j`` of ``tree_flatten(output)`` of the module call, those that have
  one); none for the optimizer window. Then, for every operator call ``i`` dispatched while the
  window records (0-based, counting calls without tensors too)::

      op/{i:04d}/{module}/{func}/in{j}[<SOURCE]    before the call (in-place ops mutate them)
      op/{i:04d}/{module}/{func}/out{j}             after it

  ``func`` is ``str(func)`` of the operator overload (``aten.addmm.default``,
  ``myns.myop.default``); ``module`` is the label of the innermost module of the model whose
  forward is running (forward window), the window module's label (backward window) or
  ``(optimizer)`` (optimizer window). ``j`` counts the ``torch.Tensor`` leaves of
  ``tree_flatten((args, kwargs))`` (inputs) or of ``tree_flatten(out)`` (outputs) only, 0-based.
  After the tensors, each Python ``float`` among those leaves is an input too, numbered on from
  there and recorded as a float64 scalar with the source ``scalar`` (``torch.mul(x, 0.3)``'s
  ``0.3``: a value computed outside torch, whose difference the tensors alone would not show).
  Python ints are left out: they are mostly shapes, dimensions and indices, and a differing one
  changes a layout or an operator, which the trace shows anyway.
  ``SOURCE`` says where that very tensor object came from, when it came from this window:
  ``op{k}.out{m}`` (output ``m`` of the earlier operator ``k``; the latest such), ``in{m}`` or
  ``grad_out{m}`` (window input ``m``). A tensor subclass is recorded as ``watch`` records it
  (``_torch.subclasses.plain``): a ``DTensor`` (FSDP2's parameters, tensor parallel's weights and
  activations) as this rank's local shard, an ``AsyncCollectiveTensor`` as the tensor it waits
  for. Tensors the writer cannot record (unsupported dtypes, sparse or meta tensors, wrapper
  subclasses of other libraries) are skipped, their ``j`` kept; so are the outputs of operators
  that allocate without writing (``empty``, ``empty_like``, ``new_empty``...: their bits are
  whatever the memory held), and such a tensor as an input until an operator has written it
  (``bernoulli_`` returns it as its output); and the outputs of collectives (the ``c10d`` and
  functional-collective operators but ``wait_tensor``: FSDP's all-gathers and reduce-scatters,
  DTensor's redistributions), which may still be running when the call returns: their values
  are recorded where the program uses them, after it waited (the next operator's input, with
  its source ``op{k}.out{m}``, or ``wait_tensor``'s output).
- Windows (step ``S`` and occurrence ``k`` of the request):

  * ``fwd/...``: the ``k``-th forward call (0-based, counted in step ``S``) of the module: opens
    in its forward pre-hook, closes in its forward hook. The model's call during which a
    zero-change recording begins ran its pre-hooks before ours existed: the engine calls
    ``call_began`` in it, which opens the window (or, for ``grad/...``, enters the mode) there.
  * ``grad/<p>``: the backward through the module owning ``p`` (the longest module label that
    prefixes ``p``'s name and a dot; the model itself otherwise), in step ``S``. The dispatch
    mode is entered, not recording, in the model's forward pre-hook at its first forward of step
    ``S``: autograd runs backward under the modes active when ``backward()`` is called, and a
    mode entered inside a backward hook would be lost. The window opens when the gradients of
    the owner's outputs arrive: a tensor hook on its output (``register_multi_grad_hook`` with
    ``mode="all"`` for several), added by a forward hook of the owner in step ``S``. Not a
    module's full backward pre-hook: its identity ``BackwardHookFunction`` makes the owner's
    outputs views that an in-place operator after it (ResNet's ``ReLU(inplace=True)`` after a
    batch norm) may not modify, so the re-run would raise. The window stops recording, and its
    file is closed, when ``p``'s gradient has been accumulated
    (``register_post_accumulate_grad_hook``); the mode is left and the hooks removed when the
    step ends (``optimizer.step()`` or ``next_step()``), before ``watch`` records the gradients.
  * ``param/<p>``: ``optimizer.step()`` of step ``S``, from after the gradients are recorded to
    before the parameters are.

- ``watch``'s own recording inside a window (the forward hooks of submodules) is not traced, nor
  is the recording of the trace itself. The hooks a window adds are removed when it is over.

Determinism: the tracer never changes a value (each operator runs on its own arguments and its
result is returned as is), so the trace is a function of the operators the program runs: two
runs of a deterministic program write identical traces, and the first record that differs is the
first operator that computed something else.

Sharded models (FSDP1, FSDP2's ``fully_shard``, tensor parallel): the windows are the same;
the operators a ``DTensor`` runs are traced as the program calls them (``aten.addmm.default`` on
``DTensor`` arguments: a dispatch mode sees an operator before the subclass does), recorded
through their local shards; the local operators and collectives the ``DTensor`` runs for it
are not traced (the mode is off while it handles one). FSDP's own operators, which run inside
a window of a sharded module (its all-gather, its copies in and out of its buffers, the views of
its flat parameters: ``_fsdp_own``), are passed through, neither recorded nor numbered: they read
memory FSDP allocated by resizing a storage, before the collective wrote it. The model's
operators record the gathered parameters as their inputs (with no source: no traced operator
made them). FSDP frees its unsharded parameters by resizing their storage after the forward,
which the trace does not hinder: it copies what it records (``_apart``) and keeps no tensor
alive (weak references only).

Limits: eager operators only (a compiled region is one opaque call, or none); one window per
process. The backward window's module is the parameter's owner, not the module whose backward
first differs; it covers the first backward through the owner in step ``S`` and ends at ``p``'s
local gradient (with DistributedDataParallel: before the allreduce); for an owner with several
outputs it opens once all their gradients have arrived, so the backward of an output whose
gradient came earlier is not in it; an owner whose forward never runs (a ``ParameterList``)
gives no window. A dispatch mode the program enters around its forward and leaves before
``backward()`` would pop ours instead of its own (modes form a stack). A module whose forward raises
leaves its window open until the step ends.
"""

import sys
import weakref

import torch as _torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode
from torch.utils._pytree import tree_flatten, tree_unflatten

from .._core import evidence as _evidence
from .._core.contract import ROOT, Window
from .._detcheck import (
    TraceWriter,
    capture_request,
    inside_request,
    operator_record_name,
    replay_inputs,
    window_record_name,
)
from . import subclasses as _subclasses
from .tensors import PLAIN as _PLAIN
from .tensors import Hook as _Hook
from .tensors import dense_with_values as _dense_with_values
from .tensors import host as _host

#: Operators that allocate without writing (``empty_like`` before dropout's ``bernoulli_``):
#: their outputs hold whatever the memory held, so the tracer records neither them nor their use
#: as an input until an operator has written them (an in-place operator returns them as its own
#: output, which is recorded).
_ALLOCATIONS = frozenset(
    [
        "aten.empty",
        "aten.empty_like",
        "aten.empty_strided",
        "aten.empty_permuted",
        "aten.new_empty",
        "aten.new_empty_strided",
    ]
)

#: The namespaces of the collective operators (``torch.distributed``'s ``c10d`` ops, the
#: functional collectives of DTensor and FSDP2): a collective may still be running when its call
#: returns (``async_op``, gloo's and NCCL's own threads), so its outputs' bits are whatever they
#: are at that moment. They are recorded where the program uses them, after it waited: as the
#: input of the next operator, or as ``wait_tensor``'s output.
_COLLECTIVES = frozenset(
    ["c10d", "_c10d_functional", "_c10d_functional_autograd", "c10d_functional"]
)

#: The collective operators whose output is complete when they return (they wait).
_WAITS = frozenset(["wait_tensor"])


#: The files of torch that only pass an operator on: the code that called it is above them
#: (``TorchDispatchMode``'s handler runs under Dynamo's ``disable``: its frames come first).
_PASSING = (
    "/torch/_tensor.py",
    "/torch/functional.py",
    "/torch/_ops.py",
    "/torch/overrides.py",
    "/torch/utils/_python_dispatch.py",
    "/torch/utils/_contextlib.py",
    "/torch/_dynamo/eval_frame.py",
    "/torch/_compile.py",
)

#: FSDP's own code (FSDP1 and FSDP2's ``fully_shard``).
_FSDP = "/torch/distributed/fsdp/"


def _fsdp_own(frame):
    """Whether the operator called from ``frame`` is FSDP's own bookkeeping (its all-gather,
    the copies in and out of its buffers, the views of its flat parameters): the innermost
    calling frame outside ``_PASSING`` is in FSDP's code. Its operands include memory FSDP
    allocates by resizing a storage, which no operator writes (FSDP1 splits its padded
    unsharded flat parameter into the all-gather's outputs before the all-gather fills it), so
    their bits mean nothing until the collective has run; the operators the model runs on the
    gathered parameters record them as their inputs."""
    for _ in range(8):
        if frame is None:
            return False
        name = frame.f_code.co_filename.replace("\\", "/")
        if not name.endswith(_PASSING):
            return _FSDP in name
        frame = frame.f_back
    return False


def _in_flight(func):
    """Whether ``func`` is a collective whose outputs may still be written after it returns."""
    namespace = getattr(func, "namespace", None)
    if namespace not in _COLLECTIVES:
        return False
    return str(getattr(func, "overloadpacket", "")).rsplit(".", 1)[-1] not in _WAITS


#: A Python float's source (``operator_record_name``'s grammar lives in Rust).
_SCALAR = ("scalar", None, None)

#: The module label of the optimizer window's operators.
OPTIMIZER = "(optimizer)"

#: Whether this process opened its window (at most one per process).
_opened = False


def _apart(tensor):
    """What the writer is handed for a traced tensor: a copy of a CPU tensor's values, never a
    numpy view of its memory (``_host``'s way for ``watch``): torch refuses for good to resize a
    storage numpy has viewed, and FSDP frees its unsharded parameters by resizing their storage
    to 0 after the forward ("Trying to resize storage that is not resizable")."""
    if tensor.is_cpu:
        tensor = tensor.detach().clone()
    return _host(tensor)


def _tensors(value):
    """``(j, tensor)`` for the tensor leaves of ``tree_flatten(value)``, ``j`` counting them."""
    leaves, _ = tree_flatten(value)
    return enumerate(leaf for leaf in leaves if isinstance(leaf, _torch.Tensor))


class OpTracer(TorchDispatchMode):
    """The dispatch mode: records every operator's tensors while ``recording`` is true and
    ``paused`` is 0 (plain attributes: backward may run on another thread); passes operators
    through otherwise."""

    def __init__(self, step, label):
        super().__init__()
        self.writer = None
        self.step = step
        #: The label when no module of ``stack`` runs.
        self.label = label
        #: Labels of the modules whose forward runs, innermost last (forward window).
        self.stack = []
        self.recording = False
        #: Above 0 while ``watch`` records (its ``_host`` runs operators).
        self.paused = 0
        #: The next operator's number.
        self.index = 0
        #: Whether each call is written out with its non-tensor arguments (``site:call:{i}``).
        self.calls = False
        #: ``id(tensor)`` -> ``(weakref or tensor, source)``: where a window tensor came from.
        self._sources = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.recording or self.paused or _fsdp_own(sys._getframe(1)):
            return func(*args, **kwargs)
        i = self.index
        self.index += 1
        module = self.stack[-1] if self.stack else self.label
        where = _evidence.site(sys._getframe(1))
        if where is not None:  # the program's line of this call (src/compare/operator.rs)
            self.writer.add_environment(f"site:op:{i}", where)
        operator = str(func)
        if self.calls:  # its other arguments, which the tensors do not show (`run --inside`)
            self.writer.add_environment(f"site:call:{i}", _call_text(operator, args, kwargs))
        leaves, _ = tree_flatten((args, kwargs))
        j = 0
        for leaf in leaves:
            if not isinstance(leaf, _torch.Tensor):
                continue
            source, uninitialized = self._source(leaf)
            if not uninitialized:  # else: memory an allocation left as it was: bits mean nothing
                self._record(operator_record_name(i, module, operator, "in", j, source), leaf)
            j += 1
        for leaf in leaves:  # Python floats, numbered after the tensors
            if isinstance(leaf, float):
                name = operator_record_name(i, module, operator, "in", j, _SCALAR)
                self._record(name, _torch.tensor(leaf, dtype=_torch.float64))
                j += 1
        out = func(*args, **kwargs)
        allocation = str(getattr(func, "overloadpacket", "")) in _ALLOCATIONS
        in_flight = _in_flight(func)
        for j, tensor in _tensors(out):
            if not (allocation or in_flight):
                self._record(operator_record_name(i, module, operator, "out", j), tensor)
            self._remember(tensor, ("op", i, j), uninitialized=allocation)
        return out

    def record_inputs(self, kind, value):
        """Records the window's inputs, ``window/{kind}{j}`` for the tensor leaves of ``value``,
        and remembers them as sources (``kind`` ``"out"``: its outputs, ``run --inside``)."""
        self.paused += 1
        try:
            for j, tensor in _tensors(value):
                self._record(window_record_name(kind, j), tensor)
                self._remember(tensor, (kind, j, None))
        finally:
            self.paused -= 1

    def _record(self, name, tensor):
        try:
            with _subclasses.outside_transforms(tensor):
                if (
                    type(tensor) not in _PLAIN
                    or not _dense_with_values(tensor)
                    or _subclasses.transformed(tensor)
                ):
                    # A DTensor (FSDP2, tensor parallel): its local shard; an
                    # AsyncCollectiveTensor: the tensor it waits for (the operator waits
                    # anyway); a torch.func level: the tensor under it.
                    tensor = _subclasses.plain(tensor).tensor
                self.writer.record(self.step, name, _apart(tensor))
        except Exception:
            pass  # not recordable (a dtype, a meta or sparse tensor): the same on both sides

    def _source(self, tensor):
        """Where ``tensor`` came from in this window (``None``: elsewhere), and whether it is
        still the uninitialised memory of an allocation."""
        entry = self._sources.get(id(tensor))
        if entry is None:
            return None, False
        ref, source, uninitialized = entry
        held = ref() if isinstance(ref, weakref.ref) else ref
        return (source, uninitialized) if held is tensor else (None, False)

    def _remember(self, tensor, source, uninitialized=False):
        try:
            ref = weakref.ref(tensor)
        except TypeError:
            ref = tensor
        self._sources[id(tensor)] = (ref, source, uninitialized)

    def pause(self):
        """The engine records: what runs now is not the model's."""
        self.paused += 1

    def resume(self):
        """Ends one ``pause``."""
        self.paused -= 1

    def enter(self):
        """Enters the mode (on this thread's mode stack), not recording yet."""
        self.__enter__()

    def leave(self):
        """Leaves the mode; when another mode was pushed above it and is still there, stays
        below it, passing everything through."""
        self.recording = False
        if _get_current_dispatch_mode() is self:
            self.__exit__(None, None, None)


def _owner(labels, param_name):
    """The label of the module that owns ``param_name``: the longest that prefixes it."""
    best = ""
    for label in labels:
        if label and param_name.startswith(label + ".") and len(label) > len(best):
            best = label
    return best or ROOT


def plan(current_step, model, writer, updates):
    """The operator trace (``detcheck._core.contract.OperatorTrace``) the recording engine must
    take for the process's capture request, or ``None`` (no request, another rank's, or a name
    the engine does not make). ``current_step``: the engine's step getter; ``updates``: whether
    optimizer steps reach the engine (``param/*`` records exist)."""
    request = capture_request()
    if request is None or writer is None:
        return None
    rank, step, occurrence, name, folder = request
    if getattr(writer, "rank", None) != rank:
        return None
    modules = {(label or ROOT): module for label, module in model.named_modules()}
    params = dict(model.named_parameters())
    if name.startswith("fwd/"):
        wanted = name[len("fwd/") :]
        fits = [label for label in modules if wanted == label or wanted.startswith(label + ".")]
        if fits:
            return _ForwardWindow(
                current_step,
                folder,
                step,
                occurrence,
                modules,
                max(fits, key=len),
                inside_request(),
            )
    elif name.startswith("grad/") and name[len("grad/") :] in params:
        param_name = name[len("grad/") :]
        label = _owner(modules, param_name)
        return _BackwardWindow(current_step, folder, step, modules, label, params[param_name])
    elif name.startswith("param/") and updates and name[len("param/") :] in params:
        return _OptimizerWindow(current_step, folder, step)
    return None


#: The longest call text kept (``site:call:{i}``).
_CALL_TEXT = 400


def _call_text(operator, args, kwargs):
    """``aten.gelu.default(float32[64, 256], approximate='tanh')``: an operator call with its
    tensors as dtype and shape and its other arguments as Python shows them (an argument whose
    ``repr`` raises, by its type's name: the tracer never fails the program)."""

    def show(value):
        if isinstance(value, _torch.Tensor):
            return f"{str(value.dtype).replace('torch.', '')}{list(value.shape)}"
        if isinstance(value, (list, tuple)):
            return "[" + ", ".join(show(v) for v in value) + "]"
        try:
            return repr(value)
        except Exception:
            return f"<{type(value).__name__}>"

    parts = [show(a) for a in args] + [f"{k}={show(v)}" for k, v in kwargs.items()]
    text = f"{operator}({', '.join(parts)})"
    return text if len(text) <= _CALL_TEXT else text[: _CALL_TEXT - 3] + "..."


class _Replaced(_torch.autograd.Function):
    """The reference's values in place of the program's tensor, with its gradient passed
    through to the program's: the replayed module's output has B's inputs' exact bits, and the
    program's backward still reaches the layers before the module."""

    @staticmethod
    def forward(ctx, mine, theirs):
        return theirs.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _replayed(folder, step, call, writer):
    """``call`` (``(args, kwargs)`` of the window's module) with its tensor leaves replaced by
    the window inputs of the ``--inside`` trace in ``folder`` at ``step`` (leaf ``j`` by
    ``window/in{j}``, cast to the leaf's dtype and device); ``None``, with the reason in the
    trace's environment (``site:replay:error``, which ``detcheck run`` reports), when they do not
    fit: a count, a shape or a file that differs."""
    try:
        theirs = {j: (dtype, shape, data) for j, dtype, shape, data in replay_inputs(folder, step)}
        leaves, spec = tree_flatten(call)
        tensors = [i for i, leaf in enumerate(leaves) if isinstance(leaf, _torch.Tensor)]
        extra = sorted(set(theirs) - set(range(len(tensors))))
        if extra:
            raise ValueError(
                f"the reference's module has tensor input {extra[0]}, this run's has "
                f"{len(tensors)} tensor inputs"
            )
        for j, at in enumerate(tensors):
            if j not in theirs:
                continue  # the reference could not record it: this run's own is kept
            dtype, shape, data = theirs[j]
            mine = leaves[at]
            if tuple(shape) != tuple(mine.shape):
                raise ValueError(
                    f"input {j} is {list(mine.shape)} here and {list(shape)} in the reference"
                )
            value = (
                _torch.frombuffer(bytearray(data), dtype=getattr(_torch, dtype)).reshape(shape)
                if data
                else _torch.empty(shape, dtype=getattr(_torch, dtype))
            )
            value = value.to(device=mine.device, dtype=mine.dtype)
            leaves[at] = _Replaced.apply(mine, value) if mine.requires_grad else value
        args, kwargs = tree_unflatten(leaves, spec)
        writer.add_environment("site:replay:inputs", str(folder))
        return args, kwargs
    except Exception as error:  # never the program's failure: detcheck run reports it
        writer.add_environment("site:replay:error", f"{type(error).__name__}: {error}")
        return None


class _Window(Window):
    """One window of a recording: its tracer, its hooks, its file; the engine's
    ``OperatorTrace``. The engine calls ``step_ends()`` before it records the gradients,
    ``before_update()`` after, ``after_update()`` before it records the parameters,
    ``pause()``/``resume()`` around its own recording, and ``remove()``."""

    #: ``detcheck run --inside``: every tensor kept (full mode), not statistics.
    _full = False

    def __init__(self, current_step, folder, step, label):
        super().__init__(current_step, folder, step, OpTracer(step, label))
        self._entered = False

    def _open_file(self):
        """Creates the file; ``False`` when this process already opened its window."""
        global _opened
        if _opened:
            self._done = True  # the hooks go when the step ends
            return False
        _opened = True
        mode = "full" if self._full else "stats"
        self.tracer.writer = TraceWriter(self._folder / "ops", 0, 1, mode=mode)
        self.tracer.calls = self._full
        return True

    def _enter(self):
        self.tracer.enter()
        self._entered = True

    def _close_file(self):
        self.tracer.recording = False
        writer, self.tracer.writer = self.tracer.writer, None
        if writer is not None:
            writer.close()

    def _finish(self):
        """The window is over: leaves the mode, closes the file, removes the hooks."""
        self._done = True
        self.tracer.recording = False
        if self._entered:
            self._entered = False
            self.tracer.leave()
        self._close_file()
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def remove(self):
        """Ends the window now (``watch``'s ``remove()``, or its step is over)."""
        if self._hooks or self._entered or self.tracer.writer is not None:
            self._finish()
        self._done = True


class _ForwardWindow(_Window):
    """``fwd/<label>...``: the ``occurrence``-th forward call of the module in step ``S``.
    With ``inside`` (``detcheck run --inside``: ``inside_request()``), the trace is full and
    ends with the window's outputs (``window/out{j}``), and, with a folder to replay from, the
    module runs on that trace's window inputs (``_replayed``)."""

    def __init__(self, current_step, folder, step, occurrence, modules, label, inside=None):
        super().__init__(current_step, folder, step, label)
        self._full = inside is not None
        self._replay_from = inside[0] if inside is not None else None
        self._occurrence = occurrence
        self._calls = 0
        self._module = modules[label]
        self._labels = {id(module): label for label, module in modules.items()}
        self._hooks.append(
            self._module.register_forward_pre_hook(_Hook(self._pre_hook), with_kwargs=True)
        )

    def _pre_hook(self, module, args, kwargs):
        if self._done or not self._now():
            return None
        call = self._calls
        self._calls += 1
        if call != self._occurrence or not self._open_file():
            return None
        tracer = self.tracer
        replaced = None
        if self._replay_from is not None:
            replaced = _replayed(self._replay_from, self._step, (args, kwargs), tracer.writer)
            if replaced is not None:
                args, kwargs = replaced
        tracer.record_inputs("in", (args, kwargs))
        tracer.stack = [tracer.label]
        self._hooks.append(module.register_forward_hook(_Hook(self._close_hook)))
        for sub in module.modules():
            if sub is module:
                continue
            label = self._labels[id(sub)]
            self._hooks.append(
                sub.register_forward_pre_hook(_Hook(self._push(label)), prepend=True)
            )
            self._hooks.append(sub.register_forward_hook(_Hook(self._pop)))
        self._enter()
        tracer.recording = True
        return replaced

    def call_began(self, module, args, kwargs):
        if module is self._module:
            self._pre_hook(module, args, kwargs)

    def _push(self, label):
        stack = self.tracer.stack

        def push(module, args):
            stack.append(label)

        return push

    def _pop(self, module, args, output):
        if len(self.tracer.stack) > 1:
            self.tracer.stack.pop()

    def _close_hook(self, module, args, output):
        if self._full:
            self.tracer.recording = False
            self.tracer.record_inputs("out", output)
        self._finish()

    def step_ends(self):
        # Step S is over (a forward that raised left its window open), or the window was had.
        if self._done or self._now():
            self.remove()


class _BackwardWindow(_Window):
    """``grad/<p>``: the backward through ``p``'s owner module in step ``S``, up to ``p``'s
    accumulated gradient."""

    def __init__(self, current_step, folder, step, modules, label, param):
        super().__init__(current_step, folder, step, label)
        self._module = modules[label]
        self._param = param
        self._opened = False
        self._root = modules[ROOT]
        self._hooks.append(self._root.register_forward_pre_hook(_Hook(self._enter_hook)))

    def _enter_hook(self, module, args):
        if self._entered or self._done or not self._now():
            return None
        self._enter()
        self._hooks.append(self._module.register_forward_hook(_Hook(self._output_hook)))
        if self._param.requires_grad:
            self._hooks.append(
                self._param.register_post_accumulate_grad_hook(_Hook(self._grad_hook))
            )
        return None

    def call_began(self, module, args, kwargs):
        if module is self._root:
            self._enter_hook(module, args)

    def _output_hook(self, module, args, output):
        if self._opened or not self._entered or not self._now():
            return None
        outputs = [(j, t) for j, t in _tensors(output) if t.requires_grad]
        if not outputs:
            return None
        indices = [j for j, _ in outputs]
        tensors = [t for _, t in outputs]
        if len(tensors) == 1:
            hook = tensors[0].register_hook(lambda grad: self._open(indices, [grad]))
        else:
            hook = _torch.autograd.graph.register_multi_grad_hook(
                tensors, lambda grads: self._open(indices, grads), mode="all"
            )
        self._hooks.append(hook)
        return None

    def _open(self, indices, grads):
        if self._opened or self._done or not self._entered:
            return None
        self._opened = True
        if not self._open_file():
            return None
        tracer = self.tracer
        tracer.paused += 1
        try:
            for j, grad in zip(indices, grads):
                if grad is not None:
                    tracer._record(window_record_name("grad_out", j), grad)
                    tracer._remember(grad, ("grad_out", j, None))
        finally:
            tracer.paused -= 1
        tracer.recording = True
        return None

    def _grad_hook(self, param):
        # Stops recording; the hooks go when the step ends (not from inside autograd's call).
        if self.tracer.recording:
            self._close_file()

    def step_ends(self):
        if self._done or self._now():
            self.remove()


class _OptimizerWindow(_Window):
    """``param/<p>``: ``optimizer.step()`` of step ``S``."""

    def __init__(self, current_step, folder, step):
        super().__init__(current_step, folder, step, OPTIMIZER)

    def before_update(self):
        if self._done or not self._now() or not self._open_file():
            return
        self._enter()
        self.tracer.recording = True

    def after_update(self):
        if self._entered:
            self._finish()
