"""The operator trace of a MindSpore recording: every primitive inside one record's cell, so that
detcheck can name the first MindSpore operator where two runs part (docs/operators.md).

The torch tracer's contract (``detcheck._torch.ops``: the capture request, the file
``DIR/ops/rank0.dctrace``, the record names ``window/in{j}`` and
``op/{i:04d}/{cell}/{operator}/in{j}[<SOURCE]``, ``.../out{j}``, the ``site:op:{i}`` lines, one
window per process), through what MindSpore lets Python see. In PyNative mode every operator a
cell runs is a call of a ``mindspore.ops.Primitive`` (``nn.Dense``'s ``MatMul`` and
``BiasAdd``, ``ops.relu``'s ``ReLU``, a ``ops.Custom`` operator); while a window records, the
``__call__`` of every ``Primitive`` class that defines one is wrapped, and each outermost call
(a primitive's ``__call__`` that calls its base class's is one call) with a tensor among its
arguments or results is traced:

- ``operator`` is the primitive's name (``MatMul``, ``BiasAdd``); a ``Custom`` operator's is
  ``Custom(<its function's name>)``, so a program's own operator is named as it is written;
- ``cell`` is the label of the innermost cell of the model whose ``construct`` is running
  (forward pre-hooks and hooks on the window cell's sub-cells); ``(optimizer)`` in the
  optimizer's window;
- inputs are the ``mindspore.Tensor`` arguments (positional, then keyword), then the Python
  floats among them as float64 scalars (``<scalar``); outputs the tensors of the result
  (``_core.contract.named_leaves``' order); a tensor's source is ``op{k}.out{m}`` or ``in{m}`` as
  for torch.

Windows (step ``S``, occurrence ``k`` of the request):

- ``fwd/<label>...``: the ``k``-th call of that cell in step ``S`` (its forward pre-hook to its
  forward hook);
- ``param/<p>``: the optimizer's call of step ``S`` (the engine's ``before_update`` to
  ``after_update``);
- ``grad/<p>``: none. MindSpore computes gradients inside ``value_and_grad``'s C++ (its
  primitives' backward functions run no Python), so the trace says why
  (``detcheck.operator-trace`` in the trace's environment) and the finding is "unavailable".

Determinism: the tracer changes no value (each primitive runs on its own arguments and its
result is returned as is); the trace is a function of the primitives the program runs.

Limits: PyNative mode only (a graph-mode cell is compiled: no primitive call reaches Python);
operators that do not go through a ``Primitive``'s ``__call__`` (a ``Tensor`` method bound to a
C++ function) are not seen, and a difference they make shows at the next traced primitive as an
input that differed, or as no operator differing; one window per process, on the captured rank.
"""

import sys
import weakref

import mindspore
from mindspore.ops import Primitive

from .._core import evidence as _evidence
from .._core.contract import ROOT, Window, named_leaves
from .._detcheck import TraceWriter, capture_request, operator_record_name, window_record_name

__all__ = ["plan"]

#: The cell label of the optimizer window's operators (the torch tracer's).
OPTIMIZER = "(optimizer)"
#: A Python float's source.
_SCALAR = ("scalar", None, None)
#: Whether this process opened its window (at most one per process).
_opened = False


def _is_tensor(value):
    return isinstance(value, mindspore.Tensor)


def _tensors(value):
    """``(j, tensor)`` for the tensors of ``value`` (a call's arguments or result), in order."""
    return enumerate(t for _, t in named_leaves("", value, _is_tensor))


def _floats(value, depth=0):
    """The Python floats among ``value``'s leaves, in order."""
    if isinstance(value, float):
        yield value
    elif depth < 8 and isinstance(value, (tuple, list)):
        for item in value:
            yield from _floats(item, depth + 1)
    elif depth < 8 and isinstance(value, dict):
        for item in value.values():
            yield from _floats(item, depth + 1)


def operator_name(primitive):
    """The name of a primitive in the trace (module doc)."""
    name = str(getattr(primitive, "name", None) or type(primitive).__name__)
    func = getattr(primitive, "func", None) if name == "Custom" else None
    if func is not None:
        name = f"Custom({getattr(func, '__name__', type(func).__name__)})"
    return name.replace("/", ".")


def _primitive_classes():
    """Every class of ``Primitive``'s family that defines its own ``__call__``."""
    found, seen, stack = [], set(), [Primitive]
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if "__call__" in cls.__dict__ and cls.__name__ != "ProxyOp":
            found.append(cls)
        stack.extend(cls.__subclasses__())
    return found


