"""The `srun` launcher against a real Slurm (`bash scripts/slurm-local.sh start`): the unmodified
DDP script of examples/programs/python/unmodified (gloo, env:// initialisation, no detcheck
import) run as Slurm job steps, its ranks' RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR set
from SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and the step's node list by the start-up hook;
and its clock-reseed control caught. Skips without a Slurm, or fails where
DETCHECK_REQUIRE_SLURM is set (.ci/run sets it)."""

from support import PROGRAMS, ROOT, requires, run_detcheck

requires("torch")
requires("gloo")
requires("slurm")

UNMODIFIED = PROGRAMS / "unmodified"


def test_unmodified_ddp_script_passes_under_srun(detcheck_bin):
    run = run_detcheck(
        detcheck_bin,
        "check",
        "--no-progress",
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
