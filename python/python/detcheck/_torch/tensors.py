"""The PyTorch front end's leaf: how a tensor, a module's output and a wrapped model look to
the recorder. Imports torch and nothing of detcheck's but the native module and
``_torch.subclasses``; every other torch module of the package builds on it.

Main names: ``host`` (what the writer is handed for a tensor), ``lendable`` (a tensor the
writer may read in place, with no copy) and ``visible_holders`` (its rule for a step's
gradients and parameters), ``leaves`` (the tensors of a
module's output, named), ``unwrap_model`` and ``replicated_records`` (the one rule for wrappers
and for replicated records; ``gradient_sync``: a step updated from unsynced gradients, DDP's
``no_sync()``, holds no replicas), ``Hook`` (a hook that pickles to nothing and that TorchScript
never sees: ``keep_hooks_out_of_torchscript``).

Determinism: pure functions of their arguments; ``leaves`` follows the output's own order.

Invariant (nothing of detcheck's in the user's modules; ``ModuleHooks``): the recorder's module
hooks are held by detcheck and dispatched from torch's global hooks, so what a program saves or
copies is what it would without detcheck (a model compiled by ``torch.compile`` excepted: its hooks
stay on its modules, as ``Hook`` objects that pickle to nothing).
"""

import functools
import inspect
import sys
import warnings

import torch

from .._core.arrays import TORCH_RAW, torch_dtype_name
from .._core.contract import RemovedOnce, named_leaves, replicated_records
from .._detcheck import supported_dtypes
from .subclasses import PLAIN_TYPES

__all__ = [
    "MODULE_HOOKS",
    "Hook",
    "ModuleHooks",
    "compiled_part",
    "dense_with_values",
    "host",
    "keep_hooks_out_of_torchscript",
    "leaves",
    "lendable",
    "model_loss",
    "replicated_records",
    "sharded_by",
    "unwrap_model",
    "gradient_sync",
    "visible_holders",
]

#: The tensor types handed to the writer without looking further.
PLAIN = frozenset(PLAIN_TYPES)

#: Dtypes whose CPU tensors the writer reads in place through numpy: the supported ones numpy
#: has (bfloat16, uint16 and the 8-bit floats go through ``detcheck._core.arrays``, as tensors on
#: other devices do).
_NUMPY_VIEWABLE = frozenset(
    getattr(torch, name)
    for name in supported_dtypes()
    if name not in TORCH_RAW and hasattr(torch, name)
)


def host(tensor):
    """What to hand the writer for ``tensor``: a numpy view of its memory (no copy) for a dense
    CPU tensor of a numpy dtype, so the writer reads it through the buffer protocol without
    calling back into Python; otherwise the tensor itself (the writer converts it)."""
    if tensor.is_cpu and tensor.dtype in _NUMPY_VIEWABLE and tensor.layout is torch.strided:
        try:
            return tensor.detach().numpy()
        except (RuntimeError, TypeError):  # a tensor numpy cannot view (a conjugate view)
            pass
    return tensor


#: torch's copy-on-write clone (private, torch 2.2 and later) and the read-only pointer that does
#: not materialize it, where this torch has both.
_LAZY_CLONE = (
    getattr(torch, "_lazy_clone", None) if hasattr(torch.Tensor, "const_data_ptr") else None
)

#: Below this, a copy costs less than lending (the snapshot and its bookkeeping).
LEND_BYTES = 64 << 10

#: The number of references to a storage (torch's private ``_storage_Use_Count``, given the
#: storage's address), where this torch has it: every tensor on the storage holds one, and so
#: does whatever keeps a raw view of its memory (a numpy array's or DLPack's alias of it).
_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


#: Whether a tensor's storage is copy-on-write (a snapshot of it was lent).
_IS_COW = getattr(torch._C, "_is_cow_tensor", lambda tensor: False)


def visible_holders(tensors):
    """``{storage address: n}``: for the storage of each of ``tensors``, how many distinct
    tensors among them and their bases (``_base``) hold it. The second rule of ``lendable``:
    a step's gradients and parameters, seen together (``TorchSink.put_state``), with what
    FSDP2 keeps of its shards (``_torch.subclasses.shard_holders``). Left out: tensors with no
    storage of their own, and (the time it takes to ask) small tensors that are no view,
    which ``lendable`` never lends on their own. A tensor left out can only make a count
    smaller than its storage's references: the tensors on that storage are then copied,
    never lent wrongly."""
    seen = {}
    for tensor in tensors:
        if tensor._base is None and tensor.nbytes < LEND_BYTES:
            continue
        for holder in (tensor, tensor._base):
            if holder is None:
                continue
            try:
                key = holder.untyped_storage()._cdata
            except (RuntimeError, NotImplementedError, TypeError):
                continue  # a wrapper subclass or a meta tensor: no storage to share
            seen.setdefault(key, {})[id(holder)] = holder
    return {key: len(held) for key, held in seen.items()}


