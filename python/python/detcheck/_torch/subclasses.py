"""What a tensor that is not a plain ``torch.Tensor`` is recorded as, so that recording never
raises inside the program's forward, backward or step.

``plain(tensor)`` returns a ``Plain``: the plain tensor whose bytes are recorded, a note on what
it is (``None`` for a plain tensor), whether its values are the same on every rank of its
mesh (``None``: the recorder's own rule decides), and for a shard of a larger tensor its
placement: ``(global_shape, offset, extent)``, the global shape and, per dimension, the global
index of the shard's first element and how many elements of the global tensor it holds (the
``world_sizes`` check adds up the shards of every rank to compare the global tensor). It
raises ``Unrecordable`` with the reason when there are no values to record. The rules:

- a plain, dense ``torch.Tensor`` or ``nn.Parameter``: itself (``watch`` hands those to the
  writer without asking);
- a ``DTensor`` (FSDP2's parameters, gradients and optimizer state; tensor parallel): this
  rank's local shard (``to_local()``), noted with its placements, mesh, coordinate and global
  shape; replicated only when every placement is ``Replicate`` (a ``Shard`` is this rank's
  part, a ``Partial`` a partial sum: neither may be compared across ranks); its placement from
  torch's own ``compute_local_shape_and_global_offset`` when its placements are ``Shard`` and
  ``Replicate`` (a ``Partial`` holds no part of the global tensor: no placement, and the note
  says it is not compared across world sizes);
- FSDP1's ``FlatParameter``: this rank's shard, noted with the unsharded size; never
  replicated; its placement in the 1-D index space of the unpadded flat parameter (the shard
  starts at rank x shard size; its padding past the unpadded size is left out of the extent);
- a parameter DeepSpeed ZeRO stage 3 has partitioned (``partitioned``: its ``data`` released to
  an empty tensor between the forwards that gather it, its ``ds_tensor`` this rank's part): that
  part, noted with the parameter's shape; never replicated; placed in the 1-D index space of the
  flattened parameter as FSDP1's shard is (rank x partition size, padding left out). Recording
  the empty ``data`` would compare nothing while counting as compared;
- an ``AsyncCollectiveTensor`` (a functional collective's result, tensor parallel's module
  outputs): the tensor it waits for;
- a tensor of ``torch.func``'s transforms (``grad``, ``vjp``, ``vmap``: a module's output in a
  forward that ``functional_call`` runs under ``grad_and_value``): the tensor under all its
  levels (under ``vmap``, with the batch dimension), noted with the count of levels. It is read
  with the transforms off (``outside_transforms``): under them even a plain tensor's
  ``detach()`` is lifted into a level and has no storage;
- a quantized tensor: its integers (``int_repr()``), noted with its scheme;
- a meta tensor, a ``FakeTensor``, a nested or sparse tensor, and a wrapper subclass of
  another library (no storage of its own): ``Unrecordable``;
- any other subclass (a plain Python subclass of ``torch.Tensor``): its data as a plain tensor
  (``as_subclass``), noted with its class.

``shard_holders(model)`` finds the tensors FSDP2 keeps on its shards' memory besides the
parameters (``_torch.tensors.lendable``'s holders of a parameter's storage).

``transformed(tensor)`` says whether a tensor is one of ``torch.func``'s, and
``outside_transforms(tensor)`` is the context a recorder reads ``tensor`` in: the transforms
off while one runs or for a tensor of ``torch.func``'s, nothing otherwise.

Determinism: a function of the tensor alone. Limits: a DTensor's records are its local shards;
the global tensor is not gathered (that would add collectives to the program): its placement
lets a comparison put the shards together. A flat parameter's offset assumes FSDP1 shards over
the whole world (``FULL_SHARD``, ``SHARD_GRAD_OP``); a hybrid strategy's is not known.
"""

import contextlib

import torch

#: The types recorded as they are.
PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


class Unrecordable(Exception):
    """The tensor holds no values detcheck can record; the message says why."""


class Plain:
    """What ``plain`` found: ``tensor`` (plain), ``note`` (a string, a function that makes
    it, or ``None``), ``replicated`` (``True``/``False`` where the tensor's type decides, else
    ``None``)."""

    __slots__ = ("tensor", "note", "replicated", "placement")

    def __init__(self, tensor, note=None, replicated=None, placement=None):
        self.tensor = tensor
        self.note = note
        self.replicated = replicated
        self.placement = placement


def _is_dtensor(tensor):
    cls = type(tensor)
    return (
        cls.__name__ == "DTensor" and hasattr(tensor, "to_local") and hasattr(tensor, "placements")
    )


#: ``_dtensor_placement``'s answers by the DTensor's spec (its mesh, placements and global
#: shape and strides) and local shape: a sharded model's parameters, gradients and activations
#: have the same few placements every step, and torch's computation of one costs about 60 us
#: (a third of the recorder's time a record under FSDP2, docs/benchmarks.md).
_PLACEMENTS: dict = {}
_MAX_PLACEMENTS = 4096


