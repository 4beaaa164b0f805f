"""The start-up hook of zero-change recording: what ``detcheck.pth`` runs when a Python
interpreter of the environment starts.

The wheel installs ``detcheck.pth`` into site-packages (python/data/purelib/), whose one line
imports this module and calls ``activate()`` only when ``DETCHECK_TRACE_DIR`` is set, that is,
in a program detcheck launched; everywhere else it costs one dictionary lookup. ``activate()``:

0. under detcheck's ``srun`` launcher, sets the rank's ``RANK``, ``WORLD_SIZE``,
   ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``DETCHECK_RANK`` from Slurm's
   variables (``detcheck::file::slurm``), so an unmodified torch.distributed script with
   ``env://`` initialisation runs as under torchrun;
1. returns at once in a process that is not one of the launch's ranks: no rank in its
   environment (torchrun's agent, which imports torch too), or a child of the rank's process
   (``DETCHECK_RECORDER_PID``, set here by the first interpreter of the rank and inherited by
   everything it starts: data-loader workers, compilers, helper scripts). Such a child becomes
   a rank when it joins a process group (``torch.distributed.init_process_group``): a program
   that starts its own ranks (``torch.multiprocessing.spawn``, Lightning's ``devices=N``) has
   each recorded as the rank the group gives it, in the launch's trace folder, stopped at the
   launch's steps (``_adopt``); and a rank whose group is larger than the launch's world takes
   the group's size, so its trace and its new peers' agree;
2. with ``--deterministic`` (``DETCHECK_DETERMINISTIC``), applies the hint table's start-up
   calls (``detcheck._core.settings``): ``random.seed`` now, ``numpy.random.seed`` when numpy is
   imported, the torch ones when torch is;
3. when torch is imported (an import hook that runs after torch's own ``__init__``), starts
   the recorder, ``detcheck._torch.auto``, which hooks every module and optimizer; when mindspore is
   imported instead, MindSpore's recorder, ``detcheck._mindspore.auto`` (the first of the two
   frameworks imported is the one recorded);
4. keeps the rank's failures readable (``detcheck::launch::RankFiles``): its process id, the
   traceback of an exception that ends it (``sys.excepthook``), its Python stacks on ``SIGUSR2``
   (``faulthandler``, unless the program handles that signal);
5. at one rank, gives a program that creates a process group a world of one
   (``detcheck._launch.single_rank``), and a DeepSpeed program its launcher's variables when it
   imports deepspeed (without them ``deepspeed.init_distributed`` looks for MPI); at several,
   makes each rank's first point-to-point send wait for its slot of the launch, so messages
   received from any source arrive in another order in each run (``detcheck._launch.arrival``);
   a launcher that runs the program as its one child (``accelerate launch --cpu``, torch
   elastic's agent of one worker under ``fabric run --devices=1``) hands the rank to that
   child before starting it (``_hand_over_before``);
6. at exit, finishes the recorder's trace, or, when nothing was recorded and the program opened
   no writer of its own, leaves a note saying why (``rank{R}.no-records.txt``, which detcheck
   prints when the rank's trace is missing).

A failure here never stops the program: it is printed on stderr as one ``detcheck:`` line, and
the missing trace is reported by detcheck.

Determinism: nothing here reads the clock or OS entropy; the seeds are the scenario's.

Invariant (a rank is a process in the program's process group; ``_adopt``): a process a rank started
becomes the rank its group gives it when it joins one, and the run has as many ranks as traces
(``src/run/process.rs``, ``ranks_found``).
"""

import atexit
import functools
import importlib.abc
import importlib.util
import os
import sys

from .._core.lifecycle import say as _say
from .._mindspore.plugin import PLUGIN as _MINDSPORE
from .._torch.plugin import PLUGIN as _TORCH

#: The framework front ends, a plugin each (``_core.contract.Plugin``; tests/tidy.rs's
#: ``FRONT_ENDS``): the first one the program imports is recorded.
_FRONT_ENDS = (_TORCH, _MINDSPORE)

#: The variable that names the rank's recording process.
PID_VAR = "DETCHECK_RECORDER_PID"

#: What ``activate`` found: the launch, the plan; ``None`` when this process records nothing.
_state = None
#: Whether ``activate`` ran in this process.
_activated = False


