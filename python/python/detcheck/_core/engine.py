"""The recording engine: one model's records, step by step, for every way of recording
(``detcheck.torch.watch``, the zero-change recorder ``detcheck._torch.auto``, the framework
callbacks), through a framework's front end (``detcheck._core.contract.FrontEnd``).

``Recording`` makes, per step:

- ``fwd/<module>`` at each forward of each module (the model itself is ``fwd/(model)``), a
  module output's tensors as the front end names them;
- ``in/(model).N`` (with ``inputs``): the model's tensor arguments, then its keyword
  arguments by name, each call; ``loss`` (with ``loss``): what the model's output carries;
- ``in/<module>.N`` (with ``module_inputs``; by default when the launch asks for the data
  flow, ``DETCHECK_RECORD=flow``: ``run --dump``, whoever records, the zero-change recorder or
  the program's own ``watch``), before a module's call, each of
  its tensor arguments that is no tensor recorded earlier in the step (as it was then: an
  in-place change is seen by the tensor's version): what code between modules made (an added
  offset, a residual sum, a functional call), so that ``compare --align`` knows every module's
  input; the environment says so (``site:flow``);
- ``grad/<param>`` when the caller says the backward is over (``end_backward``), and
  ``param/<param>`` when it says the update is done (``after_update``), which ends the step
  (each parameter looked up again by name then: ``torch.func.functional_call`` calls the model
  with the program's own tensors, a new dict of them after each update);
- ``end/<param>`` when a zero-change recording ends (``record_end_state``: after the last step,
  or at exit); in an unperturbed run (``DETCHECK_RECORD=end``) nothing else: the recording
  is made with no record kind;
- in a rank detcheck launched (``_core.evidence.installed()``), the evidence of a divergence's
cause:
  ``init/<param>`` (the parameters when the recording starts), ``rng/*`` at
  the model's first forward of each step, and what ``_core.evidence`` notes (``seed/*``,
  ``data/indices``, each with its line) at the step it happens in (before the recording starts:
  at its first step); the ``data/outside`` digests of values that entered torch from the
  program's lines since its last record come before its next record (``_outside_first``).

The caller drives the steps: ``end_backward``, ``after_update``, ``next_step`` (no optimizer),
``step_to(n)``; ``first_call_began`` when the recording began inside a call of the model (the
zero-change recorder), whose pre-hooks ran before the recording's existed. With an operator
trace (a capture re-run), the engine tells it where the step is and pauses it while it records.
``Handle`` is what each framework's ``watch`` returns, less its framework
(``detcheck.torch.WatchHandle``, ``detcheck.mindspore.WatchHandle``): a ``Recording`` and the
hooks that drive it.

Determinism: records are made in the order the program runs the hooked code; nothing here
reads a clock or a hash order.
"""

import weakref
from typing import Any, Literal, TypeVar

from . import evidence as _evidence
from .contract import ROOT, FrontEnd, Removable

__all__ = ["RECORDS", "Recording", "Handle"]

#: The values that entered torch since the last record (``_core.evidence.OUTSIDE``, emptied in
#: place): a record's hook flushes them first when it is not empty.
_OUTSIDE = _evidence.OUTSIDE

#: The kinds of records a recording can make: forward outputs (``fwd/*``), gradients
#: (``grad/*``) and parameters after each update (``param/*``).
RECORDS = ("fwd", "grad", "param")


def _launch_asks_for_the_flow():
    """Whether this rank's launch asks for the data flow (``DETCHECK_RECORD=flow``, read by
    the launch contract's one reader, ``RecorderPlan``); a value it refuses records no flow
    (the zero-change recorder's start-up says why)."""
    from .._detcheck import recorder_plan

    try:
        return recorder_plan()[2] == "flow"
    except Exception:
        return False


