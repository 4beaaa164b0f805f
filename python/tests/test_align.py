"""`detcheck compare --align` on a real program run as two "devices" on the CPU
(examples/programs/python/align/two_devices.py): the other device accumulates its matrix
products in another order, so no tensor is bitwise equal to the reference's; planted bugs, at
several depths, are named as the first culprit at step 0; an ill-conditioned but correct
operation is never blamed; a bf16 autocast run aligns with its f32 reference at bf16's
rounding. Each dump is one `detcheck run --dump --mode full -- python two_devices.py ...`."""

import json
import sys

import pytest
from support import PROGRAMS, MadeWhenRead, requires, run_detcheck

# Its module-scoped dumps are made once: every test of the module on one pytest-xdist worker
# (CI runs `--dist loadgroup`), not once per worker.
pytestmark = pytest.mark.xdist_group("align")

requires("torch")

SCRIPT = PROGRAMS / "align" / "two_devices.py"

#: The code between two modules that `--between` plants, before a correct but ill-conditioned
#: module (the mean subtracted from values near 1000).
BETWEEN = ("offset", "residual", "functional", "inplace")

#: name -> the program's arguments for that "device"
RUNS = {
    "reference": (),
    "other": ("--device-kind", "other"),
    "reference_offset": ("--offset", "1000"),
    "other_offset": ("--device-kind", "other", "--offset", "1000"),
    "gelu_0": ("--device-kind", "other", "--bug", "approx_gelu", "--bug-block", "0"),
    "gelu_2": ("--device-kind", "other", "--bug", "approx_gelu", "--bug-block", "2"),
    "reference_300": ("--shift", "300"),
    "other_300": ("--device-kind", "other", "--shift", "300"),
    "norm_0": (
        "--device-kind",
        "other",
        "--bug",
        "unstable_norm",
        "--bug-block",
        "0",
        "--shift",
        "300",
    ),
    "norm_2": (
        "--device-kind",
        "other",
        "--bug",
        "unstable_norm",
        "--bug-block",
        "2",
        "--shift",
        "300",
    ),
    "bf16": ("--device-kind", "other", "--autocast"),
    "bf16_gelu": ("--device-kind", "other", "--autocast", "--bug", "approx_gelu"),
    "bf16_norm": ("--device-kind", "other", "--autocast", "--bug", "unstable_norm"),
    **{
        f"{device}_{kind}": ("--device-kind", device, "--between", kind)
        for kind in BETWEEN
        for device in ("reference", "other")
    },
}


@pytest.fixture(scope="module")
def dumps(detcheck_bin, tmp_path_factory):
    """The runs of RUNS by name, each dumped (full mode) once, when first read."""
    root = tmp_path_factory.mktemp("align")

    def dump(name):
        path = root / name
        cmd = ("run", "--dump", path, "--mode", "full", "--", sys.executable, SCRIPT)
        run_detcheck(detcheck_bin, *cmd, *RUNS[name], cwd=root, code=0)
        return {name: path}

    return MadeWhenRead(dump)


#: The full tier (docs/testing.md): a second case of what a CI case of the same test proves.
FULL = pytest.mark.full(
    covered_by="test_align.py::test_a_planted_bug_is_the_first_culprit_at_step_0"
)


def align(detcheck_bin, dumps, a, b, *flags, code):
    done = run_detcheck(
        detcheck_bin,
        "compare",
        "--align",
        "--format",
        "json",
        *flags,
        dumps[a],
        dumps[b],
        code=code,
    )
    result = json.loads(done.stdout)
    assert result["exit_code"] == code and result["aligned"] == (code == 0)
    return result["alignment"]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("other", "reference"),
        ("other_offset", "reference_offset"),
        pytest.param(
            "other_300",
            "reference_300",
            marks=pytest.mark.full(
                covered_by="test_align.py::test_rounding_everywhere_is_aligned_where_a_bitwise_compare_differs"
            ),
        ),
    ],
)
def test_rounding_everywhere_is_aligned_where_a_bitwise_compare_differs(detcheck_bin, dumps, a, b):
    al = align(detcheck_bin, dumps, a, b, code=0)
    assert al["culprit"] is None and al["counts"][1:] == [0, 0], al["rows"][:3]
    assert al["num_records"] > 200
    run_detcheck(detcheck_bin, "compare", dumps[a], dumps[b], code=1)


