"""Every launcher idiom (issue 54): a program started the way its authors start it, with its
ranks started by a launcher detcheck does not drive (accelerate's `launch` and
`notebook_launcher`, `python -m torch.distributed.run`), is checked as `detcheck check --
<that command>`: each process that becomes a rank is recorded as that rank and stopped at
`--steps`, and `replicas` compares them; a launcher of one process (`accelerate launch --cpu`,
`fabric run --devices=1`) hands the rank to the program it runs. DeepSpeed's `deepspeed`
launcher is in test_verdicts.py (its own CI section). Lightning's `devices=N` and
`torch.multiprocessing.spawn` are in test_zoo.py."""

import shutil
import sys
from pathlib import Path

import pytest
from support import PROGRAMS, check, requires

requires("torch")
requires("accelerate")

LOOP = PROGRAMS / "verdicts" / "accelerate_loop.py"
#: Each test gives its launcher a port of its own: their default, 29500, is every launcher's,
#: and tests run two at a time.
PORT = {"accelerate": "29631", "torchrun": "29632", "notebook": "29633"}
BIN = Path(sys.executable).parent


def _checked_at_two_ranks(detcheck_bin, tmp_path, *command):
    shutil.copy(LOOP, tmp_path / LOOP.name)
    (line,) = check(
        detcheck_bin, "--steps", "3", "--timeout", "240", "--", *command, cwd=tmp_path, code=0
    ).scenarios.values()
    assert line["verdict"] == "ok", line
    repeat, replicas = line["checks"]
    assert repeat["comparison"]["world_sizes"] == [2, 2], repeat
    assert repeat["status"] == replicas["status"] == "passed", line["checks"]
    assert repeat["comparison"]["num_compared"] > 0, repeat
    assert replicas["comparison"]["num_compared"] > 0, replicas
    return line


