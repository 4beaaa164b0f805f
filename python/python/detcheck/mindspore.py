"""Recording a MindSpore model every step from inside the program:
``detcheck.mindspore.watch(cell, writer, optimizer)`` and ``DetcheckCallback`` for
``Model.train`` (docs/mindspore.md is the long form; the zero-change recorder,
``detcheck._mindspore.auto``, records an unmodified script the same way).

Per step (the handle's ``current_step``), PyTorch's names and order: ``fwd/<cell>`` for each
cell's output as it runs (the model itself is ``fwd/(model)``; tuple, list and dict outputs give
``fwd/<cell>.0`` or ``fwd/<cell>.<key>``), then, when the optimizer is called, ``grad/<param>``
(the gradients it is given, in the model's parameter order) and ``param/<param>`` after its
update, which ends the step. Without an optimizer, ``handle.next_step()`` ends it. Names are
the model's own inside MindSpore's training wrappers (``TrainOneStepCell``, ``WithLossCell``).

``DetcheckCallback`` records ``Model.train``: in PyNative mode what ``watch`` records, and the
step's ``loss`` (the network's output) after its parameters; in graph mode, where no hook runs,
the ``loss`` and ``param/*`` at each step's end.

Determinism: records are made in the order the program runs the hooked code; the recording
changes no value (``Tensor.asnumpy()`` copies). Graph mode: compiled cells run no hooks, so
``watch`` records there only what ``handle.next_step()`` and the callback hand it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import mindspore as _ms
from mindspore.train import Callback as _Callback

from ._core.contract import Removable
from ._core.engine import RECORDS, Handle, Recording
from ._detcheck import TraceWriter, _program_records
from ._mindspore.frontend import MindSporeFrontEnd, describe_run, is_graph_mode, unwrap_cell

__all__ = ["watch", "WatchHandle", "DetcheckCallback"]


class WatchHandle(Handle):
    """The hooks of one ``watch``: the step counter, ``next_step()``, ``step(n)``, ``remove()``.

    Also a context manager that removes the hooks when the block ends.
    """

    def next_step(self) -> None:
        """Ends the step (without an optimizer): advances the step."""
        self._recording.next_step()

    def record_loss(self, loss: Any, step: int | None = None) -> None:
        """Records ``loss`` (a MindSpore tensor) as ``loss`` at ``step`` (the current one)."""
        sink = self._recording.sink
        if sink is not None and loss is not None:
            at = self._recording.current_step if step is None else step
            sink.put(at, "loss", loss, False, False)


class _OptimizerHook:
    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def remove(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.remove()


def watch(
    cell: Any,
    writer: TraceWriter | None,
    optimizer: Any = None,
    *,
    replicated: bool | None = None,
    start_step: int = 0,
    records: Collection[str] = RECORDS,
) -> WatchHandle:
    """Records ``cell``'s forward outputs, the gradients its ``optimizer`` is given and its
    parameters after each update into ``writer`` every step, as this module's documentation
    describes; returns a ``WatchHandle``.

    ``cell``: an ``nn.Cell`` (a training wrapper such as ``TrainOneStepCell`` is looked
    through to the model inside). ``writer``: a ``detcheck.TraceWriter``, or ``None`` (what
    ``TraceWriter.from_env()`` gives outside detcheck): nothing is hooked or recorded.
    ``optimizer``: the ``nn.Optimizer`` whose call ends a step (a ``TypeError`` for anything
    else). ``replicated``: record ``grad/*`` and ``param/*`` as replicated (default: no).
    ``records``: which of ``"fwd"``, ``"grad"``, ``"param"`` to record.
    """
    if not isinstance(cell, _ms.nn.Cell):
        raise TypeError(
            f"detcheck.mindspore.watch records an nn.Cell, not a {type(cell).__qualname__}"
        )
    if optimizer is not None and not isinstance(optimizer, _ms.nn.Optimizer):
        raise TypeError(
            "detcheck.mindspore.watch: optimizer must be a mindspore.nn.Optimizer (or None and "
            f"handle.next_step()), not a {type(optimizer).__qualname__}"
        )
    if start_step < 0:
        raise ValueError(f"start_step {start_step} is negative")
    _program_records("the program calls detcheck.mindspore.watch")
    model = unwrap_cell(cell)
    graph = is_graph_mode()
    describe_run(writer, graph)
    frontend = MindSporeFrontEnd(graph=graph)
    recording = Recording(
        frontend,
        model,
        writer,
        bool(replicated),
        start_step,
        updates=optimizer is not None,
        records=records,
    )
    hooks: list[Removable] = []
    if optimizer is not None and writer is not None:

        def before(opt: Any, args: Any) -> None:
            try:
                frontend.gradients_given(opt, args[0] if args else ())
                recording.end_backward()
            except Exception:
                pass

        def after(opt: Any, args: Any, output: Any) -> None:
            try:
                recording.after_update()
            except Exception:
                pass

        hooks.append(_OptimizerHook(optimizer.register_forward_pre_hook(before)))
        hooks.append(_OptimizerHook(optimizer.register_forward_hook(after)))
    return WatchHandle(recording, hooks)


class DetcheckCallback(_Callback):
    """A ``Model.train`` callback that records the training (module doc): ``writer`` (default:
    the launch's ``TraceWriter.from_env()``, opened when training begins and closed when it
    ends), ``replicated`` as for ``watch``."""

    def __init__(self, writer: TraceWriter | None = None, replicated: bool | None = None) -> None:
        super().__init__()
        self._given = writer
        self._replicated = replicated
        self._writer: TraceWriter | None = None
        self._handle: WatchHandle | None = None
        self._graph = False

    def on_train_begin(self, run_context: Any) -> None:
        cb = run_context.original_args()
        self._writer = self._given if self._given is not None else TraceWriter.from_env()
        self._graph = is_graph_mode()
        network = getattr(cb, "train_network", None) or cb.network
        optimizer = None if self._graph else getattr(cb, "optimizer", None)
        if not isinstance(optimizer, _ms.nn.Optimizer):
            optimizer = None
        self._handle = watch(network, self._writer, optimizer, replicated=self._replicated)

    def on_train_step_end(self, run_context: Any) -> None:
        handle = self._handle
        if handle is None or self._writer is None:
            return
        cb = run_context.original_args()
        loss = getattr(cb, "net_outputs", None)
        if isinstance(loss, (tuple, list)):
            loss = loss[0] if loss else None
        if self._graph:  # no hook ran: the parameters now, then the loss, end the step
            handle._recording.after_update()
        handle.record_loss(loss, handle.current_step - 1)

    def on_train_end(self, run_context: Any) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self._writer is not None and self._given is None:
            self._writer.close()
        self._writer = None