class _State:
    def __init__(self, rank, world_size, seed, files, stop_after, deterministic, record):
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        #: The rank's files in the trace folder (``note``, ``error``, ``pid``, ``stacks``:
        #: ``detcheck::launch::RankFiles``).
        self.files = files or {}
        self.note = self.files.get("note")
        self.stop_after = stop_after
        self.deterministic = deterministic
        #: An unperturbed run (``DETCHECK_RECORD=end``): nothing read during the steps, the
        #: end state recorded once after the last.
        self.end_state_only = record == "end"
        #: A run of the ``batch_sizes`` check (``DETCHECK_RECORD=rows``): each sample's rows
        #: of the model's records, at the sample's step (``detcheck._torch.rows``).
        self.rows = record == "rows"
        #: The recorder, once torch (``detcheck._torch.auto.Recorder``) or mindspore
        #: (``detcheck._mindspore.auto.Recorder``) is imported.
        self.recorder = None
        #: The framework whose recorder runs: ``"torch"``, ``"mindspore"`` or ``None``.
        self.framework = None
        #: The open file ``faulthandler`` writes the stacks into (kept open while we live).
        self.stacks_file = None
        #: A process the launch did not start, recorded as the rank it joined a process group
        #: as (``_adopt``).
        self.adopted = False

    def forget_rank_files(self):
        """The rank ends normally: its pid file and its stacks file (when nothing was written
        into it) are removed, so a dump holds the traces and nothing else."""
        for key in ("pid", "stacks"):
            path = self.files.get(key)
            try:
                if path is not None and (key == "pid" or os.path.getsize(path) == 0):
                    os.remove(path)
            except OSError:
                pass


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callbacks[name](module)`` once module ``name`` has been imported (after its own
    code ran), by wrapping the loader of its spec.

    A callback is spent when the module's code runs, not when its spec is found: a program (or
    a library it imports first: datasets, transformers, trl) may ask
    ``importlib.util.find_spec("torch")`` to learn whether torch is installed, which finds a
    spec and imports nothing; the import that follows must still be followed."""

    def __init__(self, callbacks):
        self._callbacks = dict(callbacks)
        self._finding = set()

    def find_spec(self, name, path=None, target=None):
        if name not in self._callbacks or name in self._finding:
            return None
        self._finding.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding.discard(name)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ThenCall(spec.loader, lambda module: self._imported(name, module))
        return spec

    def _imported(self, name, module):
        callback = self._callbacks.pop(name, None)
        if not self._callbacks and self in sys.meta_path:
            sys.meta_path.remove(self)
        if callback is not None:
            callback(module)


class _ThenCall(importlib.abc.Loader):
    """A loader that runs the wrapped one, then the callback."""

    def __init__(self, loader, callback):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._callback(module)
        except Exception as e:  # never break the program's import
            _say(f"the start-up hook failed after importing {module.__name__}: {e!r}")

    def __getattr__(self, name):
        return getattr(self._loader, name)


def _asked(rows):
    """The start-up rows of ``rows`` that the launch asks for (all, or a subset by name)."""
    return [r for r in rows if r[0] == "startup" and r[1] in _state.deterministic]


def _apply(stack):
    from .._core import settings as _settings

    _settings.apply(_asked(_settings.settings(stack)), _state.seed)


def _framework_imported(plugin, module):
    """The program imported ``plugin``'s framework: its recorder starts, unless another
    framework's runs (one framework per process)."""
    if _state.framework is not None:
        return
    _state.framework = plugin.framework
    if _state.deterministic:
        _apply(plugin.framework)
    if _evidence_wanted():
        try:
            plugin.install_evidence()
        except Exception as e:
            _say(f"cannot follow {plugin.follows}: {e!r}")
    joins = _JOINS_THE_LAUNCH.get(plugin.framework)
    if joins is not None:
        joins(module)
    _state.recorder = plugin.start(_state)


def _join_the_launch(torch_module):
    """What a torch program's process group needs of the launch: followed when it joins one
    (``_follow_the_group``); at one rank, a world of one; at several, arrival order varied."""
    _follow_the_group(torch_module)
    if _state.adopted:
        pass  # its process group exists already
    elif _state.world_size == 1:
        from . import single_rank as _single_rank

        _single_rank.install()
        # DeepSpeed looks for MPI (mpi4py) when its launcher's variables are missing: at one
        # rank they are given as its launcher would.
        _when_imported("deepspeed", lambda _module: _single_rank.fill())
    else:
        try:
            from .._detcheck import first_send_delay
            from . import arrival as _arrival

            _arrival.install(torch_module.distributed, first_send_delay())
        except Exception as e:
            _say(f"cannot vary the order in which point-to-point messages arrive: {e!r}")


