"""Inside the culprit of `detcheck compare --align`: `detcheck run --dump DIR --inside RECORD`
dumps the operators of one module (its inputs, every operator's inputs and outputs, its
outputs, in full), `--replay REF` runs that module on the inputs of the reference's such dump,
and `compare --align A B` of the two names the operator whose error is its own, with each
side's call and line, or says where the module is computed another way. The program is
examples/programs/python/align/two_devices.py, run as two "devices" on the CPU, unmodified."""

import json
import shlex
import sys

import pytest
from support import PROGRAMS, requires, run_detcheck

requires("torch")

SCRIPT = PROGRAMS / "align" / "two_devices.py"
OTHER = ("--device-kind", "other")
GELU_0 = (*OTHER, "--bug", "approx_gelu", "--bug-block", "0")
NORM_0 = (*OTHER, "--bug", "unstable_norm", "--bug-block", "0", "--shift", "300")


def inside(detcheck_bin, folder, record, args, *flags, code=0):
    """`detcheck run --dump FOLDER --inside RECORD FLAGS -- python two_devices.py ARGS`."""
    program = ("--", sys.executable, SCRIPT, *args)
    return run_detcheck(
        detcheck_bin, "run", "--dump", folder, "--inside", record, *flags, *program, code=code
    )


def align(detcheck_bin, a, b, code):
    done = run_detcheck(detcheck_bin, "compare", "--align", "--format", "json", a, b, code=code)
    return json.loads(done.stdout)


def test_replay_names_the_approximate_operator_and_its_argument(detcheck_bin, tmp_path):
    b, a = tmp_path / "b", tmp_path / "a"
    done = inside(detcheck_bin, b, "fwd/blocks.0.act", ())
    assert "the operators inside `fwd/blocks.0.act` (step 0, rank 0" in done.stdout, done.out
    # Three steps: the program trains on after the window, its backward through the replayed
    # inputs included.
    done = inside(detcheck_bin, a, "fwd/blocks.0.act", GELU_0, "--replay", b)
    assert f"the module ran on the inputs of {b}" in done.stdout, done.out
    result = align(detcheck_bin, a, b, code=1)
    al = result["alignment"]
    first = al["culprit"]
    assert first["name"] == "op/0000/blocks.0.act/aten.gelu.default/out0", first
    assert first["blame"] == "own" and first["excess"] > 10, first
    call = al["culprit_call"]
    assert "approximate='tanh'" in call["calls"][0] and "approximate" not in call["calls"][1]
    assert "two_devices.py:" in call["sites"][0], call
    assert any("same inputs on both sides" in n for n in al["notes"]), al["notes"]
    assert "A calls `aten.gelu.default(float32[64, 256], approximate='tanh')`" in result["text"]


def test_a_module_computed_another_way_is_said_and_judged_whole(detcheck_bin, tmp_path):
    b, a, a_own = tmp_path / "b", tmp_path / "a", tmp_path / "a_own"
    inside(detcheck_bin, b, "fwd/blocks.0.norm", ("--shift", "300"))
    inside(detcheck_bin, a, "fwd/blocks.0.norm", NORM_0, "--replay", b)
    al = align(detcheck_bin, a, b, code=1)["alignment"]
    assert al["culprit"]["name"] == "window/out0" and al["culprit"]["blame"] == "own"
    part = al["operators_part"]
    assert (part["call"], part["left"], part["right"]) == (
        1,
        "aten.mul.Tensor",
        "aten.sub.Tensor",
    ), part
    # A's E[x^2] - E[x]^2 and B's E[(x - mean)^2] are at their own lines of the program.
    assert part["at"]["sites"][0] != part["at"]["sites"][1], part
    # Without the replay the module runs on its own inputs, which differ by rounding: still a
    # pair of traces that part at the same call.
    inside(detcheck_bin, a_own, "fwd/blocks.0.norm", NORM_0)
    done = run_detcheck(detcheck_bin, "compare", "--align", a_own, b)
    assert done.code in (0, 1) and "the operators part at call 1" in done.stdout, done.out


def test_a_correct_module_replayed_is_aligned(detcheck_bin, tmp_path):
    """The other device's product (four partial products, summed last first) against
    `F.linear`: other operators, the same result within rounding."""
    b, a = tmp_path / "b", tmp_path / "a"
    inside(detcheck_bin, b, "fwd/blocks.0.up", ())
    inside(detcheck_bin, a, "fwd/blocks.0.up", OTHER, "--replay", b)
    al = align(detcheck_bin, a, b, code=0)["alignment"]
    assert al["operators_part"] is not None and al["culprit"] is None, al


