"""Zero-change recording: the recorder the start-up hook (``detcheck._startup``) starts in a
rank's process once torch is imported, which records a PyTorch program that never imports
detcheck (python/README.md, "Zero-change recording", is the long form).

``Recorder`` works through torch's global hooks: the model is the first module with parameters
whose forward runs at the top level (looked through its wrappers: ``_tensors.unwrap_model``);
from then on an ``_engine.Recording`` records it, with ``in/(model).N`` and ``loss`` besides
``watch``'s records. A step ends at every ``torch.optim.Optimizer.step()`` (torch's global
optimizer hooks), or, in a loop that made no optimizer by its first backward, at the model's
next forward after a backward (the rhythm). ``DETCHECK_STOP_AFTER`` = N ends the process after
the N-th step (``os._exit`` after a barrier). The trace is finished at interpreter exit and on
SIGTERM. The recorder stands down when the program records itself (the native
``_program_records`` channel); forked and multiprocessing children never record.

Determinism: the records are the engine's; what is recorded depends only on what the program
runs. Limits: eager modules (a compiled module's inner modules run no hooks), one model.
"""

import os
import signal
import sys

import torch
from torch.nn.modules import module as _module
from torch.optim import optimizer as _optimizer

from ._detcheck import TraceWriter, _on_program_records, _program_records_itself
from ._engine import Recording
from ._tensors import Hook, compiled_part, leaves, replicated_records, unwrap_model
from ._torch_frontend import TORCH, before_optimizer_step, describe_run

__all__ = ["start", "Recorder"]

#: The running recorder of this process (``start``), or ``None``.
_recorder = None


def _has_parameters(module):
    return next(iter(module.parameters()), None) is not None


