"""The recorder contract: what a framework front end gives the recording engine
(``detcheck._core.engine``), so that one engine records PyTorch today and MindSpore next.

Three small interfaces, as ``typing.Protocol`` classes (checked by the type checker, never at
run time):

- ``FrontEnd``: model discovery and names (``modules``, ``parameters``), the hooks on a
  module's forward, a module output's tensors (``outputs``), a parameter's gradient, the loss a
  model's output carries, and where tensors go (``sink``, ``operator_trace``).
- ``TensorSink``: how one framework's tensor reaches the writer (conversion, tensor subclasses,
  device kernels). ``put`` never raises into the program.
- ``OperatorTrace``: the operator tracer of a capture re-run, driven by the engine through a
  step getter (given to it) and ``pause``/``resume`` (the engine's own recording is no operator
  of the model).

Two rules both front ends share, as plain functions: ``named_leaves`` (the names of an output's
tensors) and ``replicated_records`` (when ``grad/*`` and ``param/*`` are replicated records).
And what a writer takes (``capabilities``): every writer takes ``record`` and
``record_replicated``; more only where its class declares it (``CAPABILITIES``, the native
``TraceWriter``'s), never found by probing the writer for a method.

And how the start-up hook starts a front end in a launched rank (``Plugin``): each framework's
folder declares one (``_torch/plugin.py``, ``_mindspore/plugin.py``), so the next framework
adds a folder and one line in the hook's list (``detcheck._launch.startup``), not a copy of it.

And what every operator-trace window shares (``Window``): its state and the answers where it
does nothing; each front end's window opens, traces and ends its own way.

Step boundaries are not the front end's: the caller of the engine drives them (``watch``'s
optimizer hooks, the zero-change recorder's global hooks, a framework callback).

Imports nothing: the contract holds for every framework.
"""

from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, Optional, Protocol

__all__ = [
    "ROOT",
    "FrontEnd",
    "OperatorTrace",
    "Plugin",
    "Removable",
    "RemovedOnce",
    "TensorSink",
    "Window",
    "capabilities",
    "named_leaves",
    "replicated_records",
]

#: The label of the model itself in record names (``fwd/(model)``, ``in/(model).0``).
ROOT = "(model)"


class Plugin(NamedTuple):
    """A framework front end as the start-up hook starts it in a launched rank, once the program
    imports ``framework`` (the first framework imported is the one recorded): the hint table's
    ``framework`` rows under ``--deterministic``, then ``install_evidence()`` (a failure is said
    as "cannot follow ``follows``"), then ``start(state)``, which returns the recorder. The
    callables import the framework's modules when called, never before."""

    #: The module whose import starts the front end; its name in the trace and the hint table.
    framework: str
    #: What its evidence follows, for the one line said when it cannot.
    follows: str
    install_evidence: Callable[[], None]
    start: Callable[[Any], Any]