#: What a framework's process group needs of the launch, by framework: torch.distributed's
#: (a program's own ranks adopted, a world of one, arrival order); MindSpore's ranks are
#: msrun's own, started by the launch.
_JOINS_THE_LAUNCH = {_TORCH.framework: _join_the_launch}


def _write_whole(path, text):
    """Writes ``text`` to ``path`` under a temporary name, then renames it: a reader never sees
    half a file."""
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(partial, path)


def _keep_failures_readable():
    """The rank's side of ``detcheck::launch::RankFiles``: its process id now, its traceback if
    the program ends with an uncaught exception, its stacks when detcheck asks (``SIGUSR2``,
    a launch past its timeout), so that a failure reads like the rank's own under every
    launcher. Each part is skipped where it would change what the program sees (a handler of
    its own for the signal)."""
    import faulthandler
    import signal
    import time

    files = _state.files
    if "pid" in files:
        _write_whole(files["pid"], f"{os.getpid()}\n")
    if "stacks" in files and signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL:
        _state.stacks_file = open(files["stacks"], "w", encoding="utf-8")
        faulthandler.register(signal.SIGUSR2, file=_state.stacks_file, all_threads=True)
    if "error" in files:
        from .._detcheck import error_file_magic

        previous = sys.excepthook
        magic = error_file_magic()

        def excepthook(kind, value, tb):
            if os.environ.get(PID_VAR) == str(os.getpid()):
                try:
                    import traceback

                    text = "".join(traceback.format_exception(kind, value, tb))
                    header = f"{magic} rank={_state.rank} time={time.time():.6f}\n"
                    _write_whole(files["error"], header + text)
                except Exception:
                    pass
            previous(kind, value, tb)

        sys.excepthook = excepthook


def activate():
    """Sets up recording in a rank of a detcheck launch (module doc); never raises."""
    global _state, _activated
    if _activated:  # an environment whose site-packages is processed twice runs the .pth twice
        return
    _activated = True
    try:
        from .._detcheck import launch_info, recorder_plan, srun_rank_variables

        # A task of detcheck's `srun` launcher: Slurm's SLURM_PROCID, SLURM_NTASKS, ... as
        # the variables torch.distributed and detcheck read, before the program's code runs.
        for name, value in srun_rank_variables():
            os.environ[name] = value
        info = launch_info()
        if info is None:
            return
        rank, world_size, seed, files = info
        if rank is None:
            return  # not a rank: torchrun's agent, a `none` launch
        claimed = os.environ.get(PID_VAR)
        if claimed is not None and claimed != str(os.getpid()):
            # A process the rank's process started: a rank once it joins a process group.
            _when_imported("torch", _adopt_when_it_joins_a_group)
            return
        os.environ[PID_VAR] = str(os.getpid())
        # The names of the settings to apply; what the run records.
        stop_after, deterministic, record = recorder_plan()
        _state = _State(rank, world_size, seed, files, stop_after, deterministic, record)
        try:
            _keep_failures_readable()
        except Exception as e:
            _say(f"cannot keep this rank's failures readable: {e!r}")
        callbacks = {p.framework: functools.partial(_framework_imported, p) for p in _FRONT_ENDS}
        if deterministic:
            _apply_python_now_and_numpy_later(callbacks)
        if _evidence_wanted():
            _follow_generators(callbacks)
        for plugin in _FRONT_ENDS:
            if plugin.framework in sys.modules:  # imported by another .pth file
                callbacks.pop(plugin.framework)
                _framework_imported(plugin, sys.modules[plugin.framework])
        if callbacks:
            sys.meta_path.insert(0, _AfterImport(callbacks))
        if _state.rows:
            _when_imported("transformers.generation.utils", _generate_is_a_batch)
        _when_imported("accelerate.commands.launch", _hand_the_rank_to_the_one_child)
        _when_imported("torch.distributed.launcher.api", _hand_the_rank_to_the_one_worker)
        atexit.register(_at_exit)
    except Exception as e:
        _state = None
        _say(f"the start-up hook cannot record this process: {e}")