#: What ``_dtensor`` reads of a DTensor's placements (theirs, its shard's placement or why
#: none, whether replicated), by the spec object itself (``id``; the spec kept beside it, so
#: the id stays its) and the local shape: FSDP2 gives a parameter, and the gradients made for
#: it, one spec object for the whole run, and comparing specs for equality (``_PLACEMENTS``'s
#: lookup) costs more than the lookup saves.
_DTENSORS: dict = {}


def _dtensor_placement(tensor, placements, local):
    """``(global_shape, offset, extent)`` of a DTensor's local shard, or the reason there is
    none (a string); remembered by its spec (``_PLACEMENTS``)."""
    try:
        key = (tensor._spec, tuple(local.shape))
        hash(key)
    except Exception:  # a DTensor without a hashable spec: computed each time
        return _compute_dtensor_placement(tensor, placements, local)
    found = _PLACEMENTS.get(key)
    if found is None:
        found = _compute_dtensor_placement(tensor, placements, local)
        if len(_PLACEMENTS) < _MAX_PLACEMENTS:
            _PLACEMENTS[key] = found
    return found


def _compute_dtensor_placement(tensor, placements, local):
    kinds = [type(p).__name__ for p in placements]
    if any(k not in ("Shard", "Replicate", "_StridedShard") for k in kinds):
        return (
            "its placements include a Partial (a partial sum, no part of the global tensor): "
            "not compared across world sizes"
        )
    if all(k == "Replicate" for k in kinds):
        return None
    try:
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    except ImportError as e:  # a torch without it: recorded as the local shard only
        return f"no placement: {e}"
    try:
        shape, offset = compute_local_shape_and_global_offset(
            tensor.shape, tensor.device_mesh, placements
        )
    except Exception as e:
        return f"no placement: {type(e).__name__}: {e}"
    shape = [int(d) for d in shape]
    if list(local.shape) != shape:
        return (
            f"no placement: torch computes the local shape {shape}, "
            f"the shard is {list(local.shape)}"
        )
    return ([int(d) for d in tensor.shape], [int(o) for o in offset], shape)


def _dtensor(tensor):
    # The local shard itself (what ``to_local()`` returns without autograd, under no_grad):
    # ``to_local()`` with autograd on runs an autograd function, a third of a record's time.
    local = getattr(tensor, "_local_tensor", None)
    if not isinstance(local, torch.Tensor):
        local = tensor.to_local()
    spec = getattr(tensor, "_spec", None)
    known = _DTENSORS.get(id(spec))
    if known is not None and known[0] is spec and known[1] == local.shape:
        placements, placement, why, replicated = known[2]
    else:
        placements = tuple(tensor.placements)
        placement = _dtensor_placement(tensor, placements, local)
        why = placement if isinstance(placement, str) else None
        placement = None if isinstance(placement, str) else placement
        replicated = all(type(p).__name__ == "Replicate" for p in placements)
        if spec is not None and len(_DTENSORS) < _MAX_PLACEMENTS:
            _DTENSORS[id(spec)] = (spec, local.shape, (placements, placement, why, replicated))

    def note():  # made once per record name (the recorder asks only for a new name)
        mesh = tensor.device_mesh
        try:
            coordinate = mesh.get_coordinate()
        except Exception:
            coordinate = None
        text = (
            f"DTensor {list(map(str, placements))} on mesh {tuple(mesh.shape)} at "
            f"{coordinate}: global shape {list(tensor.shape)}, recorded as the local shard "
            f"{list(local.shape)}"
        )
        if placement is not None:
            text += f" at offset {placement[1]}"
        return text + (f"; {why}" if why else "")

    inner = local if type(local) is torch.Tensor else plain(local).tensor
    return Plain(inner, note, replicated, placement)


def partitioned(tensor):
    """Whether ``tensor`` is a parameter DeepSpeed ZeRO stage 3 has partitioned: an empty tensor
    with this rank's part beside it (``ds_tensor``) of a parameter of ``ds_numel`` elements."""
    return (
        tensor.numel() == 0
        and isinstance(getattr(tensor, "ds_tensor", None), torch.Tensor)
        and getattr(tensor, "ds_numel", 0) > 0
    )


def _zero3_partition(tensor):
    """This rank's part of a ZeRO-3 partitioned parameter (``partitioned``), with its
    placement in the flattened parameter (``None`` when the rank is not known)."""
    part = tensor.ds_tensor
    total = int(tensor.ds_numel)
    shape = list(getattr(tensor, "ds_shape", [total]))
    size = part.numel()
    note = (
        f"DeepSpeed ZeRO-3 partition: this rank's {size} elements of the {shape} parameter "
        f"({total} elements, flattened)"
    )
    placement = None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            rank = dist.get_rank(group=getattr(tensor, "ds_process_group", None))
        except Exception:
            rank = -1
        if rank >= 0:
            start = rank * size
            extent = max(0, min(size, total - start))
            placement = ([total], [min(start, total)], [extent])
    data = part.detach()
    return Plain(
        data if type(data) is torch.Tensor else data.as_subclass(torch.Tensor),
        note,
        False,
        placement,
    )


