"""What the tests share: the repository's paths, the independent trace decoder
(scripts/dctrace.py), the one runner of the `detcheck` binary, and the one way to skip.

A test module imports from here (``from support import decode``), never from ``conftest`` or
another test module (test_layout.py checks it); conftest.py holds only fixtures. pytest finds
this package because it puts python/tests on ``sys.path`` (its default "prepend" import mode).

``requires(name)`` is the only way a test skips: it skips when ``name`` is missing, unless the
``DETCHECK_REQUIRE_*`` variable of ``name`` is set (CI sets them), when the test fails instead.
"""

import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from functools import cached_property
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DCTRACE = ROOT / "scripts" / "dctrace.py"
#: The example programs (numpy, mpi4py, torch, frameworks, the corpus, the unmodified scripts).
PROGRAMS = ROOT / "examples" / "programs" / "python"

# --- Trace files, read without detcheck ----------------------------------------------------------

_RECORD = re.compile(
    r"^step (?P<step>\d+) seq (?P<seq>\d+) (?P<name>\S+) (?P<dtype>\w+)\[(?P<shape>[^\]]*)\] "
    r"md5 (?P<md5>[0-9a-f]{32})(?P<rest>.*)$"
)


def tree_digest(data):
    """A record's digest of ``data``, by its definition (docs/trace-format.md, "The digest"):
    md5 of each 4096-byte chunk, concatenated, again, until one chunk remains, whose plain md5
    is the digest (plain md5 for at most 4096 bytes)."""
    b = bytes(data)
    while len(b) > 4096:
        b = b"".join(hashlib.md5(b[i : i + 4096]).digest() for i in range(0, len(b), 4096))
    return hashlib.md5(b).digest()


def digest_hex(data):
    """``tree_digest(data)`` as the trace decoder prints it."""
    return tree_digest(data).hex()


def dctrace(path):
    """The text scripts/dctrace.py prints for the trace file ``path`` (its header, environment
    entries and records)."""
    return subprocess.run(
        [sys.executable, str(DCTRACE), str(path)], capture_output=True, text=True, check=True
    ).stdout


def decode(path):
    """The records of a trace file as dicts, read by scripts/dctrace.py (not by detcheck)."""
    out = dctrace(path)
    records = []
    for line in out.splitlines():
        m = _RECORD.match(line)
        if not m:
            continue
        rest = m["rest"].split()
        record = {
            "step": int(m["step"]),
            "seq": int(m["seq"]),
            "name": m["name"],
            "dtype": m["dtype"],
            "shape": [int(d) for d in m["shape"].split(",") if d.strip()],
            "md5": m["md5"],
            "replicated": "replicated" in rest,
        }
        for key in ("max", "min", "mean", "norm"):
            if key in rest:
                record[key] = float(rest[rest.index(key) + 1])
        records.append(record)
    header = out.splitlines()[0]
    assert header.startswith("header:"), out
    return records


def environment(path):
    """The environment entries of a trace file (scripts/dctrace.py), as a dict."""
    return dict(
        line[len("environment: ") :].split("=", 1)
        for line in dctrace(path).splitlines()
        if line.startswith("environment: ")
    )


# --- The `detcheck` binary -----------------------------------------------------------------------


def detcheck_path():
    """The absolute path of the `detcheck` binary: $DETCHECK_BIN (a relative one is taken from
    the current directory, so a test may run the binary in another), or the release build (built
    here with `cargo build --release --bin detcheck`, in $CARGO_TARGET_DIR or target/)."""
    if os.environ.get("DETCHECK_BIN"):
        return os.path.abspath(os.environ["DETCHECK_BIN"])
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--bin", "detcheck"], cwd=ROOT, check=True
    )
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target.is_absolute():
        target = ROOT / target
    return str(target / "release" / "detcheck")


class DetcheckRun:
    """What one `detcheck` command did: its exit ``code``, ``stdout`` and ``stderr``; ``out``
    (both, for assertion messages); ``lines`` (its JSON lines, parsed) and ``scenarios`` (the
    scenario lines of `check --format json`, by scenario name)."""

    def __init__(self, args, code, stdout, stderr):
        self.args = args
        self.code = code
        self.stdout = stdout
        self.stderr = stderr

    @property
    def out(self):
        return self.stdout + self.stderr

    @cached_property
    def lines(self):
        return [json.loads(line) for line in self.stdout.splitlines() if line.startswith("{")]

    @cached_property
    def scenarios(self):
        return {s["scenario"]["name"]: s for s in self.lines if s.get("type") == "scenario"}


