"""detcheck for Python: write detcheck trace files from a Python program.

``TraceWriter`` writes one rank's trace file (``rank{R}.dctrace``) with detcheck's own writer,
so the ``detcheck`` binary reads, compares and checks it like any other dump::

    import detcheck

    writer = detcheck.TraceWriter.from_env()   # None when detcheck did not launch us
    ...
    if writer is not None:
        writer.record(step, "grad/fc1.weight", grad)   # numpy, torch, buffer objects
    ...
    writer.close()

``detcheck.torch.watch(model, writer, optimizer)`` records a PyTorch model's forward outputs,
gradients and parameters every step (imported on first use; torch is never imported otherwise).

``detcheck.seed_all(seed)`` seeds ``random``, numpy and torch and turns on deterministic
algorithms (``detcheck._core.settings``). A program that never imports detcheck is recorded all the
same under ``detcheck check -- python train.py``: the wheel's start-up hook (``detcheck.pth``,
``detcheck._launch.startup``) records its PyTorch model and optimizer (``detcheck._torch.auto``).

``detcheck.check(...)`` and ``detcheck.compare(a, b)`` run the ``detcheck`` command (this
package's, ``python -m detcheck``) and return report objects; a pytest plugin adds the
``detcheck_check`` fixture and the ``detcheck`` marker.
See python/README.md for the API, the errors and the launch contract.
"""

from typing import TYPE_CHECKING

from ._core.api import CheckReport, Comparison, ScenarioOutcome, check, compare
from ._core.settings import Setting, seed_all
from ._detcheck import DetcheckError, TraceWriter, __version__

__all__ = [
    "CheckReport",
    "Comparison",
    "DetcheckError",
    "ScenarioOutcome",
    "Setting",
    "TraceWriter",
    "__version__",
    "check",
    "compare",
    "seed_all",
]

if TYPE_CHECKING:
    from types import ModuleType


def __getattr__(name: str) -> "ModuleType":
    # `detcheck.torch` on first use, so that neither `import detcheck` nor
    # `from detcheck import *` imports torch.
    if name == "torch":
        import importlib

        return importlib.import_module("detcheck.torch")
    raise AttributeError(f"module 'detcheck' has no attribute {name!r}")
