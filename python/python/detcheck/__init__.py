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

``detcheck.check(...)`` and ``detcheck.compare(a, b)`` run the ``detcheck`` command (this
package's, ``python -m detcheck``) and return report objects; a pytest plugin adds the
``detcheck_check`` fixture and the ``detcheck`` marker.
See python/README.md for the API, the errors and the launch contract.
"""

from ._api import CheckReport, Comparison, ScenarioOutcome, check, compare
from ._detcheck import DetcheckError, TraceWriter, __version__

__all__ = [
    "CheckReport",
    "Comparison",
    "DetcheckError",
    "ScenarioOutcome",
    "TraceWriter",
    "__version__",
    "check",
    "compare",
    "torch",
]


def __getattr__(name):
    # `detcheck.torch` on first use, so `import detcheck` never imports torch.
    if name == "torch":
        import importlib

        return importlib.import_module("detcheck.torch")
    raise AttributeError(f"module 'detcheck' has no attribute {name!r}")