def run_detcheck(detcheck_bin, *args, cwd=None, env=None, timeout=1800, code=None):
    """Runs `detcheck ARGS` (paths as strings) and returns its ``DetcheckRun``; with ``code``,
    asserts that it exited with it.

    The command runs with this interpreter's folder first on PATH, so the `python3` of the
    programs it launches is this environment's (this build of the package, and its start-up
    hook). ``env``: variables set on top of this process's environment. ``cwd``: its working
    directory. ``timeout``: a backstop in seconds against a hung run, not a measurement."""
    __tracebackhide__ = True  # an unexpected exit code is reported at the caller's line
    full = dict(os.environ)
    full["PATH"] = os.path.dirname(sys.executable) + os.pathsep + full.get("PATH", "")
    full.update(env or {})
    argv = [str(detcheck_bin), *map(str, args)]
    done = subprocess.run(argv, capture_output=True, text=True, env=full, timeout=timeout, cwd=cwd)
    run = DetcheckRun(argv, done.returncode, done.stdout, done.stderr)
    if code is not None:
        assert run.code == code, (
            f"`{' '.join(argv)}` exited with {run.code}, not {code}:\n{run.out}"
        )
    return run


#: How a passing `repeat`'s note begins where its unperturbed runs took run 2's place: a program
#: that can race, compared by the end states of run 1 and two runs that read nothing during
#: their steps (docs/checks.md).
ALIKE = "by end states: run 1 and 2 unperturbed runs end alike"


def check(detcheck_bin, *args, unperturbed=False, **kwargs):
    """`detcheck check --no-progress --format json ARGS` (``run_detcheck``'s options).

    Without ``unperturbed``, `--no-unperturbed` too: a test checks its own subject (a launcher, a
    wrapper, a planted bug), and `repeat`'s two unperturbed runs of a passing program would
    add to its cost (docs/checks.md). Tests whose subject is the verdict on a program as it runs
    without detcheck pass ``unperturbed=True`` (test_verdicts.py, test_zoo.py's manifest rows,
    one MindSpore and one DDP script: python/tests/README.md)."""
    flags = () if unperturbed or "--no-unperturbed" in args else ("--no-unperturbed",)
    return run_detcheck(
        detcheck_bin, "check", "--no-progress", "--format", "json", *flags, *args, **kwargs
    )


def caught_with_element(line):
    """The first divergence of a caught control (a scenario line), after checking its element
    is named."""
    assert line["verdict"] == "ok (caught)", line
    first = line["first_divergence"]
    element = first["element"]
    found = element.get("found") or element.get("found_in_reruns")
    assert found is not None, element
    assert isinstance(found["index"], list) and found["flat_index"] >= 0
    assert found["left_bits"] != found["right_bits"]
    assert found["left_bits"].startswith("0x") and found["right_bits"].startswith("0x")
    assert found["ulps"] is None or found["ulps"] >= 1
    return first


class MadeWhenRead:
    """A module's expensive files (dumps, comparisons) as a mapping whose values are made when
    first read, a group of keys at a time: ``make(group)`` returns {key: value} for every key
    whose ``group_of(key)`` is ``group``. The tests that run (CI leaves the full tier out,
    docs/testing.md) make only what they read."""

    def __init__(self, make, group_of=lambda key: key):
        self.make, self.group_of, self.made = make, group_of, {}

    def __getitem__(self, key):
        if key not in self.made:
            self.made.update(self.make(self.group_of(key)))
        return self.made[key]


def runs(variable="DETCHECK_CONTROL_RUNS", default=1):
    """How many times to run a control: ``$variable``, ``default`` (1) when unset (.ci/run and
    scripts/diagnosis-controls.sh ask for more)."""
    return int(os.environ.get(variable, str(default)))


# --- Python programs in fresh interpreters -------------------------------------------------------


