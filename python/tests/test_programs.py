"""The example programs of examples/programs/python/ under `detcheck check`, with this
interpreter (and so this build of the package) as their `python3`: the launch contract end to
end (TraceWriter.from_env in processes detcheck started, repeat/replicas/variants checks, and
the negative controls caught)."""

import pytest
from support import PROGRAMS, requires, run_detcheck


def test_numpy_program_and_its_control(detcheck_bin):
    run = run_detcheck(
        detcheck_bin,
        "check",
        "--no-progress",
        PROGRAMS / "numpy_ranks.json",
        PROGRAMS / "control_numpy_set_order.json",
        timeout=600,
        code=0,
    )
    assert "2 passed, 0 failed" in run.out, run.out


# .ci/run installs torch and sets DETCHECK_REQUIRE_TORCH=1, so there the test cannot skip.
# The full tier (docs/testing.md): a DDP program passing and its control caught are checked in
# CI on the unmodified DDP script.
@pytest.mark.full(
    covered_by="test_zero_change.py::test_an_unmodified_ddp_script_passes_at_one_and_two_ranks_and_its_controls_are_caught"
)
def test_torch_ddp_program_and_its_control(detcheck_bin):
    requires("torch")
    torch = PROGRAMS / "torch"
    # the DDP program under torchrun, and the dropout control; the clean program under the
    # processes launcher and the other controls are test_diagnosis.py's
    run = run_detcheck(
        detcheck_bin,
        "check",
        "--no-progress",
        "--no-unperturbed",  # the verdicts' own tests run them (support.check says why)
        torch / "torch_ddp_torchrun.json",
        torch / "control_torch_unseeded_dropout.json",
        timeout=600,
        code=0,
    )
    assert "2 passed, 0 failed" in run.out, run.out


# .ci/run installs mpi4py and sets DETCHECK_REQUIRE_MPI4PY=1, so there the test cannot skip.
def test_mpi4py_program_and_its_control(detcheck_bin):
    requires("mpi4py")
    run = run_detcheck(
        detcheck_bin, "check", "--no-progress", PROGRAMS / "mpi4py", timeout=600, code=0
    )
    assert "2 passed, 0 failed" in run.out, run.out
