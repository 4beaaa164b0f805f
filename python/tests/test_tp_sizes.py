"""Tensor-parallel size invariance (issue 56, item 4): the `world_sizes` check of a hand-written
tensor-parallel model (`examples/programs/python/batch/tp_infer.py`, Megatron's column- then
row-parallel MLP on gloo, plain tensors, no DTensor). Nothing marks its records replicated; the
row-parallel output after its all-reduce is held alike by every rank, and is compared with the
1-rank model's (docs/checks.md, world_sizes). Its parameter shards are not compared against the
whole parameters of the world of one.

Needs torch (CI installs it).
"""

import sys

import pytest
from support import PROGRAMS, check, requires

requires("torch")

SCRIPT = PROGRAMS / "batch" / "tp_infer.py"


def world_sizes(detcheck_bin, *flags, sizes="1,2,4", code):
    args = ("--checks", "world_sizes", "--world-sizes", sizes, "--", sys.executable, SCRIPT)
    (line,) = check(detcheck_bin, *args, *flags, code=code).scenarios.values()
    return line


def test_a_tensor_parallel_model_differs_from_its_one_rank_self_at_its_all_reduce(detcheck_bin):
    line = world_sizes(detcheck_bin, code=1)
    assert line["verdict"] == "FAIL", line
    (sizes,) = line["checks"]
    assert sizes["note"].startswith("world size 1 (smallest) vs 2 (larger)"), sizes
    first = line["first_divergence"]
    # The row-parallel layer's output at step 0: the first record every rank holds alike.
    assert (first["step"], first["name"]) == (0, "fwd/1"), first
    operator = first["operator"]
    assert operator["finding"] == "split_work", operator
    # Its weight is a shard at 2 ranks, whole at 1; the all-reduce that adds the halves' partial
    # products is named with the script's line.
    assert operator["call"]["inputs"] == ["f32[64,1024]"] and operator["other"] == "f32[64,512]"
    collective = operator["collective"]
    assert collective["operator"] == "c10d.allreduce_.default", collective
    assert collective["site"].endswith("tp_infer.py:54"), collective


# The full tier (docs/testing.md): world_sizes passing on a program whose ranks split the work is
# checked in CI on the unmodified DDP script (1 and 2 ranks).
@pytest.mark.full(
    covered_by="test_zero_change.py::test_an_unmodified_ddp_script_passes_at_one_and_two_ranks_and_its_controls_are_caught"
)
def test_a_fixed_reduction_order_makes_it_equal_at_1_2_and_4_ranks(detcheck_bin):
    line = world_sizes(detcheck_bin, "--fixed-order", code=0)
    assert line["verdict"] == "ok", line
    (sizes,) = line["checks"]
    # The model's input, the row-parallel layer's output and the model's, in each of 3 steps,
    # at 2 and at 4 ranks against 1; the two parameter shards are not compared.
    comparison = sizes["comparison"]
    assert comparison["num_compared"] == 18, comparison
    notes = comparison["notes"]
    assert "9 record(s) that nothing marks replicated held alike by every rank at world size 4" in (
        " ".join(notes)
    ), notes
    assert any(n.startswith("2 record(s) replicated at world size 1") for n in notes), notes