@pytest.mark.parametrize(
    "command",
    [
        (
            *(str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2"),
            *("--main_process_port", PORT["accelerate"], LOOP.name),
        ),
        # The full tier (docs/testing.md): a launcher that starts its ranks as scripts is
        # checked in CI with accelerate's.
        pytest.param(
            (
                *(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"),
                *("--master-port", PORT["torchrun"], LOOP.name),
            ),
            marks=pytest.mark.full(
                covered_by="test_launchers.py::test_a_launcher_that_starts_ranks_as_scripts"
            ),
        ),
    ],
    ids=["accelerate launch", "python -m torch.distributed.run"],
)
def test_a_launcher_that_starts_ranks_as_scripts(detcheck_bin, tmp_path, command):
    line = _checked_at_two_ranks(detcheck_bin, tmp_path, *command)
    assert line["scenario"]["name"] == "accelerate_loop", line["scenario"]


#: A plain training loop (no process group; seeded with `--fixed`).
PLAIN = PROGRAMS / "causes" / "split_order.py"


@pytest.mark.parametrize(
    ("command", "script"),
    [
        ((str(BIN / "accelerate"), "launch", "--cpu"), (LOOP.name,)),
        # torch elastic's agent of one worker, run in the launched process: Lightning Fabric's
        # README's `fabric run` calls `torch.distributed.run.main` so (detcheck knows torchrun's
        # own command as a launcher, whose agent is no rank). Any script may be run so; one that
        # joins no group was never recorded.
        ((str(BIN / "fabric"), "run", "--accelerator=cpu", "--devices=1"), (PLAIN.name, "--fixed")),
    ],
    ids=["accelerate launch --cpu", "fabric run --devices=1"],
)
def test_a_launcher_of_one_process_hands_the_rank_to_the_program_it_runs(
    detcheck_bin, tmp_path, command, script
):
    """`accelerate launch --cpu script.py` (accelerate's README's CPU run) and torch elastic's
    agent of one worker run the script as one child process that joins no process group:
    before, detcheck's rank was the launcher, which trains nothing, and the check ended in an
    error ("no module ran forward"). The launcher now hands the rank to its child, whose
    training is recorded and compared."""
    if Path(command[0]).name == "fabric":
        requires("lightning")
    for path in (LOOP, PLAIN):
        shutil.copy(path, tmp_path / path.name)
    (line,) = check(
        detcheck_bin, "--steps", "2", "--", *command, *script, cwd=tmp_path, code=0
    ).scenarios.values()
    assert line["verdict"] == "ok", line
    assert line["scenario"]["name"] == script[0].removesuffix(".py"), line["scenario"]
    repeat = line["checks"][0]
    assert repeat["comparison"]["world_sizes"] == [1, 1], repeat
    assert repeat["comparison"]["num_compared"] > 0, repeat


def test_notebook_launcher_forking_its_ranks_under_an_elastic_agent(detcheck_bin, tmp_path):
    """`notebook_launcher` forks each rank under torch elastic's agent, which counts a worker
    done only once the function returned a value: before, the forked children were no ranks
    (a forked child stands down), and once recorded and stopped at `--steps` the agent waited
    for ever. Each is now recorded as the rank its group gives it, and hands the agent a
    return value as it stops."""
    command = (sys.executable, LOOP.name, "--notebook", "--port", PORT["notebook"])
    _checked_at_two_ranks(detcheck_bin, tmp_path, *command)


def test_a_world_that_nobody_starts_fails_at_once_with_the_command_to_run(detcheck_bin, tmp_path):
    """A script that asks `init_process_group` for two ranks, checked at one: detcheck started
    one rank and the script starts no other, so the call would wait until the timeout (300 s,
    issue 54). It fails within seconds (exit 3), naming the line and the command to run (which
    passes: the next test)."""
    script = PROGRAMS / "verdicts" / "world_of_two.py"
    args = ("--timeout", "120", "--", sys.executable, script)
    (line,) = check(detcheck_bin, *args, cwd=tmp_path, code=3).scenarios.values()
    assert line["verdict"] == "ERROR", line
    error = line["error"]
    assert "asks init_process_group for a world of 2 ranks (at world_of_two.py:19)" in error, error
    assert "still running after the timeout" not in error, error
    told = "`detcheck check --ranks 2 --launcher torchrun -- python world_of_two.py`"
    assert told in error, error


# The full tier (docs/testing.md): a check at 2 ranks under torchrun passing is checked in CI on
# test_verdicts.py's ranks that train apart.
@pytest.mark.full(
    covered_by="test_verdicts.py::test_ranks_that_train_different_models_get_replicas_na_with_the_reason"
)
def test_the_command_a_world_that_nobody_starts_is_told_to_run_passes(detcheck_bin, tmp_path):
    script = PROGRAMS / "verdicts" / "world_of_two.py"
    args = ("--ranks", "2", "--launcher", "torchrun", "--", sys.executable, script)
    (line,) = check(detcheck_bin, *args, cwd=tmp_path, code=0).scenarios.values()
    assert line["verdict"] == "ok", line


def test_processes_started_with_spawn_that_join_no_group_are_named_in_the_error(
    detcheck_bin, tmp_path
):
    """A program whose training runs in processes it started with `torch.multiprocessing.spawn`
    that join no process group (an RPC program's workers): no rank is recorded, and the error
    says which processes, where they were started and what to do, not only that the launched
    process ran no model."""
    script = PROGRAMS / "verdicts" / "spawn_no_group.py"
    shutil.copy(script, tmp_path / script.name)
    args = ("--timeout", "120", "--", sys.executable, script.name)
    (line,) = check(detcheck_bin, *args, cwd=tmp_path, code=3).scenarios.values()
    error = line["error"]
    said = "it started 2 processes with torch.multiprocessing (at spawn_no_group.py:21)"
    assert said in error, error
    assert "detcheck.TraceWriter" in error, error
