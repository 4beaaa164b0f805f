"""The PyTorch front end of the recorder contract (``detcheck._core.contract``): ``TORCH``, what the
engine (``detcheck._core.engine``) needs of torch, and ``TorchSink``, how a torch tensor reaches the
writer: plain tensors from the host (``_torch.tensors.host``), or lent to it with no copy where
``_torch.tensors.lendable`` allows (a module's output; a step's gradients and parameters, seen
together by ``put_state``), tensor subclasses through their data (``_torch.subclasses``), CUDA
tensors through the device kernels when device digests are on (``_torch.device_records``), and the
operator tracer of a capture re-run (``_torch.ops``); where a training step begins and ends around
an optimizer's step (``starts_update``, ``after_optimizer_step``: the outermost step around it, a
framework's wrapper or another optimizer); and, in a rank detcheck launched, the evidence of causes
torch gives (``install_evidence``): its generators, their seeding calls, the sample indices data
loaders fetch, and the values that enter torch from the program's lines (``torch.tensor``,
``torch.as_tensor``, ``torch.from_numpy``); and whether the run shows that recording cannot change
what it computes (``synchronous``: one process on the CPU, no thread of the program's own).

Determinism: records are made in the order the engine asks; a skipped record is noted once per
name (``detcheck.skipped/<name>``), the same in every run of the same program.
"""

import functools
import os
import sys
import weakref
from typing import Any

import torch

from .._core import evidence as _evidence
from .._core.contract import capabilities
from . import subclasses as _subclasses
from .tensors import (
    MODULE_HOOKS,
    PLAIN,
    Hook,
    dense_with_values,
    host,
    leaves,
    lendable,
    model_loss,
    replicated_records,
    visible_holders,
)

__all__ = [
    "TORCH",
    "TorchSink",
    "describe_run",
    "before_optimizer_step",
    "closure_of",
    "after_optimizer_step",
    "starts_update",
    "install_evidence",
    "synchronous",
]


