"""Zero-change recording of a MindSpore program: the recorder the start-up hook
(``detcheck._launch.startup``) starts in a rank's process once ``mindspore`` is imported, which
records a MindSpore script that never imports detcheck (docs/mindspore.md is the long form).

``Recorder`` follows PyTorch's rules (``detcheck._torch.auto``), through what MindSpore offers:

- **The model** is the first ``nn.Cell`` with trainable parameters whose call runs at the top
  level (not inside another cell's), looked through MindSpore's training wrappers
  (``_mindspore.frontend.unwrap_cell``: ``TrainOneStepCell``, ``WithLossCell``...). It is found
  by wrapping ``nn.Cell.__call__`` (the class's, for every cell), a wrapper removed again at the
  end of the first step; from then on an ``_core.engine.Recording`` records it through the cells'
  own forward hooks: ``in/(model).N``, ``fwd/<cell>``, ``grad/<param>``, ``param/<param>``.
- **The loss** is the output of the first loss cell (``nn.LossBase``) that runs outside the
  model in the first step; a forward hook on it records ``loss`` every step.
- **Steps.** Every call of an optimizer (``nn.Optimizer.__call__``, wrapped for the class) is
  one step: the gradients it is given are ``grad/*`` (before it runs), the parameters after it
  are ``param/*``. That covers ``opt(grads)`` after ``ms.value_and_grad``, ``TrainOneStepCell``
  and ``Model.train`` in PyNative mode. ``DETCHECK_STOP_AFTER`` = N ends the process after the
  N-th step (``os._exit(0)``, the trace finished first).
- **Graph mode.** A compiled graph runs no hook and no Python: where the optimizer is called from
  Python (``opt(grads)`` at the top level) its gradients and parameters are recorded; in
  ``Model.train``, a callback added to the call records ``loss`` (the network's output) and the
  parameters at each step end. Forward outputs and inputs are not recorded there, and a step
  compiled whole (``@ms.jit`` around the optimizer's call) records nothing: the rank's note says
  so (docs/mindspore.md).

- **Ranks** (``--launcher msrun``): ``grad/*`` and ``param/*`` are replicated records when the
  ranks hold them alike (``_core.contract.replicated_records``): MindSpore's data-parallel mode, or
  a ``nn.DistributedGradReducer`` called before the first step's optimizer (the gradients it is
  given are then the allreduce's); the loss, inputs and forward outputs are each rank's own.
  After the ``DETCHECK_STOP_AFTER``-th step the rank leaves as at its end (``_before_exit``):
  msrun's scheduler waits for every worker to say goodbye.

The trace is finished at interpreter exit and on SIGTERM; the recorder stands down when the
program records itself (the native ``_program_records`` channel); forked children never record.
That life, the same for torch's recorder, is ``_core.lifecycle.LifecycleRecorder``'s; this module
adds MindSpore's wrappers and how they find the model and the steps. Nothing here raises into
the program: a failure is one ``detcheck:`` line on stderr.

Determinism: the records are the engine's; what is recorded depends only on what the program
runs. Limits: one model; one framework per process (the first imported of torch and MindSpore).
"""

import atexit
import os

from mindspore import nn

from .._core.contract import replicated_records
from .._core.engine import Recording
from .._core.lifecycle import LifecycleRecorder, say
from .frontend import (
    MindSporeFrontEnd,
    data_parallel,
    describe_run,
    has_trainable_parameters,
    is_grad_reducer,
    is_graph_mode,
    is_loss_cell,
    unwrap_cell,
)

__all__ = ["start", "Recorder"]

#: The running recorder of this process (``start``), or ``None``.
_recorder = None


