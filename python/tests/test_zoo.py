"""The zoo (examples/zoo, issue 54): upstream programs vendored unmodified, checked the way
their own READMEs run them.

pytorch/examples' mnist (`python main.py`) reads `../data`, a sibling of its folder. detcheck
runs every launch in a private copy of the working directory; before the copy stood for the
folders above it too, `../data` was missing there and torchvision tried to download MNIST (exit
3, no network). The data is made by examples/zoo/mnist_data.py (nothing is downloaded).
Needs torch and torchvision (scripts/install-python.sh --torch)."""

import os
import shutil
import subprocess
import sys

import pytest
from support import PROGRAMS, ROOT, check, requires, run_detcheck

requires("torch")
requires("torchvision")
requires("lightning")

ZOO = ROOT / "examples" / "zoo"


def test_mnist_reads_its_sibling_data_folder_as_without_detcheck(detcheck_bin, tmp_path):
    tree = tmp_path / "pytorch-examples"
    shutil.copytree(ZOO / "pytorch-examples" / "mnist", tree / "mnist")
    subprocess.run([sys.executable, ZOO / "mnist_data.py", tree / "data"], check=True)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    args = ("--steps", "3", "--", sys.executable, "main.py", "--epochs", "1")
    (line,) = check(detcheck_bin, *args, cwd=tree / "mnist", code=0).scenarios.values()
    assert line["verdict"] == "ok", line
    repeat = line["checks"][0]
    assert repeat["status"] == "passed", repeat
    assert repeat["comparison"]["num_compared"] > 0, repeat
    # Nothing was written into the user's tree (torchvision found its files; the check's own
    # report goes where `check` says, outside it).
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert [p for p in after if p not in before and "detcheck" not in str(p)] == [], after


IMAGENET = ZOO / "pytorch-examples" / "imagenet"


@pytest.mark.full(
    covered_by="test_zoo.py::test_lightning_starting_its_own_ranks_is_checked_at_every_rank"
)
def test_imagenet_spawning_its_own_worker_is_recorded_and_its_unseeded_worker_named(
    detcheck_bin, tmp_path
):
    """imagenet's README runs it as `--multiprocessing-distributed` with `--dist-url tcp://...`:
    `main()` seeds (`--seed`), then `torch.multiprocessing.spawn` starts the worker that builds
    the model. Before, that worker was never recorded nor stopped (exit 3 at the timeout). Now
    it is recorded as the rank its process group gives it; and since a spawned process does not
    inherit its parent's seed, its model differs from run to run (a plain run's worker draws
    another `torch.initial_seed()` each time): the cause is the initial parameters, and the fix
    names the process the program started."""
    shutil.copytree(IMAGENET, tmp_path / "imagenet")
    argv = [sys.executable, "main.py", "-a", "resnet18", "--dummy", "--seed", "1", "-b", "8"]
    argv += ["--workers", "0", "--dist-backend", "gloo", "--multiprocessing-distributed"]
    argv += ["--world-size", "1", "--rank", "0", "--dist-url", "tcp://127.0.0.1:29533"]
    (line,) = check(
        detcheck_bin, "--steps", "2", "--", *argv, cwd=tmp_path / "imagenet", code=1
    ).scenarios.values()
    first = line["first_divergence"]
    assert first["name"] == "init/conv1.weight" and first["step"] == 0, first
    cause = first["cause"]
    assert cause["kind"] == "initial_parameters", cause
    assert "a process the program started itself" in cause["fix"], cause
    assert "main.py:157" in cause["fix"], cause
    # the parent's seed, which the worker does not inherit (a fact the parent passes on)
    assert "the parent seeded at main.py:90" in cause["fix"], cause
    # Its dump holds the worker's trace as rank 0's, and nothing else (no note of the parent
    # that recorded nothing, no mark of the started rank).
    dump = tmp_path / "dump"
    run_detcheck(
        detcheck_bin,
        "run",
        "--dump",
        dump,
        "--steps",
        "2",
        "--",
        *argv,
        cwd=tmp_path / "imagenet",
        code=0,
    )
    assert sorted(p.name for p in dump.iterdir()) == ["rank0.dctrace"]


def test_lightning_starting_its_own_ranks_is_checked_at_every_rank(detcheck_bin, tmp_path):
    """`Trainer(devices=2, strategy="ddp")` run as `python script.py`: Lightning starts rank 1
    itself. Both ranks are recorded and stopped at `--steps`; `replicas` compares them."""
    script = PROGRAMS / "verdicts" / "lightning_devices.py"
    (line,) = check(
        detcheck_bin, "--steps", "3", "--", sys.executable, script, cwd=tmp_path, code=0
    ).scenarios.values()
    assert line["verdict"] == "ok", line
    repeat, replicas = line["checks"]
    assert repeat["comparison"]["world_sizes"] == [2, 2], repeat
    assert repeat["status"] == replicas["status"] == "passed", line["checks"]
    assert replicas["comparison"]["num_compared"] > 0, replicas


