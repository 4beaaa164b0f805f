"""Recording a PyTorch model every step: ``detcheck.torch.watch(model, writer, optimizer)``
(python/README.md, "Recording a PyTorch model: `detcheck.torch.watch`", is the long form).

Per step (the handle's ``current_step``): ``fwd/<module>`` for each module's forward output as
it runs (the model itself is ``fwd/(model)``; a tuple, list or dict output gives one record per
tensor, ``fwd/<module>.0`` or ``fwd/<module>.<key>``); ``grad/<param>`` when the step ends;
``param/<param>`` after the update (with an optimizer). A step ends at ``optimizer.step()``
(gradients before it runs, parameters after; a closure's gradients when it first returns), or
at ``handle.next_step()`` without an optimizer. Names are the model's own inside its wrappers
(``_torch.tensors.unwrap_model``).

``optimizer`` may be a framework's wrapper (accelerate, Lightning, Fabric, DeepSpeed): the
``torch.optim.Optimizer`` inside it whose ``step()`` does the update is hooked
(``_unwrap_optimizer``), so a step the wrapper skips (an accumulation micro-batch, an fp16
overflow) ends none.

Determinism: records are made in the order the program runs the hooked code; the recording
changes no value. Recording a GPU tensor copies it to the host (or digests it on the device,
``device_digests``), which synchronises: the program runs slower, not differently. Requires
torch 2.0 or later (optimizer step hooks).

``detcheck.torch.batch_invariance(model, samples, batch_sizes)`` checks that each sample's
outputs do not depend on what else is in its batch, ``prefill_decode_parity(model, prompt)``
that decoding with a KV cache computes what one forward over the sequence does
(``detcheck._torch.batch``); ``with batch_invariant(): ...`` computes the operators whose rounding
follows the batch's shape one sample at a time (the fix those checks verify).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch as _torch

from ._core.contract import Removable
from ._core.engine import RECORDS, Handle, Recording
from ._detcheck import TraceWriter, _program_records
from ._torch.batch import (
    BatchInvariance,
    BatchRecord,
    ParityRecord,
    PrefillDecodeParity,
    batch_invariance,
    batch_invariant,
    prefill_decode_parity,
)
from ._torch.frontend import (
    MAX_OPTIMIZER_WRAPPERS,
    TORCH,
    after_optimizer_step,
    before_optimizer_step,
    describe_run,
    own_step_hooks,
    starts_update,
    wrapped_optimizer,
)
from ._torch.tensors import Hook, gradient_sync, replicated_records, unwrap_model

__all__ = [
    "watch",
    "WatchHandle",
    "batch_invariance",
    "batch_invariant",
    "BatchInvariance",
    "BatchRecord",
    "prefill_decode_parity",
    "PrefillDecodeParity",
    "ParityRecord",
]


def _qualname(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _unwrap_optimizer(optimizer: Any) -> _torch.optim.Optimizer:
    """The ``torch.optim.Optimizer`` inside ``optimizer`` whose ``step()`` does the update, on
    which ``watch`` registers its step hooks.

    ``optimizer`` itself when its step hooks are its own (``own_step_hooks``: a torch optimizer,
    or a subclass that ran ``Optimizer.__init__``); otherwise the wrapped object, found in
    ``._optimizer`` then ``.optimizer`` (``wrapped_optimizer``), checked the same way, at
    most ``MAX_OPTIMIZER_WRAPPERS`` levels deep. accelerate's ``AcceleratedOptimizer`` (an
    ``Optimizer`` subclass that never runs ``__init__``), Lightning's ``LightningOptimizer``
    (a plain object that imitates the optimizer's class and forwards its attributes) and
    DeepSpeed's wrappers are such wrappers. Their ``step()`` calls the inner one's, where the
    hooks fire, or skips it (an accumulation micro-batch, an fp16 overflow): then no hook fires.

    Raises ``TypeError`` naming the types it went through when no such optimizer is found.
    """
    path = _qualname(optimizer)
    obj = optimizer
    for _ in range(MAX_OPTIMIZER_WRAPPERS + 1):
        if own_step_hooks(obj):
            return obj
        found = wrapped_optimizer(obj)
        if found is None:
            break
        attr, obj = found
        path += f", whose .{attr} is a {_qualname(obj)}"
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
        f"{MAX_OPTIMIZER_WRAPPERS} wrappers deep). Pass the torch.optim.Optimizer whose step() "
        "updates the parameters, or no optimizer and call handle.next_step()"
    )


class WatchHandle(Handle):
    """The hooks of one ``watch``: the step counter, ``next_step()``, ``step(n)``, ``remove()``.

    Also a context manager that removes the hooks when the block ends.
    """

    def next_step(self) -> None:
        """Ends the step (without an optimizer): records ``grad/*``, then advances the step."""
        self._recording.next_step()


def watch(
    model: _torch.nn.Module,
    writer: TraceWriter | None,
    optimizer: Any = None,
    *,
    replicated: bool | None = None,
    start_step: int = 0,
    device_digests: bool | None = None,
    records: Collection[str] = RECORDS,
) -> WatchHandle:
    """Records ``model``'s forward outputs, gradients and (with ``optimizer``) parameters into
    ``writer`` every step, as this module's documentation describes; returns a ``WatchHandle``.

    ``writer``: a ``detcheck.TraceWriter`` (or anything with its ``record``,
    ``record_replicated`` and ``world_size``), or ``None`` (what ``TraceWriter.from_env()``
    gives outside detcheck): then nothing is hooked or recorded, and the handle only counts
    steps.

    ``optimizer``: the ``torch.optim.Optimizer`` whose ``step()`` ends a step, or a framework's
    wrapper of one (accelerate, Lightning, DeepSpeed: the optimizer inside is hooked); a
    ``TypeError`` when there is none, also when ``writer`` is ``None``.

    ``replicated``: ``None`` for the rule (a DistributedDataParallel model and more than one
    rank; a step whose update ran inside its ``no_sync()``, as accelerate's ``LocalSGD`` runs
    them, records its gradients and parameters as the rank's own), or ``True``/``False``.

    ``start_step``: the first step's number.

    ``device_digests``: ``None`` computes the digests of CUDA tensors on their GPU when Triton
    imports, else copies them to the host; ``True`` requires the device kernels
    (``ImportError`` without Triton); ``False`` always copies.

    ``records``: which of ``"fwd"``, ``"grad"``, ``"param"`` to record (all by default).
    """
    return _watch(
        model,
        writer,
        optimizer,
        replicated=replicated,
        start_step=start_step,
        device_digests=device_digests,
        records=records,
    )


def _watch(
    model: _torch.nn.Module,
    writer: TraceWriter | None,
    optimizer: Any = None,
    *,
    replicated: bool | None = None,
    start_step: int = 0,
    device_digests: bool | None = None,
    records: Collection[str] = RECORDS,
    loss: bool = False,
) -> WatchHandle:
    """``watch``, and ``loss``: also the ``loss`` the model's output carries, each forward (the
    Hugging Face callback's record)."""
    if optimizer is not None:
        optimizer = _unwrap_optimizer(optimizer)
    _program_records("the program calls detcheck.torch.watch")
    inner, is_ddp = unwrap_model(model)
    describe_run(writer)
    # The rule's replicas are also a step's own where its update ran inside DDP's `no_sync()`;
    # a `replicated` given by the program is kept as given.
    synced = gradient_sync(model) if replicated is None else None
    if replicated is None:
        replicated = replicated_records(
            is_ddp, getattr(writer, "world_size", 1), world_of_one=False
        )
    if start_step < 0:
        raise ValueError(f"start_step {start_step} is negative")
    recording = Recording(
        TORCH,
        inner,
        writer,
        replicated,
        start_step,
        updates=optimizer is not None,
        device_digests=device_digests,
        records=records,
        loss=loss,
        synced=synced,
    )
    hooks: list[Removable] = []
    if optimizer is not None and writer is not None:
        hooks.append(
            optimizer.register_step_pre_hook(
                Hook(
                    lambda opt, args, kwargs: (
                        before_optimizer_step(recording, opt, args, kwargs)
                        if starts_update(opt)
                        else None
                    )
                )
            )
        )
        hooks.append(
            optimizer.register_step_post_hook(
                Hook(lambda opt, args, kwargs: after_optimizer_step(opt, recording.after_update))
            )
        )
    return WatchHandle(recording, hooks)