def _flat_parameter_placement(tensor):
    """``(global_shape, offset, extent)`` of FSDP1's flat parameter shard, or ``None``."""
    full = getattr(tensor, "_unpadded_unsharded_size", None)
    if full is None or tensor.dim() != 1:
        return None
    total = 1
    for d in full:
        total *= int(d)
    shard = tensor.numel()
    if shard == total:
        return ([total], [0], [total])
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    start = dist.get_rank() * shard  # FSDP1 (FULL_SHARD over the world): rank r's chunk
    extent = max(0, min(shard, total - start))
    return ([total], [min(start, total)], [extent])


#: ``torch._C._functorch`` (``torch.func``'s transforms), where this torch has it.
_FUNCTORCH = getattr(torch._C, "_functorch", None)


def shard_holders(model):
    """A function giving the tensors FSDP2 keeps on its shards' memory besides the parameters
    (each ``FSDPParam``'s padded 1-D ``_sharded_param_data``, whose base is the padded shard
    the parameter's local tensor is a view of), or ``None`` where no module of ``model`` is
    FSDP2's (``fully_shard``). Its modules are found once; the tensors are read at each call,
    as FSDP2 may replace them (its lazy initialization, ``load_state_dict``)."""
    params = []
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        if get_state is None:
            continue
        try:
            groups = getattr(get_state(), "_fsdp_param_groups", ())
        except Exception:  # not an FSDP2 module after all, or one without a state yet
            continue
        for group in groups:
            params.extend(getattr(group, "fsdp_params", ()))
    if not params:
        return None

    def holders():
        found = (getattr(param, "_sharded_param_data", None) for param in params)
        return [t for t in found if type(t) is torch.Tensor]

    return holders


def transformed(tensor):
    """Whether ``tensor`` is wrapped by a ``torch.func`` transform (a ``grad`` or ``vmap``
    level)."""
    return _FUNCTORCH is not None and _FUNCTORCH.is_functorch_wrapped_tensor(tensor)


def outside_transforms(tensor):
    """The context to read ``tensor`` in (module doc): the transforms off while a transform
    runs (a tensor of the recorder's own, made under it, is lifted too) or for ``tensor`` of
    theirs."""
    if _FUNCTORCH is not None and (
        _FUNCTORCH.peek_interpreter_stack() is not None or transformed(tensor)
    ):
        return torch._C._DisableFuncTorch()
    return contextlib.nullcontext()


def _unwrapped(tensor):
    """The tensor under all of ``tensor``'s transform levels (called with them off)."""
    levels = 0
    while transformed(tensor) and levels < 64:
        tensor = _FUNCTORCH.get_unwrapped(tensor)
        levels += 1
    note = (
        f"a tensor of torch.func's transforms: recorded as the tensor under its {levels} level(s)"
    )
    return Plain(plain(tensor).tensor if type(tensor) not in PLAIN_TYPES else tensor, note)


def plain(tensor):
    """The plain tensor to record for ``tensor`` (module doc); raises ``Unrecordable``."""
    if transformed(tensor):
        return _unwrapped(tensor)
    cls = type(tensor)
    if _is_dtensor(tensor):
        return _dtensor(tensor)
    if cls.__name__ == "FlatParameter":
        # FSDP1's flat parameter (use_orig_params=False): this rank's shard of the flattened,
        # padded parameters of one FSDP unit.
        full = getattr(tensor, "_unpadded_unsharded_size", None)
        of = f" of the {list(full)} unsharded flat parameter" if full is not None else ""
        note = f"FSDP flat parameter: this rank's shard, {tensor.numel()} elements{of}"
        try:
            placement = _flat_parameter_placement(tensor)
        except Exception:
            placement = None
        return Plain(tensor.as_subclass(torch.Tensor), note, False, placement)
    if cls in PLAIN_TYPES and partitioned(tensor):
        return _zero3_partition(tensor)
    if cls.__name__ == "AsyncCollectiveTensor" and hasattr(tensor, "wait"):
        # A collective's result still in flight (tensor parallel's outputs): waited for, as
        # the program's next use of it would.
        return Plain(plain(tensor.wait()).tensor)
    name = f"{cls.__module__}.{cls.__qualname__}"
    if cls.__name__ == "FakeTensor" or tensor.is_meta:
        raise Unrecordable(f"a {name} on {tensor.device} holds no values")
    if getattr(tensor, "is_nested", False):
        raise Unrecordable("a nested tensor has no single row-major layout")
    if tensor.layout is not torch.strided:
        raise Unrecordable(f"a sparse tensor ({tensor.layout}) is not recorded")
    if tensor.is_quantized:
        data = tensor.int_repr()
        return Plain(data, f"quantized ({tensor.qscheme()}): recorded as its integers")
    try:
        from torch.utils._python_dispatch import is_traceable_wrapper_subclass

        wrapper = is_traceable_wrapper_subclass(tensor)
    except ImportError:
        wrapper = False
    if wrapper:
        raise Unrecordable(f"a {name} is a wrapper subclass with no storage of its own")
    if cls in PLAIN_TYPES:
        return Plain(tensor)
    return Plain(tensor.as_subclass(torch.Tensor), f"a {name}: recorded through its data")