# The full tier (docs/testing.md): a replay of other operators aligned is checked in CI on the
# two-device program.
@pytest.mark.full(covered_by="test_align_inside.py::test_a_correct_module_replayed_is_aligned")
def test_a_compiled_attention_replayed_is_aligned_with_eager(detcheck_bin, tmp_path):
    """A script nobody here wrote for this (the corpus's nanoGPT-style trainer), as its author
    runs it, against itself with `--compile=True`: at step 1 the attention's parameters carry
    the first update's rounding (inputs from outside the window, allowed), and on eager's
    inputs every operator inside it is aligned."""
    script = PROGRAMS / "corpus" / "nanogpt_train.py"
    b, a = tmp_path / "b", tmp_path / "a"
    record = ("fwd/transformer.h.0.attn", "--inside-step", "1")
    for folder, flags, args in ((b, (), ()), (a, ("--replay", b), ("--compile=True",))):
        program = ("--", sys.executable, script, *args)
        run_detcheck(
            detcheck_bin, "run", "--dump", folder, "--inside", *record, *flags, *program, code=0
        )
    al = align(detcheck_bin, a, b, code=0)["alignment"]
    assert al["num_records"] > 80 and any("same inputs" in n for n in al["notes"]), al


def test_the_commands_compare_prints_find_the_operator(detcheck_bin, tmp_path):
    """`compare --align` of two whole runs prints the three commands that look inside its
    culprit, each side's program as its dump recorded it (`site:program`); run as printed,
    not edited, they name the operator."""
    ra, rb = tmp_path / "run_a", tmp_path / "run_b"
    for folder, args in ((ra, GELU_0), (rb, ())):
        program = ("--", sys.executable, SCRIPT, "--steps", "1", *args)
        run_detcheck(detcheck_bin, "run", "--dump", folder, "--mode", "full", *program, code=0)
    done = run_detcheck(detcheck_bin, "compare", "--align", ra, rb, code=1)
    commands = [
        line.strip()
        for line in done.stdout.splitlines()
        if line.startswith("    detcheck ")  # the indented commands after "inside it:"
    ]
    assert len(commands) == 3 and "program>" not in done.stdout, done.stdout
    program_a = [sys.executable, str(SCRIPT), "--steps", "1", *GELU_0]
    assert shlex.split(commands[1])[-len(program_a) :] == program_a, commands
    for i, command in enumerate(commands):
        argv = shlex.split(command)[1:]  # without `detcheck`
        run_detcheck(detcheck_bin, *argv, cwd=tmp_path, code=1 if i == 2 else 0)
    result = align(detcheck_bin, tmp_path / "A-IN", tmp_path / "B-IN", code=1)
    assert result["alignment"]["culprit_call"]["operator"] == "aten.gelu.default"


def test_bad_input_is_named_with_exit_2(detcheck_bin, tmp_path):
    b = tmp_path / "b"
    inside(detcheck_bin, b, "fwd/embed", ())
    # The embedding's inputs ([64, 32]) cannot be a norm's ([64, 64]).
    done = inside(detcheck_bin, tmp_path / "a", "fwd/blocks.0.norm", (), "--replay", b, code=2)
    assert "input 0 is [64, 64] here and [64, 32] in the reference" in done.stderr, done.out
    assert not (tmp_path / "a" / "rank0.dctrace").exists()
    done = inside(detcheck_bin, tmp_path / "c", "fwd/embed", (), "--replay", tmp_path, code=2)
    assert f"--replay {tmp_path}" in done.stderr and "no operator trace" in done.stderr
    done = inside(detcheck_bin, tmp_path / "d", "fwd/no_such_module", (), code=2)
    assert "ran no window of `fwd/no_such_module`" in done.stderr, done.out
    done = inside(detcheck_bin, tmp_path / "e", "grad/embed.weight", (), code=2)
    assert "give a forward record of a module" in done.stderr, done.out
    done = inside(detcheck_bin, b, "fwd/embed", (), code=2)
    assert "already holds a dump" in done.stderr, done.out


@pytest.mark.parametrize("flag", [("--perturb", "1"), ("--checkpoint", "ck")])
def test_flags_of_a_plain_dump_are_refused(detcheck_bin, tmp_path, flag):
    done = inside(detcheck_bin, tmp_path / "a", "fwd/embed", (), *flag, code=2)
    assert f"{flag[0]}" in done.stderr and "not with --inside" in done.stderr, done.out