def named_leaves(
    name: str, value: Any, is_tensor: Callable[[Any], bool], depth: int = 0
) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` of every tensor in a module's or cell's output, in order, the one
    naming rule of both front ends: a tuple or list gives ``name.0``, ``name.1``...; a dict
    ``name.<key>`` in its order; 8 levels deep at most."""
    if is_tensor(value):
        yield name, value
    elif depth >= 8:
        return
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from named_leaves(f"{name}.{i}", item, is_tensor, depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from named_leaves(f"{name}.{key}", item, is_tensor, depth + 1)


def capabilities(writer: Any) -> frozenset[str]:
    """What ``writer`` takes beyond ``record`` and ``record_replicated``, as its class declares
    it (``CAPABILITIES``): ``sharded`` (``record_sharded``), ``digested`` (``record_digested``
    and the device records' ``_record_later``/``_fill``), ``lent`` (``_record_lent``),
    ``environment`` (``add_environment``). ``None`` and a writer that declares nothing take
    records alone."""
    return frozenset(getattr(type(writer), "CAPABILITIES", ()))


def replicated_records(held_alike: Any, world_size: int, world_of_one: bool = True) -> bool:
    """The one rule for ``grad/*`` and ``param/*``: recorded as replicated (every rank must
    hold the same bits) when the program's structure says its ranks hold them alike
    (``held_alike``: a DistributedDataParallel model, a DTensor all of whose placements are
    Replicate, a MindSpore program in data-parallel mode or with a ``DistributedGradReducer``).

    ``world_of_one``: what a world of one rank gives, which trivially holds them alike. ``True``
    for the zero-change recorder and a DTensor (so ``world_sizes`` compares a one-rank run with
    no flag); ``watch`` passes ``False``, its documented rule since its first release (a one-rank
    ``watch`` user says ``replicated=True``)."""
    if world_size == 1:
        return world_of_one
    return bool(held_alike)


class Removable(Protocol):
    """A registered hook."""

    def remove(self) -> None: ...


class RemovedOnce:
    """A ``Removable`` that calls ``remove`` (a framework handle's, or detcheck's own) the
    first time it is removed, and never raises: a hook of detcheck's never fails the program.
    ``None``: nothing to remove."""

    __slots__ = ("_remove",)

    def __init__(self, remove: Optional[Callable[[], Any]] = None) -> None:
        self._remove = remove

    def remove(self) -> None:
        remove, self._remove = self._remove, None
        if remove is not None:
            try:
                remove()
            except Exception:
                pass


class TensorSink(Protocol):
    """Hands a framework's tensors to the writer."""

    def put(self, step: int, name: str, tensor: Any, replicated: bool, state: bool) -> None:
        """Records ``tensor`` as ``name`` at ``step``; ``state``: a gradient or parameter (its
        placements may decide ``replicated``). Never raises into the program."""

    def put_state(self, step: int, items: list[tuple[str, Any]], replicated: bool) -> None:
        """Records one step's gradients or parameters, ``(name, tensor)`` in order, as ``put``
        with ``state``: given together, so that a front end may look at all of them before it
        records one (the torch front end lends a tensor whose memory only they hold)."""

    def end_step(self) -> None:
        """The step is over (records held on a device may be handed over)."""

    def close(self) -> None:
        """No more records: hand over what is held."""


class OperatorTrace(Protocol):
    """The operator tracer of one capture re-run."""

    def step_ends(self) -> None:
        """The step's forward and backward are over (before the gradients are recorded)."""

    def before_update(self) -> None:
        """The optimizer's update begins."""

    def after_update(self) -> None:
        """The optimizer's update is done."""

    def call_began(self, module: Any, args: Any, kwargs: Any) -> None:
        """The model's call during which the recording began is under way: the trace's
        pre-hooks on the model were added after that call collected its pre-hooks."""

    def pause(self) -> None:
        """The engine records: operators run now are not the model's."""

    def resume(self) -> None:
        """Ends one ``pause``."""

    def remove(self) -> None:
        """Removes the tracer's hooks and closes its file."""


class Window:
    """What every framework's operator-trace window shares: its state (the step getter, the
    trace's folder, the window's step, its tracer, the hooks it holds, whether it is over) and
    ``OperatorTrace``'s answers where a window does nothing. A front end's window opens its
    file, traces and ends (``remove``) its own way (``_torch/ops.py``, ``_mindspore/ops.py``)."""

    def __init__(self, current_step: Callable[[], int], folder: Any, step: int, tracer: Any):
        self._current_step = current_step
        self._folder = folder
        self._step = step
        self.tracer = tracer
        self._hooks: list[Any] = []
        self._done = False

    def _now(self) -> bool:
        """Whether the program is in the window's step."""
        return bool(self._current_step() == self._step)

    def pause(self) -> None:
        self.tracer.pause()

    def resume(self) -> None:
        self.tracer.resume()

    def call_began(self, module: Any, args: Any, kwargs: Any) -> None:
        """The model's call during which the recording began is under way."""

    def step_ends(self) -> None:
        """The step's forward and backward are over (before the gradients are recorded)."""

    def before_update(self) -> None:
        """The optimizer's update begins (after the gradients are recorded)."""

    def after_update(self) -> None:
        """The optimizer's update is done (before the parameters are recorded)."""


class FrontEnd(Protocol):
    """What a framework provides to the engine."""

    def modules(self, model: Any) -> Iterable[tuple[str, Any]]:
        """``(label, module)`` of every module, the model itself labelled ``""``."""

    def parameters(self, model: Any) -> Iterable[tuple[str, Any]]:
        """``(name, parameter)`` of every parameter, in the model's order."""

    def on_forward(self, module: Any, hook: Callable[..., Any]) -> Removable:
        """Calls ``hook(module, args, output)`` after each forward of ``module``."""

    def on_backward(self, hook: Callable[[Any], Any]) -> Removable:
        """Calls ``hook(tensor)`` before each backward pass the program starts, with the tensor
        it starts from (the loss), until removed."""

    def on_forward_inputs(self, module: Any, hook: Callable[..., Any]) -> Removable:
        """Calls ``hook(module, args, kwargs)`` before each forward of ``module``."""

    def outputs(self, name: str, value: Any) -> Iterator[tuple[str, Any]]:
        """``(name, tensor)`` of every tensor in a module's output, in order."""

    def gradient(self, parameter: Any) -> Optional[Any]:
        """The parameter's gradient, or ``None``."""

    def trainable(self, parameter: Any) -> bool:
        """Whether the parameter is updated by the optimizer."""

    def loss_of(self, output: Any) -> Optional[Any]:
        """The loss a model's output carries, or ``None``."""

    def sink(self, writer: Any, device_digests: Optional[bool], model: Any) -> TensorSink:
        """The sink of one engine's records of ``model``."""

    def operator_trace(
        self, current_step: Callable[[], int], model: Any, writer: Any, updates: bool
    ) -> Optional[OperatorTrace]:
        """The operator trace the process's capture request asks of this model, or ``None``."""
