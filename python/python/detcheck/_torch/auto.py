"""Zero-change recording: the recorder the start-up hook (``detcheck._launch.startup``) starts in a
rank's process once torch is imported, which records a PyTorch program that never imports
detcheck (python/README.md, "Zero-change recording", is the long form).

``Recorder`` works through torch's global hooks: the model is the first module with parameters whose
forward runs at the top level (looked through its wrappers: ``_torch.tensors.unwrap_model``); from
then on an ``_core.engine.Recording`` records it, with ``in/(model).N`` and ``loss`` besides
``watch``'s records. A step ends at every ``torch.optim.Optimizer.step()`` (torch's global optimizer
hooks; a step whose closure runs the model's first forward, LBFGS's, records that closure's
gradients: ``_Begins``), once, when the outermost step around it returns (a wrapper that steps it
once a parameter group and then writes the model, DeepSpeed's ZeRO optimizer; another torch
optimizer: ``_torch.frontend.after_optimizer_step``), or, in a loop that made no optimizer by its
first backward, at the model's next forward after a backward (the rhythm; ``torch.func`` loops too:
their ``functional_call`` runs the model's forward, ``grad`` its backward). A program that steps an
optimizer (without a closure) before any module ran forward through its call (it calls
``forward`` itself) is recorded from that step on, the model being the module around the step
that holds the optimizer's parameters: gradients and parameters, no forward records. In a run of the
``batch_sizes`` check (``DETCHECK_RECORD=rows``) each call of the model is a batch whose samples
``_torch.rows.RowsSink`` writes, a sample a step. ``DETCHECK_STOP_AFTER`` = N ends the process after
the N-th step (``os._exit`` after a barrier). The trace is finished at interpreter exit and on
SIGTERM. The recorder stands down when the program records itself (the native ``_program_records``
channel); forked and multiprocessing children never record. That life, the same for MindSpore's
recorder, is ``_core.lifecycle.LifecycleRecorder``'s; this module adds torch's hooks and how they
find the model and the steps.

Determinism: the records are the engine's; what is recorded depends only on what the program
runs. Limits: eager modules (a compiled module's inner modules run no hooks), one model.
"""

import sys

import torch
from torch.nn.modules import module as _module
from torch.optim import optimizer as _optimizer

from .._core.engine import Recording
from .._core.lifecycle import LifecycleRecorder
from . import rows as _rows
from .frontend import (
    TORCH,
    after_optimizer_step,
    before_optimizer_step,
    closure_of,
    describe_run,
    shut_down_loader_workers,
    starts_update,
    synchronous,
)
from .tensors import (
    MODULE_HOOKS,
    Hook,
    compiled_part,
    gradient_sync,
    keep_hooks_out_of_torchscript,
    leaves,
    replicated_records,
    sharded_by,
    unwrap_model,
)

__all__ = ["start", "Recorder"]

#: The running recorder of this process (``start``), or ``None``.
_recorder = None


def _has_parameters(module):
    return next(iter(module.parameters()), None) is not None


