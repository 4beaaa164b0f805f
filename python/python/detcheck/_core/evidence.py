"""Evidence of a divergence's cause, recorded beside a model's records in a rank that detcheck
launched (docs/causes.md has the vocabulary and the rules that use it):

- ``seed/<generator>``: the generator's state right after each call that seeds it
  (``random.seed``, ``numpy.random.seed``, ``torch.manual_seed``, and the frameworks' helpers,
  which call these), so a seed that changes from run to run (a clock, a process id, OS entropy)
  is a record of its own;
- ``rng/<generator>``: the generator's state at the start of a step, recorded only when the
  generator was drawn from since it was last looked at: an unseeded generator that nothing draws
  from is never recorded, so it is never named as a cause;
- ``data/indices``: the sample indices a data loader fetches (the front end's, ``_torch.frontend``);
- ``data/outside``: a digest of the values that entered torch at one line of the program
  (``torch.tensor``, ``torch.as_tensor``, ``torch.from_numpy`` called from the program's own
  files: the front end's wrappers call ``entered``), one record per line between two of the
  engine's records (``flush_outside``, which the engine calls before its next record), so that a
  value from numpy, a file or the clock that changes from run to run is named with its line;
- facts, one value each, written to the trace's environment when the recording finishes
  (``fact``/``facts``): ``site:unseeded_generator``, the line of the program's first call that
  made a generator without a seed, which seeds itself from OS entropy (``UNSEEDED_MAKERS``:
  ``numpy.random.default_rng()``, a gymnasium environment's first ``reset()`` without
  ``seed=``), and ``site:unseeded_maker``, which of them,
  ``site:unseeded_global``, the line of the program's first draw from numpy's global generator
  (or read of its state, from which a library derives a seed) before anything seeded it, and
  ``site:unseeded_python``, the same of Python's ``random``; ``site:unseeded_torch``, the line
  of the first call that seeded torch after its default generator had been drawn from;
  ``site:drawn_before_model``, the model's line when that happened before the model was built;
  ``site:model_builder``, the framework helper that built the model, where one of
  ``MODEL_BUILDERS`` did (``LightningCLI``: it seeds through its own option);
  ``site:seed_drawn``, the line of such a draw whose value the program then seeded a generator
  with (``opt.manualSeed = random.randint(1, 10000)``, then ``torch.manual_seed(opt.manualSeed)``:
  pytorch/examples' dcgan), so the seed's cause is named at the draw, where a constant fixes it,
  ``site:any_source`` (``_launch.arrival``), and in a rank a process started itself
  (``_launch.startup._adopt``), ``site:parent_seeded``: where that process first seeded a generator
  (``SEEDED_VAR``, passed on in the environment), whose seed the rank does not inherit;
- ``detcheck.files``: the files outside the launch's private folder that the program opened
  (``install_file_audit``: Python's ``open`` audit event, so ``open``, ``os.open``,
  ``torch.load``, ``numpy.load`` and memory maps alike; ``torch.save``, which opens its file in
  C++, through the torch front end's wrapper), as
  ``{"read": [...], "wrote": [...]}``: those it read before writing them (that existed when
  opened) and those it wrote, at most 32 of each, sorted. A run that read what an earlier run
  wrote at an absolute path (a checkpoint folder, ``/tmp``) did not start from the same files;
  the system's folders, installed packages, the frameworks' caches and fresh temporary names
  are left out.

And ``concurrent``: the program's first line that started a thread or process of its own (or
a loader that hands over batches as they are ready, ``runs_beside``), which a framework's
recorder reads when it says whether recording can change what the program computes
(``_torch.frontend.synchronous``, docs/checks.md).

Each record's caller, the innermost frame outside detcheck, the frameworks and the standard
library (``file:line``, the path relative to the working directory: ``site``), goes to the
trace's environment as ``site:<step>:<name>:<k>`` (the k-th record of that name in the step);
``program_caller`` is the stricter question of a wrapped library function: whether the innermost
frame outside that library, detcheck and the standard library is the program's (not another
installed package's). The
comparison never counts these records as divergences (``src/compare``: evidence kinds); the cause
of a divergence is decided from them (``src/check/cause.rs``).

Main type: none; the module keeps one process-wide state: the generators, their last seen
states, the digests of the values that entered torch since the engine's last record
(``OUTSIDE``), and the sink (the running ``Recording``) or the evidence waiting for one.

Determinism: the records are functions of what the program runs; the states are compared as
bytes; a line's digest is CRC-32 and Adler-32 of its values' dtypes, shapes and bytes (above
64 KiB, of 1,024 evenly spaced elements: a change to a few elements of a large array can be
missed; checksums, not md5, as the one cost on a hot path: evidence, never a result). Limits: the
global generators only (a ``torch.Generator`` or ``numpy.random.Generator``
object the program makes is seen through its seeding call's line only where it goes through a
patched function); a hook here never raises into the program.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import sysconfig
import tempfile
import zlib
from collections.abc import Callable
from typing import Any

__all__ = [
    "install_python",
    "install_numpy",
    "install_unseeded_makers",
    "add_generator",
    "track_seeding",
    "note",
    "site",
    "fact",
    "facts",
    "program_caller",
    "entered",
    "flush_outside",
    "OUTSIDE",
    "install_file_audit",
    "install_process_watch",
    "concurrent",
    "runs_beside",
    "opened",
    "FILES_KEY",
]

#: The record kinds this module and the front ends make (the comparison's evidence kinds).
KINDS = ("seed", "rng", "data")

#: name -> a function giving the generator's state as bytes (recorded as a uint8 array).
_generators: dict[str, Callable[[], bytes]] = {}
#: name -> the state's bytes when last looked at.
_last: dict[str, bytes] = {}
#: name -> the state's bytes when it began to be followed (``drawn_before``).
_initial: dict[str, bytes] = {}
#: Evidence made before a recording runs: (name, array, site).
_waiting: list[tuple[str, Any, str | None]] = []
#: The running recording's ``evidence`` method, or ``None``.
_sink: Callable[[str, Any, str | None], None] | None = None
#: key -> value of the facts noted (the first value of each key is kept).
_facts: dict[str, str] = {}
#: The program's line -> the digest ``[CRC-32, Adler-32]`` of the values that entered torch
#: there since the engine's last record (``entered``); emptied in place by ``flush_outside``.
OUTSIDE: dict[tuple[str, int], list[int]] = {}
#: The most lines whose values are digested between two records (the rest are not noted).
_MAX_OUTSIDE_LINES = 64

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # detcheck/, above _core/


def _prefixes(*keys: str) -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    places = {paths.get(k) for k in keys}
    return tuple(sorted(os.path.abspath(p) + os.sep for p in places if p))


#: The standard library's folders, and the installed packages'.
_STDLIB = _prefixes("stdlib", "platstdlib")
_PACKAGES = _prefixes("purelib", "platlib")
_OURS = _PACKAGE + os.sep
_SKIPPED = _STDLIB + _PACKAGES + (_OURS,)


@functools.lru_cache(maxsize=4096)
def _program_file(path: str) -> str | None:
    """``path`` made absolute when it is the program's (not detcheck's, an installed package's
    or the standard library's), else ``None``; cached: the operator tracer asks at every call."""
    if path.startswith("<"):
        return None
    full = os.path.abspath(path)
    return None if full.startswith(_SKIPPED) else full