class Recorder(LifecycleRecorder):
    """The zero-change recorder of one MindSpore rank (module doc). ``recorded``: whether it
    opened its trace; ``finish(why)`` closes it."""

    def __init__(self, state):
        super().__init__(state)
        self._frontend = None
        self._model = None
        #: The classes' own ``__call__``s, while wrapped: ``{class: original}``.
        self._patched = {}
        #: Whether the loss cell is still looked for (the first step).
        self._seeking_loss = True
        self._loss_hook = None
        #: An optimizer's call ended a step since the last ``Model.train`` step end.
        self._stepped_by_optimizer = False
        #: Why no step could be seen (graph mode), for the no-records note.
        self._graph_seen = False
        #: A ``DistributedGradReducer`` ran in the first step (data parallel).
        self._reducer_seen = False

    # --- installing and removing ----------------------------------------------------------

    def _install_hooks(self):
        # The optimizer's first: its wrapper calls the cells' own ``__call__``, not theirs.
        self._wrap(nn.Optimizer, self._optimizer_call)
        self._wrap(nn.Cell, self._cell_call)
        self._wrap_model_train()

    def _wrap(self, cls, wrapper):
        original = cls.__dict__.get("__call__")
        inherited = cls.__call__
        recorder = self

        def __call__(cell, *args, **kwargs):
            return wrapper(inherited, cell, args, kwargs)

        __call__._detcheck_recorder = recorder
        self._patched[cls] = original
        cls.__call__ = __call__

    def _unwrap(self, cls):
        if cls not in self._patched:
            return
        original = self._patched.pop(cls)
        try:
            if original is None:
                del cls.__call__
            else:
                cls.__call__ = original
        except Exception:
            pass

    def _wrap_model_train(self):
        try:
            from mindspore.train import Model
        except Exception:
            return
        original = Model.train
        if getattr(original, "_detcheck_recorder", None) is not None:
            return
        recorder = self

        def train(model, epoch, train_dataset, *args, **kwargs):
            try:
                callbacks = kwargs.get("callbacks")
                if len(args) >= 1:  # callbacks given by position
                    callbacks, args = args[0], args[1:]
                kwargs["callbacks"] = recorder._with_step_callback(callbacks)
            except Exception as e:
                say(f"cannot follow Model.train's steps: {e!r}")
            return original(model, epoch, train_dataset, *args, **kwargs)

        train._detcheck_recorder = recorder
        train.__doc__ = original.__doc__
        self._model_train = (Model, original)
        Model.train = train

    def _with_step_callback(self, callbacks):
        from mindspore.train import Callback

        recorder = self

        class _StepEnds(Callback):
            def on_train_step_end(self, run_context):
                recorder._model_train_step_ends(run_context)

        if callbacks is None:
            return [_StepEnds()]
        if isinstance(callbacks, (list, tuple)):
            return [*callbacks, _StepEnds()]
        return [callbacks, _StepEnds()]

    # --- the model ------------------------------------------------------------------------

    def _cell_call(self, original, cell, args, kwargs):
        depth = self._depth
        self._depth += 1
        try:
            if depth == 0 and self.status == "waiting":
                self._maybe_start(cell)
            elif depth == 0 and is_grad_reducer(cell):
                self._reducer_seen = True
            elif self._seeking_loss and self.status == "recording" and is_loss_cell(cell):
                self._hook_loss(cell)
            return original(cell, *args, **kwargs)
        finally:
            self._depth = depth

    def _maybe_start(self, cell):
        try:
            if isinstance(cell, nn.Optimizer) or not has_trainable_parameters(cell):
                return
            self._start(cell, is_graph_mode())
        except Exception as e:
            say(f"cannot record the model: {e!r}")
            self.stand_down(f"recording the model failed: {e!r}")

    def _start(self, root, graph, parameters=None):
        """Opens the trace and records ``root``'s model (``None``: only ``parameters``)."""
        self._writer = self._open_writer()
        if self._writer is None:
            return
        model = unwrap_cell(root) if root is not None else None
        self._model = model
        describe_run(self._writer, graph)
        self._frontend = MindSporeFrontEnd(graph=graph, parameters=parameters)
        self._begin(
            Recording(
                self._frontend,
                model,
                self._writer,
                replicated_records(data_parallel(), self._writer.world_size),
                self._steps,
                updates=True,
                **self._recording_kinds(inputs=True),
            )
        )
        if graph:
            self._graph_seen = True
            self._stop_seeking_loss()

    def _hook_loss(self, cell):
        """Records the output of the loss cell ``cell`` as ``loss``, from this call on."""
        self._seeking_loss = False
        handle = self._handle

        if self._state.end_state_only:
            self._stop_seeking_loss()  # an unperturbed run reads nothing during its steps
            return

        def record_loss(loss_cell, args, output):
            try:
                if handle is not None and self.status == "recording":
                    loss = output[0] if isinstance(output, (tuple, list)) else output
                    handle.sink.put(handle.current_step, "loss", loss, False, False)
            except Exception:
                pass
            return None

        try:
            self._loss_hook = cell.register_forward_hook(record_loss)
        except Exception as e:
            say(f"cannot record the loss: {e!r}")
        self._stop_seeking_loss()

    def _stop_seeking_loss(self):
        self._seeking_loss = False
        self._unwrap(nn.Cell)

    # --- steps ------------------------------------------------------------------------------

    def _optimizer_call(self, original, optimizer, args, kwargs):
        if self.status == "waiting":
            # No model ran in Python before the optimizer (graph mode): record its parameters.
            try:
                params = [(p.name, p) for p in getattr(optimizer, "parameters", ())]
                self._start(None, True, params)
            except Exception as e:
                say(f"cannot record the optimizer's parameters: {e!r}")
        recording = self.status == "recording"
        if recording and self._reducer_seen and not self._handle.replicated:
            # The gradients come out of an allreduce: every rank holds them, and the
            # parameters they update, alike from this step on.
            self._handle.replicated = True
        if recording:
            try:
                self._frontend.gradients_given(optimizer, args[0] if args else ())
                self._handle.end_backward()
            except Exception as e:
                self._say_once(f"cannot record the gradients: {e!r}")
        result = original(optimizer, *args, **kwargs)
        self._step_ends(recording)
        return result

    def _step_ends(self, recording, loss=None):
        self._stepped_by_optimizer = True
        if recording and self.status == "recording":
            try:
                if loss is not None and not self._state.end_state_only:
                    self._handle.sink.put(self._handle.current_step, "loss", loss, False, False)
                self._record_update()
            except Exception as e:
                self._say_once(f"cannot record the parameters: {e!r}")
        if self._seeking_loss:
            self._stop_seeking_loss()  # the first step is over: no loss cell was seen
        self._count_step()

    def _model_train_step_ends(self, run_context):
        """``Model.train``'s step end: a step of graph mode, where no optimizer call reached
        Python (in PyNative mode the optimizer's call ended it already)."""
        if self._stepped_by_optimizer:
            self._stepped_by_optimizer = False
            return
        try:
            cb = run_context.original_args()
            if self.status == "waiting":
                network = getattr(cb, "train_network", None) or getattr(cb, "network", None)
                if network is None:
                    return
                self._start(network, True)
            loss = getattr(cb, "net_outputs", None)
            if isinstance(loss, (tuple, list)):
                loss = loss[0] if loss else None
        except Exception as e:
            self._say_once(f"cannot follow Model.train's step: {e!r}")
            return
        self._step_ends(self.status == "recording", loss)
        self._stepped_by_optimizer = False

    # --- the end ------------------------------------------------------------------------------

    def _before_exit(self):
        # A worker of a MindSpore cluster (msrun's, `MS_ROLE=MS_WORKER`) must leave it as at
        # its end: MindSpore's exit function unregisters it from the scheduler, which otherwise
        # waits for it, declares it timed out and fails the job. So the process's exit functions
        # run now, as at a normal exit, before the recorder's `os._exit(0)`.
        if os.environ.get("MS_ROLE") != "MS_WORKER":
            return
        try:
            atexit._run_exitfuncs()
        except Exception as e:
            say(f"leaving MindSpore's cluster: {e!r}")

    def _remove_hooks(self):
        self._unwrap(nn.Cell)
        self._unwrap(nn.Optimizer)
        model_train = getattr(self, "_model_train", None)
        if model_train is not None:
            cls, original = model_train
            cls.train = original
            self._model_train = None
        if self._loss_hook is not None:
            try:
                self._loss_hook.remove()
            except Exception:
                pass
            self._loss_hook = None

    def _nothing_ran(self):
        if self._steps:
            return (
                f"mindspore was imported and {self._steps} optimizer step(s) ran, but no "
                "nn.Cell with trainable parameters ran: nothing to record"
            )
        return (
            "mindspore was imported, but no nn.Cell with trainable parameters ran and no "
            "nn.Optimizer was called from Python: nothing to record (a step compiled whole, "
            "`@ms.jit` around the optimizer's call, runs no Python: docs/mindspore.md)"
        )


def start(state):
    """Starts the recorder of this rank (``_launch.startup`` calls it once mindspore is
    imported)."""
    global _recorder
    _recorder = Recorder(state)
    _recorder.install()
    return _recorder