@pytest.mark.parametrize(
    "kind",
    [
        "offset",
        *(
            pytest.param(
                kind,
                marks=pytest.mark.full(
                    covered_by="test_align.py::test_an_error_made_between_modules_is_inherited_never_a_modules_own"
                ),
            )
            for kind in BETWEEN[1:]
        ),
    ],
)
def test_an_error_made_between_modules_is_inherited_never_a_modules_own(detcheck_bin, dumps, kind):
    """Error entering through code between modules (an added offset, a residual sum, a
    functional call, an in-place change of an input), then a correct but ill-conditioned
    module: `run --dump` records that module's input (`in/recenter.0`, the data flow), so the
    module is judged on it and aligned. Before, its input was in no record and the module was
    blamed: `error, own, 32x` (issue 53)."""
    a, b = f"other_{kind}", f"reference_{kind}"
    al = align(detcheck_bin, dumps, a, b, "--every-record", code=0)
    assert al["culprit"] is None and al["counts"][1:] == [0, 0], al["rows"][:3]
    names = [r["name"] for r in al["records"]]
    assert "in/recenter.0" in names, names[:40]
    # The recentring's input is recorded only because code between modules made it: every
    # other module's input is a record before it (none of theirs is in the dump).
    assert [n for n in names if n.startswith("in/") and not n.startswith("in/(model)")] == [
        "in/recenter.0"
    ] * 3, names


@pytest.mark.parametrize(
    ("a", "b", "culprit"),
    [
        ("gelu_0", "reference", "fwd/blocks.0.act"),
        pytest.param("gelu_2", "reference", "fwd/blocks.2.act", marks=FULL),
        ("norm_0", "reference_300", "fwd/blocks.0.norm"),
        pytest.param("norm_2", "reference_300", "fwd/blocks.2.norm", marks=FULL),
        ("bf16_norm", "reference", "fwd/blocks.1.norm"),
    ],
)
def test_a_planted_bug_is_the_first_culprit_at_step_0(detcheck_bin, dumps, a, b, culprit):
    al = align(detcheck_bin, dumps, a, b, code=1)
    first = al["culprit"]
    assert (first["name"], first["step"], first["blame"]) == (culprit, 0, "own"), first
    # Every record before it is aligned: the first layer, with its rounding, is not blamed.
    before = [r for r in al["rows"] if (r["step"], r["seq"]) < (first["step"], first["seq"])]
    assert before == [], before
    # The records after it in its step inherit its error rather than being culprits.
    assert al["chain_len"] >= 1, al["chain"]


def test_the_approximate_activation_is_small_in_absolute_terms(detcheck_bin, dumps):
    """msprobe's thresholds pass it (cosine > 0.99 and max abs err < 1e-3); align names it
    because its error is thousands of times f32's rounding at its magnitude."""
    first = align(detcheck_bin, dumps, "gelu_0", "reference", code=1)["culprit"]
    metrics = first["metrics"]
    assert metrics["cosine"] > 0.99 and metrics["max_abs_err"] < 1e-3, metrics
    assert first["error"] / 2**-24 > 1000, first


def test_bf16_autocast_aligns_at_bf16_rounding(detcheck_bin, dumps):
    al = align(detcheck_bin, dumps, "bf16", "reference", code=0)
    assert al["culprit"] is None
    # An approximation within bf16's rounding is no culprit there (it is one in f32 above).
    align(detcheck_bin, dumps, "bf16_gelu", "reference", code=0)


def test_the_text_names_the_culprit_and_its_chain(detcheck_bin, dumps):
    done = run_detcheck(
        detcheck_bin, "compare", "--align", dumps["gelu_0"], dumps["reference"], code=1
    )
    assert "first culprit: step 0 rank 0 `fwd/blocks.0.act`" in done.stdout, done.stdout
    assert "the error is its own" in done.stdout
    assert "inherited by" in done.stdout


def test_bad_input_is_named_with_exit_2(detcheck_bin, dumps, tmp_path):
    done = run_detcheck(
        detcheck_bin,
        "compare",
        "--align",
        "--growth",
        "0",
        dumps["other"],
        dumps["reference"],
        code=2,
    )
    assert "--growth must be a positive number" in done.stderr
    done = run_detcheck(
        detcheck_bin,
        "compare",
        "--align",
        "--precision",
        "i64",
        dumps["other"],
        dumps["reference"],
        code=2,
    )
    assert "--precision: `i64` is not a floating dtype" in done.stderr
    done = run_detcheck(
        detcheck_bin, "compare", "--growth", "3", dumps["other"], dumps["reference"], code=2
    )
    assert "--align" in done.stderr