def run_python(tmp_path, source, *args, timeout=600):
    """Runs ``source`` (dedented) as tmp_path/program.py with ``args`` in a fresh interpreter
    that sees this one's ``sys.path`` (accelerate's and Lightning's state is process-wide);
    asserts it exits with 0 and returns the JSON object it prints last."""
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(source))
    done = subprocess.run(
        [sys.executable, str(program), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- What a test needs, and the one way to skip --------------------------------------------------

_TORCH = ("DETCHECK_REQUIRE_TORCH", "DETCHECK_REQUIRE_FRAMEWORKS")  # --frameworks implies --torch
_FRAMEWORKS = ("DETCHECK_REQUIRE_FRAMEWORKS",)


def _module(name):
    return lambda: importlib.import_module(name)


def _mpi4py():
    # Not imported: mpi4py is only launched, by mpirun, in the programs the tests check.
    if importlib.util.find_spec("mpi4py") is None:
        raise ImportError("No module named 'mpi4py'")
    if shutil.which("mpirun") is None:
        raise ImportError("mpirun is not on PATH")


def _gloo():
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        raise ImportError("torch.distributed with gloo is not available")


def _slurm():
    # A Slurm that answers: srun on PATH and a node ready for jobs (scripts/slurm-local.sh start).
    if shutil.which("srun") is None or shutil.which("sinfo") is None:
        raise ImportError("srun is not on PATH")
    states = subprocess.run(
        ["sinfo", "--noheader", "--Node", "--format=%T"], capture_output=True, text=True
    ).stdout.split()
    if not any(s in ("idle", "mixed", "allocated", "completing") for s in states):
        raise ImportError(f"no Slurm node is up (sinfo: {states or 'no answer'})")


def _fork():
    if not hasattr(os, "fork"):
        raise ImportError("os.fork is POSIX")


def _msprobe(framework="torch"):
    """The Python interpreter that imports msprobe (mindstudio-probe) with ``framework``:
    $DETCHECK_MSPROBE_PYTHON (torch) or $DETCHECK_MSPROBE_MS_PYTHON (mindspore), else
    target/venv-msprobe's or target/venv-msprobe-ms's (scripts/install-msprobe.sh [--mindspore]),
    else this one."""
    variable, venv = {
        "torch": ("DETCHECK_MSPROBE_PYTHON", "venv-msprobe"),
        "mindspore": ("DETCHECK_MSPROBE_MS_PYTHON", "venv-msprobe-ms"),
    }[framework]
    candidates = [os.environ.get(variable), ROOT / "target" / venv]
    for candidate in candidates:
        if not candidate:
            continue
        python = Path(candidate)
        if python.is_dir():
            python = python / "bin" / "python"
        if python.exists():
            break
    else:
        python = Path(sys.executable)
    found = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util as u; "
            f"print(all(u.find_spec(m) is not None for m in ('msprobe', {framework!r})))",
        ],
        capture_output=True,
        text=True,
    )
    if found.stdout.strip() != "True":
        raise ImportError(f"{python} cannot import msprobe and {framework}")
    return str(python)


#: name -> (probe: returns what `requires` returns or raises ImportError, the variables that make
#: it required, where it comes from).
def _deepspeed():
    # Not imported here (its import starts its accelerator): found, for the programs it runs.
    if importlib.util.find_spec("deepspeed") is None:
        raise ImportError("No module named 'deepspeed'")