class TorchSink:
    """The ``TensorSink`` of one engine: the writer, device records once a tensor goes to the
    device kernels, and the names already noted in the environment. ``model``: the recorded
    model, where FSDP2's own holders of its shards' memory are found (``put_state``)."""

    def __init__(self, writer, device_digests, model=None):
        self._writer = writer
        #: What the writer takes (``_core.contract.capabilities``: declared, never probed).
        self._takes = capabilities(writer)
        #: ``True``, ``False`` or ``None`` (on for CUDA tensors where Triton runs).
        self._device_digests = device_digests
        #: The ``DeviceRecords`` once a tensor went to the device kernels.
        self._device = None
        self._noted = set()
        #: The writer's in-place path for lent tensors (``lendable``), where it has one.
        self._record_lent = writer._record_lent if "lent" in self._takes else None
        self._model = model
        #: ``_torch.subclasses.shard_holders`` of the model, once asked (``False`` before).
        self._shard_holders = False
        if device_digests and "digested" not in self._takes:
            raise TypeError(
                "device_digests=True needs a detcheck.TraceWriter (record_digested), not a "
                f"{type(writer).__name__}"
            )

    def put(self, step, name, tensor, replicated=False, state=False):
        """Hands one record to the writer, a tensor subclass through its data; ``state``: a
        gradient or parameter, whose DTensor placements decide ``replicated``. Never raises into
        the program: a tensor with no values to record, or a failure to record one, is skipped
        with one note in the trace's environment (``detcheck.skipped/<name>``); a sharded tensor
        is noted once (``detcheck.tensor/<name>``)."""
        self._guarded(name, tensor, self._put, step, name, tensor, replicated, state)

    def _put(self, step, name, tensor, replicated, state):
        self._record(step, name, self._resolve(name, tensor, replicated, state), None)

    def put_state(self, step, items, replicated):
        """Records one step's gradients or parameters (``(name, tensor)`` pairs, in their
        order) as ``put`` with ``state`` does, after looking at all of them: a tensor whose
        storage no one holds but them, their bases and FSDP2 (``_torch.tensors.visible_holders``) is
        lent to the writer rather than copied (``lendable``'s second rule)."""
        resolved = [
            (
                name,
                tensor,
                self._guarded(name, tensor, self._resolve, name, tensor, replicated, True),
            )
            for name, tensor in items
        ]
        holders = None
        if self._lends():
            seen = [found[0] for _, _, found in resolved if found is not None]
            try:
                holders = visible_holders(seen + self._framework_holders())
            except Exception:
                holders = {}  # none lent: each is copied
        for name, tensor, found in resolved:
            if found is not None:
                self._guarded(name, tensor, self._record, step, name, found, holders)

    def _framework_holders(self):
        """The tensors FSDP2 keeps on its shards' memory (``_torch.subclasses.shard_holders``), or
        none."""
        if self._shard_holders is False:
            model = self._model
            self._shard_holders = None if model is None else _subclasses.shard_holders(model)
        return [] if self._shard_holders is None else self._shard_holders()

    def _guarded(self, name, tensor, fn, *args):
        """``fn(*args)`` with ``tensor`` read outside torch.func's transforms; ``None`` and a
        note instead of an exception (``put``'s promise)."""
        try:
            with _subclasses.outside_transforms(tensor):
                return fn(*args)
        except _subclasses.Unrecordable as e:
            self.note("detcheck.skipped/", name, str(e))
        except ImportError:
            raise  # device_digests=True without Triton: the caller's request cannot be met
        except Exception as e:
            self.note("detcheck.skipped/", name, f"recording it failed: {type(e).__name__}: {e}")
        return None

    def _resolve(self, name, tensor, replicated, state):
        """``(tensor, replicated, placement)``: the plain tensor to record for ``tensor``
        (``_torch.subclasses.plain``, noted once where it is not the tensor itself), whether it is
        replicated, and its placement where it is a shard."""
        if (
            type(tensor) not in PLAIN
            or not dense_with_values(tensor)
            or _subclasses.transformed(tensor)
            or _subclasses.partitioned(tensor)
        ):
            found = _subclasses.plain(tensor)
            if found.note is not None:
                self.note("detcheck.tensor/", name, found.note)
            if found.replicated is not None and state:
                replicated = replicated_records(
                    found.replicated, getattr(self._writer, "world_size", 1)
                )
            if found.placement is not None and "sharded" in self._takes:
                # A shard: never replicated, at world size 1 too.
                return found.tensor, False, found.placement
            return found.tensor, replicated, None
        return tensor, replicated, None

    def _lends(self):
        """Whether records may be lent to the writer (``lendable``): its in-place path, and
        no device kernels in the way."""
        return (
            self._record_lent is not None
            and self._device is None
            and self._device_digests is not True
        )

    def _record(self, step, name, found, holders):
        """Records a resolved tensor (``_resolve``): lent where ``lendable`` allows (a module's
        output; with ``holders``, ``put_state``'s rule), else copied."""
        tensor, replicated, placement = found
        if self._lends():
            lent = lendable(tensor, holders)
            if lent is not None:
                # No copy: the writer's thread reads a copy-on-write snapshot in place.
                shape = tuple(tensor.shape)
                self._record_lent(step, name, lent[0], lent[1], shape, replicated, placement)
                return
        if placement is not None:
            # Its placement and position digest go with it (`world_sizes`), on the writer's
            # thread; through the host, as the position digest has no GPU kernel.
            self._writer.record_sharded(step, name, host(tensor), *placement)
            return
        self._put_plain(step, name, tensor, replicated)

    def note(self, prefix, name, text):
        """One environment entry per record name (what ``put`` skipped or how it recorded it)."""
        key = prefix + name
        if key in self._noted:
            return
        self._noted.add(key)
        try:
            self._writer.add_environment(key, text() if callable(text) else text)
        except Exception:
            pass

    def _put_plain(self, step, name, tensor, replicated):
        if self._device_digests is not False and tensor.device.type != "cpu":
            self._start_device_records()
        elif self._device_digests and self._device is None:
            self._start_device_records()  # CPU tensors under Triton's interpreter (tests)
        if self._device is not None:
            self._device.record(step, name, tensor, replicated, lambda: host(tensor))
        elif replicated:
            self._writer.record_replicated(step, name, host(tensor))
        else:
            self._writer.record(step, name, host(tensor))

    def _start_device_records(self):
        if self._device is not None or "digested" not in self._takes:
            return
        try:
            from .device_records import DeviceRecords

            self._device = DeviceRecords(self._writer, run_on_cpu=bool(self._device_digests))
        except ImportError as e:  # no Triton: the host path, unless asked for explicitly
            if self._device_digests:
                raise ImportError(f"device_digests=True needs Triton: {e}") from e
            self._device_digests = False

    def end_step(self):
        if self._device is not None:
            self._device.end_step()

    def close(self):
        if self._device is not None:
            self._device.close()
            self._device = None