def _hand_over_before(original, one_child):
    """``original``, a launcher's function that starts the program, wrapped so that the rank is
    handed to the child it starts when ``one_child(*args, **kwargs)`` says that child is the
    launch's one process: a child that joins no process group would never become the rank
    (``_adopt`` follows a group), and the launcher, which claimed it, trains nothing. Handing
    over is giving up the claim (``PID_VAR``, so the child claims the rank as the first
    interpreter of it, and this process writes no trace, note or traceback), unless this
    process recorded something already. Several processes are never handed one rank: they join
    a group and are adopted as they join."""
    import functools

    @functools.wraps(original)
    def launcher(*args, **kwargs):
        try:
            recorder = _state.recorder if _state is not None else None
            mine = os.environ.get(PID_VAR) == str(os.getpid())
            if mine and (recorder is None or not recorder.recorded) and one_child(*args, **kwargs):
                del os.environ[PID_VAR]
        except Exception as e:
            _say(f"cannot hand the rank to the process this launcher starts: {e!r}")
        return original(*args, **kwargs)

    launcher._detcheck_hands_over = True
    return launcher


def _hand_the_rank_to_the_one_child(module):
    """``accelerate launch`` of one process (``--cpu``, one device: its ``simple_launcher``)
    runs the program as one child process that joins no process group: the rank is handed to
    it (``_hand_over_before``)."""
    original = getattr(module, "simple_launcher", None)
    if original is not None and not getattr(original, "_detcheck_hands_over", False):
        module.simple_launcher = _hand_over_before(original, lambda *args, **kwargs: True)


def _hand_the_rank_to_the_one_worker(module):
    """torch elastic's ``launch_agent`` of one worker on one node, run inside the rank's
    process (``fabric run --devices=1``, ``torch.distributed.run.main`` called by a program):
    its worker is the program, and joins no group when it trains alone (Fabric's single-device
    strategy). The rank is handed to it (``_hand_over_before``); at several workers each joins
    the group and is adopted."""
    original = getattr(module, "launch_agent", None)
    if original is None or getattr(original, "_detcheck_hands_over", False):
        return

    def one_worker(config, *args, **kwargs):
        return config.nproc_per_node == 1 and config.max_nodes == 1

    module.launch_agent = _hand_over_before(original, one_worker)


def _generate_is_a_batch(module):
    """In a run of the ``batch_sizes`` check: a call of Hugging Face's ``generate`` is one
    batch (``detcheck._torch.rows``)."""
    try:
        from .._torch import rows as _rows

        _rows.wrap_generate(module)
    except Exception as e:
        _say(f"cannot follow generate's batches: {e!r}")


def _when_imported(name, callback):
    """Calls ``callback(module)`` once ``name`` is imported (now, when it is already)."""
    if name in sys.modules:
        callback(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport({name: callback}))


def _wrap_init_process_group(dist, then, before=None):
    """Wraps ``dist.init_process_group`` so that ``then(rank, world_size, caller's frame)``
    runs after each call that created the default group, and ``before(original, args, kwargs,
    caller's frame)`` before each call (it may raise: the call then fails with its error);
    wrapping twice does nothing."""
    original = getattr(dist, "init_process_group", None)
    if original is None or getattr(original, "_detcheck_follows", False):
        return
    import functools

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        if before is not None:
            before(original, args, kwargs, sys._getframe(1))
        result = original(*args, **kwargs)
        try:
            if dist.is_initialized():
                then(dist.get_rank(), dist.get_world_size(), sys._getframe(1))
        except Exception as e:
            _say(f"cannot follow the process group this process joined: {e!r}")
        return result

    init_process_group._detcheck_follows = True
    dist.init_process_group = init_process_group


def _adopt_when_it_joins_a_group(torch_module):
    dist = getattr(torch_module, "distributed", None)
    if dist is not None and dist.is_available():
        _wrap_init_process_group(dist, lambda *joined: _adopt(*joined, torch_module))


def _set_identity(rank, world_size):
    """The launch's variables of rank ``rank`` of ``world_size`` (what the writer and the rank's
    files read), and this process as the rank's recording process."""
    from .._detcheck import launch_variables

    for name, value in launch_variables(rank, world_size):
        os.environ[name] = value
    os.environ[PID_VAR] = str(os.getpid())