def _shown(full: str, line: int) -> str:
    cwd = os.getcwd() + os.sep
    shown = full[len(cwd) :] if full.startswith(cwd) else full
    return f"{shown}:{line}"


def site(frame: Any = None) -> str | None:
    """The innermost caller outside detcheck, installed packages and the standard library, as
    ``file:line`` (relative to the working directory when it is inside it), or ``None``."""
    frame = _program_frame(frame if frame is not None else sys._getframe(1))
    full = None if frame is None else _program_file(frame.f_code.co_filename)
    return None if full is None else _shown(full, frame.f_lineno)


@functools.lru_cache(maxsize=4096)
def _whose(path: str, through: str) -> tuple[str, str]:
    """``"program"`` (the program's file), ``"other"`` (another installed package's, or code
    torch.fx generated: a compiled graph calling the function) or ``"past"`` (a frame to look
    past: detcheck's, the standard library's, one under ``through``, or one with no file), with
    the path made absolute; cached: a wrapped function asks at every call."""
    if path.startswith("<eval_with_key>"):
        return "other", path
    if path.startswith("<"):
        return "past", path
    full = os.path.abspath(path)
    # Packages before the standard library: site-packages may lie inside its folder.
    if full.startswith(through) or full.startswith(_OURS):
        return "past", full
    if full.startswith(_PACKAGES):
        return "other", full
    if full.startswith(_STDLIB):
        return "past", full
    return "program", full


def program_caller(frame: Any, through: str) -> tuple[str, int] | None:
    """The program's own frame that called a function of the package under the folder
    ``through``, as (its file's absolute path, its line), when the innermost frame outside that
    package, detcheck and the standard library is the program's; ``None`` when it is another
    installed package's (a library's own use is not the program's) or a graph that torch.fx
    generated (compiled code: its frames carry no line of the program)."""
    while frame is not None:
        whose, full = _whose(frame.f_code.co_filename, through)
        if whose == "program":
            return full, frame.f_lineno
        if whose == "other":
            return None
        frame = frame.f_back
    return None


def entered(where: tuple[str, int], parts: Any) -> None:
    """Values entered torch at the program's line ``where`` (``program_caller``'s): ``parts``
    (byte buffers: their dtype, shape and values) go into that line's digest until the engine's
    next record."""
    digest = OUTSIDE.get(where)
    if digest is None:
        if len(OUTSIDE) >= _MAX_OUTSIDE_LINES:
            return
        digest = OUTSIDE[where] = [0, 1]
    crc, adler = digest
    for part in parts:
        crc, adler = zlib.crc32(part, crc), zlib.adler32(part, adler)
    digest[0], digest[1] = crc, adler