class Recorder:
    """The zero-change recorder of one rank (module doc). ``recorded``: whether it opened its
    trace; ``finish(why)`` closes it."""

    def __init__(self, state):
        self._state = state
        #: ``waiting`` (no model yet), ``recording``, ``finished`` or ``stood down``.
        self.status = "waiting"
        self.recorded = False
        self._depth = 0
        self._steps = 0
        self._writer = None
        self._handle = None
        self._forward_hooks = []
        self._step_hooks = []
        self._stood_down_because = None
        #: The writer's record count when the last step ended (more at exit: a step is open).
        self._records_before_step = 0
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

    def install(self):
        self._forward_hooks = [
            _module.register_module_forward_pre_hook(Hook(self._pre_forward)),
            _module.register_module_forward_hook(Hook(self._post_forward), always_call=True),
        ]
        self._step_hooks = [
            _optimizer.register_optimizer_step_pre_hook(self._before_step),
            _optimizer.register_optimizer_step_post_hook(self._after_step),
        ]
        _on_program_records(self.stand_down)
        os.register_at_fork(after_in_child=self._forked)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            try:
                signal.signal(signal.SIGTERM, self._terminated)
            except ValueError:  # not the main thread
                pass

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
        self._remove_forward_hooks()
        import multiprocessing

        if multiprocessing.parent_process() is not None:
            self.stand_down("a multiprocessing child is no rank")
            return
        if _program_records_itself():
            self.stand_down("the program records itself")
            return
        model, ddp = unwrap_model(root)
        self._writer = TraceWriter._for_recorder()
        if self._writer is None:
            self.stand_down("not launched by detcheck")
            return
        describe_run(self._writer)
        compiled = compiled_part(root)
        if compiled is not None:
            # The cause of a divergence inside it cannot be traced (src/compare/cause.rs).
            self._writer.add_environment("site:compiled", compiled)
        self._handle = Recording(
            TORCH,
            model,
            self._writer,
            replicated_records(ddp, self._writer.world_size),
            self._steps,
            updates=True,
            inputs=True,
            loss=True,
        )
        self.status = "recording"
        self.recorded = True
        self._model_hooks = [
            model.register_forward_pre_hook(Hook(self._rhythm_before_forward), prepend=True),
            model.register_forward_hook(Hook(self._rhythm_after_forward)),
        ]
        if model is root:
            # This call's pre-hooks were collected before the handle's was added: its evidence
            # and inputs are recorded here. A global pre-hook is not given the keyword
            # arguments; they are the calling `Module._call_impl`'s own `kwargs`.
            caller = sys._getframe(2).f_locals.get("kwargs")
            kwargs = caller if isinstance(caller, dict) else {}
            self._handle.paused(self._handle.model_forward_begins)(root, args, kwargs)

    def _before_step(self, optimizer, args, kwargs):
        self._optimizer_steps()
        if self.status == "recording":
            return before_optimizer_step(self._handle, optimizer, args, kwargs)
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
            _say_once(self, f"cannot follow the backward of the model: {e!r}")
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
            _say_once(self, f"cannot record the gradients at the end of backward: {e!r}")

    def _rhythm_before_forward(self, module, args):
        """The model's next forward after a backward ends a step of a loop without an
        optimizer: the parameters are recorded (the update is done), the step advances, and
        the program ends after the N-th step when asked."""
        if not self._backward_seen or self._mode == "optimizer" or self.status != "recording":
            return None
        try:
            self._backward_seen = False
            self._handle.after_update()
            self._records_before_step = self._writer.num_records
            self._steps += 1
        except Exception as e:
            _say_once(self, f"cannot end the step at the model's forward: {e!r}")
            return None
        stop_after = self._state.stop_after
        if stop_after is not None and self._steps >= stop_after:
            self._end_program()
        return None

    def _after_step(self, optimizer, args, kwargs):
        self._optimizer_steps()
        if self.status == "recording":
            self._handle.after_update()
            self._records_before_step = self._writer.num_records
        self._steps += 1
        stop_after = self._state.stop_after
        if self.status == "recording" and stop_after is not None and self._steps >= stop_after:
            self._end_program()

    def _end_program(self):
        """The N-th step is recorded: finish the trace, end the process with status 0."""
        self.finish(None)
        self._state.forget_rank_files()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        dist = getattr(torch, "distributed", None)
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                dist.barrier()
                dist.destroy_process_group()
        except Exception:
            pass
        os._exit(0)

    def finish(self, why):
        """Closes the trace (``why``: ``None`` after the last step, ``"exit"`` at interpreter
        exit, ``"SIGTERM"``): a step still open is marked in the environment."""
        self._remove_forward_hooks()
        if self.status != "recording":
            return
        self.status = "finished"
        handle, writer = self._handle, self._writer
        self._remove_model_hooks()
        handle.remove()
        if why is not None and writer.num_records > self._records_before_step:
            writer.add_environment(
                "detcheck.recording", f"ended during step {handle.current_step} ({why})"
            )
        writer.close()

    def stand_down(self, why):
        """The program records itself (or this process is no rank): remove every hook, drop
        the writer unfinished."""
        if self.status == "stood down":
            return
        self._stood_down_because = why
        previous, self.status = self.status, "stood down"
        self._remove_forward_hooks()
        for hook in self._step_hooks:
            hook.remove()
        self._step_hooks = []
        self._remove_model_hooks()
        if previous == "recording":
            self._handle.remove()
            self._writer.abort()
        self.recorded = False

    def _forked(self):
        # A forked child (a data-loader worker) holds a copy of the writer without its thread:
        # it records nothing and never touches the writer (the parent's file is the trace).
        self.status = "stood down"
        self._stood_down_because = "a forked child is no rank"
        self._writer = None
        self._handle = None
        self._forward_hooks = []
        self._step_hooks = []
        self._model_hooks = []
        self.recorded = False

    def _terminated(self, signum, frame):
        self.finish("SIGTERM")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def why_nothing(self):
        """Why this rank recorded nothing, for the no-records note."""
        if self._stood_down_because is not None:
            return f"recorded nothing: {self._stood_down_because}"
        if self._steps:
            return (
                f"torch was imported and {self._steps} optimizer step(s) ran, but no "
                "torch.nn.Module with parameters ran forward: nothing to record"
            )
        return (
            "torch was imported, but no torch.nn.Module with parameters ran forward and no "
            "optimizer stepped: nothing to record"
        )


def _an_optimizer_exists():
    """Whether the program made a ``torch.optim.Optimizer`` (asked once, at the end of the
    first backward through the model, before any optimizer stepped)."""
    import gc

    return any(isinstance(o, torch.optim.Optimizer) for o in gc.get_objects())


def _say_once(recorder, message):
    if getattr(recorder, "_said", False):
        return
    recorder._said = True
    try:
        sys.stderr.write(f"detcheck: {message}\n")
    except Exception:
        pass


def start(state):
    """Starts the recorder of this rank (``_startup`` calls it once torch is imported)."""
    global _recorder
    _recorder = Recorder(state)
    _recorder.install()
    return _recorder