_NEEDS = {
    "torch": (_module("torch"), _TORCH, "scripts/install-python.sh --torch installs it"),
    "torchvision": (
        _module("torchvision"),
        _TORCH,
        "scripts/install-python.sh --torch installs it",
    ),
    "gymnasium": (
        _module("gymnasium"),
        _TORCH,
        "scripts/install-python.sh --torch installs it",
    ),
    "deepspeed": (
        _deepspeed,
        ("DETCHECK_REQUIRE_DEEPSPEED",),
        "scripts/install-python.sh --deepspeed installs it",
    ),
    "triton": (
        _module("triton"),
        _TORCH,
        "installed with torch (scripts/install-python.sh --torch)",
    ),
    "gloo": (_gloo, _TORCH, "torch's CPU backend of torch.distributed"),
    "transformers": (
        _module("transformers"),
        _FRAMEWORKS,
        "scripts/install-python.sh --frameworks installs it",
    ),
    "accelerate": (
        _module("accelerate"),
        _FRAMEWORKS,
        "scripts/install-python.sh --frameworks installs it",
    ),
    "lightning": (
        _module("lightning"),
        _FRAMEWORKS,
        "scripts/install-python.sh --frameworks installs it",
    ),
    "lightning.pytorch": (
        _module("lightning.pytorch"),
        _FRAMEWORKS,
        "scripts/install-python.sh --frameworks installs it",
    ),
    "mpi4py": (_mpi4py, ("DETCHECK_REQUIRE_MPI4PY",), "mpi4py and mpirun; .ci/run installs them"),
    "mindspore": (
        _module("mindspore"),
        ("DETCHECK_REQUIRE_MINDSPORE",),
        "scripts/install-python.sh --mindspore target/venv-ms installs it (a venv of its own: "
        "MindSpore 2.10 needs numpy<2)",
    ),
    "fork": (_fork, (), "a POSIX system"),
    "msprobe": (
        _msprobe,
        ("DETCHECK_REQUIRE_MSPROBE",),
        "scripts/install-msprobe.sh installs it into target/venv-msprobe",
    ),
    "msprobe-mindspore": (
        lambda: _msprobe("mindspore"),
        ("DETCHECK_REQUIRE_MSPROBE",),
        "scripts/install-msprobe.sh --mindspore installs it into target/venv-msprobe-ms",
    ),
    "slurm": (
        _slurm,
        ("DETCHECK_REQUIRE_SLURM",),
        "bash scripts/slurm-local.sh start runs a one-node Slurm here",
    ),
}


def required(name):
    """Whether a test needing ``name`` must fail rather than skip where it is missing (one of
    its ``DETCHECK_REQUIRE_*`` variables is set, non-empty)."""
    return any(os.environ.get(v) for v in _NEEDS[name][1])


def requires(name):
    """What a test needs: returns ``name``'s module (``None`` for what is not a module: mpi4py
    with mpirun, gloo, fork) when it is there. When it is missing, skips the test (or the whole
    module, called at its top level) with the reason; or, where ``required(name)``, fails it.

    ``name``: torch, torchvision, gymnasium, deepspeed, triton, gloo (torch.distributed's),
    transformers, accelerate, lightning, lightning.pytorch, mindspore, mpi4py (with mpirun on
    PATH), fork (``os.fork``), slurm (``srun`` and a node that is up), msprobe or msprobe-mindspore
    (returns the path of a Python interpreter that imports msprobe with torch, or with
    MindSpore, which need not be this one)."""
    __tracebackhide__ = True  # pytest reports the skip or failure at the test's line
    if name not in _NEEDS:
        raise ValueError(f"requires: unknown {name!r}; known: {sorted(_NEEDS)}")
    probe, variables, source = _NEEDS[name]
    try:
        return probe()
    except ImportError as e:
        missing = f"{name} is missing ({e}); {source}"
    if required(name):
        named = ", ".join(v for v in variables if os.environ.get(v))
        pytest.fail(f"{missing}; {named} is set, so this fails", pytrace=False)
    pytest.skip(missing, allow_module_level=True)


# --- models for the inference checks -------------------------------------------------------------


def covers_without_a_ci_case(items):
    """The `full` tests among pytest's collected ``items`` whose ``covered_by`` names a collected
    test function every case of which is of the full tier too (each parameter marked `full`), so
    that CI runs nothing of the cover: ``"nodeid: why"`` lines, sorted. A cover in a module not
    collected here (another pytest run of .ci/run), or a Rust test, is test_layout.py's to check
    statically (docs/testing.md)."""
    cases = {}
    for item in items:
        name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        cases.setdefault(name, []).append(item.get_closest_marker("full") is not None)
    bad = set()
    for item in items:
        mark = item.get_closest_marker("full")
        cover = mark.kwargs.get("covered_by") if mark is not None else None
        if cover in cases and all(cases[cover]):
            bad.add(f"{item.nodeid}: its cover {cover} has no case outside the full tier")
    return sorted(bad)


def tiny_gpt2(prompts=8):
    """A tiny GPT-2 (transformers' ``GPT2Config``, random init seeded with 0, no download) in
    eval mode, and ``prompts`` prompts of 6 tokens (test_batch.py, test_logprobs.py)."""
    requires("transformers")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=64,
        vocab_size=128,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config).eval(), torch.randint(1, 128, (prompts, 6))
