"""Zero-change recording: the recorder the start-up hook (``detcheck._startup``) starts in a
rank's process once torch is imported, which records a PyTorch program that never imports
detcheck, with the records and names of ``detcheck.torch.watch``.

How it finds what to record (``Recorder``), through torch's global hooks:

- The model: the first module with parameters whose forward runs while no other module's does
  (a global forward pre-hook counts the depth). A ``DistributedDataParallel``,
  ``DataParallel`` or ``FullyShardedDataParallel`` wrapper is looked through (``.module``), as is
  ``torch.compile``'s ``OptimizedModule`` (``._orig_mod``), so the names are the model's own at
  every world size. From then on that model is recorded by ``detcheck.torch.WatchHandle``, the
  class ``watch`` uses (one implementation), with two more records: ``in/(model).N`` (its
  tensor arguments, then its keyword arguments by name: a data-order divergence shows there)
  and ``loss`` (the ``loss`` its output carries: Hugging Face models). The global forward hooks
  are removed once the model is found: recording then costs what ``watch`` costs. Other
  top-level models (a GAN's second network, a teacher) are not recorded; ``watch`` records them.
- Steps: every ``torch.optim.Optimizer.step()`` that runs, through torch's global optimizer
  hooks, ends a step (``grad/*`` before the update, ``param/*`` after). A framework's wrapper
  (accelerate, Lightning) steps the torch optimizer inside it, where the hook fires, so a step
  is an update: an accumulation micro-batch or a step that ``GradScaler`` skips ends none. With
  several optimizers each one's step ends a step (a GAN's two updates are two steps).
- Replicated records: ``grad/*`` and ``param/*`` are recorded as replicated when the model is
  wrapped in ``DistributedDataParallel`` or the world has one rank, so ``replicas`` and
  ``world_sizes`` check them without a flag.
- Stop: with ``DETCHECK_STOP_AFTER`` = N (``--steps N``; the default of ``detcheck check --
  PROGRAM``), after the N-th step's records the trace is finished and the process ends with
  status 0 (``os._exit``, after a barrier and ``destroy_process_group`` when torch.distributed
  is initialized, so no rank leaves a peer inside a collective): the rest of the program does
  not run. ``--run-to-end`` (``params.stop_after_steps: false``) lets it run to its end.
- Exit: the trace is finished at interpreter exit, however the program ends (a return, an
  exception, ``sys.exit``), and on SIGTERM (torchrun's way to stop a rank when a peer failed)
  when the program has no handler of its own; a rank that ends during a step gets the
  environment entry ``detcheck.recording`` = ``ended during step S`` (that step's records are
  partial). detcheck reports a rank that exits non-zero as a failed run with its status, never
  as a divergence. A SIGKILL leaves no trace.

Standing down: the program records itself when it calls ``TraceWriter.from_env()`` (or
``from_env_for_rank``), ``detcheck.torch.watch``, or a framework callback of detcheck's; then
the recorder removes its hooks and drops its writer unfinished, if it had opened one, and the
program's own trace is the rank's. Processes that are not a rank's main process (torchrun's
agent, data-loader workers, forked or spawned) never record (``_startup`` and ``_forked``).

Determinism: the records are ``watch``'s; what is recorded depends only on what the program
runs. Limits: eager modules (a compiled module's inner modules run no hooks: only its output is
recorded), one model.
"""

import os
import signal
import sys

import torch
from torch.nn.modules import module as _module
from torch.optim import optimizer as _optimizer

from ._detcheck import TraceWriter, _on_program_writer, _program_opened_writer
from .torch import WatchHandle, _add_versions

__all__ = ["start", "stand_down", "Recorder"]

#: The wrappers looked through to the model, and the attribute that holds it.
_WRAPPED = (("module", "DistributedDataParallel"), ("module", "DataParallel"),
            ("module", "FullyShardedDataParallel"), ("_orig_mod", "OptimizedModule"))

#: The running recorder of this process (``start``), or ``None``.
_recorder = None


def _unwrap(root):
    """The model inside ``root``'s wrappers, and whether one was DistributedDataParallel."""
    ddp = False
    for _ in range(8):
        for attr, cls in _WRAPPED:
            if type(root).__name__ == cls and isinstance(getattr(root, attr, None), torch.nn.Module):
                ddp = ddp or cls == "DistributedDataParallel"
                root = getattr(root, attr)
                break
        else:
            return root, ddp
    return root, ddp


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

    def install(self):
        self._forward_hooks = [
            _module.register_module_forward_pre_hook(self._pre_forward),
            _module.register_module_forward_hook(self._post_forward, always_call=True),
        ]
        self._step_hooks = [
            _optimizer.register_optimizer_step_pre_hook(self._before_step),
            _optimizer.register_optimizer_step_post_hook(self._after_step),
        ]
        _on_program_writer(lambda: self.stand_down("the program opened its own trace writer"))
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
        if _program_opened_writer():
            self.stand_down("the program opened its own trace writer")
            return
        model, ddp = _unwrap(root)
        self._writer = TraceWriter._for_recorder()
        if self._writer is None:
            self.stand_down("not launched by detcheck")
            return
        _add_versions(self._writer)
        replicated = ddp or self._writer.world_size == 1
        self._handle = WatchHandle(
            model, self._writer, None, replicated, self._steps,
            inputs=True, loss=True, updates="caller",
        )
        self.status = "recording"
        self.recorded = True
        if model is root:
            # This call's pre-hooks were collected before the handle's was added: its inputs
            # are recorded here. A global pre-hook is not given the keyword arguments; they
            # are the calling `Module._call_impl`'s own `kwargs`.
            caller = sys._getframe(2).f_locals.get("kwargs")
            kwargs = caller if isinstance(caller, dict) else {}
            self._handle._paused(self._handle._record_inputs)(root, args, kwargs)

    def _before_step(self, optimizer, args, kwargs):
        if self.status == "recording":
            return self._handle._before_update(optimizer, args, kwargs)
        return None

    def _after_step(self, optimizer, args, kwargs):
        if self.status == "recording":
            self._handle._after_update(optimizer, args, kwargs)
            self._records_before_step = self._writer.num_records
        self._steps += 1
        stop_after = self._state.stop_after
        if self.status == "recording" and stop_after is not None and self._steps >= stop_after:
            self._end_program()

    def _end_program(self):
        """The N-th step is recorded: finish the trace, end the process with status 0."""
        self.finish(None)
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


def start(state):
    """Starts the recorder of this rank (``_startup`` calls it once torch is imported)."""
    global _recorder
    _recorder = Recorder(state)
    _recorder.install()
    return _recorder


def stand_down(why):
    """The program records itself: the recorder of this process, if any, stands down."""
    if _recorder is not None:
        _recorder.stand_down(why)