def lendable(tensor, holders=None):
    """``(snapshot, dtype name)``: a copy-on-write snapshot of ``tensor`` that the writer's
    thread reads in place (``TraceWriter._record_lent``), so the program pays no copy; or
    ``None``, and the tensor is copied (``host``).

    Why a rule at all: torch keeps the snapshot's memory unchanged (a later write through any
    tensor on the same storage first gives that storage memory of its own, and every tensor on
    it follows), but a raw view of the memory taken before the snapshot (a numpy array of the
    tensor, a DLPack capsule) would not follow that move: it would stop seeing the program's
    writes. So a tensor is lent only where no such view can exist. Always: dense, contiguous,
    on the CPU, in memory torch allocated (numpy's or shared memory cannot be cloned lazily),
    and at least ``LEND_BYTES`` (or a gradient or parameter on a storage lent already). Then
    one of two rules:

    - ``holders`` ``None`` (a module's output): a fresh result of autograd's operators
      (``grad_fn`` set, not a view), which nothing has viewed unless the module's own forward
      did and keeps that view past the step (unsupported while recorded);
    - ``holders`` given (a gradient or parameter: ``visible_holders`` of the step's): every
      reference to its storage is one of the tensors counted there, so none is a raw view (a
      numpy array or DLPack alias adds a reference that no tensor seen accounts for, and then
      the tensor is copied). A view taken after the snapshot is harmless: ``numpy()`` first
      gives the tensor memory of its own.

    What bypasses both is a pointer kept as a number (``data_ptr()`` handed to C) or a DLPack
    capsule of the tensor itself (``to_dlpack(t)``, which holds no reference of its own),
    later written through: unsupported while recorded. Determinism: the bytes read are those a
    copy would hold, so the record is the same."""
    if (
        _LAZY_CLONE is None
        or not tensor.is_cpu
        or tensor.layout is not torch.strided
        or not tensor.is_contiguous()
    ):
        return None
    if tensor.nbytes < LEND_BYTES and (holders is None or not _IS_COW(tensor)):
        # Small: copied. Unless (a step's gradient or parameter) its storage is lent already,
        # a sibling's in the same flat buffer (FSDP2's gradients): copying it through numpy
        # would first give the whole storage memory of its own, a copy of all of it.
        return None
    if holders is None:
        if tensor.grad_fn is None or tensor._base is not None:
            return None
    elif _USE_COUNT is None:
        return None
    else:
        # Held while it asks: the storage's Python object is one reference more (`+ 1`).
        storage = tensor.untyped_storage()
        seen = holders.get(storage._cdata)
        if seen is None or _USE_COUNT(storage._cdata) != seen + 1:
            return None
    try:
        return _LAZY_CLONE(tensor.detach()), torch_dtype_name(tensor.dtype)
    except TypeError:  # a dtype detcheck does not record: `host` says so
        return None
    except RuntimeError:  # memory torch does not own: copied instead
        return None


def dense_with_values(tensor):
    """Whether a plain tensor's values are its strided memory (not quantized, meta, nested or
    sparse): then the writer reads it as it is."""
    return tensor.layout is torch.strided and not (
        tensor.is_quantized or tensor.is_meta or tensor.is_nested
    )


def _inert(*args, **kwargs):
    """What a hook of detcheck's becomes in a copy of the model: nothing."""
    return None


def _inert_hook():
    return _inert


