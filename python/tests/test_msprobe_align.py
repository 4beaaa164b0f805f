"""`detcheck compare --align` checked against msprobe 26.2 (mindstudio-probe, installed by
scripts/install-msprobe.sh) on dumps that msprobe writes itself (docs/align.md, "Checked against
msprobe").

examples/programs/python/align/msprobe_two_devices.py is run as the reference ("device b") and
as another device ("device a") with a planted bug: an approximate GELU kernel (errors ~1e-4 in
float32) or a gross error (one block's up projection doubled), each dumped by msprobe's
PrecisionDebugger at level mix in its tensor and statistics modes, and recorded by `detcheck run
--mode full`. Then:
- msprobe's own compare (`msprobe compare -tp A/dump.json -gp B/dump.json --xlsx`) and `detcheck
  compare --align --every-record --format json` measure the same pairs: every metric msprobe
  computed (Cosine, EucDist, MaxAbsErr, MaxRelativeErr, the One/Five Thousandth Err Ratios; in
  statistics mode the Max/Min/Mean/L2norm diffs) equals detcheck's to 1e-6 relative (1e-12
  absolute near 0), row by row, and where msprobe gives no number detcheck gives none;
- verdicts: on the GELU pair msprobe passes the GELU module's forward rows (every row of it in
  tensor mode) and first flags another module, while detcheck names the GELU as the first
  culprit; on the gross pair both flag the up projection first;
- msprobe's statistics and tensor dumps and detcheck's own traces of the same runs give detcheck
  the same verdict and the same culprit module;
- `python -m detcheck.replay` on msprobe_replay.py's dumps (level L1): the GELU called with
  another argument is the one call whose replay on the reference's inputs is not aligned.

Skips where no interpreter imports msprobe; fails instead where DETCHECK_REQUIRE_MSPROBE is set
(.ci/run's msprobe section).
"""

import json
import math
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support import PROGRAMS, MadeWhenRead, requires, run_detcheck

MSPROBE_PYTHON = requires("msprobe")
#: One worker makes the two-device program's dumps (`--dist loadgroup`, .ci/run's msprobe
#: section); the replay's own dumps (`REPLAY`) are another worker's to make, beside them.
pytestmark = pytest.mark.xdist_group("msprobe_align")
REPLAY = pytest.mark.xdist_group("msprobe_replay")
PROGRAM = PROGRAMS / "align" / "msprobe_two_devices.py"
STEPS = ["--steps", "1"]

#: The runs: the reference ("device b") and the other device with each planted bug.
RUNS = {
    "reference": ["--device-kind", "reference"],
    "gelu": ["--device-kind", "other", "--bug", "approx_gelu"],
    "gross": ["--device-kind", "other", "--bug", "gross_scale"],
}
#: The module of each planted bug (its place in the model).
BUGGY_MODULE = {"gelu": "blocks.1.act", "gross": "blocks.1.up"}
#: msprobe's dump tasks: statistics and tensor mode.
TASKS = ["statistics", "tensor"]

#: msprobe's tensor-mode columns and detcheck's metrics.
TENSOR_COLUMNS = {
    "Cosine": "cosine",
    "EucDist": "euc_dist",
    "MaxAbsErr": "max_abs_err",
    "MaxRelativeErr": "max_rel_err",
    "One Thousandth Err Ratio": "one_thousandth",
    "Five Thousandths Err Ratio": "five_thousandths",
}
#: msprobe's statistics-mode columns and the index in detcheck's `stat_diffs`.
STATS_COLUMNS = {"Max diff": 0, "Min diff": 1, "Mean diff": 2, "L2norm diff": 3}

# Reads msprobe's result workbook with msprobe's own pandas (not in detcheck's environment).
READ_XLSX = """
import json, sys
import pandas as pd
frame = pd.read_excel(sys.argv[1], dtype=object)
rows = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
        for r in frame.to_dict(orient="records")]
print(json.dumps(rows))
"""