class Recorder(LifecycleRecorder):
    """The zero-change recorder of one rank (module doc). ``recorded``: whether it opened its
    trace; ``finish(why)`` closes it."""

    def __init__(self, state):
        super().__init__(state)
        self._forward_hooks = []
        self._step_hooks = []
        #: How steps end: ``undecided`` until the first update, then ``optimizer`` (a torch
        #: optimizer's step) or ``rhythm`` (a backward, then the model's next forward: a loop
        #: that updates its parameters by hand).
        self._mode = "undecided"
        #: Hooks on the model for the rhythm (removed with the handle's).
        self._model_hooks = []
        #: A backward through the model ended since its last forward began.
        self._backward_seen = False
        #: A callback at the end of the running backward is queued.
        self._callback_queued = False
        #: The hooks on the model that begin and end a batch (``DETCHECK_RECORD=rows``).
        self._batch_hooks = []
        #: Whether a step with no model found yet looked for its optimizer's module.
        self._owner_sought = False

    def _install_hooks(self):
        self._forward_hooks = [
            _module.register_module_forward_pre_hook(Hook(self._pre_forward)),
            _module.register_module_forward_hook(Hook(self._post_forward), always_call=True),
        ]
        self._step_hooks = [
            _optimizer.register_optimizer_step_pre_hook(self._before_step),
            _optimizer.register_optimizer_step_post_hook(self._after_step),
        ]

    def _remove_forward_hooks(self):
        for hook in self._forward_hooks:
            hook.remove()
        self._forward_hooks = []

    def _pre_forward(self, module, args):
        depth = self._depth
        self._depth += 1
        if depth == 0 and self.status == "waiting" and _has_parameters(module):
            self._start(module, args)
        return None

    def _post_forward(self, module, args, output):
        self._depth = max(0, self._depth - 1)
        return None

    def _start(self, root, args):
        """The recording of ``root`` begins: in its first call (``args``, its positional
        arguments), or at an optimizer's step (``None``: ``_module_stepped_by``)."""
        self._remove_forward_hooks()
        model, ddp = unwrap_model(root)
        self._writer = self._open_writer()
        if self._writer is None:
            return
        describe_run(self._writer)
        sharded = sharded_by(root)
        if sharded is not None:
            self._writer.add_environment("detcheck.sharded", sharded)
        compiled = compiled_part(root)
        if compiled is not None:
            # The cause of a divergence inside it cannot be traced (src/compare/cause.rs).
            self._writer.add_environment("site:compiled", compiled)
            # TorchDynamo runs eagerly around global module hooks: the hooks go on the modules.
            MODULE_HOOKS.on_modules = True
        recording = Recording(
            TORCH,
            model,
            self._writer,
            replicated_records(ddp, self._writer.world_size),
            self._steps,
            updates=True,
            synced=gradient_sync(root),
            **self._recording_kinds(inputs=True, loss=True),
        )
        self._begin(recording)
        self._model_hooks = [
            MODULE_HOOKS.before(model, self._rhythm_before_forward, first=True),
            MODULE_HOOKS.after(model, self._rhythm_after_forward),
        ]
        if self._state.rows:
            # The `batch_sizes` check: each call of the model is a batch (or of `generate`,
            # `_launch.startup`), whose samples `RowsSink` writes when it ends.
            sink = recording.sink = _rows.RowsSink(recording.sink, self._writer)
            self._batch_hooks = [
                MODULE_HOOKS.before(model, self._batch_begins, with_kwargs=True, first=True),
                MODULE_HOOKS.after(model, self._batch_ends),
                # The drill-down's re-run: one module call's operators (DETCHECK_ROWS_INSIDE).
                *_rows.Inside.install(model, sink, self._writer, MODULE_HOOKS),
            ]
        if model is root and args is not None:
            # This call's pre-hooks were collected before the handle's was added: its evidence
            # and inputs are recorded here. A global pre-hook is not given the keyword
            # arguments; they are the calling `Module._call_impl`'s own `kwargs`.
            kwargs = _call_kwargs()
            if self._state.rows:
                self._batch_begins(root, args, kwargs)
                if _rows.Inside.current is not None:
                    _rows.Inside.current.first_call(root, args, kwargs)
            self._handle.first_call_began(root, args, kwargs)

    def _batch_begins(self, module, args, kwargs):
        _rows.BATCHES.begin(*_rows.batch_of(args, kwargs))

    def _batch_ends(self, module, args, output):
        _rows.BATCHES.end()

    def _before_step(self, optimizer, args, kwargs):
        self._optimizer_steps()
        if not starts_update(optimizer):
            return None
        if self.status == "recording":
            return before_optimizer_step(self._handle, optimizer, args, kwargs)
        closure = closure_of(optimizer, args, kwargs)
        if self.status == "waiting" and not self._owner_sought and closure is None:
            # A step, without a closure, before any module with parameters ran forward through
            # its call: the program calls `forward` itself (pytorch/examples'
            # mnist_forward_forward), so no module hook ran. The model is the module around
            # this call that holds the optimizer's parameters, looked for once.
            self._owner_sought = True
            owner = _module_stepped_by(optimizer)
            if owner is not None:
                self._start(owner, None)
            if self.status == "recording":
                return before_optimizer_step(self._handle, optimizer, args, kwargs)
        if self.status == "waiting":
            # A step before the model's first forward: with a closure (LBFGS), the recording
            # begins inside it, and the gradients it computes are the first step's.
            return before_optimizer_step(_Begins(self), optimizer, args, kwargs)
        return None

    def _optimizer_steps(self):
        """A torch optimizer steps: it ends the steps from now on."""
        if self._mode != "optimizer":
            self._mode = "optimizer"
            self._remove_model_hooks()

    def _remove_model_hooks(self):
        for hook in self._model_hooks:
            hook.remove()
        self._model_hooks = []

    # The rhythm of a loop without a torch optimizer (module doc, "Steps"). Each part catches
    # its own failure: a hook of the recorder never raises into the program.

    def _rhythm_after_forward(self, module, args, output):
        """Hooks the model's outputs, to learn when a backward through them ends."""
        try:
            if self._mode == "optimizer" or self.status != "recording":
                return None
            if not torch.is_grad_enabled():
                return None
            for _, tensor in leaves("", output):
                if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                    tensor.register_hook(self._output_grad)
        except Exception as e:
            self._say_once(f"cannot follow the backward of the model: {e!r}")
        return None

    def _output_grad(self, grad):
        # The backward through the model has begun: a callback at its end (queued twice, so
        # that it runs after DistributedDataParallel's own, which is queued later and
        # finishes the gradients' allreduce).
        if not self._callback_queued:
            self._callback_queued = True
            engine = torch.autograd.Variable._execution_engine
            engine.queue_callback(lambda: engine.queue_callback(self._backward_ended))
        return None

    def _backward_ended(self):
        self._callback_queued = False
        try:
            if self._mode == "optimizer" or self.status != "recording":
                return
            if self._mode == "undecided":
                # The first backward: a program that made a torch optimizer steps it (perhaps
                # after several backwards: gradient accumulation); one that made none updates
                # its parameters by hand.
                if _an_optimizer_exists():
                    self._optimizer_steps()
                    return
                self._mode = "rhythm"
            self._backward_seen = True
            self._handle.end_backward()
        except Exception as e:
            self._say_once(f"cannot record the gradients at the end of backward: {e!r}")

    def _rhythm_before_forward(self, module, args):
        """The model's next forward after a backward ends a step of a loop without an
        optimizer: the parameters are recorded (the update is done), the step advances, and
        the program ends after the N-th step when asked."""
        if not self._backward_seen or self._mode == "optimizer" or self.status != "recording":
            return None
        try:
            self._backward_seen = False
            self._record_update()
        except Exception as e:
            self._say_once(f"cannot end the step at the model's forward: {e!r}")
            return None
        self._count_step()
        return None

    def _after_step(self, optimizer, args, kwargs):
        self._optimizer_steps()
        after_optimizer_step(optimizer, self._update_done)

    def _update_done(self):
        """The update is done (after the wrapper's step that encloses the optimizer's, if any:
        ``frontend.after_optimizer_step``): the parameters are recorded, the step ends."""
        if self.status == "recording":
            self._record_update()
        self._count_step()

    def _before_exit(self):
        shut_down_loader_workers()
        dist = getattr(torch, "distributed", None)
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                dist.barrier()
                dist.destroy_process_group()
        except Exception:
            pass

    def _remove_hooks(self):
        self._remove_forward_hooks()
        for hook in self._step_hooks:
            hook.remove()
        self._step_hooks = []
        self._remove_model_hooks()
        self._remove_batch_hooks()

    def _remove_batch_hooks(self):
        for hook in self._batch_hooks:
            hook.remove()
        self._batch_hooks = []

    def _remove_hooks_at_finish(self):
        # The optimizer's step hooks stay (they count the steps, and record nothing more).
        self._remove_forward_hooks()
        self._remove_model_hooks()
        self._remove_batch_hooks()

    def _forget_hooks(self):
        self._forward_hooks = []
        self._step_hooks = []
        self._model_hooks = []
        self._batch_hooks = []

    def _synchronous(self):
        return synchronous()

    def _nothing_ran(self):
        if self._steps:
            return (
                f"torch was imported and {self._steps} optimizer step(s) ran, but no "
                "torch.nn.Module with parameters ran forward: nothing to record"
            )
        return (
            "torch was imported, but no torch.nn.Module with parameters ran forward and no "
            "optimizer stepped: nothing to record"
        )