class _TorchFrontEnd:
    """The ``FrontEnd`` of PyTorch (``detcheck._core.contract``)."""

    name = "torch"

    def modules(self, model):
        return model.named_modules()

    def parameters(self, model):
        return model.named_parameters()

    def on_forward(self, module, hook):
        return MODULE_HOOKS.after(module, hook)

    def on_backward(self, hook):
        return BackwardHook(hook)

    def on_forward_inputs(self, module, hook):
        return MODULE_HOOKS.before(module, hook, with_kwargs=True)

    def outputs(self, name, value):
        if isinstance(value, torch.Tensor):  # the common case, without the generator
            return ((name, value),)
        return leaves(name, value)

    def gradient(self, parameter):
        return parameter.grad

    def trainable(self, parameter):
        return parameter.requires_grad

    def loss_of(self, output):
        loss = model_loss(output)
        return None if loss is None else loss.detach()

    def sink(self, writer, device_digests, model):
        return TorchSink(writer, device_digests, model)

    def operator_trace(self, current_step, model, writer, updates):
        from .._detcheck import capture_request

        if capture_request() is None:
            return None
        from . import ops as _ops  # imports torch's dispatch machinery: only for a capture re-run

        return _ops.plan(current_step, model, writer, updates)


#: The PyTorch front end.
TORCH = _TorchFrontEnd()


def describe_run(writer):
    """Adds torch's, CUDA's and cuDNN's versions to the writer's environment snapshot (those
    available), so ``detcheck compare`` shows when two runs used different ones, and the
    backend of the default process group as ``site:collective`` (``gloo``, ``nccl``): the
    reduction the report's table shows for a program."""
    if "environment" not in capabilities(writer):
        return
    facts = {"torch.version": torch.__version__, "torch.cuda": torch.version.cuda}
    cudnn = getattr(torch.backends, "cudnn", None)
    if cudnn is not None and cudnn.is_available():
        facts["torch.cudnn"] = cudnn.version()
    try:
        _GROUP[0] = _group()
        if _GROUP[0] is not None:
            facts["site:collective"] = _GROUP[0][0]
    except Exception:
        pass  # a process group being torn down, or a backend that cannot name itself
    for key, value in facts.items():
        if value is not None:
            writer.add_environment(key, str(value))


def synchronous():
    """Why recording cannot change the values this process computed, as words (the zero-change
    recorder writes them as ``_core.lifecycle.SYNCHRONOUS_KEY``), or ``None``
    when it can or nothing shows it cannot: torch never started a device (CUDA, XPU) and no
    compiled graph ran (whose kernels may be chosen by timing), no other framework is loaded
    (MindSpore, torch_npu: their operators run asynchronously; mpi4py: its messages), the
    program started no thread or process of its own (``_core.evidence.concurrent``), and this
    rank is the only one, or its ranks are joined by gloo (whose collectives give the same bits
    whatever the timing) with no receive from any source, no collective or message the program
    left running beside it (``ASYNC_COLLECTIVE``) and no RPC. Then its operators run one after
    another on the CPU whatever the time between them, and ``repeat``'s runs unperturbed by
    recording would compute what the recorded runs did."""
    if _evidence.concurrent() is not None:
        return None
    if any(name in sys.modules for name in ("mindspore", "torch_npu", "mpi4py")):
        return None
    noted = _evidence.facts()
    if "site:any_source" in noted or ASYNC_COLLECTIVE in noted:
        return None
    try:
        for device in ("cuda", "xpu"):
            module = getattr(torch, device, None)
            if module is not None and module.is_initialized():
                return None
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None and dynamo.utils.counters["stats"]["unique_graphs"]:
            return None
        backend, world = _GROUP[0] or _group() or ("none", int(os.environ.get("WORLD_SIZE", "1")))
    except Exception:
        return None  # a state that cannot be asked: nothing is claimed
    if world == 1:
        return "one process, on the CPU, with no thread or process of the program's own"
    rpc = sys.modules.get("torch.distributed.rpc")
    if backend != "gloo" or (rpc is not None and getattr(rpc, "_is_current_rpc_agent_set", bool)()):
        return None
    return (
        f"{world} ranks, each one process on the CPU with no thread or process of the "
        "program's own, joined by gloo's collectives, none left running beside it"
    )