class PrimitiveTracer:
    """Records every outermost primitive call while ``recording`` is true and ``paused`` is 0
    (``install`` wraps the classes' ``__call__``, ``uninstall`` puts them back)."""

    def __init__(self, step, label, to_host):
        self.writer = None
        #: What the writer is handed for a tensor (``_mindspore.frontend.host``).
        self._host = to_host
        self.step = step
        self.label = label
        #: Labels of the cells whose ``construct`` runs, innermost last.
        self.stack = []
        self.recording = False
        self.paused = 0
        self.index = 0
        #: Above 0 inside a traced call (a primitive calling its base class's ``__call__``).
        self._depth = 0
        #: ``id(tensor)`` -> ``(weakref or tensor, source)``.
        self._sources = {}
        #: ``{class: its own __call__}`` while wrapped.
        self._wrapped = {}

    def install(self):
        for cls in _primitive_classes():
            original = cls.__dict__["__call__"]
            self._wrapped[cls] = original
            cls.__call__ = self._wrapper(original)

    def uninstall(self):
        wrapped, self._wrapped = self._wrapped, {}
        for cls, original in wrapped.items():
            try:
                cls.__call__ = original
            except Exception:
                pass

    def _wrapper(self, original):
        tracer = self

        def __call__(primitive, *args, **kwargs):
            if not tracer.recording or tracer.paused or tracer._depth:
                return original(primitive, *args, **kwargs)
            tracer._depth += 1
            try:
                return tracer._traced(original, primitive, args, kwargs)
            finally:
                tracer._depth -= 1

        return __call__

    def _traced(self, original, primitive, args, kwargs):
        inputs = list(_tensors((args, kwargs)))
        out = None
        if not inputs:  # made from no tensor: traced when it makes one
            out = original(primitive, *args, **kwargs)
            if not any(True for _ in _tensors(out)):
                return out  # no tensor in or out: a check, a shape, a type
        i = self.index
        self.index += 1
        cell = self.stack[-1] if self.stack else self.label
        operator = operator_name(primitive)
        where = _evidence.site(sys._getframe(2))
        if where is not None:  # the program's line of this call (src/compare/operator.rs)
            self.writer.add_environment(f"site:op:{i}", where)
        if inputs:  # before the call: an in-place primitive (Assign) changes them
            for j, tensor in inputs:
                name = operator_record_name(i, cell, operator, "in", j, self._source(tensor))
                self._record(name, tensor)
            for j, value in enumerate(_floats((args, kwargs)), start=len(inputs)):
                name = operator_record_name(i, cell, operator, "in", j, _SCALAR)
                self._record(name, mindspore.Tensor(value, mindspore.float64))
            out = original(primitive, *args, **kwargs)
        for j, tensor in _tensors(out):
            self._record(operator_record_name(i, cell, operator, "out", j), tensor)
            self._remember(tensor, ("op", i, j))
        return out

    def record_inputs(self, kind, value):
        """Records the window's inputs, ``window/{kind}{j}``, and remembers them as sources."""
        self.paused += 1
        try:
            for j, tensor in _tensors(value):
                self._record(window_record_name(kind, j), tensor)
                self._remember(tensor, (kind, j, None))
        finally:
            self.paused -= 1

    def _record(self, name, tensor):
        self.paused += 1  # converting a tensor may run a primitive (a bfloat16 cast)
        try:
            self.writer.record(self.step, name, self._host(tensor))
        except (TypeError, ValueError, NotImplementedError, RuntimeError):
            pass  # not recordable (a dtype): the same on both sides
        finally:
            self.paused -= 1

    def _source(self, tensor):
        entry = self._sources.get(id(tensor))
        if entry is None:
            return None
        ref, source = entry
        held = ref() if isinstance(ref, weakref.ref) else ref
        return source if held is tensor else None

    def _remember(self, tensor, source):
        try:
            ref = weakref.ref(tensor)
        except TypeError:
            ref = tensor
        self._sources[id(tensor)] = (ref, source)

    def pause(self):
        self.paused += 1

    def resume(self):
        self.paused -= 1


def _say_unsupported(writer, why):
    try:
        writer.add_environment("detcheck.operator-trace", why)
    except Exception:
        pass