def msprobe_dump(folder, task, flags, program=PROGRAM, level="mix", steps=STEPS):
    """Runs the program under msprobe's PrecisionDebugger (every step and rank)."""
    config = folder.with_suffix(".json")
    config.write_text(
        json.dumps(
            {
                "task": task,
                "dump_path": str(folder),
                "rank": [],
                "step": [],
                "level": level,
                task: {"scope": [], "list": [], "data_mode": ["all"]}
                | ({"summary_mode": "statistics"} if task == "statistics" else {}),
            }
        )
    )
    done = subprocess.run(
        [MSPROBE_PYTHON, str(program), *steps, *flags, "--msprobe-config", str(config)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return folder


def detcheck_trace(detcheck_bin, folder, flags):
    """Records the program with `detcheck run --mode full` (no msprobe)."""
    run_detcheck(
        detcheck_bin,
        "run",
        "--dump",
        folder,
        "--mode",
        "full",
        "--",
        sys.executable,
        PROGRAM,
        *STEPS,
        *flags,
        code=0,
        timeout=900,
    )
    return folder


def step_folder(dump):
    """msprobe's folder of step 0 (`step0/proc<PID>` for a process without a rank)."""
    (folder,) = (dump / "step0").iterdir()
    return folder


@pytest.fixture(scope="module")
def dumps(tmp_path_factory, detcheck_bin):
    """{(run, "statistics" | "tensor" | "trace"): folder}: a run dumped by msprobe in both tasks
    and recorded by detcheck (two at a time) when one of the three is first read."""
    root = tmp_path_factory.mktemp("msprobe")

    def make(run):
        flags = RUNS[run]
        with ThreadPoolExecutor(max_workers=2) as pool:
            jobs = {t: pool.submit(msprobe_dump, root / f"{run}-{t}", t, flags) for t in TASKS}
            jobs["trace"] = pool.submit(detcheck_trace, detcheck_bin, root / f"{run}-trace", flags)
            return {(run, kind): job.result() for kind, job in jobs.items()}

    return MadeWhenRead(make, group_of=lambda key: key[0])


#: The full tier (docs/testing.md): CI checks the metrics, the culprits and the verdicts against
#: msprobe's on the approximate GELU (a culprit msprobe passes); the gross error, which both
#: flag, is of the full tier.
FULL_GROSS = pytest.mark.full(covered_by="test_msprobe_align.py::test_metrics_equal_msprobes")


def msprobe_compare(a, b, out):
    """msprobe's compare of step 0 of two dumps (B the bench), its workbook's rows."""
    done = subprocess.run(
        [
            str(Path(MSPROBE_PYTHON).parent / "msprobe"),
            "compare",
            "-tp",
            str(step_folder(a) / "dump.json"),
            "-gp",
            str(step_folder(b) / "dump.json"),
            "-o",
            str(out),
            "--xlsx",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (workbook,) = out.glob("*.xlsx")
    read = subprocess.run(
        [MSPROBE_PYTHON, "-c", READ_XLSX, str(workbook)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(read.stdout)


def align(detcheck_bin, a, b):
    """`detcheck compare --align --every-record --format json A B`: its alignment."""
    run = run_detcheck(
        detcheck_bin, "compare", "--align", "--every-record", "--format", "json", a, b
    )
    assert run.code in (0, 1), run.out
    (line,) = run.lines
    assert line["exit_code"] == run.code and line["aligned"] == (run.code == 0), line
    return line["alignment"]


@pytest.fixture(scope="module")
def compared(dumps, detcheck_bin, tmp_path_factory):
    """{(pair, task): (msprobe's rows, detcheck's alignment)}: msprobe's compare and detcheck's
    alignment of a pair in both tasks, made when one of them is first read."""
    root = tmp_path_factory.mktemp("compare")

    def make(pair):
        jobs = {}
        with ThreadPoolExecutor(max_workers=2) as pool:
            for task in TASKS:
                a, b = dumps[pair, task], dumps["reference", task]
                rows = pool.submit(msprobe_compare, a, b, root / f"{pair}-{task}")
                jobs[pair, task] = (rows, align(detcheck_bin, a, b))
        return {key: (rows.result(), alignment) for key, (rows, alignment) in jobs.items()}

    return MadeWhenRead(make, group_of=lambda key: key[0])


def number(value):
    """A cell of msprobe's workbook as a number; None for its words (`unsupported`, `N/A`)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return None if math.isnan(value) else float(value)
    try:
        x = float(str(value).strip())
    except ValueError:
        return None
    return None if math.isnan(x) else x


def parity(rows, alignment, task):
    """Checks each metric of each row msprobe computed against detcheck's; returns (values
    compared, the largest relative difference)."""
    records = {(r["step"], r["name"]): r for r in alignment["records"]}
    compared, worst = 0, 0.0
    columns = TENSOR_COLUMNS if task == "tensor" else STATS_COLUMNS
    for row in rows:
        name = row["NPU Name"]
        theirs = {column: number(row.get(column)) for column in columns}
        if not str(row.get("NPU Dtype")).startswith("torch.") or all(
            v is None for v in theirs.values()
        ):
            # A non-tensor argument (`<class 'int'>`: not a record of detcheck's), or nothing
            # msprobe could compute.
            continue
        record = records.get((0, name))
        assert record is not None, f"msprobe's row `{name}` has no record in detcheck's alignment"
        metrics = record["metrics"]
        for column, key in columns.items():
            if task == "tensor":
                ours = metrics[key]
            else:
                diffs = metrics["stat_diffs"]
                ours = None if diffs is None else diffs[key]
            if theirs[column] is None:
                assert ours is None, (
                    f"`{name}` {column}: msprobe gives {row[column]!r}, detcheck {ours}"
                )
                continue
            assert ours is not None, f"`{name}` {column}: msprobe {theirs[column]}, detcheck none"
            assert math.isclose(ours, theirs[column], rel_tol=1e-6, abs_tol=1e-12), (
                f"`{name}` {column}: msprobe {theirs[column]!r}, detcheck {ours!r}"
            )
            compared += 1
            if abs(theirs[column]) > 1e-12:
                worst = max(worst, abs(ours - theirs[column]) / abs(theirs[column]))
    return compared, worst


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize(
    "pair", [p if p == "gelu" else pytest.param(p, marks=FULL_GROSS) for p in BUGGY_MODULE]
)
def test_metrics_equal_msprobes(compared, pair, task):
    rows, alignment = compared[pair, task]
    values, worst = parity(rows, alignment, task)
    # Every tensor row was compared: 313 of the 334 rows are tensors, with 6 numbers each in
    # tensor mode (fewer for single values) and 4 in statistics mode.
    assert len(rows) > 300 and values >= 4 * 300, (len(rows), values)
    print(f"{pair} {task}: {len(rows)} rows, {values} values, max relative difference {worst:.3g}")


# --- Names: msprobe's records and detcheck's, as the module they belong to ------------------------

_MODULE = re.compile(r"^Module\.(?P<path>.+)\.[A-Za-z_]\w*\.(forward|backward|parameters_grad)\.")
_CALL = re.compile(r"^(?P<call>.+?\.\d+\.(forward|backward))\.")


def module_of(name, construct):
    """The module (`blocks.1.act`) of a record: msprobe's `Module.<path>.<Class>.forward.0...`,
    an API call inside one (construct.json gives its parent), or detcheck's `fwd/<path>`,
    `grad/<path>.<param>`."""
    for prefix in ("fwd/",):
        if name.startswith(prefix):
            return name[len(prefix) :]
    for prefix in ("grad/", "param/"):
        if name.startswith(prefix):
            return name[len(prefix) :].rsplit(".", 1)[0]
    m = _MODULE.match(name)
    if m:
        return m["path"]
    call = _CALL.match(name)
    if call:
        parent = construct.get(call["call"]) or construct.get(
            call["call"].replace(".backward", ".forward")
        )
        if parent:
            return module_of(parent + ".", construct)
    return name


def construct_of(dump):
    path = step_folder(dump) / "construct.json"
    return json.loads(path.read_text()) if path.exists() else {}


@pytest.mark.parametrize(
    ("pair", "source"),
    [
        ("gelu", "statistics"),
        # msprobe's tensor dumps at level mix hold the API records inside the LayerNorms, among
        # them the row means of the recentred, shifted residual stream, whose rounding is a
        # relative error 30x the stream's: judged against every earlier record, the GELU's error
        # was within its allowance (0.62x); judged against its own call's inputs (the data flow
        # the dump holds, docs/align.md), it is the culprit.
        ("gelu", "tensor"),
        pytest.param("gross", "statistics", marks=FULL_GROSS),
        pytest.param("gross", "tensor", marks=FULL_GROSS),
    ],
)
def test_same_culprit_from_msprobe_dumps_and_traces(dumps, detcheck_bin, pair, source):
    """detcheck's verdict and first culprit on msprobe's dump of a task are those on detcheck's
    own traces of the same runs: not aligned, the culprit at step 0 in the buggy module."""
    found = {}
    for kind in (source, "trace"):
        a, b = dumps[pair, kind], dumps["reference", kind]
        alignment = align(detcheck_bin, a, b)
        culprit = alignment["culprit"]
        assert culprit is not None, (kind, alignment["notes"])
        assert culprit["step"] == 0 and culprit["blame"] == "own", culprit
        construct = construct_of(a) if kind != "trace" else {}
        found[kind] = module_of(culprit["name"], construct), culprit["name"]
    assert {m for m, _ in found.values()} == {BUGGY_MODULE[pair]}, found


def verdicts(rows):
    """msprobe's Result column (pass, warning, error) by row name."""
    return {row["NPU Name"]: row["Result"] for row in rows}


def test_gelu_passes_msprobe_and_is_detchecks_culprit(compared, dumps):
    """The approximate GELU (errors ~2.5e-4 in float32, ~190 roundoffs at its magnitude):
    msprobe passes every forward row of the GELU module in both tasks (and every row of it in
    tensor mode), and the first row it flags is another module's; detcheck names the GELU as
    the first culprit on msprobe's statistics dump (and on its own traces, above)."""
    for task in TASKS:
        rows, alignment = compared["gelu", task]
        construct = construct_of(dumps["gelu", task])
        results = verdicts(rows)
        gelu = {n: v for n, v in results.items() if module_of(n, construct) == "blocks.1.act"}
        forward = {n: v for n, v in gelu.items() if ".forward." in n}
        assert len(forward) >= 2 and set(forward.values()) == {"pass"}, (task, gelu)
        if task == "tensor":
            assert set(gelu.values()) == {"pass"}, gelu
        flagged = [n for n, v in results.items() if v != "pass"]
        assert flagged and module_of(flagged[0], construct) != "blocks.1.act", (task, flagged)
        if task == "statistics":
            culprit = alignment["culprit"]
            assert module_of(culprit["name"], construct) == "blocks.1.act", (task, culprit)
            assert culprit["blame"] == "own" and culprit["verdict"] != "aligned", culprit


@pytest.mark.full(
    covered_by="test_msprobe_align.py::test_gelu_passes_msprobe_and_is_detchecks_culprit"
)
def test_gross_error_flagged_by_both(compared, dumps):
    """A gross error (one block's up projection doubled): msprobe's first row that is not a pass
    is the up projection's, and detcheck's first culprit is the same module."""
    for task in TASKS:
        rows, alignment = compared["gross", task]
        construct = construct_of(dumps["gross", task])
        errors = [row["NPU Name"] for row in rows if row["Result"] == "error"]
        assert errors, task
        assert module_of(errors[0], construct) == "blocks.1.up", (task, errors)
        culprit = alignment["culprit"]
        assert module_of(culprit["name"], construct) == "blocks.1.up", (task, culprit)
        assert culprit["verdict"] == "error", culprit


# `python -m detcheck.replay`: A's calls run again on B's recorded inputs (docs/align.md,
# "Replay"). msprobe_replay.py's "device a" calls GELU with approximate="tanh".
REPLAY_PROGRAM = PROGRAMS / "align" / "msprobe_replay.py"


@pytest.fixture(scope="module")
def replay_dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay")
    runs = {"reference": [], "tanh": ["--approximate", "tanh"]}
    return {
        run: msprobe_dump(root / run, "tensor", flags, REPLAY_PROGRAM, "L1", [])
        for run, flags in runs.items()
    }


def replay(detcheck_bin, *args):
    done = subprocess.run(
        [sys.executable, "-m", "detcheck.replay", "--format", "json", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"DETCHECK_BIN": str(detcheck_bin)},
    )
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    return done.returncode, lines, done.stderr


@REPLAY
def test_replay_names_the_call_whose_error_is_its_own(replay_dumps, detcheck_bin, tmp_path):
    code, (line,), log = replay(
        detcheck_bin, replay_dumps["tanh"], replay_dumps["reference"], "--out", tmp_path / "r"
    )
    assert code == 1 and "replayed 5 calls" in log, log
    alignment = line["alignment"]
    assert alignment["culprit"]["name"] == "Functional.gelu.0.forward.output.0", alignment
    assert alignment["culprit"]["blame"] == "own" and alignment["culprit"]["excess"] > 16
    # Replayed on B's inputs, the calls after the GELU give B's outputs: nothing inherits, the
    # one error is the GELU's (compare --align A B, whose inputs differ, blames them as
    # inherited).
    assert alignment["counts"] == [12, 0, 1], alignment["counts"]
    kept = sorted(p.name for p in (tmp_path / "r" / "step0" / "rank0").iterdir())
    assert kept == ["dump.json", "dump_tensor_data"], kept
    direct = align(detcheck_bin, replay_dumps["tanh"], replay_dumps["reference"])
    assert direct["counts"][2] > 1, direct["counts"]  # the errors its successors inherit


@REPLAY
def test_replay_of_the_reference_on_itself_is_aligned(replay_dumps, detcheck_bin):
    code, (line,), log = replay(detcheck_bin, replay_dumps["reference"], replay_dumps["reference"])
    assert code == 0 and line["aligned"], log


def test_replay_says_what_it_cannot_replay(dumps, detcheck_bin, tmp_path):
    # msprobe's statistics mode holds no tensors to call again with; a folder that is no dump.
    code, lines, log = replay(
        detcheck_bin, dumps["gelu", "statistics"], dumps["reference", "statistics"]
    )
    assert code == 2 and lines == [] and "task `statistics`" in log, log
    code, lines, log = replay(detcheck_bin, tmp_path, dumps["reference", "tensor"])
    assert code == 2 and "no step<N>/rank<M>/dump.json" in log, log
    # Module calls are listed as not replayed, with why (the mix-level dumps of the GELU pair).
    code, lines, log = replay(detcheck_bin, dumps["gelu", "tensor"], dumps["reference", "tensor"])
    assert code == 0 and "replayed 37 calls" in log and "not replayed: 19 module calls" in log, log
