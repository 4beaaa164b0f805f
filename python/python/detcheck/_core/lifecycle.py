"""The life of a zero-change recorder, whatever its framework: what ``detcheck._torch.auto``
(PyTorch) and ``detcheck._mindspore.auto`` (MindSpore) share, so that both begin, end and stand down
by the same rules (python/README.md, "Zero-change recording").

``LifecycleRecorder`` is their base class. It keeps the writer and the ``Recording`` once the
model is found, the status (``waiting``, ``recording``, ``finished``, ``stood down``), the
step count and the writer's record count when the last step ended. It installs what every
recorder needs besides its framework's hooks (the native ``_program_records`` channel, which
makes it stand down; a fork handler: a forked child never records; the SIGTERM handler, where
SIGTERM is still the default), opens the writer (``None``: this process is no rank, or the
program records itself), ends the process after the ``DETCHECK_STOP_AFTER``-th step, and
finishes the trace at exit and on SIGTERM, marking a step still open. A subclass adds its
framework's hooks (``_install_hooks``), removes them (``_remove_hooks``; at ``finish``,
``_remove_hooks_at_finish``) and says why nothing was recorded (``_nothing_ran``).

Determinism: nothing here records; the records are the engine's. Limits: one recorder per
process; nothing here raises into the program (a failure is one ``detcheck:`` line on stderr,
once).
"""

import os
import shutil
import signal
import sys

from .._detcheck import TraceWriter, _on_program_records, _program_records_itself

__all__ = ["LifecycleRecorder", "say"]


#: The environment key of a run that shows that recording cannot change what the program
#: computes, with that in words (``_synchronous``); read by ``repeat`` (src/check/mod.rs,
#: ``SYNCHRONOUS_KEY``).
SYNCHRONOUS_KEY = "detcheck.synchronous"


def say(message):
    """Writes ``detcheck: message`` on stderr (never raises)."""
    try:
        sys.stderr.write(f"detcheck: {message}\n")
        sys.stderr.flush()
    except Exception:
        pass


