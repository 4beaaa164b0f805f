"""The tests' fixtures, and the one setting that must come before any test module is imported.
What the tests share otherwise is in the `support` package (support/__init__.py)."""

import os
import sys

import pytest
from support import covers_without_a_ci_case, detcheck_path

# Triton's interpreter (TRITON_INTERPRET=1) runs detcheck._torch.device's kernels on CPU tensors
# where there is no GPU. Triton reads the variable when it is first imported (its own library is
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


#: The longest tests of CI's tier, longest first (`--durations` of .ci/run's pytests,
#: 2026-11-30): started first, so that the two workers end together. pytest-xdist hands tests
#: (and `xdist_group`s) out in collection order, and a 5-minute test handed out last kept one
#: worker busy alone for its whole length (CI's time, issue 55). Any order of the tests is
#: correct; this one is only faster.
LONGEST_FIRST = (
    "test_zero_change.py::test_an_unmodified_ddp_script_passes",
    "test_causes.py::test_a_planted_bug_is_named_by_its_cause[arrival_order]",
    "test_verdicts.py::test_a_result_that_recording_changes",
    "test_zoo.py::test_lightning_starting_its_own_ranks",
    "test_launchers.py::test_a_launcher_that_starts_ranks_as_scripts",
    "test_launchers.py::test_a_launcher_of_one_process",
    "test_batch_sizes.py::test_a_tiny_gpt2",
    "test_tp_sizes.py::test_a_tensor_parallel_model_differs",
    "test_causes.py::test_a_planted_bug_is_named_by_its_cause[batch_noise]",
    "test_verdicts.py::test_ranks_that_train_different_models",
    "test_causes.py::test_deterministic_names_the_setting_that_fixes_it",
    "test_zoo.py::test_a_zoo_program_as_its_readme_runs_it",
    "test_mindspore.py::test_an_unmodified_script",
    "test_align.py::",
)


def pytest_collection_modifyitems(config, items):
    # A full test's cover must have a case CI runs (test_layout.py checks the rest statically).
    bad = covers_without_a_ci_case(items)
    if bad:
        raise pytest.UsageError("full tests whose cover CI never runs:\n" + "\n".join(bad))

    def rank(item):
        nodeid = item.nodeid.rsplit("/", 1)[-1]
        return next(
            (i for i, prefix in enumerate(LONGEST_FIRST) if nodeid.startswith(prefix)),
            len(LONGEST_FIRST),
        )

    items.sort(key=rank)