def _outside_compiled_graphs(fn):
    """``fn`` as TorchDynamo leaves it: run eagerly, never traced into a compiled graph. A hook
    on a ``torch.compile``d module runs inside the code Dynamo traces, and Dynamo may fail on
    what a recorder does (host copies, numpy arrays of generator states) instead of breaking
    the graph; the program must never fail because it is recorded.

    ``torch.compiler.disable`` imports Dynamo (about a second, in every recorded program): it
    is applied when the hook is first called after the program imported Dynamo itself (by
    compiling); until then nothing can be tracing, and ``fn`` runs as it is."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if disable is None:
        return fn
    if "torch._dynamo" in sys.modules:
        return disable(fn)
    disabled = []

    @functools.wraps(fn)
    def eager(*args, **kwargs):
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        if not disabled:
            disabled.append(disable(fn))
        return disabled[0](*args, **kwargs)

    return eager


class Hook:
    """A hook detcheck attaches to a user's module, optimizer or tensor. It pickles, and
    deep-copies, to ``_inert``: ``torch.save(model)``, ``copy.deepcopy(model)`` and pickling
    for multiprocessing work while the model is recorded, and the copy records nothing. It
    runs outside compiled graphs (``_outside_compiled_graphs``), TorchScript never sees it
    (``keep_hooks_out_of_torchscript``), and under ``torch.jit.trace`` it runs without the
    tracer's warnings about what it reads."""

    __slots__ = ("_fn",)

    def __init__(self, fn):
        self._fn = _outside_compiled_graphs(fn)
        keep_hooks_out_of_torchscript()

    def __call__(self, *args, **kwargs):
        if torch._C._get_tracing_state() is None:
            return self._fn(*args, **kwargs)
        # Under torch.jit.trace: what the recorder reads is no part of the traced graph, and
        # the tracer's warnings about it (a tensor turned into numpy) are not the program's.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            return self._fn(*args, **kwargs)

    def __reduce__(self):
        return (_inert_hook, ())

    def __deepcopy__(self, memo):
        return _inert