def flush_outside() -> None:
    """Notes one ``data/outside`` record per line where values entered torch since the last
    flush (in the order the lines were first reached), with that line; the engine calls it
    before each record it makes, so the record comes before the first one those values could
    have changed."""
    waiting = list(OUTSIDE.items())
    OUTSIDE.clear()
    for (full, line), (crc, adler) in waiting:
        digest = crc.to_bytes(4, "little") + adler.to_bytes(4, "little")
        note("data/outside", _array(digest), _shown(full, line))


def _program_frame(frame: Any) -> Any:
    """The innermost frame of the program's own files from ``frame`` outwards, or ``None``."""
    while frame is not None and _program_file(frame.f_code.co_filename) is None:
        frame = frame.f_back
    return frame


def assigned_at(frame: Any, value: Any) -> str | None:
    """Where ``value``, an object a program's call was given, got its name: the last line at or
    above the innermost program frame's line, in that frame's function, that assigns a name
    bound to ``value`` there (``shuffle = torch.Generator().manual_seed(...)``); else that
    frame's own line (``generator=torch.Generator().manual_seed(...)`` in the call)."""
    import linecache
    import re

    frame = _program_frame(frame)
    full = None if frame is None else _program_file(frame.f_code.co_filename)
    if full is None:
        return None
    names = [n for n, v in frame.f_locals.items() if v is value and n.isidentifier()]
    for line in range(frame.f_lineno - 1, max(frame.f_code.co_firstlineno, 1) - 1, -1):
        text = linecache.getline(full, line)
        if any(re.match(rf"\s*{n}\s*(:[^=]*)?=[^=]", text) for n in names):
            return _shown(full, line)
    return _shown(full, frame.f_lineno)


def note(name: str, array: Any, where: str | None) -> None:
    """Hands one piece of evidence to the running recording, or keeps it until one runs."""
    if _sink is not None:
        _sink(name, array, where)
    elif len(_waiting) < 10_000:
        _waiting.append((name, array, where))


#: The fact of the program's first draw from numpy's global generator before it was seeded
#: (``_note_unseeded_global_draws``).
UNSEEDED_GLOBAL_KEY = "site:unseeded_global"


def fact(key: str, value: str) -> None:
    """Notes a fact about the run (``site:<what>`` → the program's line); the first value of a
    key is kept."""
    if len(_facts) < 64:
        _facts.setdefault(key, value)


def facts() -> dict[str, str]:
    """The facts noted so far, for the trace's environment (with ``FILES_KEY`` when the
    program opened such files)."""
    noted = dict(_facts)
    if _files_read or _files_written:
        opened = {"read": sorted(_files_read), "wrote": sorted(_files_written)}
        noted[FILES_KEY] = json.dumps(opened, separators=(",", ":"))
    return noted


#: The environment entry of the files opened outside the launch's folder (src/compare/cause.rs).
FILES_KEY = "detcheck.files"
#: The most paths noted of each kind (the first ones opened).
_MAX_FILES = 32
#: Paths read before this process wrote them, and paths written (dicts: sets in opening order).
_files_read: dict[str, None] = {}
_files_written: dict[str, None] = {}
#: Path prefixes not noted (``install_file_audit``), and whether the hook is installed.
_not_noted: tuple[str, ...] = ()
_audited = False
#: ``os.open`` flags that write.
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def install_file_audit() -> None:
    """Notes the files the program opens outside the launch's private folder (module doc):
    an audit hook (``sys.addaudithook``: it cannot be removed, so it is added once, and it
    never raises)."""
    global _not_noted, _audited
    if _audited:
        return
    home = os.path.expanduser("~")
    tmp = tempfile.gettempdir()
    places = [
        *(
            os.sep + d + os.sep
            for d in ("proc", "sys", "dev", "etc", "usr", "lib", "lib64", "run", "var")
        ),
        *(os.path.abspath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}),
        *_SKIPPED,
        # The frameworks' caches (Inductor's and Triton's kernels, downloads), and fresh names
        # (tempfile's, multiprocessing's): no run reads another's through them by accident.
        os.path.join(home, ".cache") + os.sep,
        os.path.join(home, ".triton") + os.sep,
        os.path.join(tmp, "torchinductor_"),
        os.path.join(tmp, "triton"),
        os.path.join(tmp, "tmp"),
        os.path.join(tmp, "pymp-"),
    ]
    trace_dir = os.environ.get("DETCHECK_TRACE_DIR")
    if trace_dir:
        places.append(os.path.abspath(trace_dir) + os.sep)
    launch = _launch_folder(os.getcwd())
    if launch is not None:
        # The launch's private copy of the working directory (src/run/workdir.rs), which no
        # other run sees: a later launch gets it back made like the user's folder again.
        places.append(launch + os.sep)
    _not_noted = tuple(sorted(set(places)))
    sys.addaudithook(_audit)
    _audited = True


#: The processes this one started through ``torch.multiprocessing`` (``spawn``,
#: ``start_processes``): how many, and the program's line that started the first (or ``None``),
#: for the note of a rank that recorded nothing (``_launch.startup``): its ranks may be there.
STARTED_BY_TORCH: list[Any] = [0, None]
_SPAWN = "/torch/multiprocessing/"


