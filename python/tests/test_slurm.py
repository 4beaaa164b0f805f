"""The `srun` launcher against a real Slurm (`bash scripts/slurm-local.sh start`): the unmodified
DDP script of examples/programs/python/unmodified (gloo, env:// initialisation, no detcheck
import) run as Slurm job steps, its ranks' RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR set
from SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and the step's node list by the start-up hook;
its clock-reseed control caught; and a numpy + mpi4py program (`--mpi=pmix`). Skips without a
Slurm (or mpi4py), or fails where DETCHECK_REQUIRE_SLURM (DETCHECK_REQUIRE_MPI4PY) is set
(.ci/run sets both)."""

import pytest
from support import PROGRAMS, ROOT, requires, run_detcheck

requires("torch")
requires("gloo")
requires("slurm")

UNMODIFIED = PROGRAMS / "unmodified"

#: The full tier (docs/testing.md): the same script and control under srun (the smoke test's job
#: step, detcheck's srun launcher) are checked in CI by tests/slurm.rs's sbatch smoke test.
FULL_SBATCH = pytest.mark.full(
    covered_by="tests/slurm.rs::the_sbatch_smoke_test_passes_and_writes_its_reports"
)


@FULL_SBATCH
def test_unmodified_ddp_script_passes_under_srun(detcheck_bin):
    run = run_detcheck(
        detcheck_bin,
        "check",
        "--no-progress",
        "--no-unperturbed",  # the verdicts' own tests run them (support.check)
        "--launcher",
        "srun",
        "--ranks",
        "2",
        "--steps",
        "2",
        "--checks",
        "repeat,replicas,world_sizes",
        "--world-sizes",
        "1,2",
        "--",
        "python3",
        "ddp_train.py",
        cwd=UNMODIFIED,
        timeout=900,
        code=0,
    )
    assert "1 passed, 0 failed" in run.out, run.out
    assert "repeat+replicas+world_sizes" in run.out, run.out


@FULL_SBATCH
def test_clock_reseed_control_is_caught_under_srun(detcheck_bin):
    run = run_detcheck(
        detcheck_bin,
        "check",
        "--no-progress",
        ROOT / "examples" / "slurm" / "control_ddp_clock_reseed.json",
        timeout=900,
        code=0,
    )
    assert "1 passed, 0 failed" in run.out, run.out
    assert "init/" in run.out, run.out  # caught at the model's initial weights


def test_an_mpi4py_program_runs_under_srun_with_pmix(detcheck_bin, tmp_path):
    """A numpy + mpi4py program of the user's own: srun is given `--mpi=pmix` (the script names
    mpi4py), and its ranks are MPI's."""
    requires("mpi4py")
    script = PROGRAMS / "mpi4py" / "numpy_mpi4py.py"
    args = ("--launcher", "srun", "--ranks", "2", "--steps", "3", "--", "python3", script)
    run = run_detcheck(
        detcheck_bin,
        "check",
        "--no-progress",
        *args,
        "--seed",
        "0",
        "--steps",
        "3",
        cwd=tmp_path,
        timeout=900,
        code=0,
    )
    assert "repeat+replicas" in run.out and "1 passed, 0 failed" in run.out, run.out