# --- examples/zoo/zoo.toml: the entries marked `ci` (scripts/zoo.sh runs them all) ------------

sys.path.insert(0, str(ZOO))
import zoo  # noqa: E402  (examples/zoo/zoo.py: the manifest's runner)

CI_CASES = [
    (program, planted)
    for program in zoo.load()
    for planted in [None, *program.get("planted", [])]
    if (planted or program).get("ci")
]


#: A case whose entry says `ci = "full"` is of the full tier (docs/testing.md).
FULL_ZOO = pytest.mark.full(covered_by="test_zoo.py::test_a_zoo_program_as_its_readme_runs_it")


@pytest.mark.parametrize(
    ("program", "planted"),
    [pytest.param(p, x, marks=FULL_ZOO if (x or p)["ci"] == "full" else ()) for p, x in CI_CASES],
    ids=[f"{p['name']}: {x['name'] if x else 'clean'}" for p, x in CI_CASES],
)
def test_a_zoo_program_as_its_readme_runs_it(detcheck_bin, tmp_path, program, planted):
    """Clean: the verdict the manifest expects, and no check that passed after comparing
    nothing. Planted: FAIL with the bug's cause class and line."""
    for module in program.get("requires", ()):
        requires(module)
    copy = zoo.prepare(program, tmp_path, planted)
    line, _ = zoo.check(detcheck_bin, program, copy)
    if planted is None:
        verdict, kind, where = (
            program.get("verdict", "ok"),
            program.get("class"),
            program.get("line"),
        )
        found, why = zoo.judge(line, verdict, kind, where, program.get("compared", ()))
    else:
        found, why = zoo.judge(line, "FAIL", planted["class"], planted.get("line"))
    assert not why, (found, why, line.get("first_divergence"), line.get("error"))


def test_a_zoo_table_updated_for_one_program_keeps_the_others_rows():
    # `scripts/zoo.sh --update NAME`: that program's rows are replaced, the others' kept as the
    # table's last run wrote them, in the manifest's order, and the held rows recounted.
    programs = zoo.load()
    earlier = (ROOT / "docs" / "zoo.md").read_text()
    assert zoo.table(programs, [], earlier) == earlier
    kept = zoo._rows_by_program(earlier, programs)
    name = programs[1]["name"]
    again = zoo.Outcome(name, "clean", "ok", "FAIL", "repeat 1", 1.0, 1.0, False, ["planted"])
    updated = zoo.table(programs, [again], earlier)
    rows = zoo._rows_by_program(updated, programs)
    assert len(rows[name]) == 1 and rows[name][0].endswith("| **no**: planted |")
    assert {k: v for k, v in rows.items() if k != name} == {
        k: v for k, v in kept.items() if k != name
    }
    order = [line for line in updated.splitlines() if line.startswith("| ") and "(`" in line]
    assert [line.split(" (`")[0][2:] for line in order] == [
        p["name"] for p in programs if p["name"] in rows
    ]
    held = sum(r.endswith("| yes |") for k, v in kept.items() if k != name for r in v)
    others = sum(len(v) for k, v in kept.items() if k != name)
    assert updated.splitlines()[-1] == f"{held} of {others + 1} held."


def test_a_plain_run_ends_at_the_step_the_check_stops_at(tmp_path):
    # `plain_until` and `ranks` (zoo.toml): the program's processes get the variables detcheck's
    # launcher gives its ranks, and the plain run ends once each printed the step's line (the
    # programs here sleep on: a plain run that waited for their end would time out).
    script = tmp_path / "steps.py"
    script.write_text(
        "import os, time\n"
        "for step in (1, 2, 3):\n"
        "    print(f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}: step {step}\")\n"
        "time.sleep(600)\n"
    )
    copy = zoo.Copy(tmp_path, tmp_path, dict(os.environ), [sys.executable, str(script)])
    program = {"plain_until": r"^rank [01] of 2: step 3$", "ranks": 2}
    assert zoo._plain(program, copy, timeout=60) > 0
    # `plain_steps`: torch's optimizer-step hook ends it at the check's steps (2 here), with
    # nothing else of the zoo's in the program: the third step never ran.
    script.write_text(
        "import pathlib, time, torch\n"
        "p = torch.nn.Parameter(torch.ones(2))\n"
        "optimizer = torch.optim.SGD([p], lr=0.1)\n"
        "for step in (1, 2, 3):\n"
        "    p.sum().backward()\n"
        "    pathlib.Path(f'step{step}').write_text('')\n"
        "    optimizer.step()\n"
        "time.sleep(600)\n"
    )
    assert zoo._plain({"plain_steps": True, "steps": 2}, copy, timeout=60) > 0
    assert sorted(p.name for p in tmp_path.glob("step[0-9]")) == ["step1", "step2"]
    # A line never printed is an error naming the field, not a time.
    program = {"plain_until": r"step 4", "ranks": 1}
    script.write_text("print('step 1')\n")
    with pytest.raises(RuntimeError, match="plain_until"):
        zoo._plain(program, copy, timeout=60)
