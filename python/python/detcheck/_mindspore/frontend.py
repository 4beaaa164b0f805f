"""The MindSpore front end of the recorder contract (``detcheck._core.contract``): what the
recording engine (``detcheck._core.engine``) needs of an ``nn.Cell`` model, and ``MindSporeSink``,
how a MindSpore tensor reaches the writer (``Tensor.asnumpy()``, a numpy array on the host).

``MindSporeFrontEnd`` is made per recording, because a MindSpore gradient is no attribute of its
parameter: it is what the optimizer is given (``opt(grads)``, after ``ms.value_and_grad``, inside
``TrainOneStepCell`` or ``Model.train``). The caller hands the gradients over with
``gradients_given(optimizer, grads)`` just before the engine's ``end_backward``; ``gradient(p)``
then looks ``p`` up among them. Other parts:

- ``unwrap_cell``: the model inside MindSpore's training wrappers (``TrainOneStepCell`` and its
  loss-scale and gradient-accumulation kin through ``.network``, ``WithLossCell`` through
  ``._backbone``), so records are named after the model's own cells whichever way it is run;
- ``is_loss_cell``: a loss (``nn.LossBase``), whose output is the ``loss`` record;
- ``describe_run``: MindSpore's version, its execution mode, and the framework fact
  (``site:framework``) the report reads to name MindSpore's settings (src/check/settings.rs);
- ``install_evidence``: ``seed/mindspore`` at each ``mindspore.set_seed`` (docs/causes.md), and
  the line that built each model (``Cell.insert_param_to_cell``, wrapped on the class);
- ``data_parallel``, ``is_grad_reducer``: whether the ranks hold their parameters alike (the
  data-parallel mode, a ``DistributedGradReducer``), so ``grad/*`` and ``param/*`` are recorded
  as replicated (``_core.contract.replicated_records``).

``operator_trace``: in a capture re-run, the primitives of the captured record's cell
(``detcheck._mindspore.ops``), for the operator drill-down.

Graph mode (``GRAPH_MODE``, or a ``@jit`` step): the compiled graph runs no Python hooks, so the
front end made with ``graph=True`` registers none; what reaches Python (the optimizer's call
at the top level, ``Model.train``'s callbacks) is still recorded (docs/mindspore.md).

Determinism: records are made in the order the engine asks; conversions copy the tensor's
bytes, changing no value. A record that cannot be made is noted once in the trace's environment
(``detcheck.skipped/<name>``), never raised into the program.
"""

import functools
import os
import sys

import mindspore
from mindspore import nn

from .._core import evidence as _evidence
from .._core.contract import ROOT, RemovedOnce, capabilities, named_leaves

__all__ = [
    "MindSporeFrontEnd",
    "MindSporeSink",
    "data_parallel",
    "is_grad_reducer",
    "describe_run",
    "install_evidence",
    "is_graph_mode",
    "is_loss_cell",
    "host",
    "outputs",
    "unwrap_cell",
]


def is_graph_mode():
    """Whether MindSpore compiles cells into graphs (``GRAPH_MODE``), where no hook runs."""
    try:
        return mindspore.get_context("mode") == mindspore.GRAPH_MODE and (
            os.environ.get("MS_JIT") != "0"
        )
    except Exception:
        return False


def host(tensor):
    """What the writer is handed for a MindSpore tensor: its numpy copy (``asnumpy``); a
    bfloat16 tensor, which numpy has no dtype for, as float32 (every bfloat16 value is one)."""
    if isinstance(tensor, mindspore.Tensor):
        if tensor.dtype == mindspore.bfloat16:
            tensor = tensor.astype(mindspore.float32)
        return tensor.asnumpy()
    return tensor


def outputs(name, value):
    """``(name, tensor)`` of every tensor in a cell's output, in order: the PyTorch front
    end's rule (``named_leaves``)."""
    return named_leaves(name, value, lambda v: isinstance(v, mindspore.Tensor))


#: The wrappers looked through to the model, by class name (so that none is imported), and the
#: attribute that holds what they wrap.
_WRAPPERS = (
    ("network", "TrainOneStepCell"),
    ("network", "TrainOneStepWithLossScaleCell"),
    ("network", "GradAccumulationCell"),
    ("network", "PipelineCell"),
    ("network", "MicroBatchInterleaved"),
    ("_backbone", "WithLossCell"),
    ("_network", "WithEvalCell"),
    ("_network", "DataWrapper"),
)


def unwrap_cell(cell):
    """The model inside ``cell``'s training wrappers (``_WRAPPERS``, 8 deep at most)."""
    for _ in range(8):
        for mro_name in (c.__name__ for c in type(cell).__mro__):
            found = next((attr for attr, name in _WRAPPERS if name == mro_name), None)
            if found is not None:
                inner = getattr(cell, found, None)
                if isinstance(inner, nn.Cell):
                    cell = inner
                    break
        else:
            return cell
    return cell


def is_loss_cell(cell):
    """Whether ``cell`` is a loss (``nn.LossBase``): its output is the step's ``loss``."""
    return isinstance(cell, nn.LossBase)


def is_grad_reducer(cell):
    """Whether ``cell`` is a ``nn.DistributedGradReducer``: the allreduce of a data-parallel
    program's gradients, after which every rank holds the same gradients."""
    reducer = getattr(nn, "DistributedGradReducer", None)
    return reducer is not None and isinstance(cell, reducer)


def data_parallel():
    """Whether MindSpore runs data parallel (``set_auto_parallel_context(parallel_mode=
    DATA_PARALLEL)``): every rank holds the same parameters and, after the allreduce, the same
    gradients."""
    try:
        return mindspore.get_auto_parallel_context("parallel_mode") == "data_parallel"
    except Exception:
        return False


