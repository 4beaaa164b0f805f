"""``detcheck.seed_all(seed, deterministic=True)``: the settings that make a PyTorch program
reproducible, applied from inside it; and the same settings applied by detcheck's start-up hook
to an unmodified program (``detcheck check --deterministic``).

The list of settings is not here: it is detcheck's one hint table (``hints::deterministic()`` in
Rust, read through ``detcheck._detcheck.deterministic_settings()``), where each has what it
changes and its source; docs/operators.md shows it. This module only knows how to apply each
one (``_APPLY``, one function per name; a test checks the two lists agree):

- ``PYTHONHASHSEED``: cannot be set from inside a running interpreter (its string hashes are
  fixed at start-up). ``seed_all`` says so (a ``RuntimeWarning``) when the variable does not pin
  them; ``detcheck check --deterministic`` sets it in the launch environment.
- ``CUBLAS_WORKSPACE_CONFIG``: set in ``os.environ``; cuBLAS reads it when CUDA starts, so it
  holds only when CUDA has not started yet (``seed_all`` says so otherwise).
- ``random.seed``, ``numpy.random.seed`` (numpy's legacy global generator; the seed modulo
  2**32), ``torch.manual_seed`` (the CPU's and every CUDA device's generators).
- ``torch.use_deterministic_algorithms(True)``, ``torch.backends.cudnn.deterministic = True``,
  ``torch.backends.cudnn.benchmark = False``.
- ``torch._inductor.config.deterministic = True``: set on the config when it is imported
  already; otherwise as ``TORCHINDUCTOR_DETERMINISTIC=1`` in ``os.environ``, which the config
  reads when torch.compile first imports it (importing it here would cost seconds at start-up).
- ``HCCL_DETERMINISTIC=true``: set in ``os.environ``; HCCL reads it when a communicator is made.
- MindSpore's (docs/mindspore.md): ``mindspore.set_seed``, ``mindspore.manual_seed``,
  ``mindspore.dataset.config.set_seed`` and ``set_num_parallel_workers(1)``, and
  ``mindspore.set_deterministic(True)`` (applied through the context's own switch, as
  ``set_context(deterministic="ON")`` does, so that the program's own call of
  ``set_deterministic`` later does not fail as a second one). Applied only when mindspore is
  imported (a note says so otherwise): ``seed_all`` never imports it.

Determinism: every value set is a function of ``seed``; nothing reads the clock or OS entropy.
Limits: generators the program makes itself (``torch.Generator()``, ``np.random.default_rng()``)
and data-loader workers' seeds are the program's; a program that reseeds later undoes these.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterable
from typing import Any, Callable, NamedTuple

from .._detcheck import deterministic_settings

__all__ = ["seed_all", "Setting"]


#: One setting as ``seed_all`` reports it: ``name`` (the hint table's), ``statement`` (what was
#: done, the seed filled in), ``applied`` (False: it could not be done from here) and ``note``.
class Setting(NamedTuple):
    name: str
    statement: str
    applied: bool
    note: str


def _hash_seed(seed: int, value: str) -> tuple[bool, str]:
    pinned = os.environ.get("PYTHONHASHSEED", "random") != "random"
    if pinned:
        return True, f"PYTHONHASHSEED={os.environ['PYTHONHASHSEED']} pins this interpreter"
    return False, (
        "cannot be set from inside a running interpreter (its str hashes are fixed when it "
        "starts): launch it with PYTHONHASHSEED=0, or under `detcheck check --deterministic`"
    )


def _cublas(seed: int, value: str) -> tuple[bool, str]:
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = value
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return (
            False,
            "CUDA has started: cuBLAS read the variable already (set it before CUDA starts)",
        )
    return True, ""


def _random(seed: int, value: str) -> tuple[bool, str]:
    import random

    random.seed(seed)
    return True, ""


def _numpy(seed: int, value: str) -> tuple[bool, str]:
    try:
        import numpy
    except ImportError:
        return False, "numpy is not installed"
    numpy.random.seed(seed % 2**32)
    return True, ""


def _with_torch(apply: Callable[[Any, int], object]) -> Callable[[int, str], tuple[bool, str]]:
    def applied(seed: int, value: str) -> tuple[bool, str]:
        try:
            import torch
        except ImportError:
            return False, "torch is not installed"
        apply(torch, seed)
        return True, ""

    return applied


def _cudnn(name: str, flag: bool) -> Callable[[int, str], tuple[bool, str]]:
    def apply(torch: Any, seed: int) -> None:
        setattr(torch.backends.cudnn, name, flag)

    return _with_torch(apply)


def _inductor(seed: int, value: str) -> tuple[bool, str]:
    config: Any = sys.modules.get("torch._inductor.config")
    if config is not None:
        config.deterministic = True
    else:
        os.environ["TORCHINDUCTOR_DETERMINISTIC"] = "1"
    return True, ""


def _hccl(seed: int, value: str) -> tuple[bool, str]:
    os.environ["HCCL_DETERMINISTIC"] = value
    return True, ""


def _with_mindspore(apply: Callable[[Any, int], object]) -> Callable[[int, str], tuple[bool, str]]:
    def applied(seed: int, value: str) -> tuple[bool, str]:
        mindspore = sys.modules.get("mindspore")
        if mindspore is None:
            return False, "mindspore is not imported (applied only once it is)"
        apply(mindspore, seed)
        return True, ""

    return applied


def _ms_deterministic(mindspore: Any, seed: int) -> None:
    # The context's own switch (what set_context(deterministic="ON") calls): the public
    # mindspore.set_deterministic refuses a second call, which the program may make itself.
    from mindspore import context

    try:
        context._context().set_deterministic("ON")
    except AttributeError:  # another MindSpore: its public call
        mindspore.set_deterministic(True)


def _ms_dataset(name: str, value: Callable[[int], int]) -> Callable[[Any, int], None]:
    def apply(mindspore: Any, seed: int) -> None:
        from mindspore import dataset

        getattr(dataset.config, name)(value(seed))

    return apply


#: How to apply each setting of the hint table: ``(seed, value) -> (applied, note)``.
_APPLY = {
    "PYTHONHASHSEED": _hash_seed,
    "CUBLAS_WORKSPACE_CONFIG": _cublas,
    "random.seed": _random,
    "numpy.random.seed": _numpy,
    "torch.manual_seed": _with_torch(lambda torch, seed: torch.manual_seed(seed)),
    "torch.use_deterministic_algorithms": _with_torch(
        lambda torch, seed: torch.use_deterministic_algorithms(True)
    ),
    "torch.backends.cudnn.deterministic": _cudnn("deterministic", True),
    "torch.backends.cudnn.benchmark": _cudnn("benchmark", False),
    "torch._inductor.config.deterministic": _inductor,
    "HCCL_DETERMINISTIC": _hccl,
    "mindspore.set_seed": _with_mindspore(lambda ms, seed: ms.set_seed(seed % 2**32)),
    "mindspore.manual_seed": _with_mindspore(lambda ms, seed: ms.manual_seed(seed % 2**32)),
    "mindspore.dataset.config.set_seed": _with_mindspore(
        _ms_dataset("set_seed", lambda seed: seed % 2**32)
    ),
    "mindspore.dataset.config.set_num_parallel_workers": _with_mindspore(
        _ms_dataset("set_num_parallel_workers", lambda seed: 1)
    ),
    "mindspore.set_deterministic": _with_mindspore(_ms_deterministic),
}

#: The seeds; with ``deterministic=False`` only these are applied.
_SEEDS = frozenset(
    [
        "random.seed",
        "numpy.random.seed",
        "torch.manual_seed",
        "mindspore.set_seed",
        "mindspore.manual_seed",
        "mindspore.dataset.config.set_seed",
    ]
)


def settings(stack: str | None = None) -> list[tuple[str, str, str, str, str, str]]:
    """The hint table's deterministic settings, in order, as ``(kind, name, value, statement,
    why, reference)`` (``kind``: ``"launch"`` or ``"startup"``); ``stack``: only the names of
    that stack's module (``"torch"``: those starting with ``torch.``; ``"mindspore"``: with
    ``mindspore.``; ``"python"``: the others)."""
    rows = deterministic_settings()
    frameworks = ("torch.", "mindspore.")
    if stack in ("torch", "mindspore"):
        return [r for r in rows if r[1].startswith(stack + ".")]
    if stack == "python":
        return [r for r in rows if not r[1].startswith(frameworks)]
    return rows


def apply(rows: Iterable[tuple[str, str, str, str, str, str]], seed: int) -> list[Setting]:
    """Applies ``rows`` (of ``settings()``) with ``seed``; returns a ``Setting`` for each."""
    done: list[Setting] = []
    for kind, name, value, statement, _why, _reference in rows:
        applied, note = _APPLY[name](int(seed), value)
        if kind == "startup":  # a call's SEED; PYTHONHASHSEED keeps its name
            statement = statement.replace("SEED", str(seed))
        done.append(Setting(name, statement, applied, note))
    return done


def seed_all(seed: int, deterministic: bool = True) -> list[Setting]:
    """Seeds Python's ``random``, numpy's global generator, torch (CPU and every CUDA
    device) and, when the program has imported it, MindSpore (its global seed, default
    generator and dataset seed) with ``seed``; with ``deterministic`` (the default) also turns
    on deterministic algorithms, cuDNN's deterministic mode (benchmark off),
    ``CUBLAS_WORKSPACE_CONFIG``, ``HCCL_DETERMINISTIC``, MindSpore's deterministic operators and
    its dataset's single worker.
    Returns what was done, a ``Setting`` per row of detcheck's table (module doc), and warns
    (``RuntimeWarning``) about what cannot be done from inside a running process
    (``PYTHONHASHSEED`` when it does not pin this interpreter; ``CUBLAS_WORKSPACE_CONFIG`` once
    CUDA started). A library that is not installed is skipped, with a note.

    Call it once, before the model is made and before CUDA starts.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed_all: seed must be a non-negative int, got {seed!r}")
    rows = [r for r in settings() if deterministic or r[1] in _SEEDS]
    done = apply(rows, seed)
    for s in done:
        if not s.applied and s.name in ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG"):
            warnings.warn(f"detcheck.seed_all: {s.name}: {s.note}", RuntimeWarning, stacklevel=2)
    return done