def plan(current_step, model, writer, updates, to_host):
    """The operator trace (``detcheck._core.contract.OperatorTrace``) of this process's capture
    request, or ``None`` (no request, another rank's, or a record with no window: module doc).
    ``current_step``: the engine's step getter; ``updates``: whether the optimizer's calls
    reach the engine; ``to_host``: a tensor as the writer takes it (the front end's ``host``)."""
    request = capture_request()
    if request is None or writer is None or model is None:
        return None
    rank, step, occurrence, name, folder = request
    if getattr(writer, "rank", None) != rank:
        return None
    cells = {(label or ROOT): cell for label, cell in model.cells_and_names()}
    if name.startswith("fwd/"):
        wanted = name[len("fwd/") :]
        fits = [label for label in cells if wanted == label or wanted.startswith(label + ".")]
        if fits:
            label = max(fits, key=len)
            return _ForwardWindow(current_step, folder, step, to_host, occurrence, cells, label)
    elif name.startswith("param/") and updates:
        return _OptimizerWindow(current_step, folder, step, to_host)
    elif name.startswith("grad/"):
        _say_unsupported(
            writer,
            "MindSpore computes gradients in value_and_grad's C++, where no primitive call "
            "reaches Python: no operator trace for grad/* (docs/mindspore.md)",
        )
    return None


class _Window(Window):
    """One window: its tracer, its hooks, its file (``detcheck._torch.ops._Window``'s life;
    here ``_open`` also wraps the primitives)."""

    def __init__(self, current_step, folder, step, to_host, label):
        super().__init__(current_step, folder, step, PrimitiveTracer(step, label, to_host))

    def _open(self):
        """Creates the file and wraps the primitives; ``False`` when this process already
        opened its window."""
        global _opened
        if _opened:
            self._done = True
            return False
        _opened = True
        self.tracer.writer = TraceWriter(self._folder / "ops", 0, 1, mode="stats")
        self.tracer.install()
        return True

    def _finish(self):
        self._done = True
        tracer = self.tracer
        tracer.recording = False
        tracer.uninstall()
        writer, tracer.writer = tracer.writer, None
        if writer is not None:
            writer.close()
        for hook in self._hooks:
            try:
                hook.remove()
            except Exception:
                pass
        self._hooks = []

    def remove(self):
        if not self._done or self._hooks or self.tracer.writer is not None:
            self._finish()


class _ForwardWindow(_Window):
    """``fwd/<label>...``: the ``occurrence``-th call of the cell in step ``S``."""

    def __init__(self, current_step, folder, step, to_host, occurrence, cells, label):
        super().__init__(current_step, folder, step, to_host, label)
        self._occurrence = occurrence
        self._calls = 0
        self._cell = cells[label]
        self._labels = {id(cell): label for label, cell in cells.items()}
        self._hooks.append(self._cell.register_forward_pre_hook(self._pre_hook, with_kwargs=True))

    def _pre_hook(self, cell, args, kwargs):
        try:
            self._begin(cell, args, kwargs)
        except Exception:
            self._finish()  # never break the program: no trace rather than a failure
        return None

    def _begin(self, cell, args, kwargs):
        if self._done or not self._now():
            return
        call = self._calls
        self._calls += 1
        if call != self._occurrence or not self._open():
            return
        tracer = self.tracer
        tracer.record_inputs("in", (args, kwargs))
        tracer.stack = [tracer.label]
        self._hooks.append(cell.register_forward_hook(self._close_hook))
        for _, sub in cell.cells_and_names():
            if sub is cell or id(sub) not in self._labels:
                continue
            self._hooks.append(sub.register_forward_pre_hook(self._push(self._labels[id(sub)])))
            self._hooks.append(sub.register_forward_hook(self._pop))
        tracer.recording = True

    def _push(self, label):
        stack = self.tracer.stack

        def push(cell, args):
            stack.append(label)
            return None

        return push

    def _pop(self, cell, args, output):
        if len(self.tracer.stack) > 1:
            self.tracer.stack.pop()
        return None

    def _close_hook(self, cell, args, output):
        self._finish()
        return None

    def step_ends(self):
        if self._done or self._now():
            self.remove()


class _OptimizerWindow(_Window):
    """``param/<p>``: the optimizer's call of step ``S``."""

    def __init__(self, current_step, folder, step, to_host):
        super().__init__(current_step, folder, step, to_host, OPTIMIZER)

    def before_update(self):
        if self._done or not self._now() or not self._open():
            return
        self.tracer.recording = True

    def after_update(self):
        if self.tracer.recording or self.tracer.writer is not None:
            self._finish()
