"""The PyTorch front end's leaf: how a tensor, a module's output and a wrapped model look to
the recorder. Imports torch and nothing of detcheck's but the native module and
``_subclasses``; every other torch module of the package builds on it.

Main names: ``host`` (what the writer is handed for a tensor), ``leaves`` (the tensors of a
module's output, named), ``unwrap_model`` and ``replicated_records`` (the one rule for wrappers
and for replicated records), ``Hook`` (a hook that pickles to nothing).

Determinism: pure functions of their arguments; ``leaves`` follows the output's own order.
"""

import torch

from ._arrays import TORCH_RAW
from ._contract import named_leaves, replicated_records
from ._detcheck import supported_dtypes
from ._subclasses import PLAIN_TYPES

__all__ = [
    "Hook",
    "compiled_part",
    "dense_with_values",
    "host",
    "leaves",
    "model_loss",
    "replicated_records",
    "unwrap_model",
]

#: The tensor types handed to the writer without looking further.
PLAIN = frozenset(PLAIN_TYPES)

#: Dtypes whose CPU tensors the writer reads in place through numpy: the supported ones numpy
#: has (bfloat16, uint16 and the 8-bit floats go through ``detcheck._arrays``, as tensors on
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
    the graph; the program must never fail because it is recorded."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return fn if disable is None else disable(fn)


class Hook:
    """A hook detcheck attaches to a user's module, optimizer or tensor. It pickles, and
    deep-copies, to ``_inert``: ``torch.save(model)``, ``copy.deepcopy(model)`` and pickling
    for multiprocessing work while the model is recorded, and the copy records nothing. It
    runs outside compiled graphs (``_outside_compiled_graphs``)."""

    __slots__ = ("_fn",)

    def __init__(self, fn):
        self._fn = _outside_compiled_graphs(fn)

    def __call__(self, *args, **kwargs):
        return self._fn(*args, **kwargs)

    def __reduce__(self):
        return (_inert_hook, ())

    def __deepcopy__(self, memo):
        return _inert


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
)


def unwrap_model(model):
    """The model inside ``model``'s wrappers (DistributedDataParallel, DataParallel, FSDP1's
    FullyShardedDataParallel, ``torch.compile``'s OptimizedModule; 8 deep at most), so that
    records are named after the model's own modules at every world size; and whether one of
    them was DistributedDataParallel (its gradients are allreduced: replicated)."""
    ddp = False
    for _ in range(8):
        for attr, cls in _WRAPPERS:
            inner = getattr(model, attr, None) if type(model).__name__ == cls else None
            if isinstance(inner, torch.nn.Module):
                ddp = ddp or cls == "DistributedDataParallel"
                model = inner
                break
        else:
            return model, ddp
    return model, ddp


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