#: The program's first line that started a thread or a process of its own (``concurrent``),
#: or ``None``.
_CONCURRENT: list[Any] = [None]
#: Whether ``install_process_watch`` watches for them (``[False]`` until it runs).
_WATCHING: list[bool] = [False]


def concurrent() -> str | None:
    """What runs beside the program's main thread by the program's own doing, as evidence that
    recording can change its values (a race whose odds recording's reads change): the line
    that started its first thread or process (``threading.Thread``, ``concurrent.futures``'
    pools, ``multiprocessing``; not one a library starts for itself: a data loader's workers,
    whose batches arrive in order unless it was made with ``in_order=False``, which
    ``runs_beside`` notes; a logger's writer), or ``"torch.multiprocessing"`` for
    processes started through it; ``"not watched"`` when ``install_process_watch`` did not run
    (an unperturbed run, ``DETCHECK_EVIDENCE=0``): nothing is known, so nothing is claimed."""
    if not _WATCHING[0]:
        return "not watched"
    if STARTED_BY_TORCH[0]:
        return f"torch.multiprocessing (at {STARTED_BY_TORCH[1]})"
    return _CONCURRENT[0]


def runs_beside(where: str | None) -> None:
    """Something the program made hands it values in the order they are ready, not in a fixed
    one (a data loader's workers with ``in_order=False``): ``concurrent`` then names ``where``
    (the program's line), as for a thread of its own."""
    if _CONCURRENT[0] is None:
        _CONCURRENT[0] = where or "?"


def _started_by_program(frame: Any) -> str | None:
    """The program's line that started a thread or process whose ``start`` ``frame`` called,
    looking past the standard library's frames (``threading``, ``concurrent.futures``,
    ``multiprocessing.pool``); ``None`` when the first frame outside it is a package's or
    detcheck's."""
    while frame is not None:
        path = frame.f_code.co_filename
        whose, full = _whose(path, _NO_PACKAGE)
        if whose == "program":
            return _shown(full, frame.f_lineno)
        if whose == "other" or full.startswith(_OURS):
            return None
        frame = frame.f_back
    return None