def _adopt(rank, world_size, frame, torch_module):
    """This process, started by a rank's process, joined a process group as rank ``rank`` of
    ``world_size`` (called from ``frame``): it is recorded as that rank from now on (module
    doc, 1), and its trace says so (``site:rank_started``: a cause that depends on what the
    process inherited, such as its generators' seeds, names it)."""
    global _state
    if _state is not None:
        return
    from .._detcheck import launch_info, recorder_plan

    _set_identity(rank, world_size)
    info = launch_info()
    if info is None or info[0] is None:
        return
    rank, world_size, seed, files = info
    stop_after, deterministic, record = recorder_plan()
    _state = _State(rank, world_size, seed, files, stop_after, deterministic, record)
    _state.adopted = True
    try:
        _keep_failures_readable()
    except Exception as e:
        _say(f"cannot keep this rank's failures readable: {e!r}")
    from .._core import evidence as _evidence

    where = _evidence.site(frame)
    if _evidence_wanted():
        later = {}
        _follow_generators(later)
        if later:
            sys.meta_path.insert(0, _AfterImport(later))
        if where is not None:
            _evidence.fact("site:rank_started", where)
        parent = _evidence.parent_seeded()
        if parent is not None:
            _evidence.fact("site:parent_seeded", parent)
    if "started" in files:
        # The mark that makes the launch count this rank (``detcheck::launch::RankFiles``).
        _write_whole(files["started"], f"{where or '?'}\n")
    atexit.register(_at_exit)
    _framework_imported(_TORCH, torch_module)


def _adopt_forked(rank, world_size, frame, torch_module):
    """``_adopt`` for a forked copy of a rank (its recorder stood down at the fork): a fresh
    state and recorder. A child that multiprocessing forked ends with ``os._exit`` after its
    own exit functions, not ``atexit``'s: its trace is finished by one of those."""
    global _state
    _state = None
    _adopt(rank, world_size, frame, torch_module)
    try:
        from multiprocessing import util

        util.Finalize(None, _at_exit, exitpriority=100)
    except Exception as e:
        _say(f"cannot finish this rank's trace at its exit: {e!r}")


def _follow_the_group(torch_module):
    """A rank of the launch whose process group is larger than the launch's world (it started
    its peers itself): its identity takes the group's rank and size before its trace opens."""
    dist = getattr(torch_module, "distributed", None)
    if dist is None or not dist.is_available() or _state.adopted:
        return

    def joined(rank, world_size, frame):
        if os.environ.get(PID_VAR) != str(os.getpid()):
            # A process this rank forked (accelerate's notebook_launcher, torch's
            # start_processes with "fork") that joined a group: a rank of its own.
            _adopt_forked(rank, world_size, frame, torch_module)
            return
        if world_size > _state.world_size:
            if _state.recorder is not None and _state.recorder.recorded:
                _say(
                    f"this rank joined a process group of {world_size} after its trace "
                    f"opened as one of {_state.world_size}: its peers' traces will not match"
                )
                return
            _set_identity(rank, world_size)
            _state.rank, _state.world_size = rank, world_size

    _wrap_init_process_group(dist, joined, before=_refuse_a_world_nobody_starts)


class MissingRanks(RuntimeError):
    """A rank of the launch asked for a process group larger than the launch's world, and no
    process can join it: detcheck started fewer ranks, and this process started none."""


def _refuse_a_world_nobody_starts(original, args, kwargs, frame):
    """Fails the call at once (``MissingRanks``) when it would wait for ranks that nobody will
    start (issue 54: detcheck never waits on a rank of its own accord): the group asked for
    (``world_size``, the ``init_method``'s query, or ``WORLD_SIZE``) is larger than the launch's
    world, this process is a rank detcheck launched (not one a rank started), and it has no
    child process that could become a peer (``torch.multiprocessing.spawn``, Lightning's
    ``devices=N`` and accelerate start theirs before they join). Wherever that cannot be told
    (no ``/proc``, an argument it cannot read), it lets the call wait as without detcheck."""
    if _state is None or _state.adopted or os.environ.get(PID_VAR) != str(os.getpid()):
        return
    asked = _world_asked(original, args, kwargs)
    if asked is None or asked <= _state.world_size or _has_children() is not False:
        return
    where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    launched = _state.world_size
    program = " ".join([os.path.basename(sys.argv[0] or "..."), *sys.argv[1:]])
    message = (
        f"the program asks init_process_group for a world of {asked} ranks (at {where}), but "
        f"detcheck started {launched} rank{'s' if launched != 1 else ''} and this process "
        f"started no other: the others would never join, so it stops here instead of waiting. "
        f"Give detcheck the ranks: `detcheck check --ranks {asked} --launcher torchrun -- "
        f"python {program}` for a script that reads RANK and WORLD_SIZE from its environment, or "
        f"the program's own launcher after `--` (`detcheck check -- torchrun "
        f"--nproc-per-node {asked} {program}`)"
    )
    _say(message)
    raise MissingRanks(message)


