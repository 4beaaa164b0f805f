"""msprobe's dumps of a MindSpore program read by `detcheck compare` and `compare --align` (issue
39, item 6): examples/programs/python/mindspore/msprobe_train.py is dumped by msprobe 26.2's
own `PrecisionDebugger` (level mix: cells and APIs) in its statistics, md5 and tensor tasks, by
the interpreter of target/venv-msprobe-ms (scripts/install-msprobe.sh --mindspore: msprobe on
MindSpore 2.10, CPU). Then:
- two dumps of the same seeded run, in each task, are identical (`compare`, exit 0), with
  cells' and APIs' records;
- a run with a value from the clock inside block 1's up projection differs, first at that
  cell's API (`compare`, exit 1), in each task;
- a run whose block 1 has an approximate GELU kernel is not aligned with the reference
  (`compare --align`, exit 1) and its first culprit, at step 0 with its own error, is that GELU
  in the statistics and tensor tasks; the reference against itself is aligned (exit 0).

Skips where no interpreter imports msprobe with MindSpore; fails instead where
DETCHECK_REQUIRE_MSPROBE is set (.ci/run's msprobe section)."""

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import PROGRAMS, MadeWhenRead, requires, run_detcheck

MSPROBE_PYTHON = requires("msprobe-mindspore")
#: One worker makes this module's dumps (`--dist loadgroup`, .ci/run's msprobe section).
pytestmark = pytest.mark.xdist_group("msprobe_mindspore")
PROGRAM = PROGRAMS / "mindspore" / "msprobe_train.py"

#: The runs: the reference, and the planted bugs in block 1.
RUNS = {
    "reference": [],
    "again": [],
    "noise": ["--bug", "noise"],
    "gelu": ["--bug", "approx_gelu"],
}
TASKS = ["statistics", "md5", "tensor"]


def msprobe_dump(folder, task, flags):
    """The program under msprobe's PrecisionDebugger (level mix, every step); md5 is the
    statistics task's md5 summary mode."""
    config = folder.with_suffix(".json")
    task_name = "statistics" if task == "md5" else task
    settings = {"scope": [], "list": [], "data_mode": ["all"]}
    if task != "tensor":
        settings["summary_mode"] = task if task == "md5" else "statistics"
    config.write_text(
        json.dumps(
            {
                "task": task_name,
                "dump_path": str(folder),
                "rank": [],
                "step": [],
                "level": "mix",
                task_name: settings,
            }
        )
    )
    done = subprocess.run(
        [MSPROBE_PYTHON, str(PROGRAM), *flags, "--msprobe-config", str(config)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return folder


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """{(run, task): folder}: every run of a task dumped (two at a time) when one of them is
    first read."""
    root = tmp_path_factory.mktemp("msprobe-ms")

    def make(task):
        with ThreadPoolExecutor(max_workers=2) as pool:
            jobs = {
                run: pool.submit(msprobe_dump, root / f"{run}-{task}", task, flags)
                for run, flags in RUNS.items()
            }
            return {(run, task): job.result() for run, job in jobs.items()}

    return MadeWhenRead(make, group_of=lambda key: key[1])


#: The full tier (docs/testing.md): CI reads msprobe's tensor dumps of the MindSpore program;
#: its statistics and md5 summaries are read in CI from test_msprobe_align.py's torch dumps and
#: tests/msprobe.rs's files.
FULL_TASK = pytest.mark.full(
    covered_by="test_msprobe_mindspore.py::test_two_dumps_of_one_run_are_identical_and_noise_is_found_at_its_cell"
)


def compare(detcheck_bin, a, b, *flags):
    run = run_detcheck(detcheck_bin, "compare", "--format", "json", *flags, a, b)
    assert run.code in (0, 1), run.out
    (line,) = run.lines
    return run.code, line


@pytest.mark.parametrize(
    "task", [t if t == "tensor" else pytest.param(t, marks=FULL_TASK) for t in TASKS]
)
def test_two_dumps_of_one_run_are_identical_and_noise_is_found_at_its_cell(
    dumps, detcheck_bin, task
):
    code, line = compare(detcheck_bin, dumps["again", task], dumps["reference", task])
    comparison = line["comparison"]
    assert code == 0, comparison
    assert comparison["num_compared"] > 300, comparison
    names = {r["name"] for r in comparison.get("rows", [])}
    assert not names, names  # identical: no rows

    code, line = compare(detcheck_bin, dumps["noise", task], dumps["reference", task])
    comparison = line["comparison"]
    assert code == 1, comparison
    first = comparison["first"]
    # The noise is added after the up projection's Dense: its first API with a changed output,
    # inside Cell.blocks.1.up (an `add` of the clock's value), or that cell's own output.
    assert first["step"] == 0, first
    rows = [r["name"] for r in comparison["rows"]]
    cell = "Cell.blocks.1.up.Up.forward.0.output.0"
    assert cell in rows, rows[:10]
    assert rows.index(cell) <= 2, rows[:10]
    before = [n for n in rows if n.startswith("Cell.blocks.0.")]
    assert not before, before


@pytest.mark.parametrize("task", [pytest.param("statistics", marks=FULL_TASK), "tensor"])
def test_the_approximate_gelu_is_the_first_culprit(dumps, detcheck_bin, task):
    code, line = compare(detcheck_bin, "--align", dumps["reference", task], dumps["again", task])
    assert code == 0 and line["aligned"], line["alignment"]["notes"]

    code, line = compare(detcheck_bin, "--align", dumps["gelu", task], dumps["reference", task])
    alignment = line["alignment"]
    assert code == 1 and not line["aligned"], alignment
    culprit = alignment["culprit"]
    assert culprit is not None and culprit["step"] == 0, culprit
    assert culprit["blame"] == "own", culprit
    # msprobe names the GELU's API `Functional.gelu.<n>` and its cell `Cell.blocks.1.act.GELU`,
    # whose output inherits the API's error.
    assert culprit["name"].startswith("Functional.gelu."), culprit
    assert "`Cell.blocks.1.act.GELU.forward.0.output.0`" in alignment["chain"][0], alignment[
        "chain"
    ][:3]
