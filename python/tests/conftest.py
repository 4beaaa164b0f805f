"""The tests' fixtures, and the one setting that must come before any test module is imported.
What the tests share otherwise is in the `support` package (support/__init__.py)."""

import os
import sys

import pytest
from support import detcheck_path

# Triton's interpreter (TRITON_INTERPRET=1) runs detcheck._device's kernels on CPU tensors where
# there is no GPU. Triton reads the variable when it is first imported (its own library is
# decorated then), so it is set here, before any test module can import it.
if "triton" not in sys.modules:
    try:
        import torch

        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
    except ImportError:
        pass


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "full(covered_by): a test of the full tier (scripts/full-tests.sh), left out of CI's "
        "budget (`-m 'not full'`): it proves again, on another program, launcher or size, what "
        "the CI test ``covered_by`` ('test_module.py::test_name') proves (docs/testing.md)",
    )


@pytest.fixture(scope="session")
def detcheck_bin():
    """The path of the `detcheck` binary (built once per session, or $DETCHECK_BIN)."""
    return detcheck_path()