def install_process_watch() -> None:
    """Watches the threads and processes the program starts. Notes ``site:process_started``,
    the program's first line that starts a ``multiprocessing`` process itself and hands it a
    model (``mp.Process(target=train, args=(rank, model)).start()``: a Hogwild trainer), not one
    a library starts (data-loader workers, ``mp.spawn``'s ranks: their ``start`` is called from
    the library's own code) nor one given no model (a logger); counts ``STARTED_BY_TORCH``; and
    keeps the first line that started any thread or process of the program's own
    (``concurrent``), a program it starts with ``subprocess.Popen`` (or ``os.popen``) included,
    not one ``subprocess.run``, ``call`` or ``check_output`` waits for. ``BaseProcess.start``,
    ``threading.Thread.start`` and ``subprocess.Popen.__init__`` are wrapped: methods of Python
    classes, so no ``isinstance`` changes."""
    import subprocess
    import threading
    from multiprocessing import process

    _WATCHING[0] = True
    original = process.BaseProcess.start
    if getattr(original, "_detcheck_started", False):
        return

    @functools.wraps(original)
    def start(self: Any) -> Any:
        try:
            frame = sys._getframe(1)
            whose, full = _whose(frame.f_code.co_filename, _NO_PACKAGE)
            given = [*getattr(self, "_args", ()), *getattr(self, "_kwargs", {}).values()]
            if whose == "program" and any(hasattr(a, "register_parameter") for a in given):
                fact("site:process_started", _shown(full, frame.f_lineno))
            if _SPAWN in frame.f_code.co_filename.replace(os.sep, "/"):
                STARTED_BY_TORCH[0] += 1
                if STARTED_BY_TORCH[1] is None:
                    STARTED_BY_TORCH[1] = site(frame)
            if _CONCURRENT[0] is None:
                _CONCURRENT[0] = _started_by_program(frame)
        except Exception:
            pass
        return original(self)

    start._detcheck_started = True  # type: ignore[attr-defined]
    process.BaseProcess.start = start  # type: ignore[method-assign]

    original_thread = threading.Thread.start

    @functools.wraps(original_thread)
    def start_thread(self: Any) -> Any:
        try:
            if _CONCURRENT[0] is None:
                _CONCURRENT[0] = _started_by_program(sys._getframe(1))
        except Exception:
            pass
        return original_thread(self)

    threading.Thread.start = start_thread  # type: ignore[method-assign]

    original_popen = subprocess.Popen.__init__
    # ``subprocess``'s own file: a ``Popen`` made there is one its ``run`` or ``call`` waits for.
    own = os.path.abspath(subprocess.__file__)

    @functools.wraps(original_popen)
    def popen(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            frame = sys._getframe(1)
            # `subprocess.run`, `call` and `check_output` wait for the program they start.
            waited = os.path.abspath(frame.f_code.co_filename) == own
            if _CONCURRENT[0] is None and not waited:
                _CONCURRENT[0] = _started_by_program(frame)
        except Exception:
            pass
        original_popen(self, *args, **kwargs)

    subprocess.Popen.__init__ = popen  # type: ignore[method-assign]


def _launch_folder(cwd: str) -> str | None:
    """The folder of the launch's private copy of the working directory
    (``.../detcheck-cwd-PID-N-HOST``, src/run/workdir.rs) when ``cwd`` is inside it (the folders
    above the working directory are mirrored too: ``<copy>/home/me/lt/examples/basics``), else
    ``None``."""
    here = cwd
    while True:
        if os.path.basename(here).startswith("detcheck-cwd-"):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not _audited:
        return
    try:
        path, mode, flags = args[:3]
        if isinstance(mode, str):
            opened(path, writes=any(c in mode for c in "wax+"))
        else:
            opened(path, writes=bool((flags or 0) & _WRITES))
    except Exception:
        pass  # evidence, never a failure of the program


def opened(path: Any, writes: bool) -> None:
    """Notes a file the program opened (the audit hook's ``open`` events, and the writers that
    open their files in C++: ``torch.save``), unless it is in a place not noted."""
    if not _audited or path is None or isinstance(path, int):
        return  # not a rank detcheck launched, or a file descriptor
    full = os.path.abspath(os.fsdecode(os.fspath(path)))
    if full.startswith(_not_noted) or full.endswith((".py", ".pyc")):
        return  # Python's imports read the program's modules
    if writes:
        if len(_files_written) < _MAX_FILES:
            _files_written.setdefault(full, None)
    elif (
        full not in _files_written
        and full not in _files_read
        and len(_files_read) < _MAX_FILES
        and os.path.isfile(full)
    ):
        _files_read[full] = None


def attach(sink: Callable[[str, Any, str | None], None]) -> None:
    """A recording starts: ``sink`` takes the evidence from now on, and first what waited."""
    global _sink
    _sink = sink
    waiting = list(_waiting)
    _waiting.clear()
    for item in waiting:
        sink(*item)


def detach(sink: Callable[[str, Any, str | None], None]) -> None:
    global _sink
    if _sink == sink:
        _sink = None


def _forked() -> None:
    # A forked child (a data-loader worker) is no rank: its seeding and draws are not noted.
    global _sink
    _sink = None
    _generators.clear()
    _waiting.clear()
    _facts.clear()
    OUTSIDE.clear()
    _files_read.clear()
    _files_written.clear()


os.register_at_fork(after_in_child=_forked)


def installed() -> bool:
    """Whether this process gathers evidence (a rank detcheck launched)."""
    return bool(_generators)


def add_generator(name: str, state: Callable[[], bytes]) -> None:
    """Follows the generator ``name`` (its state as bytes from ``state()``), from its state
    now."""
    _generators[name] = state
    try:
        _last[name] = _initial[name] = state()
    except Exception:
        _generators.pop(name, None)


def _array(state: bytes) -> Any:
    import numpy as np

    return np.frombuffer(state, dtype=np.uint8)


#: The global generators some call has seeded in this process (whoever called it).
_seeded_once: set[str] = set()


def _seeded(
    name: str, frame: Any, args: tuple[Any, ...], kwargs: dict[str, Any], drawn: bool
) -> None:
    """A call seeded the generator ``name`` (``drawn``: drawn from before it was first seeded,
    ``SEEDED_AFTER_DRAWS``): notes ``seed/<name>`` with its line, unless the call is a library's
    own."""
    _seeded_once.add(name)
    state = _generators.get(name)
    if state is None:
        return
    now = state()
    _last[name] = now
    if _libraries_own_seeding(frame):
        return
    _seed_was_drawn(args, kwargs)
    where = call_site(frame)
    if drawn and where is not None:
        fact(SEEDED_AFTER_DRAWS[name], where)
    _pass_on_seeding(where)
    note(f"seed/{name}", _array(now), where)


#: The variable that tells the processes a process starts where it first seeded a generator
#: (``"<pid> <file:line>"``): a rank that process started (``torch.multiprocessing.spawn``)
#: does not inherit the seed, and its cause says so only where the parent did seed.
SEEDED_VAR = "DETCHECK_SEEDED_AT"


def _pass_on_seeding(where: str | None) -> None:
    mine = f"{os.getpid()} "
    if not os.environ.get(SEEDED_VAR, "").startswith(mine):
        os.environ[SEEDED_VAR] = mine + (where or "?")


def parent_seeded() -> str | None:
    """Where the process that started this one first seeded a generator (``SEEDED_VAR``), or
    ``None``: it did not (or this process seeded first itself)."""
    pid, _, where = os.environ.get(SEEDED_VAR, "").partition(" ")
    return where if pid and pid != str(os.getpid()) else None


def _main_file() -> str | None:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.abspath(path) if isinstance(path, str) else None


def call_site(frame: Any) -> str | None:
    """``site(frame)``, and where the innermost program frame is in a helper of the program's
    (another of its files than the script it ran), the script's line that led there first:
    ``chargpt.py:102, in mingpt/utils.py:16``: the line to change is the program's own call."""
    main = _main_file()
    inner = None
    while frame is not None:
        full = _program_file(frame.f_code.co_filename)
        if full is not None:
            if inner is None:
                inner = (full, frame.f_lineno)
                if main is None or full == main:
                    break
            elif full == main:
                return f"{_shown(full, frame.f_lineno)}, in {_shown(*inner)}"
        frame = frame.f_back
    return None if inner is None else _shown(*inner)


#: What only a model's class has (torch's ``Module``, MindSpore's ``Cell``): the ``__init__``
#: frames ``note_module_built`` looks through are theirs.
_REGISTERS = ("register_parameter", "insert_param_to_cell")

#: Where each outermost module was built (``id`` -> the program's line that called its
#: ``__init__``), noted as its parameters are registered (``note_module_built``); bounded.
_BUILT: dict[int, str] = {}

#: The framework helpers that build a model from a configuration and seed through an option of
#: their own, by a path their module's file ends with, and their name: a model built inside one
#: (``note_module_built``) notes ``site:model_builder``, whose fix the report takes from
#: src/diagnose/cause.rs ``MODEL_BUILDERS`` (``LightningCLI(..., seed_everything_default=False)``
#: is seeded by ``--seed_everything 0``, not by a call the program adds).
MODEL_BUILDERS = (
    ("lightning/pytorch/cli.py", "LightningCLI"),
    ("pytorch_lightning/cli.py", "LightningCLI"),
)
#: The fact of the builder that built the recorded model (src/compare/cause.rs).
MODEL_BUILDER_KEY = "site:model_builder"

#: ``_BUILT``'s lines whose model a ``MODEL_BUILDERS`` helper built, and its name.
_BUILT_BY: dict[str, str] = {}

#: The lines of ``_BUILT`` whose model was built after torch's generator, never seeded yet, had
#: been drawn from (``drawn_before``).
_DRAWN_BEFORE: set[str] = set()

#: The fact of the model's line when torch's generator was drawn from, unseeded, before it.
DRAWN_BEFORE_MODEL_KEY = "site:drawn_before_model"


def note_module_built(frame: Any) -> None:
    """A parameter is being registered (``frame``: inside some module's ``__init__``): notes
    the line that built the outermost module under construction, the frame just outside its
    ``__init__``, the first time, for it and for every module under construction inside it (a
    layer kept in a plain list, which the outer module does not register, is a model of its
    own: pytorch/examples' mnist_forward_forward)."""
    owners = []
    while frame is not None:
        if frame.f_code.co_name == "__init__":
            owner = frame.f_locals.get("self")
            if owner is not None and any(hasattr(owner, a) for a in _REGISTERS):
                owners.append((owner, frame))
        frame = frame.f_back
    if not owners or len(_BUILT) >= 4096:
        return
    outermost, init = owners[-1]
    if all(id(owner) in _BUILT for owner, _ in owners):
        return
    where = _BUILT.get(id(outermost)) or call_site(init.f_back)
    if where is None:
        return
    if id(outermost) not in _BUILT:
        if _drawn_unseeded("torch"):
            _DRAWN_BEFORE.add(where)
        builder = _builder(init.f_back)
        if builder is not None:
            _BUILT_BY.setdefault(where, builder)
    for owner, _ in owners:
        _BUILT.setdefault(id(owner), where)


def _drawn_unseeded(name: str) -> bool:
    """Whether the followed generator ``name`` was drawn from before anything seeded it."""
    state = _generators.get(name)
    if state is None or name in _seeded_once:
        return False
    try:
        return state() != _initial.get(name)
    except Exception:
        return False


def drawn_before(built: str) -> bool:
    """Whether the model built at the line ``built`` (``built_at``) was built after torch's
    generator, not seeded yet, had been drawn from: a seed just above that line would leave
    those draws differing (pytorch/examples' regression draws its target function first)."""
    return built in _DRAWN_BEFORE


def _builder(frame: Any) -> str | None:
    """The ``MODEL_BUILDERS`` helper among ``frame`` and its callers, if any."""
    for _ in range(64):
        if frame is None:
            return None
        path = frame.f_code.co_filename.replace(os.sep, "/")
        for suffix, name in MODEL_BUILDERS:
            if path.endswith(suffix):
                return name
        frame = frame.f_back
    return None


def built_by(where: str) -> str | None:
    """The ``MODEL_BUILDERS`` helper that built the model of ``built_at``'s line, if one did."""
    return _BUILT_BY.get(where)


def built_at(module: Any) -> str | None:
    """The program's line that built ``module`` (or the model a wrapper holds), if noted; else
    its first submodule's (``nn.Sequential(nn.Linear(...))``: the layers are built, at that
    line, before the container)."""
    wrapped = ("module", "_orig_mod", "network", "_backbone")  # torch's wrappers, MindSpore's
    for candidate in (module, *(getattr(module, name, None) for name in wrapped)):
        if hasattr(candidate, "modules"):
            parts = candidate.modules()
        elif hasattr(candidate, "cells_and_names"):
            parts = (cell for _, cell in candidate.cells_and_names())
        else:
            continue
        for k, part in enumerate(parts):
            if id(part) in _BUILT:
                return _BUILT[id(part)]
            if k >= 1000:
                break
    return None


#: ``_whose``'s ``through`` when no package's frames are to be looked past (no path starts
#: with it).
_NO_PACKAGE = "\0"


def _libraries_own_seeding(frame: Any) -> bool:
    """Whether a seeding call is an installed package's own, not the program's: the call comes
    from a package (not the program's files), and the program's line that led to it does not
    ask for seeding (no "seed" in it: `for x in loader:` reaching torchvision's FakeData, which
    seeds torch for each sample, against `seed_everything(0)` or `set_seed(0)`, a helper the
    program calls to seed)."""
    import linecache

    first = None
    while frame is not None:
        whose, full = _whose(frame.f_code.co_filename, _NO_PACKAGE)
        if whose != "past" and first is None:
            first = whose
        if whose == "program":
            if first != "other":
                return False
            return "seed" not in linecache.getline(full, frame.f_lineno).lower()
        frame = frame.f_back
    return first == "other"


def track_seeding(owner: Any, attribute: str, generator: str) -> None:
    """Wraps ``owner.attribute`` (a function that seeds ``generator``) so that each call notes
    ``seed/<generator>``; wrapping twice does nothing."""
    original = getattr(owner, attribute, None)
    if original is None or getattr(original, "_detcheck_seeding", False):
        return

    @functools.wraps(original)
    def seeding(*args: Any, **kwargs: Any) -> Any:
        drawn = generator in SEEDED_AFTER_DRAWS and _drawn_unseeded(generator)
        result = original(*args, **kwargs)
        try:
            _seeded(generator, sys._getframe(1), args, kwargs, drawn)
        except Exception:
            pass
        return result

    seeding._detcheck_seeding = True  # type: ignore[attr-defined]
    try:
        setattr(owner, attribute, seeding)
    except (AttributeError, TypeError):
        pass


def step_starts() -> list[tuple[str, Any]]:
    """The generators drawn from since they were last looked at, as ``(rng/<name>, state)``."""
    changed = []
    for name, state in _generators.items():
        try:
            now = state()
        except Exception:
            continue
        if _last.get(name) != now:
            _last[name] = now
            changed.append((f"rng/{name}", _array(now)))
    return changed


def _python_state() -> bytes:
    import array
    import random

    _, internal, _ = random.getstate()
    return array.array("Q", internal).tobytes()


def install_python() -> None:
    """Follows Python's ``random``: its state, ``random.seed``, and the program's draws from it
    before anything seeded it (``_note_unseeded_draws``)."""
    import random

    add_generator("python", _python_state)
    _note_unseeded_draws(random, _PYTHON_DRAWS, "python")
    track_seeding(random, "seed", "python")


def _numpy_state() -> bytes:
    import numpy as np

    # numpy's own `get_state`, past the wrapper that notes a draw before seeding: this read is
    # detcheck's, never the program's.
    get_state = np.random.get_state
    state: Any = getattr(get_state, "__wrapped__", get_state)(legacy=True)
    _, keys, pos, has_gauss, _ = state
    return bytes(np.asarray(keys).tobytes()) + int(pos).to_bytes(8, "little") + bytes([has_gauss])


def install_numpy(numpy: Any) -> None:
    """Follows numpy's global generator (its state, and ``numpy.random.seed``); a ``Generator``
    made without a seed is ``install_unseeded_makers``'."""
    add_generator("numpy", _numpy_state)
    _note_unseeded_draws(numpy.random, _NUMPY_DRAWS, "numpy")
    track_seeding(numpy.random, "seed", "numpy")


#: numpy's global generator's functions that draw from it or read its state to derive a seed
#: (`datasets`' ``shuffle()`` without a seed: ``np.random.get_state()``, then one draw).
_NUMPY_DRAWS = (
    "get_state",
    "random",
    "random_sample",
    "rand",
    "randn",
    "randint",
    "permutation",
    "shuffle",
    "choice",
    "uniform",
    "normal",
)


#: Python's ``random``'s functions that draw from its global generator (the module's functions
#: are its hidden instance's methods: a program calls these).
_PYTHON_DRAWS = (
    "random",
    "randint",
    "randrange",
    "getrandbits",
    "uniform",
    "choice",
    "choices",
    "sample",
    "shuffle",
    "gauss",
    "normalvariate",
)

#: The fact of each global generator's first draw before it was seeded, by generator.
UNSEEDED_KEYS = {"numpy": UNSEEDED_GLOBAL_KEY, "python": "site:unseeded_python"}

#: The fact of torch's first seeding call after its default generator had been drawn from
#: (torch's draws are C calls, not followed one by one: the seeding call's line, where the draws
#: before it are known to have happened).
UNSEEDED_TORCH_KEY = "site:unseeded_torch"

#: The generators whose draws are not followed one by one (C calls), by the fact of the first
#: call that seeded one after it had been drawn from (``track_seeding``).
SEEDED_AFTER_DRAWS = {"torch": UNSEEDED_TORCH_KEY}

#: The fact of a draw before seeding whose value a generator was then seeded with.
SEED_DRAWN_KEY = "site:seed_drawn"

#: The int values drawn from a global generator before it was seeded -> the draw's line (the
#: first 64): a seed later given one of them was drawn, not chosen (``_seed_was_drawn``).
_unseeded_values: dict[int, str] = {}


def _note_unseeded_draws(module: Any, names: tuple[str, ...], generator: str) -> None:
    """Wraps a global generator's draws (``names`` of ``module``): the first one the program's
    line makes, directly or through a library, before anything seeded that generator notes its
    ``UNSEEDED_KEYS`` fact (the generator seeds itself from OS entropy at import: what is drawn
    then differs in each run, though the program seeds it later, as a Trainer does); an int it
    returns then is kept for ``_seed_was_drawn``."""
    for name in names:
        original = getattr(module, name, None)
        if original is not None and not getattr(original, "_detcheck_unseeded", False):
            try:
                setattr(module, name, _noting_unseeded(original, generator))
            except (AttributeError, TypeError):
                pass


def _noting_unseeded(original: Any, generator: str) -> Any:
    key = UNSEEDED_KEYS[generator]

    @functools.wraps(original)
    def draw(*args: Any, **kwargs: Any) -> Any:
        value = original(*args, **kwargs)
        if generator in _seeded_once:
            return value
        # The caller's line is looked for (a walk up the stack) once for the fact, then for
        # each int value while fewer than 64 are kept.
        drawn = _an_int(value) if len(_unseeded_values) < 64 else None
        if drawn is not None or key not in _facts:
            try:
                where = site(sys._getframe(1))
                if where is not None:
                    fact(key, where)
                    if drawn is not None:
                        _unseeded_values.setdefault(drawn, where)
            except Exception:
                pass
        return value

    draw._detcheck_unseeded = True  # type: ignore[attr-defined]
    return draw


def _an_int(value: Any) -> int | None:
    """``value`` as an int when it is one: Python's, or a numpy integer scalar
    (``np.random.randint(10_000)``)."""
    if type(value) is int:
        return value
    kind = type(value)
    if kind.__module__ == "numpy" and kind.__name__.startswith(("int", "uint")):
        return int(value)
    return None


def _seed_was_drawn(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A seeding call given a value drawn before seeding (``_unseeded_values``) notes
    ``SEED_DRAWN_KEY``: the draw's line."""
    if not _unseeded_values:
        return
    seed = args[0] if args else next(iter(kwargs.values()), None)
    try:
        drawn = _unseeded_values.get(int(seed)) if seed is not None else None
    except (TypeError, ValueError, OverflowError):
        drawn = None
    if drawn is not None:
        fact(SEED_DRAWN_KEY, drawn)


#: The functions that make a generator and seed it from OS entropy when given no seed:
#: (module, function, maker). A call without a seed notes ``site:unseeded_generator`` at the
#: program's line (the innermost frame outside installed packages: the program's own call that
#: led there) and ``site:unseeded_maker``, the maker, whose words and fix the report takes from
#: src/diagnose/cause.rs ``UNSEEDED_MAKERS``. numpy's ``default_rng()``; gymnasium's
#: ``seeding.np_random()``, which an environment's first ``reset()`` without ``seed=`` calls, and
#: a space's first ``sample()`` before ``space.seed(...)`` (pytorch/examples' reinforcement
#: learning, whose environment's start states then differ from run to run).
UNSEEDED_MAKERS = (
    ("numpy.random", "default_rng", "numpy"),
    ("gymnasium.utils.seeding", "np_random", "gymnasium"),
)
#: The facts of the first generator made without a seed: the program's line, and its maker
#: (src/compare/cause.rs).
UNSEEDED_GENERATOR_KEY = "site:unseeded_generator"
UNSEEDED_MAKER_KEY = "site:unseeded_maker"


def install_unseeded_makers(when_imported: Callable[[str, Callable[[Any], None]], None]) -> None:
    """Wraps each of ``UNSEEDED_MAKERS`` once its module is imported (``when_imported(name,
    callback)``: now, when it already is)."""
    for module, function, maker in UNSEEDED_MAKERS:
        when_imported(
            module, functools.partial(_note_unseeded_maker, function=function, maker=maker)
        )


def _note_unseeded_maker(module: Any, function: str, maker: str) -> None:
    """Wraps ``module.function`` (a function: wrapping it changes no ``isinstance``): a call
    without a seed (its first argument, or ``seed=``), or with ``None``, notes the maker's
    facts. A generator the program makes is not followed otherwise (module doc)."""
    original = getattr(module, function, None)
    if original is None or getattr(original, "_detcheck_unseeded", False):
        return

    @functools.wraps(original)
    def make(*args: Any, **kwargs: Any) -> Any:
        if (args[0] if args else kwargs.get("seed")) is None:
            try:
                fact(UNSEEDED_GENERATOR_KEY, site(sys._getframe(1)) or "?")
                fact(UNSEEDED_MAKER_KEY, maker)
            except Exception:
                pass
        return original(*args, **kwargs)

    make._detcheck_unseeded = True  # type: ignore[attr-defined]
    try:
        setattr(module, function, make)
    except (AttributeError, TypeError):
        pass