def has_trainable_parameters(cell):
    """Whether ``cell`` holds a parameter the optimizer may update."""
    try:
        return bool(cell.trainable_params())
    except Exception:
        return False


class MindSporeSink:
    """The ``TensorSink`` of one recording: tensors as numpy arrays to the writer, a failure
    noted once per name."""

    def __init__(self, writer):
        self._writer = writer
        self._noted = set()

    def put(self, step, name, tensor, replicated=False, state=False):
        try:
            array = host(tensor)
            if replicated:
                self._writer.record_replicated(step, name, array)
            else:
                self._writer.record(step, name, array)
        except Exception as e:
            key = "detcheck.skipped/" + name
            if key not in self._noted:
                self._noted.add(key)
                try:
                    self._writer.add_environment(
                        key, f"recording it failed: {type(e).__name__}: {e}"
                    )
                except Exception:
                    pass

    def put_state(self, step, items, replicated):
        for name, tensor in items:
            self.put(step, name, tensor, replicated, True)

    def end_step(self):
        pass

    def close(self):
        pass


class MindSporeFrontEnd:
    """The ``FrontEnd`` of MindSpore (``detcheck._core.contract``) for one recording (module doc).
    ``graph``: hooks cannot run (graph mode); ``parameters``: the ``(name, Parameter)`` list to
    record when there is no model cell to take them from (graph mode: the optimizer's)."""

    name = "mindspore"

    def __init__(self, graph=False, parameters=None):
        self.graph = bool(graph)
        self._parameters = parameters
        #: id(parameter) -> its gradient, as the optimizer was last given them.
        self._grads = {}

    def gradients_given(self, optimizer, grads):
        """The optimizer ``optimizer`` is given ``grads`` (its parameters' order)."""
        params = list(getattr(optimizer, "parameters", ()) or ())
        try:
            grads = list(grads)
        except TypeError:
            grads = []
        self._grads = {id(p): g for p, g in zip(params, grads) if isinstance(g, mindspore.Tensor)}

    def modules(self, model):
        if model is None:
            return ()
        return ((name, cell) for name, cell in model.cells_and_names())

    def parameters(self, model):
        if self._parameters is not None:
            return list(self._parameters)
        return list(model.parameters_and_names())

    def on_forward(self, module, hook):
        if self.graph or module is None:
            return RemovedOnce()
        return RemovedOnce(module.register_forward_hook(_never_raises(hook)).remove)

    def on_backward(self, hook):
        # MindSpore has no `Tensor.backward`: its loss is the loss cell's output.
        return RemovedOnce()

    def on_forward_inputs(self, module, hook):
        if self.graph or module is None:
            return RemovedOnce()
        handle = module.register_forward_pre_hook(_never_raises(hook), with_kwargs=True)
        return RemovedOnce(handle.remove)

    def outputs(self, name, value):
        if isinstance(value, mindspore.Tensor):
            return ((name, value),)
        return outputs(name, value)

    def gradient(self, parameter):
        return self._grads.get(id(parameter))

    def trainable(self, parameter):
        return bool(getattr(parameter, "requires_grad", True))

    def loss_of(self, output):
        return None  # the loss is a loss cell's output (the recorders record it)

    def sink(self, writer, device_digests, model):
        return MindSporeSink(writer)

    def operator_trace(self, current_step, model, writer, updates):
        if self.graph:
            return None  # a compiled graph runs no primitive call in Python
        from .._detcheck import capture_request

        if capture_request() is None:
            return None
        from . import ops as _mindspore_ops  # wraps the primitives: only for a capture re-run

        return _mindspore_ops.plan(current_step, model, writer, updates, host)


def _never_raises(hook):
    """``hook`` as a MindSpore forward hook that returns ``None`` (the output unchanged) and
    never raises into the program."""

    def called(*args):
        try:
            hook(*args)
        except Exception:
            pass
        return None

    return called


def root_label():
    """The model's label in record names (``fwd/(model)``)."""
    return ROOT


def describe_run(writer, graph=False):
    """MindSpore's version and mode in the writer's environment snapshot, and the framework
    fact (``site:framework = mindspore``) that names MindSpore's settings in a report."""
    if "environment" not in capabilities(writer):
        return
    writer.add_environment("mindspore.version", str(getattr(mindspore, "__version__", "?")))
    writer.add_environment("mindspore.mode", "graph" if graph else "pynative")
    _evidence.fact("site:framework", "mindspore")


def _global_seed():
    seed = mindspore.get_seed()
    return (-1 if seed is None else int(seed)).to_bytes(8, "little", signed=True)


def install_evidence():
    """Follows MindSpore's global seed: ``seed/mindspore`` after each ``mindspore.set_seed``
    (the seed itself: MindSpore keeps no drawable state beside it that a step could show)."""
    _evidence.add_generator("mindspore", _global_seed)
    _evidence.track_seeding(mindspore, "set_seed", "mindspore")
    _note_where_models_are_built()


def _note_where_models_are_built():
    """The line that built each model (``_core.evidence.note_module_built``): MindSpore has no
    global parameter registration hook, so ``Cell.insert_param_to_cell`` (what a Cell's
    ``__setattr__`` calls for each parameter it is given, while it is constructed) is wrapped, on
    the class, once: nothing is attached to the program's Cells."""
    cell = mindspore.nn.Cell
    original = cell.insert_param_to_cell
    if getattr(original, "_detcheck_noted", False):
        return

    @functools.wraps(original)
    def insert_param_to_cell(self, *args, **kwargs):
        try:
            _evidence.note_module_built(sys._getframe(1))
        except Exception:
            pass
        return original(self, *args, **kwargs)

    insert_param_to_cell._detcheck_noted = True
    cell.insert_param_to_cell = insert_param_to_cell
