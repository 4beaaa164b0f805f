"""The `batch_sizes` check from the command line (issue 56, item 1): an unmodified script run
with `{batch}` taking each size in turn, each sample's records compared with its records at the
first size, a sample a step (docs/checks.md, "batch_sizes"). A tiny GPT-2 generating greedily
is caught at sample 0 in its first layer, the operator named (`aten.addmm`); a model of
row-wise operations passes with every sample compared, every time.

Needs torch; the GPT-2 needs transformers (CI installs both).
"""

import sys

import pytest
from support import PROGRAMS, check, requires, runs

requires("torch")

BATCH = PROGRAMS / "batch"
#: generate.py's line that calls `model.generate` (the site the drill-down names).
GENERATE_CALL = next(
    n
    for n, text in enumerate((BATCH / "generate.py").read_text().splitlines(), 1)
    if "model.generate(" in text
)


def test_a_tiny_gpt2_generating_in_batches_fails_at_sample_0_in_its_first_layer(detcheck_bin):
    requires("transformers")
    args = ("--batch-sizes", "1,8", "--run-to-end", "--", sys.executable)
    (line,) = check(
        detcheck_bin, *args, BATCH / "generate.py", "--batch-size", "{batch}", code=1
    ).scenarios.values()
    assert line["verdict"] == "FAIL", line
    (batch,) = line["checks"]
    assert batch["check"] == "batch_sizes" and batch["status"] == "failed", batch
    first = line["first_divergence"]
    # A record's step is its sample: prompt 0, alone and first of a batch of 8, parts in the
    # prefill's first matrix product (the prompt's 6 rows against 48).
    assert first["check"] == "batch_sizes" and first["step"] == 0, first
    assert first["name"].startswith("fwd/transformer.h.0."), first
    assert batch["note"] == "batch 1 (first) vs batch 8; a record's step is its sample", batch
    # Inside it, the operator: the prefill's matrix product, 6 rows against 48, at the script's
    # line that called generate.
    operator = first["operator"]
    assert operator["finding"] == "batch_variant" and operator["sizes"] == [1, 8], operator
    assert operator["call"]["operator"] == "aten.addmm.default", operator
    assert "6x64" in operator["call"]["inputs"] and "48x64" in operator["other_inputs"], operator
    assert operator["call"]["site"].endswith(f"generate.py:{GENERATE_CALL}"), operator
    assert "pad every batch to one fixed size" in line["detail"], line


def test_a_model_of_row_wise_operations_passes_with_every_sample_compared(detcheck_bin):
    script = BATCH / "rowwise.py"
    args = ("--batch-sizes", "1,3,8", "--run-to-end", "--", sys.executable, script)
    for _ in range(runs("DETCHECK_BATCH_RUNS")):
        (line,) = check(detcheck_bin, *args, "--batch-size", "{batch}", code=0).scenarios.values()
        assert line["verdict"] == "ok", line
        (batch,) = line["checks"]
        assert batch["status"] == "passed", batch
        # 24 samples, each with the model's input and its 4 outputs (3 modules and the
        # model), at sizes 3 and 8 against 1
        assert batch["comparison"]["num_compared"] == 24 * 5 * 2, batch


class _Collect:
    """A sink that keeps what it is given: (step, name, the tensor's list)."""

    def __init__(self):
        self.records = []
        self.steps_ended = 0

    def put(self, step, name, tensor, replicated=False, state=False):
        self.records.append((step, name, tensor.tolist()))

    def end_step(self):
        self.steps_ended += 1

    def close(self):
        pass


class _Writer:
    """A writer that keeps what it is given: dense CPU rows reach it directly as numpy."""

    def __init__(self, records):
        self.environment = {}
        self.records = records

    def record(self, step, name, array):
        self.records.append((step, name, array.tolist()))

    def add_environment(self, key, value):
        self.environment[key] = value


def test_rows_are_written_sample_by_sample_and_shared_tensors_are_counted():
    import torch
    from detcheck._torch import rows as _rows

    batches, inner = _rows.Batches(), _Collect()
    writer = _Writer(inner.records)
    sink = _rows.RowsSink(inner, writer, batches)
    for start in (0, 2):  # two batches of 2 rows; the second's in-place change is not seen
        x = torch.arange(start, start + 2).reshape(2, 1)
        batches.begin(_rows.rows_of((x,), {}))
        batches.begin(_rows.rows_of((), {"ids": x}))  # a forward inside generate
        sink.put(0, "in/(model).0", x)
        sink.put(0, "fwd/pos", torch.zeros(1, 3))  # shared by the batch: no sample's
        batches.end()
        sink.put(0, "fwd/(model)", x * 10)
        x.add_(100)
        batches.end()
    sink.close()
    assert inner.records == [
        (0, "in/(model).0", [[0]]),
        (0, "fwd/(model)", [[0]]),
        (1, "in/(model).0", [[1]]),
        (1, "fwd/(model)", [[10]]),
        (2, "in/(model).0", [[2]]),
        (2, "fwd/(model)", [[20]]),
        (3, "in/(model).0", [[3]]),
        (3, "fwd/(model)", [[30]]),
    ]
    assert inner.steps_ended == 4
    assert writer.environment["detcheck.rows.unsplit"].endswith("recorded in no sample: fwd/pos")