#: ``(backend, world size)`` of the default process group when the recording began
#: (``describe_run``; a program may destroy its group before the recording ends), or ``None``.
_GROUP = [None]


def _group():
    """``(backend, world size)`` of the default process group now, or ``None``."""
    distributed = getattr(torch, "distributed", None)
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return distributed.get_backend(), distributed.get_world_size()
    return None


def closure_of(optimizer, args, kwargs):
    """Where ``optimizer.step``'s closure is in a step pre-hook's ``(args, kwargs)`` (``args``
    starts with the optimizer itself): ``("kw", None)``, ``("arg", index)`` or ``None``."""
    if callable(kwargs.get("closure")):
        return ("kw", None)
    first = 1 if args and args[0] is optimizer else 0
    if len(args) > first and callable(args[first]):
        return ("arg", first)
    return None


def before_optimizer_step(recording, optimizer, args, kwargs):
    """What a torch optimizer's step pre-hook does for ``recording`` (an
    ``_core.engine.Recording``): ends the backward (records ``grad/*``); or, when ``step()`` is
    given a closure (Lightning's automatic optimization, LBFGS: forward and backward run inside the
    step), returns the arguments with the closure wrapped so that the gradients are recorded when it
    first returns."""
    where = closure_of(optimizer, args, kwargs)
    if where is None:
        recording.end_backward()
        return None
    kind, index = where
    closure = kwargs["closure"] if kind == "kw" else args[index]
    recording.pending_update = True

    def closure_then_record(*a, **kw):
        result = closure(*a, **kw)
        if recording.pending_update:
            recording.end_backward()
        return result

    if kind == "kw":
        return args, {**kwargs, "closure": closure_then_record}
    return (*args[:index], closure_then_record, *args[index + 1 :]), kwargs


#: How many wrappers deep an optimizer is looked for inside a framework's wrapper of it.
MAX_OPTIMIZER_WRAPPERS = 8

#: The attributes that hold the wrapped optimizer, in the order they are tried: Lightning's
#: ``LightningOptimizer`` and Fabric's ``_FabricOptimizer`` (``_optimizer``), accelerate's
#: ``AcceleratedOptimizer`` and DeepSpeed's engine and ZeRO/FP16/BF16 optimizers (``optimizer``).
WRAPPED_OPTIMIZER_ATTRS = ("_optimizer", "optimizer")


def own_step_hooks(obj):
    """Whether ``obj`` is a ``torch.optim.Optimizer`` whose step hooks are its own: its
    ``Optimizer.__init__`` ran, which creates the hook dicts in its instance ``__dict__`` (not
    reached through a forwarding ``__getattr__``, as Lightning's wrapper does) and makes its
    class's ``step`` run them."""
    if not isinstance(obj, torch.optim.Optimizer):
        return False
    own = getattr(obj, "__dict__", {})
    return isinstance(own.get("_optimizer_step_pre_hooks"), dict) and isinstance(
        own.get("_optimizer_step_post_hooks"), dict
    )


def wrapped_optimizer(obj):
    """What ``obj`` wraps, as (attribute, object): the first of ``WRAPPED_OPTIMIZER_ATTRS`` that
    holds another object; ``None`` when none does (a property or forwarding ``__getattr__`` that
    fails holds nothing)."""
    for attr in WRAPPED_OPTIMIZER_ATTRS:
        try:
            inner = getattr(obj, attr, None)
        except Exception:
            inner = None
        if inner is not None and inner is not obj:
            return attr, inner
    return None


def _wraps(obj, optimizer):
    """Whether ``optimizer`` is inside ``obj``, through ``wrapped_optimizer``."""
    for _ in range(MAX_OPTIMIZER_WRAPPERS):
        found = wrapped_optimizer(obj)
        if found is None:
            return False
        obj = found[1]
        if obj is optimizer:
            return True
    return False


#: The frame of the wrapper's ``step`` whose return ends the step in progress (``_enclosing``),
#: once a step post-hook has deferred the end of the step to it.
_deferred_to = None