def _caller_kwargs():
    """The keyword arguments of the ``Module.__call__`` that is calling a global forward
    pre-hook (torch gives such a hook only the positional ones): the ``kwargs`` of torch's
    ``_call_impl`` closure, a few frames up; ``{}`` where it is not found."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            break
        code = frame.f_code
        if code.co_name in ("inner", "_call_impl") and code.co_filename.endswith("module.py"):
            kwargs = frame.f_locals.get("kwargs")
            return kwargs if isinstance(kwargs, dict) else {}
        frame = frame.f_back
    return {}


def _dropping_kwargs(fn, with_kwargs):
    """A pre-hook taking ``(module, args, kwargs)`` that calls ``fn`` with or without them,
    and returns nothing (detcheck's hooks only read)."""

    def hook(module, args, kwargs):
        if with_kwargs:
            fn(module, args, kwargs)
        else:
            fn(module, args)
        return None

    return hook


class ModuleHooks:
    """detcheck's forward hooks on chosen modules, held by detcheck and never by the modules:
    one global forward pre-hook and one global forward hook of torch's
    (``register_module_forward_pre_hook``, ``register_module_forward_hook``), registered while
    any hook is wanted, look the called module up by identity and call its hooks in the order
    they were added (``first``: before the others). Nothing of detcheck's is stored in a
    user's module, so ``torch.save(model)``, ``pickle``, ``copy.deepcopy`` and
    ``torch.jit.script`` see the module exactly as without detcheck, and ``torch.load`` with
    ``weights_only`` and the program's own allowlist loads what it saved.

    Torch calls global hooks before a module's own: detcheck's pre-hooks see the inputs as the
    caller passed them, its forward hooks the module's own output (a program's forward hook
    may replace it after). detcheck's hooks only read: what they return is ignored.

    Determinism: hooks run in the order added, per module; modules are looked up by ``id``,
    each kept alive by its entry until its last hook is removed (so an ``id`` is never
    reused while looked up)."""

    def __init__(self):
        self._pre = {}  # id(module) -> (module, {key: (fn, with_kwargs)})
        self._post = {}  # id(module) -> (module, {key: fn})
        self._handles = None
        self._next = 0
        #: Hooks go on the modules themselves (``Hook``s, which pickle to nothing): for a
        #: ``torch.compile``d model, which TorchDynamo would run eagerly around global hooks,
        #: changing the program it compiles.
        self.on_modules = False

    def before(self, module, fn, with_kwargs=False, first=False):
        """``fn(module, args)`` (``with_kwargs``: ``fn(module, args, kwargs)``) before each
        forward call of ``module``."""
        if self.on_modules:
            return module.register_forward_pre_hook(
                Hook(_dropping_kwargs(fn, with_kwargs)), with_kwargs=True, prepend=first
            )
        return self._add(self._pre, module, (fn, with_kwargs), first)

    def after(self, module, fn, first=False):
        """``fn(module, args, output)`` after each forward call of ``module``."""
        if self.on_modules:
            return module.register_forward_hook(Hook(fn), prepend=first)
        return self._add(self._post, module, fn, first)

    def _add(self, table, module, value, first):
        key = self._next
        self._next += 1
        _, hooks = table.setdefault(id(module), (module, {}))
        hooks[key] = value
        if first:
            for other in [k for k in hooks if k != key]:
                hooks[other] = hooks.pop(other)
        if self._handles is None:
            nn = torch.nn.modules.module
            self._handles = (
                nn.register_module_forward_pre_hook(Hook(self._dispatch_before)),
                nn.register_module_forward_hook(Hook(self._dispatch_after)),
            )

        def remove():
            entry = table.get(id(module))
            if entry is not None:
                entry[1].pop(key, None)
                if not entry[1]:
                    del table[id(module)]
            if not self._pre and not self._post and self._handles is not None:
                for handle in self._handles:
                    handle.remove()
                self._handles = None

        return RemovedOnce(remove)

    def _dispatch_before(self, module, args):
        entry = self._pre.get(id(module))
        if entry is None or entry[0] is not module:
            return None
        kwargs = None
        for fn, with_kwargs in list(entry[1].values()):
            if with_kwargs:
                if kwargs is None:
                    kwargs = _caller_kwargs()
                fn(module, args, kwargs)
            else:
                fn(module, args)
        return None

    def _dispatch_after(self, module, args, output):
        entry = self._post.get(id(module))
        if entry is None or entry[0] is not module:
            return None
        for fn in list(entry[1].values()):
            fn(module, args, output)
        return None


#: The process's one ``ModuleHooks``.
MODULE_HOOKS = ModuleHooks()


#: The module hook dictionaries ``torch.jit.script`` compiles (each hook must be TorchScript).
_SCRIPTED_HOOKS = ("_forward_hooks", "_forward_pre_hooks")


def _set_hooks_aside(model):
    """Takes detcheck's hooks (``Hook``) out of the forward-hook dictionaries of ``model`` and
    its submodules; returns the function that puts them back, in their order."""
    saved = []
    for module in model.modules():
        for attr in _SCRIPTED_HOOKS:
            hooks = getattr(module, attr, None)
            if not hooks or not any(isinstance(h, Hook) for h in hooks.values()):
                continue
            items = list(hooks.items())
            for key, hook in items:
                if isinstance(hook, Hook):
                    del hooks[key]
            saved.append((hooks, items))

    def put_back():
        for hooks, items in saved:
            added = [(k, h) for k, h in hooks.items() if all(k != key for key, _ in items)]
            hooks.clear()
            hooks.update(items)
            hooks.update(added)

    return put_back


def _script_without_hooks(script):
    """``torch.jit.script``, scripting a module with detcheck's hooks set aside: TorchScript
    compiles every forward hook of a module it scripts, and a recorder's hook is Python it
    cannot compile. The scripted module records nothing (as a copy); the module goes on
    recording."""

    # TorchScript resolves the names of a scripted class in its caller's frame, `_frames_up`
    # frames above its own: this wrapper is one more.
    try:
        frames = "_frames_up" in inspect.signature(script).parameters
    except (TypeError, ValueError):
        frames = False

    @functools.wraps(script)
    def scripted(obj, *args, **kwargs):
        if frames and len(args) < 2:
            kwargs["_frames_up"] = kwargs.get("_frames_up", 0) + 1
        if not isinstance(obj, torch.nn.Module):
            return script(obj, *args, **kwargs)
        put_back = _set_hooks_aside(obj)
        try:
            return script(obj, *args, **kwargs)
        finally:
            put_back()

    scripted._detcheck_scripts = True
    return scripted


def keep_hooks_out_of_torchscript():
    """Replaces ``torch.jit.script`` with ``_script_without_hooks`` (once; ``torch.jit`` and
    ``torch.jit._script`` both name it): a recorded model can be scripted wherever it could
    without detcheck."""
    jit = getattr(torch, "jit", None)
    script = getattr(jit, "script", None)
    if script is None or getattr(script, "_detcheck_scripts", False):
        return
    wrapper = _script_without_hooks(script)
    jit.script = wrapper
    inner = sys.modules.get("torch.jit._script")
    if inner is not None and getattr(inner, "script", None) is script:
        inner.script = wrapper


def _is_tensor(value):
    return isinstance(value, torch.Tensor)


def leaves(name, value):
    """``(name, tensor)`` of every tensor in a module's output, in order (``named_leaves``)."""
    return named_leaves(name, value, _is_tensor)


def model_loss(output):
    """The loss a model's output carries (a Hugging Face ``ModelOutput``'s ``loss``, a dict's
    ``"loss"``), or ``None``."""
    if isinstance(output, dict):
        loss = output.get("loss")
    else:
        loss = getattr(output, "loss", None)
    return loss if isinstance(loss, torch.Tensor) else None


#: The wrappers looked through to the model (by class name, so that no framework is imported),
#: and the attribute that holds it.
_WRAPPERS = (
    ("module", "DistributedDataParallel"),
    ("module", "DataParallel"),
    ("module", "FullyShardedDataParallel"),
    ("_orig_mod", "OptimizedModule"),
    ("module", "DeepSpeedEngine"),
    # Lightning Fabric's `fabric.setup(model)`: the strategy's wrapper (DDP, FSDP) is inside
    ("_forward_module", "_FabricModule"),
)


def _holds_alike(wrapper, cls):
    """Whether the wrapper ``wrapper`` (of class name ``cls``) keeps its ranks' parameters and
    gradients alike: DistributedDataParallel (its gradients are allreduced); DeepSpeed's engine
    at ZeRO stage 0, 1 or 2 (every rank holds every parameter, updated alike; at stage 2 the
    gradients are partitioned away from ``.grad``, so none is recorded); not at stage 3, whose
    parameters are partitioned."""
    if cls == "DistributedDataParallel":
        return True
    if cls == "DeepSpeedEngine":
        try:
            return int(wrapper.zero_optimization_stage()) < 3
        except Exception:
            return False
    return False


def _wrappers(model):
    """The wrappers around ``model`` (``_WRAPPERS``, 8 deep at most), outermost first, as
    (wrapper, class name); and the model inside them."""
    chain = []
    for _ in range(8):
        for attr, cls in _WRAPPERS:
            inner = getattr(model, attr, None) if type(model).__name__ == cls else None
            if isinstance(inner, torch.nn.Module):
                chain.append((model, cls))
                model = inner
                break
        else:
            break
    return chain, model


def sharded_by(model):
    """What shards ``model``'s parameters over the ranks instead of replicating them, in words
    (DeepSpeed's engine at ZeRO stage 3), or ``None``: written into the trace's environment
    (``detcheck.sharded``), so that a ``replicas`` check with nothing to compare says so."""
    for wrapper, cls in _wrappers(model)[0]:
        if cls == "DeepSpeedEngine" and not _holds_alike(wrapper, cls):
            try:
                stage = int(wrapper.zero_optimization_stage())
            except Exception:
                return None
            return (
                f"DeepSpeed ZeRO stage {stage} partitions the parameters over the ranks: each "
                "rank holds and updates its own part"
            )
    return None


def unwrap_model(model):
    """The model inside ``model``'s wrappers (DistributedDataParallel, DataParallel, FSDP1's
    FullyShardedDataParallel, ``torch.compile``'s OptimizedModule, DeepSpeed's engine, Lightning
    Fabric's ``_FabricModule``; 8 deep at most: ``_wrappers``), so that records are named after
    the model's own modules at every world size; and whether one of them keeps the ranks'
    parameters alike (``_holds_alike``: replicated)."""
    chain, inner = _wrappers(model)
    return inner, any(_holds_alike(wrapper, cls) for wrapper, cls in chain)


def gradient_sync(model):
    """A function telling whether ``model``'s data-parallel wrappers synced the gradients of the
    backward that just ran: not inside DistributedDataParallel's ``no_sync()`` now, nor at its
    last forward (``require_forward_param_sync``, which DDP sets at each forward to whether its
    backward syncs: a backward run inside ``no_sync()`` and an update after it). Where they did
    not, each rank's update made its parameters its own. accelerate's ``LocalSGD`` holds
    ``no_sync()`` for its whole loop and averages the parameters every k steps; gradient
    accumulation runs its last backward outside it, so its update syncs. A forward under
    ``no_grad`` between the backward and the update also reads as not synced: that step's
    records are then left out of ``replicas``, never compared wrongly. Asked at each update
    (``engine.Recording``); ``None`` where no wrapper has that switch."""
    wrappers = [w for w, _ in _wrappers(model)[0] if hasattr(w, "require_backward_grad_sync")]
    if not wrappers:
        return None
    return lambda: all(
        bool(w.require_backward_grad_sync) and bool(getattr(w, "require_forward_param_sync", True))
        for w in wrappers
    )


def compiled_part(root):
    """The class of the ``torch.compile``d part of ``root`` (an OptimizedModule wrapper, or a
    module compiled in place by ``Module.compile()``), or ``None``: its generated kernels run no
    module hooks and no operator the tracer sees."""
    model = root
    for _ in range(8):
        if type(model).__name__ == "OptimizedModule":
            inner = getattr(model, "_orig_mod", None)
            return type(inner).__name__ if inner is not None else "OptimizedModule"
        inner = getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module):
            break
        model = inner
    for module in model.modules():
        if getattr(module, "_compiled_call_impl", None) is not None:
            return type(module).__name__
    return None
