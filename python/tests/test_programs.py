"""The example programs of examples/programs/python/ under `detcheck check`, with this
interpreter (and so this build of the package) as their `python3`: the launch contract end to
end (TraceWriter.from_env in processes detcheck started, repeat/replicas/variants checks, and
the negative controls caught)."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

PROGRAMS = ROOT / "examples" / "programs" / "python"


def check(detcheck_bin, *scenarios):
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    done = subprocess.run(
        [detcheck_bin, "check", "--no-progress", *map(str, scenarios)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    return done.returncode, done.stdout + done.stderr


def test_numpy_program_and_its_control(detcheck_bin):
    code, out = check(
        detcheck_bin, PROGRAMS / "numpy_ranks.json", PROGRAMS / "control_numpy_set_order.json"
    )
    assert code == 0, out
    assert "2 passed, 0 failed" in out, out


# .ci/run installs torch and sets DETCHECK_REQUIRE_TORCH=1, so there the test cannot skip.
@pytest.mark.skipif(
    not os.environ.get("DETCHECK_REQUIRE_TORCH") and importlib.util.find_spec("torch") is None,
    reason="torch is not installed; .ci/run installs it (scripts/install-python.sh --torch)",
)
def test_torch_ddp_program_and_its_control(detcheck_bin):
    torch = PROGRAMS / "torch"
    # the DDP program under torchrun, and the dropout control; the clean program under the
    # processes launcher and the other controls are test_diagnosis.py's
    code, out = check(
        detcheck_bin, torch / "torch_ddp_torchrun.json", torch / "control_torch_unseeded_dropout.json"
    )
    assert code == 0, out
    assert "2 passed, 0 failed" in out, out


# .ci/run installs mpi4py and sets DETCHECK_REQUIRE_MPI4PY=1, so there the test cannot skip.
@pytest.mark.skipif(
    not os.environ.get("DETCHECK_REQUIRE_MPI4PY")
    and (importlib.util.find_spec("mpi4py") is None or shutil.which("mpirun") is None),
    reason="mpi4py or mpirun is not installed; the mpi4py example runs where they are",
)
def test_mpi4py_program_and_its_control(detcheck_bin):
    code, out = check(detcheck_bin, PROGRAMS / "mpi4py")
    assert code == 0, out
    assert "2 passed, 0 failed" in out, out