class _Begins:
    """The recording of a step whose closure runs the model's first forward (the recording
    begins inside it), for ``before_optimizer_step``: the gradients are recorded when the
    closure first returns, if the recording began by then."""

    def __init__(self, recorder):
        self._recorder = recorder
        self.pending_update = False

    def end_backward(self):
        self.pending_update = False
        if self._recorder.status == "recording":
            self._recorder._handle.end_backward()


#: How many calls around an optimizer's step ``_module_stepped_by`` looks through.
_OWNER_DEPTH = 32


def _module_stepped_by(optimizer):
    """The module whose parameters ``optimizer`` updates, among the local variables of the calls
    around its step (a layer's ``self`` that steps its own optimizer): the outermost that holds
    all of them, or ``None``."""
    try:
        wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
        frame = sys._getframe(2)
    except Exception:
        return None
    found = None
    for _ in range(_OWNER_DEPTH):
        if frame is None or not wanted:
            break
        for value in list(frame.f_locals.values()):
            if isinstance(value, torch.nn.Module) and value is not found:
                if wanted <= {id(p) for p in value.parameters()}:
                    found = value
        frame = frame.f_back
    return found


def _an_optimizer_exists():
    """Whether the program made a ``torch.optim.Optimizer`` (asked once, at the end of the
    first backward through the model, before any optimizer stepped)."""
    import gc

    return any(isinstance(o, torch.optim.Optimizer) for o in gc.get_objects())


def start(state):
    """Starts the recorder of this rank (``_launch.startup`` calls it once torch is imported)."""
    global _recorder
    # Before the program's `from torch.jit import script`: its hooks stay out of TorchScript.
    keep_hooks_out_of_torchscript()
    _recorder = Recorder(state)
    _recorder.install()
    return _recorder


def _call_kwargs():
    """The keyword arguments of the module call whose global pre-hook is running: the calling
    ``Module._call_impl``'s own ``kwargs`` (its ``inner`` closure's, where hooks are set), found
    by name among the callers (a hook's own wrappers, ``Hook``, lie between); ``{}`` if none."""
    frame = sys._getframe(1)
    for _ in range(12):
        if frame is None:
            break
        if frame.f_code.co_name in ("inner", "_call_impl"):
            kwargs = frame.f_locals.get("kwargs")
            if isinstance(kwargs, dict):
                return kwargs
        frame = frame.f_back
    return {}