def test_a_program_that_records_itself_gets_batch_sizes_na_with_the_reason(detcheck_bin):
    """A program that writes its own traces (`detcheck.torch.watch`) writes no samples: its
    records are per step, not per sample, so comparing them across batch sizes would compare
    batches. The check is n/a, and says why, never a failure or a pass."""
    script = PROGRAMS / "torch" / "torch_ddp.py"
    (line,) = check(
        detcheck_bin, "--batch-sizes", "1,2", "--", sys.executable, script, code=1
    ).scenarios.values()
    (batch,) = line["checks"]
    assert batch["status"] == "skipped", batch
    assert batch["skip_reason"].startswith("the program's recorder wrote no samples"), batch


# The full tier (docs/testing.md): the Python API's test checks the padding and the thread split.
@pytest.mark.full(
    covered_by="test_batch.py::test_padding_to_one_size_passes_on_one_thread_and_the_thread_split_is_named_on_two"
)
def test_padding_every_batch_to_one_size_passes_on_one_thread_and_not_on_two(detcheck_bin):
    """The fix for shape dependence, verified from the command line: every batch padded to 8
    rows (pad tokens whose attention mask is all zero: padding, no sample), so each prompt is
    computed in one shape at batch 1 and 8. On one thread every sample's records are equal; on
    two, the threads split the batch by position, and prompts 4-7 (row 0 of their batch at
    batch 1, rows 4-7 at batch 8) differ, first in the attention's output: the report names
    the attention and the row's position (prompts 0-3 of the same batch were equal)."""
    requires("transformers")
    args = ("--batch-sizes", "1,8", "--run-to-end", "--", sys.executable, BATCH / "generate.py")
    padded = ("--batch-size", "{batch}", "--pad-to", "8", "--threads")
    (line,) = check(detcheck_bin, *args, *padded, "1", code=0).scenarios.values()
    assert line["verdict"] == "ok", line
    (batch,) = line["checks"]
    # 8 samples of about 130 records each: nothing of the padding rows is compared.
    assert batch["comparison"]["num_compared"] > 8 * 100, batch
    (line,) = check(detcheck_bin, *args, *padded, "2", code=1).scenarios.values()
    first = line["first_divergence"]
    assert first["step"] == 4, first
    # The attention: its input rows equal, its output rows not. At batch 1 the padding rows'
    # all-zero mask is fixed up by `where` and passed; at batch 8 there is no mask: that call
    # is paired past, and the sample's position names the split.
    operator = first["operator"]
    assert operator["finding"] == "batch_variant", operator
    assert "scaled_dot_product" in operator["call"]["operator"], operator
    assert operator["one_sided"] == ["`aten.where.self` at batch 1"], operator
    assert operator["rows"] == {"row": [0, 4], "of": 8, "before": 4, "threads": 2}, operator


# The full tier (docs/testing.md): the Python API's test checks the fix on one and two threads.
@pytest.mark.full(
    covered_by="test_batch.py::test_one_sample_at_a_time_makes_the_tiny_gpt2_invariant_on_one_and_two_threads"
)
def test_one_sample_at_a_time_passes_unpadded_on_two_threads(detcheck_bin):
    """The fix the report offers, verified from the command line: generate.py's decoding inside
    `detcheck.torch.batch_invariant()`, unpadded, on two threads: every prompt's records equal
    at batch 1 and 8."""
    requires("transformers")
    args = ("--batch-sizes", "1,8", "--run-to-end", "--", sys.executable, BATCH / "generate.py")
    invariant = ("--batch-size", "{batch}", "--batch-invariant", "--threads", "2")
    (line,) = check(detcheck_bin, *args, *invariant, code=0).scenarios.values()
    assert line["verdict"] == "ok", line
    (batch,) = line["checks"]
    assert batch["comparison"]["num_compared"] > 8 * 100, batch


# The full tier (docs/testing.md): batch_sizes' drill-down to the first operator is checked in CI
# on the tiny GPT-2.
@pytest.mark.full(
    covered_by="test_batch_sizes.py::test_a_tiny_gpt2_generating_in_batches_fails_at_sample_0_in_its_first_layer"
)
def test_an_operator_of_the_enclosing_module_is_named_past_a_module_whose_input_differed(
    detcheck_bin,
):
    """bare_matmul.py: the block's own `x @ weight` (no submodule of its own) differs at batch 1
    against 8, so the first differing record is its LayerNorm's output, whose input already
    differed; the drill-down goes on into the block's call and names `aten.mm`, its line and both
    sizes' shapes."""
    args = ("--batch-sizes", "1,8", "--", sys.executable, BATCH / "bare_matmul.py")
    (line,) = check(detcheck_bin, *args, "--batch-size", "{batch}", code=1).scenarios.values()
    first = line["first_divergence"]
    assert (first["step"], first["name"]) == (0, "fwd/norm"), first
    operator = first["operator"]
    assert operator["finding"] == "batch_variant", operator
    call = operator["call"]
    assert (call["operator"], call["module"]) == ("aten.mm.default", "(model)"), operator
    assert call["site"].endswith("bare_matmul.py:26"), operator
    assert call["inputs"] == ["1x256", "256x256"] and operator["other_inputs"][0] == "8x256"