class LifecycleRecorder:
    """The zero-change recorder of one rank, less its framework (module doc). ``recorded``:
    whether it opened its trace; ``finish(why)`` closes it."""

    def __init__(self, state):
        self._state = state
        #: ``waiting`` (no model yet), ``recording``, ``finished`` or ``stood down``.
        self.status = "waiting"
        self.recorded = False
        self._depth = 0
        self._steps = 0
        self._writer = None
        self._handle = None
        self._stood_down_because = None
        #: The writer's record count when the last step ended (more at exit: a step is open).
        self._records_before_step = 0
        self._said = False

    # --- what a framework's recorder adds ---------------------------------------------------

    def _install_hooks(self):
        """Hooks the framework, to find the model and the steps."""
        raise NotImplementedError

    def _remove_hooks(self):
        """Removes every hook of the framework (standing down)."""
        raise NotImplementedError

    def _remove_hooks_at_finish(self):
        """Removes the hooks the trace's end takes away (all of them unless overridden)."""
        self._remove_hooks()

    def _forget_hooks(self):
        """In a forked child: forgets the hooks without touching them."""

    def _before_exit(self):
        """After the last step, before the process ends (a barrier with the other ranks)."""

    def _nothing_ran(self):
        """Why nothing was recorded, when the recorder did not stand down."""
        raise NotImplementedError

    def _synchronous(self):
        """Why the run shows that recording cannot change what the program computes, in words
        (``repeat`` then makes no unperturbed run: docs/checks.md), else ``None``: the
        framework's recorder decides; unless it does, nothing is claimed."""
        return None

    # --- the beginning ----------------------------------------------------------------------

    def install(self):
        self._install_hooks()
        _on_program_records(self.stand_down)
        os.register_at_fork(after_in_child=self._forked)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            try:
                signal.signal(signal.SIGTERM, self._terminated)
            except ValueError:  # not the main thread
                pass

    def _open_writer(self):
        """The launch's writer for this rank, or ``None`` (the recorder stood down: this
        process is no rank, or the program records itself)."""
        import multiprocessing

        if multiprocessing.parent_process() is not None and not self._state.adopted:
            # Unless it joined a process group as a rank (``_launch.startup``: a
            # ``torch.multiprocessing.spawn`` worker).
            self.stand_down("a multiprocessing child is no rank")
            return None
        if _program_records_itself():
            self.stand_down("the program records itself")
            return None
        writer = TraceWriter._for_recorder()
        if writer is None:
            self.stand_down("not launched by detcheck")
        return writer

    def _recording_kinds(self, **kinds):
        """The keyword arguments of the ``Recording`` this recorder makes: ``kinds`` (``inputs``,
        ``loss``; the data flow of a dump's run, ``DETCHECK_RECORD=flow``, is the engine's own
        default), or in an unperturbed run (``DETCHECK_RECORD=end``) no record at all during the
        steps: ``finish`` records the end state; in a run of the ``batch_sizes`` check
        (``DETCHECK_RECORD=rows``) the model's inputs and its modules' outputs, which
        ``_torch.rows.RowsSink`` writes sample by sample."""
        if self._state.end_state_only:
            return {"records": (), "inputs": False, "loss": False}
        if self._state.rows:
            return {"records": ("fwd",), "inputs": True, "loss": False}
        return kinds

    def _begin(self, handle):
        """The model's ``Recording`` records from now on."""
        self._handle = handle
        self.status = "recording"
        self.recorded = True

    # --- steps ------------------------------------------------------------------------------

    def _record_update(self):
        """The update of a step is done: the parameters are recorded."""
        self._handle.after_update()
        self._records_before_step = self._writer.num_records

    def _count_step(self):
        """A step ended; the program ends after the ``DETCHECK_STOP_AFTER``-th."""
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
        self._before_exit()
        _return_to_elastic()
        _remove_multiprocessing_folder()
        os._exit(0)

    # --- the end ----------------------------------------------------------------------------

    def finish(self, why):
        """Closes the trace (``why``: ``None`` after the last step, ``"exit"`` at interpreter
        exit, ``"SIGTERM"``): a step still open is marked in the environment."""
        self._remove_hooks_at_finish()
        if self.status != "recording":
            return
        self.status = "finished"
        handle, writer = self._handle, self._writer
        # Whether a step is still open: records since the last step ended (the end state
        # below is no step's).
        open_step = writer.num_records > self._records_before_step
        try:
            handle.record_end_state(open_step)  # an unperturbed run's one read
        except Exception as e:
            say(f"cannot record the end state: {e!r}")
        synchronous = self._synchronous()
        if synchronous is not None:
            writer.add_environment(SYNCHRONOUS_KEY, synchronous)
        handle.remove()
        if why is not None and open_step:
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
        self._remove_hooks()
        if previous == "recording":
            self._handle.remove()
            self._writer.abort()
        self.recorded = False

    def _forked(self):
        # A forked child (a data-loader or dataset worker) holds a copy of the writer without
        # its thread: it records nothing and never touches the writer (the parent's file is
        # the trace).
        self.status = "stood down"
        self._stood_down_because = "a forked child is no rank"
        self._writer = None
        self._handle = None
        self._forget_hooks()
        self.recorded = False

    def _terminated(self, signum, frame):
        self.finish("SIGTERM")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _say_once(self, message):
        """``say``, the first time only."""
        if not self._said:
            self._said = True
            say(message)

    def why_nothing(self):
        """Why this rank recorded nothing, for the no-records note."""
        if self._stood_down_because is not None:
            return f"recorded nothing: {self._stood_down_because}"
        return self._nothing_ran()


def _return_to_elastic():
    """A rank that torch elastic started as a function (``elastic_launch`` of a callable:
    accelerate's ``notebook_launcher``, ``start_processes`` under an agent) and that ends at
    ``--steps``: its agent counts a worker done only once the worker's return value is in its
    queue (``_wrap``'s ``ret_val_``, a ``SimpleQueue``: written at once), so it is handed
    ``None`` as a function that returned; else the agent would wait for ever."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_wrap" and frame.f_globals.get("__name__", "").startswith(
            "torch.distributed.elastic"
        ):
            queue = frame.f_locals.get("ret_val_")
            if queue is not None:
                try:
                    queue.put(None)
                except Exception:
                    pass
            return
        frame = frame.f_back


def _remove_multiprocessing_folder():
    """Removes this process's temporary folder of multiprocessing (``pymp-*``: made on first use,
    by a data loader's workers handing tensors over, a ``Manager``), which its exit handler
    removes and ``os._exit`` skips."""
    process = sys.modules.get("multiprocessing.process")
    try:
        folder = process.current_process()._config.get("tempdir") if process else None
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
    except Exception:
        pass