class Recording:
    """One model's recording (module doc). ``writer`` ``None``: nothing is hooked or
    recorded, the step counter still counts."""

    def __init__(
        self,
        frontend: FrontEnd,
        model,
        writer,
        replicated,
        start,
        *,
        updates,
        inputs=False,
        loss=False,
        device_digests=None,
        records=RECORDS,
        module_inputs=None,
        synced=None,
    ):
        unknown = set(records) - set(RECORDS)
        if unknown:
            raise ValueError(
                f"records: unknown kind(s) {sorted(unknown)}; the kinds are {list(RECORDS)}"
            )
        self._frontend = frontend
        self._records = frozenset(records)
        self._writer = writer
        self.replicated = bool(replicated)
        #: A function telling whether the update about to run synced its gradients (``None``:
        #: always), and its answer at the last update: a rank's update made from its own
        #: gradients (DDP's ``no_sync()``) makes its gradients and parameters its own.
        self._sync = synced
        self._synced = True
        self._step = int(start)
        self._start = int(start)
        self._hooks = []
        #: The operator trace of a capture request, or ``None``.
        self._ops = None
        #: An update whose closure has not returned yet: the gradients are still to be recorded.
        self.pending_update = False
        self._model = model
        params = list(frontend.parameters(model))
        self._grad_labels = [("grad/" + name, p) for name, p in params]
        self._param_labels = [("param/" + name, p) for name, p in params]
        self.sink = None
        self._inputs = bool(inputs)
        #: The step whose start was stamped (``rng/*``).
        self._stamped = None
        #: (step, name) -> records of evidence so far: the k of their ``site:`` keys.
        self._evidence_counts: dict[tuple[int, str], int] = {}
        #: ``_core.evidence``'s sink while this recording takes the evidence, or ``None``.
        self._evidence_sink = None
        #: With ``module_inputs``: the tensors recorded this step, by ``id``: (a reference
        #: that gives the tensor back while it lives, its version then).
        self._held: dict[int, tuple[Any, Any]] | None = None
        if writer is None:
            return  # outside detcheck (`TraceWriter.from_env()` gave None): record nothing
        self._ops = frontend.operator_trace(lambda: self._step, model, writer, bool(updates))
        self.sink = frontend.sink(writer, device_digests, model)
        if module_inputs is None:  # as the launch asks (`run --dump`: the data flow)
            module_inputs = _launch_asks_for_the_flow()
        self._held = {} if module_inputs and "fwd" in self._records else None
        if self._held is not None:
            writer.add_environment("site:flow", "module inputs")
        if _evidence.installed():
            self._evidence_sink = self.paused(self._evidence)
            _evidence.attach(self._evidence_sink)
            built = _evidence.built_at(model)
            if built is not None:
                _evidence.fact("site:model_built", built)
                builder = _evidence.built_by(built)
                if builder is not None:
                    _evidence.fact(_evidence.MODEL_BUILDER_KEY, builder)
                if _evidence.drawn_before(built):
                    _evidence.fact(_evidence.DRAWN_BEFORE_MODEL_KEY, built)
            self.paused(self._record_initial_parameters)()
        if inputs or self._evidence_sink is not None:
            hook = self.paused(self.model_forward_begins)
            self._hooks.append(frontend.on_forward_inputs(model, hook))
        for name, module in frontend.modules(model) if "fwd" in self._records else ():
            label = name if name else ROOT
            if self._held is not None:
                hook = self.paused(self._module_inputs("in/" + label))
                self._hooks.append(frontend.on_forward_inputs(module, hook))
            self._hooks.append(
                frontend.on_forward(module, self.paused(self._forward("fwd/" + label)))
            )
        #: The step whose loss the model's output gave (the backward's is then not recorded).
        self._loss_step = None
        if loss:
            self._hooks.append(frontend.on_forward(model, self.paused(self._record_loss)))
            self._hooks.append(frontend.on_backward(self.paused(self._record_backward_loss)))

    @property
    def current_step(self):
        """The step the next records belong to."""
        return self._step

    def step_to(self, n):
        """The records that follow belong to step ``n``."""
        if n < 0:
            raise ValueError(f"step {n} is negative")
        if int(n) != self._step:
            if self._ops is not None:
                self._ops.step_ends()
            if self.sink is not None:
                self.sink.end_step()
            if self._held:
                self._held.clear()
        self._step = int(n)

    def next_step(self):
        """Ends the step without an update: records ``grad/*``, then advances the step."""
        if self._ops is not None:
            self._ops.step_ends()
        self._record_grads()
        self._advance()

    def remove(self):
        """Detaches every hook; nothing more is recorded (records still on a device are handed
        to the writer). Removing twice does nothing."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._evidence_sink is not None:
            self._outside_first()
            _evidence.detach(self._evidence_sink)
            self._evidence_sink = None
            # The facts of causes (an any-source receive, an unseeded numpy Generator), each
            # with the program's line (src/compare/cause.rs).
            for key, value in _evidence.facts().items():
                try:
                    self._writer.add_environment(key, value)
                except Exception:
                    pass  # a writer already closed: the facts are evidence, never a failure
        if self._ops is not None:
            self._ops.remove()
            self._ops = None
        if self.sink is not None:
            self.sink.close()

    def paused(self, hook):
        """``hook``, made invisible to the operator trace: the engine's own conversions are no
        operators of the model."""
        ops = self._ops
        if ops is None:
            return hook

        def paused_hook(*args):
            ops.pause()
            try:
                return hook(*args)
            finally:
                ops.resume()

        return paused_hook

    def _outside_first(self):
        """The values that entered torch since the last record: their ``data/outside``
        records, before the next record (``_core.evidence.flush_outside``)."""
        if self._evidence_sink is not None:
            _evidence.flush_outside()

    def model_forward_begins(self, module, args, kwargs):
        """The model's forward begins: the step's evidence at its first forward, then
        ``in/(model).N`` when inputs are recorded."""
        if _OUTSIDE:
            self._outside_first()
        if self._evidence_sink is not None and self._stamped != self._step:
            self._stamped = self._step
            for name, state in _evidence.step_starts():
                self._evidence(name, state, None)
        if self._inputs:
            self.record_inputs(module, args, kwargs)

    def first_call_began(self, module, args, kwargs):
        """The model's call during which the recording began (zero-change recording starts in
        the model's first forward pre-hook): its pre-hooks were collected before this
        recording's were added, so they run here: ``model_forward_begins``, then the operator
        trace's (a window on the model itself, in step 0, opens in this call)."""
        self.paused(self.model_forward_begins)(module, args, kwargs)
        if self._ops is not None:
            self._ops.call_began(module, args, kwargs)

    def _record_initial_parameters(self):
        # When the recording starts, before any forward: inside one, a sharded model's
        # parameters are gathered views that the wrapper frees again (FSDP1).
        trainable = self._frontend.trainable
        initial = [
            ("init/" + label[len("param/") :], param)
            for label, param in self._param_labels
            if trainable(param)
        ]
        self.sink.put_state(self._step, initial, self.replicated)

    def _evidence(self, name, array, where):
        """One record of evidence at the current step, its line as ``site:<step>:<name>:<k>``."""
        step = self._step
        k = self._evidence_counts.get((step, name), 0)
        self._evidence_counts[(step, name)] = k + 1
        self._writer.record(step, name, array)
        if where is not None:
            self._writer.add_environment(f"site:{step}:{name}:{k}", where)

    def record_inputs(self, module, args, kwargs):
        """``in/(model).N``: the model's tensor arguments, then its keyword arguments."""
        for value in (tuple(args), kwargs):
            for name, tensor in self._frontend.outputs(f"in/{ROOT}", value):
                self.sink.put(self._step, name, tensor, False, False)
                if self._held is not None:
                    self._hold(tensor)
        return None

    def _module_inputs(self, label):
        """The pre-hook of ``in/<module>.N``: the call's tensor arguments that no record of
        the step holds as they are now."""
        outputs = self._frontend.outputs

        def hook(module, args, kwargs):
            if _OUTSIDE:
                self._outside_first()
            put, step = self.sink.put, self._step
            for value in (tuple(args), kwargs):
                for name, tensor in outputs(label, value):
                    if not self._holds(tensor):
                        put(step, name, tensor, False, False)
                        self._hold(tensor)

        return hook

    def _hold(self, tensor):
        try:
            ref = weakref.ref(tensor)
        except TypeError:  # a tensor type without weak references: held until the step ends

            def ref(tensor=tensor):
                return tensor

        self._held[id(tensor)] = (ref, getattr(tensor, "_version", None))

    def _holds(self, tensor):
        held = self._held.get(id(tensor))
        return (
            held is not None
            and held[0]() is tensor
            and held[1] == getattr(tensor, "_version", None)
        )

    def _forward(self, label):
        outputs = self._frontend.outputs

        def hook(module, inputs, output):
            if _OUTSIDE:
                self._outside_first()
            put, step = self.sink.put, self._step
            for name, tensor in outputs(label, output):
                put(step, name, tensor, False, False)
                if self._held is not None:
                    self._hold(tensor)

        return hook

    def _record_loss(self, module, args, output):
        if _OUTSIDE:
            self._outside_first()
        loss = self._frontend.loss_of(output)
        if loss is not None:
            self._loss_step = self._step
            self.sink.put(self._step, "loss", loss, False, False)

    def _record_backward_loss(self, tensor):
        """``loss`` of a script whose model does not return it: the scalar its ``backward()``
        starts from (each one of a step, with gradient accumulation)."""
        if self._loss_step == self._step or tensor.dim() != 0 or not tensor.is_floating_point():
            return
        self.sink.put(self._step, "loss", tensor.detach(), False, False)

    @property
    def updated_alike(self):
        """Whether this step's ``grad/*`` and ``param/*`` (and an end state after it) are
        replicated: the recording's rule, unless the last update ran on unsynced gradients."""
        return self.replicated and self._synced

    def _record_grads(self):
        if self.sink is None or "grad" not in self._records:
            return
        if _OUTSIDE:
            self._outside_first()
        gradient = self._frontend.gradient
        grads = [(label, gradient(param)) for label, param in self._grad_labels]
        grads = [(label, grad) for label, grad in grads if grad is not None]
        self.sink.put_state(self._step, grads, self.updated_alike)

    def end_backward(self):
        """The step's forward and backward are over, its update is next: records ``grad/*``."""
        self.pending_update = False
        if self._ops is not None:
            self._ops.step_ends()
        if self._sync is not None:
            try:
                self._synced = bool(self._sync())
            except Exception:
                self._synced = True
        self._record_grads()
        if self._ops is not None:
            self._ops.before_update()

    def after_update(self):
        """The update is done: records ``param/*`` and ends the step."""
        if self.pending_update:  # an optimizer that never called its closure
            self.end_backward()
        if self._ops is not None:
            self._ops.after_update()
        if "param" in self._records:
            self._record_params(self._step)
        self._advance()

    def _record_params(self, step, prefix="param/"):
        """``param/*`` (``prefix``) at ``step``: the trainable parameters as they are now."""
        if self.sink is None:
            return
        if _OUTSIDE:
            self._outside_first()
        trainable = self._frontend.trainable
        # Looked up again by name: a parameter the model is called with now may be another
        # tensor than when the recording began (`torch.func.functional_call` swaps in the
        # program's own dict of parameters for each call, and the update makes a new one).
        now = dict(self._frontend.parameters(self._model))
        params = [
            (label, now.get(label[len("param/") :], param)) for label, param in self._param_labels
        ]
        params = [
            (prefix + label[len("param/") :], param) for label, param in params if trainable(param)
        ]
        self.sink.put_state(step, params, self.updated_alike)

    def record_end_state(self, step_open):
        """The end state, when the recording ends (after the last step, or at exit):
        ``end/<param>``, the trainable parameters as they are then, at the last update's step
        (``step_open``: at the current step, which holds records already: a step's records are
        written in order). Every zero-change recording ends with it, so a recorded run's end
        state and an unperturbed run's (``DETCHECK_RECORD=end``, which reads nothing else) are
        read at the same moment of the program; nothing when no update happened."""
        if self._step > self._start:
            self._record_params(self._step if step_open else self._step - 1, "end/")

    def _advance(self):
        self._step += 1
        if self._held:
            self._held.clear()
        if self.sink is not None:
            self.sink.end_step()


_H = TypeVar("_H", bound="Handle")


class Handle:
    """The hooks of one ``watch`` (module doc): the step counter, ``step(n)``, ``remove()``.

    Also a context manager that removes the hooks when the block ends.
    """

    def __init__(self, recording: Recording, hooks: list[Removable]) -> None:
        self._recording = recording
        self._hooks = hooks

    @property
    def current_step(self) -> int:
        """The step the next records belong to."""
        return self._recording.current_step

    @property
    def replicated(self) -> bool:
        """Whether ``grad/*`` and ``param/*`` are recorded as replicated."""
        return self._recording.replicated

    def step(self, n: int) -> None:
        """The records that follow belong to step ``n``."""
        self._recording.step_to(n)

    def remove(self) -> None:
        """Detaches every hook; nothing more is recorded (records still on a device are handed
        to the writer). Removing twice does nothing."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self._recording.remove()

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.remove()
        return False