def _world_asked(original, args, kwargs):
    """The world size an ``init_process_group`` call asks for, or None where it cannot be read."""
    try:
        import inspect

        bound = inspect.signature(original).bind_partial(*args, **kwargs).arguments
        world = bound.get("world_size", -1)
        if world is None or int(world) < 0:
            from urllib.parse import parse_qs, urlparse

            method = bound.get("init_method")
            query = parse_qs(urlparse(method).query) if isinstance(method, str) else {}
            world = (query.get("world_size") or [os.environ.get("WORLD_SIZE")])[0]
        return None if world is None else int(world)
    except (TypeError, ValueError):
        return None


def _has_children():
    """Whether this process has a live child process (``/proc``); None where it cannot tell."""
    me = str(os.getpid())
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == me and fields[0] != "Z":
            return True
    return False


def _evidence_wanted():
    """Whether to gather the evidence of causes (docs/causes.md): unless DETCHECK_EVIDENCE=0,
    or in an unperturbed run, which reads nothing during its steps, or in a run of the
    ``batch_sizes`` check, whose steps are samples."""
    if _state is not None and (_state.end_state_only or _state.rows):
        return False
    return os.environ.get("DETCHECK_EVIDENCE", "1") != "0"


def _follow_generators(callbacks):
    """Follows Python's and numpy's generators for ``_core.evidence`` (after --deterministic's own
    seeding, which is detcheck's and no evidence): Python's now, numpy's and the generator makers'
    (``UNSEEDED_MAKERS``) once imported, through ``callbacks`` (start-up's one ``_AfterImport``)."""
    from .._core import evidence as _evidence

    _evidence.install_python()
    _evidence.install_file_audit()
    _evidence.install_process_watch()
    later = functools.partial(_when_in, callbacks)
    _evidence.install_unseeded_makers(later)
    later("numpy", _evidence.install_numpy)


def _when_in(callbacks, name, then):
    """Calls ``then(module)`` now when module ``name`` is imported, else puts it in
    ``callbacks`` for when it is, after a callback of that name already there."""
    if name in sys.modules:
        then(sys.modules[name])
        return
    earlier = callbacks.get(name)
    if earlier is None:
        callbacks[name] = then
    else:
        callbacks[name] = lambda module: (earlier(module), then(module))


def _apply_python_now_and_numpy_later(callbacks):
    from .._core import settings as _settings

    rows = _asked(_settings.settings("python"))
    now = [r for r in rows if not r[1].startswith("numpy.")]
    later = [r for r in rows if r[1].startswith("numpy.")]
    _settings.apply(now, _state.seed)
    _when_in(callbacks, "numpy", lambda _module: _settings.apply(later, _state.seed))


def _at_exit():
    """Finishes the recorder's trace; or leaves the note of a rank that recorded nothing."""
    if _state is None or os.environ.get(PID_VAR) != str(os.getpid()):
        return
    _state.forget_rank_files()
    from .._detcheck import _program_records_itself

    recorder = _state.recorder
    if recorder is not None:
        recorder.finish("exit")
        if recorder.recorded:
            return
    if _program_records_itself() or _state.note is None or os.path.exists(_state.note):
        # (an existing note: a process it started took this rank and recorded nothing)
        return
    if recorder is None:
        why = (
            f"Python ran {_program()}, which never imported torch or mindspore: detcheck "
            "records a PyTorch or MindSpore program without a change to it; any other program "
            "writes its own trace with detcheck.TraceWriter"
        )
    else:
        why = recorder.why_nothing() + _started_no_rank()
    try:
        with open(_state.note, "w", encoding="utf-8") as f:
            f.write(why + "\n")
    except OSError:
        pass


def _started_no_rank():
    """What to add to the note of a rank that recorded nothing when its process started others
    through ``torch.multiprocessing`` (``spawn``) and none of them took a rank's trace (else the
    note is not shown): they joined no process group (an RPC program: ``init_rpc`` only)."""
    from .._core import evidence as _evidence

    n, where = _evidence.STARTED_BY_TORCH
    if n == 0:
        return ""
    return (
        f"; it started {n} process{'es' if n != 1 else ''} with torch.multiprocessing (at "
        f"{where or '?'}), and none recorded a rank: detcheck records a process the program "
        "starts once it joins a process group (torch.distributed.init_process_group, as "
        "mp.spawn's ranks do); one that only calls torch.distributed.rpc.init_rpc, or trains "
        "without a group, is not recorded: write its records with detcheck.TraceWriter "
        "(docs/programs.md)"
    )


def _program():
    argv = getattr(sys, "argv", None) or ["?"]
    return f"`{' '.join(argv)[:200]}`"