def _enclosing(optimizer):
    """Where the step of ``optimizer`` (a torch optimizer whose step hook runs) sits among the
    calls on the stack: ``"outer"`` when no other optimizer's step encloses it; ``"inner"`` when
    another torch optimizer with its own step hooks does (torch's ZeroRedundancyOptimizer steps
    its local optimizer): that one's hooks begin and end the step; else ``("wrapped", frame)``,
    the outermost ``step`` of a framework's wrapper of ``optimizer`` (an object with
    ``param_groups`` that holds it, ``_wraps``), which does more after the inner step returns:
    DeepSpeed's ZeRO optimizer steps the inner one once a parameter group, on its own partition
    of the parameters, then copies the partition into the model and all-gathers the others'."""
    outermost = None
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "step":
            owner = frame.f_locals.get("self")
            if owner is not None and owner is not optimizer:
                if own_step_hooks(owner):
                    return "inner"
                if getattr(owner, "param_groups", None) is not None and _wraps(owner, optimizer):
                    outermost = frame
        frame = frame.f_back
    return "outer" if outermost is None else ("wrapped", outermost)


def starts_update(optimizer):
    """Whether a step pre-hook of ``optimizer`` begins the update of a training step: not when
    an enclosing optimizer's hooks begin it, nor when its wrapper's step already began it (a ZeRO
    optimizer's second parameter group)."""
    where = _enclosing(optimizer)
    return where == "outer" or (where != "inner" and where[1] is not _deferred_to)


def after_optimizer_step(optimizer, then):
    """What a step post-hook of ``optimizer`` does: ``then()`` (the parameters are recorded, the
    step ends) once the update is done. That is now, unless the step is enclosed (``_enclosing``):
    by another torch optimizer's, whose own post-hook ends the step; or by a wrapper's ``step``,
    at whose return ``then()`` runs (a profile function of this thread watches for it; where one
    is already set, a profiler's, ``then()`` runs now). A deferred ``then`` never raises into
    the program from the profile function: its failure is written to stderr."""
    global _deferred_to
    where = _enclosing(optimizer)
    if where == "inner":
        return
    if where != "outer":
        frame = where[1]
        if frame is _deferred_to:
            return
        if sys.getprofile() is None:

            def at_return(f, event, arg):
                global _deferred_to
                if f is frame and event == "return":
                    sys.setprofile(None)
                    _deferred_to = None
                    _then_safely(then)

            _deferred_to = frame
            sys.setprofile(at_return)
            return
    then()


def _then_safely(then):
    try:
        then()
    except Exception as e:
        print(
            f"detcheck: cannot end the step after the optimizer's wrapper: {e!r}", file=sys.stderr
        )


def _cuda_state():
    # Looked at only once CUDA is initialised: asking earlier would initialise it.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.get_rng_state().numpy().tobytes()
    return b""


#: Up to this many bytes, a value entering torch is digested whole; above, from
#: ``_SAMPLES`` evenly spaced elements (``_core.evidence``'s module doc).
_WHOLE = 1 << 16
_SAMPLES = 1024

#: The torch functions through which a value from outside enters (functions only: wrapping a
#: class would change ``isinstance``), and where each takes its data.
_ENTRIES = {"tensor": "data", "as_tensor": "data", "from_numpy": None}


def _array_parts(array):
    """A numpy array's dtype and shape, then its bytes (above ``_WHOLE``: ``_SAMPLES`` evenly
    spaced elements), for the digest; no torch operator runs."""
    header = f"{array.dtype.str}{array.shape}".encode()
    if array.nbytes > _WHOLE:
        # A view of a contiguous array (a copy of another), then a copy of the elements taken.
        array = array.reshape(-1)[:: -(-array.size // _SAMPLES)].copy()
    elif not array.flags.c_contiguous:
        array = array.copy()
    return (header, array)


def _parts(result, data, numpy):
    """What the digest of one value entering torch takes: the numpy array it came from, or the
    Python number, or the result's values (a list's, on the CPU); ``None``: nothing to digest (a
    tensor made from a tensor: its values come from torch; a list sent to another device)."""
    if isinstance(data, numpy.ndarray):
        return None if data.dtype.hasobject else _array_parts(data)
    if isinstance(data, torch.Tensor) or not isinstance(result, torch.Tensor):
        return None
    if isinstance(data, (bool, int, float, complex)):
        return (f"{result.dtype}:{data!r}".encode(),)
    if not result.is_cpu or result.layout != torch.strided:
        return None
    try:
        array = result.numpy()
    except (RuntimeError, TypeError):  # requires grad; a dtype numpy lacks (bfloat16)
        flat = result.detach().reshape(-1)
        array = flat.view(torch.uint8).numpy() if flat.is_contiguous() else None
    return None if array is None else _array_parts(array)


def _entering(original, data_argument, numpy):
    """``original`` (``torch.tensor``, ...), wrapped to digest the values it takes in from the
    program's own lines (``_core.evidence.entered``). It never changes the result, and does nothing
    while torch compiles (Dynamo inlines the wrapper and sees only ``original``), under a
    dispatch mode (fake tensors, the operator tracer) or in a process that is no rank (a
    data-loader worker)."""
    through = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    dispatch_modes = torch._C._len_torch_dispatch_stack

    @functools.wraps(original)
    def entering(*args, **kwargs):
        if torch.compiler.is_compiling():
            return original(*args, **kwargs)
        result = original(*args, **kwargs)
        if not _evidence.installed() or dispatch_modes():
            return result
        try:
            where = _evidence.program_caller(sys._getframe(1), through)
            if where is not None:
                data = args[0] if args else kwargs.get(data_argument) if data_argument else None
                parts = _parts(result, data, numpy)
                if parts is not None:
                    _evidence.entered(where, parts)
        except Exception:
            pass  # evidence, never a failure of the program
        return result

    entering._detcheck_entering = True
    return entering


def _follow_values_entering():
    """Wraps ``torch.tensor``, ``torch.as_tensor`` and ``torch.from_numpy`` (``_entering``);
    wrapping twice does nothing."""
    import numpy

    for name, data_argument in _ENTRIES.items():
        original = getattr(torch, name, None)
        if original is None or getattr(original, "_detcheck_entering", False):
            continue
        wrapper = _entering(original, data_argument, numpy)
        setattr(torch, name, wrapper)
        _same_in_torchscript(original, wrapper)


def _same_in_torchscript(original, wrapper):
    """TorchScript resolves a function to its builtin operator by identity, in a table it
    builds once (from ``dir(torch)``, so it finds ``wrapper`` when built later): where it was
    built already, ``wrapper`` gets ``original``'s operator, or scripted code that calls it would
    try to compile the wrapper."""
    builtins = sys.modules.get("torch.jit._builtins")
    table = getattr(builtins, "_builtin_table", None)
    if isinstance(table, dict) and id(original) in table:
        table[id(wrapper)] = table[id(original)]


def _note_saved_files():
    """``torch.save`` to a path opens its file in C++, unseen by the audit hook of
    ``_core.evidence.opened``: the path is noted here."""
    save = torch.save
    if getattr(save, "_detcheck_noted", False):
        return

    @functools.wraps(save)
    def noted(obj, f, *args, **kwargs):
        if isinstance(f, (str, bytes, os.PathLike)):
            try:
                _evidence.opened(f, writes=True)
            except Exception:
                pass  # evidence, never a failure of the program
        return save(obj, f, *args, **kwargs)

    noted._detcheck_noted = True
    torch.save = noted


def _note_where_models_are_built():
    """The line that built each model (``_core.evidence.note_module_built``), from torch's global
    parameter registration hook: it runs while a module is constructed, never in a step."""
    from torch.nn.modules import module as module_py

    register = getattr(module_py, "register_module_parameter_registration_hook", None)
    if register is None or getattr(_note_where_models_are_built, "_installed", False):
        return
    _note_where_models_are_built._installed = True

    def registered(module, name, param):
        try:
            _evidence.note_module_built(sys._getframe(1))
        except Exception:
            pass
        return None

    register(registered)


def _note_loader_seed(generator, frame):
    """A loader given its own ``torch.Generator``: ``seed/loader``, the generator's seed as the
    loader got it, at the line that made (seeded) it, so a generator seeded from a clock or OS
    entropy (``g.seed()``) is named as such rather than as an unseeded shuffle."""
    if isinstance(generator, torch.Generator) and generator.device.type == "cpu":
        import numpy

        seed = numpy.frombuffer(generator.initial_seed().to_bytes(8, "little"), numpy.uint8)
        _evidence.note("seed/loader", seed, _evidence.assigned_at(frame, generator))


def _note_splits():
    """Wraps ``random_split`` (``torch.utils.data`` and its ``dataset`` module: a function, so
    wrapping changes no ``isinstance``): each call notes ``data/split``, the indices of its parts
    one after another, at the program's line that called it. A split drawn from a generator
    not seeded yet gives other samples to each part while the loaders fetch the same indices."""
    import numpy
    import torch.utils.data as data
    from torch.utils.data import dataset

    original = dataset.random_split
    if getattr(original, "_detcheck_split", False):
        return

    @functools.wraps(original)
    def random_split(*args, **kwargs):
        parts = original(*args, **kwargs)
        try:
            indices = [numpy.asarray(p.indices, dtype=numpy.int64).reshape(-1) for p in parts]
            values = numpy.concatenate(indices) if indices else numpy.zeros(0, numpy.int64)
            _evidence.note("data/split", values, _evidence.call_site(sys._getframe(1)))
        except Exception:
            pass  # parts that are no Subsets of integer indices: nothing to note
        return parts

    random_split._detcheck_split = True
    dataset.random_split = random_split
    data.random_split = random_split


#: ``torch.distributed``'s calls that may run beside the program (with ``async_op=True``), and
#: its point-to-point calls that always do.
_MAY_RUN_BESIDE = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "gather",
    "barrier",
)
_ALWAYS_BESIDE = ("isend", "irecv", "batch_isend_irecv")

#: The fact of the program's first line that made a data loader whose workers hand over their
#: batches as they finish them (``in_order=False``): the order of its batches is timing
#: (src/diagnose/cause.rs, the data order rule).
OUT_OF_ORDER_LOADER = "site:out_of_order_loader"

#: The fact of the program's first line that left a collective or a message running beside
#: it (``async_op=True``, ``isend``, ``irecv``): its result, read before its ``wait()``, is a
#: race; ``synchronous`` then claims nothing.
ASYNC_COLLECTIVE = "site:async_collective"


def _note_collectives_left_running():
    """Wraps ``torch.distributed``'s collectives and point-to-point calls (module functions,
    so no ``isinstance`` changes; the program's ``dist.all_reduce``, not a name it imported
    before torch's evidence was installed): a call from the program's own line with
    ``async_op=True``, or an ``isend``/``irecv``, notes ``ASYNC_COLLECTIVE`` (a library's own
    calls, DDP's or FSDP's, wait where they must). While Dynamo traces, the wrapper is only a
    call of the original, which Dynamo then handles as without detcheck (a compiled run is not
    claimed synchronous anyway)."""
    distributed = getattr(torch, "distributed", None)
    if distributed is None or not distributed.is_available():
        return
    through = os.path.dirname(os.path.abspath(distributed.__file__)) + os.sep
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
    noted = [False]

    def noting(original, always):
        if getattr(original, "_detcheck_beside", False):
            return original

        @functools.wraps(original)
        def call(*args, **kwargs):
            if compiling():
                return original(*args, **kwargs)
            if (always or kwargs.get("async_op")) and not noted[0]:
                try:
                    if _evidence.program_caller(sys._getframe(1), through) is not None:
                        noted[0] = True
                        _evidence.fact(ASYNC_COLLECTIVE, _evidence.site(sys._getframe(1)) or "?")
                except Exception:
                    pass
            return original(*args, **kwargs)

        call._detcheck_beside = True
        return call

    for names, always in ((_MAY_RUN_BESIDE, False), (_ALWAYS_BESIDE, True)):
        for name in names:
            original = getattr(distributed, name, None)
            if callable(original):
                setattr(distributed, name, noting(original, always))


def install_evidence():
    """Follows torch's generators (CPU and the current CUDA device), the calls that seed them,
    the sample indices data loaders fetch and the values that enter torch from the program's
    lines, for ``_core.evidence`` (a rank detcheck launched); and notes a collective the program
    leaves running beside it (``ASYNC_COLLECTIVE``)."""
    _evidence.add_generator("torch", lambda: torch.get_rng_state().numpy().tobytes())
    _evidence.add_generator("cuda", _cuda_state)
    for owner in (torch, torch.random):
        _evidence.track_seeding(owner, "manual_seed", "torch")
        _evidence.track_seeding(owner, "seed", "torch")
    for name in ("manual_seed", "manual_seed_all", "seed", "seed_all"):
        _evidence.track_seeding(torch.cuda, name, "cuda")
    _follow_values_entering()
    _note_saved_files()
    _note_where_models_are_built()
    _note_splits()
    _note_collectives_left_running()
    import numpy
    from torch.utils.data import dataloader

    loader_init = dataloader.DataLoader.__init__
    iter_init = dataloader._BaseDataLoaderIter.__init__
    next_index = dataloader._BaseDataLoaderIter._next_index
    if getattr(next_index, "_detcheck_indices", False):
        return

    # functools.wraps keeps the signatures that frameworks read (Lightning re-makes loaders
    # from DataLoader.__init__'s parameters).
    @functools.wraps(loader_init)
    def made_here(self, *args, **kwargs):
        loader_init(self, *args, **kwargs)
        try:
            self._detcheck_site = _evidence.site()
            _note_loader_seed(getattr(self, "generator", None), sys._getframe(1))
            if getattr(self, "in_order", True) is False and self.num_workers > 0:
                # Batches in the order the workers finish them: timing, which recording changes.
                _evidence.runs_beside(self._detcheck_site)
                _evidence.fact(OUT_OF_ORDER_LOADER, self._detcheck_site or "?")
        except Exception:
            pass

    @functools.wraps(iter_init)
    def iterates(self, loader, *args, **kwargs):
        iter_init(self, loader, *args, **kwargs)
        self._detcheck_site = getattr(loader, "_detcheck_site", None)
        if hasattr(self, "_shutdown_workers"):
            try:
                LOADERS_WITH_WORKERS.add(self)
            except TypeError:
                pass

    @functools.wraps(next_index)
    def noted(self):
        index = next_index(self)
        try:
            values = numpy.asarray(index, dtype=numpy.int64).reshape(-1)
            _evidence.note("data/indices", values, getattr(self, "_detcheck_site", None))
        except Exception:
            pass  # indices that are no integers (a sampler of keys): nothing to note
        return index

    noted._detcheck_indices = True
    dataloader.DataLoader.__init__ = made_here
    dataloader._BaseDataLoaderIter.__init__ = iterates
    dataloader._BaseDataLoaderIter._next_index = noted


#: The live data-loader iterators with worker processes (weakly held), which a rank that ends at
#: its N-th step shuts down first (``shut_down_loader_workers``).
LOADERS_WITH_WORKERS: "weakref.WeakSet[Any]" = weakref.WeakSet()


def shut_down_loader_workers() -> None:
    """Shuts down the workers of every live data-loader iterator as the iterator does when it is
    done (``_shutdown_workers``: the workers are told to stop and joined), so that they end as
    without detcheck, with their exit handlers (multiprocessing removes their temporary folders
    then), rather than being killed with the rank that ends at its N-th step."""
    for iterator in list(LOADERS_WITH_WORKERS):
        try:
            iterator._shutdown_workers()
        except Exception:
            pass


class BackwardHook:
    """Calls ``hook(tensor)`` before each backward pass the program starts, until removed: the
    loss of a script that computes it outside its model (``F.mse_loss(model(x), y)``).
    ``torch.Tensor.backward`` is replaced by a function that calls the original (subclasses,
    ``__torch_function__`` and keyword arguments pass through), and so is
    ``torch.autograd.grad`` for a single output (``torch.func``'s ``grad``, ``grad_and_value``
    and ``vjp`` compute through it: the scalar a functional training loop differentiates), never
    while a graph is being compiled (``Hook``). TorchScript resolves ``torch.autograd.grad`` to
    its builtin operator by identity: the replacement is registered as the same builtin.
    Removing restores each original when nothing replaced it since."""

    def __init__(self, hook):
        original = torch.Tensor.backward
        hook = Hook(hook)

        @functools.wraps(original)
        def backward(tensor, *args, **kwargs):
            hook(tensor)
            return original(tensor, *args, **kwargs)

        self._original, self._patched = original, backward
        torch.Tensor.backward = backward
        grad = torch.autograd.grad

        @functools.wraps(grad)
        def grad_of(outputs, *args, **kwargs):
            single = outputs
            if isinstance(outputs, (tuple, list)) and len(outputs) == 1:
                single = outputs[0]
            if isinstance(single, torch.Tensor):
                hook(single)
            return grad(outputs, *args, **kwargs)

        self._grad, self._grad_patched = grad, grad_of
        torch.autograd.grad = grad_of
        _register_builtin = getattr(
            sys.modules.get("torch.jit._builtins"), "_register_builtin", None
        )
        if _register_builtin is not None:
            try:
                _register_builtin(grad_of, "aten::grad")
            except Exception:
                pass

    def remove(self):
        if torch.Tensor.backward is self._patched:
            torch.Tensor.backward = self._original
        if torch.autograd.grad is self._grad_patched:
            torch.autograd.grad = self._grad
