"""Program diagnosis end to end: `detcheck check` on the negative controls of
examples/programs/python/, each caught by `repeat` and diagnosed as a built-in kind is: the first
differing element (index, both values with their bits, ULPs), and for a PyTorch program recorded
by `detcheck.torch.watch` the first differing operator and why (docs/operators.md).

Each control runs `DETCHECK_CONTROL_RUNS` times (default 1; .ci/run sets 20 for numpy and mpi4py,
`DETCHECK_TORCH_CONTROL_RUNS` for the torch ones): every run must catch it and name both.
The launchers: processes (numpy), mpirun (mpi4py), torchrun (torch, numpy noise)."""

import json

import pytest
from support import PROGRAMS, caught_with_element, check, requires, runs


def check_json(detcheck_bin, *args, code=0):
    """The scenario line of `detcheck check --format json ARGS` of one scenario file, which
    exits with `code`."""
    scenarios = check(detcheck_bin, *args, code=code).scenarios
    assert len(scenarios) == 1, scenarios
    return next(iter(scenarios.values()))


def test_numpy_set_order_names_its_element(detcheck_bin):
    """The set-order control (processes launcher): PYTHONHASHSEED changes every launch, and
    the re-runs, which reproduce their launches' PYTHONHASHSEED, reproduce the element."""
    for _ in range(runs()):
        line = check_json(detcheck_bin, PROGRAMS / "control_numpy_set_order.json")
        first = caught_with_element(line)
        assert first["name"] == "grad/mix"
        # a function of the launch: the re-runs reproduce the checked runs' values
        assert "found" in first["element"], first["element"]
        assert "operator" not in first, "a numpy program traces no operators"
        env = line["checks"][0]["comparison"]["environment"]
        hashseed = [e for e in env if e["key"] == "PYTHONHASHSEED"]
        assert hashseed and hashseed[0]["hint"]["fix"] == "set PYTHONHASHSEED=0", env
        # Shown to matter: a third run with run 1's hash seed repeated run 1.
        assert first["cause"]["kind"] == "hash_order", first["cause"]


def test_mpi4py_any_source_names_its_element(detcheck_bin):
    """The ANY_SOURCE control (mpirun launcher)."""
    requires("mpi4py")
    scenario = PROGRAMS / "mpi4py" / "control_numpy_mpi4py_any_source.json"
    for _ in range(runs()):
        first = caught_with_element(check_json(detcheck_bin, scenario))
        assert first["name"].startswith("grad/"), first["name"]


# The full tier (docs/testing.md): an operator's input from outside the traced operators, under
# torchrun, is checked in CI on the unmodified DDP script's control.
@pytest.mark.full(
    covered_by="test_zero_change.py::test_an_unmodified_ddp_script_passes_at_one_and_two_ranks_and_its_controls_are_caught"
)
def test_torch_numpy_noise_is_an_input_from_outside(detcheck_bin):
    """numpy noise inside `block` (torchrun launcher): the first differing operator's input
    came from outside the traced operators."""
    requires("torch")
    scenario = PROGRAMS / "torch" / "control_torch_numpy_noise.json"
    for _ in range(runs("DETCHECK_TORCH_CONTROL_RUNS")):
        first = caught_with_element(check_json(detcheck_bin, scenario))
        assert first["name"] == "fwd/block", first["name"]
        operator = first["operator"]
        assert operator["finding"] == "input_from_outside", operator
        assert operator["source"] == {"source": "untraced"}, operator
        assert operator["call"]["module"] == "block", operator
        assert operator["window"] == "forward"


# The full tier (docs/testing.md): the same program, at one rank expected identical, is checked
# in CI with its finding, operator, module, inputs and cause by the test of every report below.
@pytest.mark.full(covered_by="test_diagnosis.py::test_the_operator_finding_reaches_every_report")
def test_torch_entropy_sum_is_a_nondeterministic_operator(detcheck_bin):
    """A custom operator (torch.library) that sums in an order drawn from OS entropy: named,
    with its module and input layouts, and classified as nondeterministic."""
    requires("torch")
    scenario = PROGRAMS / "torch" / "control_torch_entropy_sum.json"
    for _ in range(runs("DETCHECK_TORCH_CONTROL_RUNS")):
        first = caught_with_element(check_json(detcheck_bin, scenario))
        assert first["name"] == "fwd/block", first["name"]
        operator = first["operator"]
        assert operator["finding"] == "nondeterministic", operator
        assert operator["call"]["operator"] == "detcheck_examples.entropy_sum.default", operator
        assert operator["call"]["module"] == "block"
        assert operator["call"]["inputs"] == ["f64[8,64]"], operator
        assert operator["hint"] is None, "a program's own operator is in no table"
        assert first["cause"]["kind"] == "nondeterministic_operator", first["cause"]


# The full tier (docs/testing.md): a DDP program passing repeat, replicas and world_sizes is
# checked in CI on the unmodified DDP script.
@pytest.mark.full(
    covered_by="test_zero_change.py::test_an_unmodified_ddp_script_passes_at_one_and_two_ranks_and_its_controls_are_caught"
)
def test_torch_clean_ddp_passes_repeat_replicas_and_world_sizes(detcheck_bin):
    requires("torch")
    line = check_json(detcheck_bin, PROGRAMS / "torch" / "torch_ddp.json")
    assert line["verdict"] == "ok", line
    assert [c["check"] for c in line["checks"]] == ["repeat", "replicas", "world_sizes"]
    assert all(c["holds"] for c in line["checks"]), line["checks"]


def test_the_operator_finding_reaches_every_report(detcheck_bin, tmp_path):
    """A check that does not hold (the entropy-sum program expected identical) carries the
    operator finding into the text, the JSON lines, the JUnit failure and the HTML page."""
    requires("torch")
    import xml.etree.ElementTree as ET

    spec = json.loads((PROGRAMS / "torch" / "control_torch_entropy_sum.json").read_text())
    spec["expect"] = "identical"
    spec["world_size"] = 1
    spec["params"]["command"] = [
        a.replace("{scenario_dir}", str(PROGRAMS / "torch")) for a in spec["params"]["command"]
    ]
    scenario = tmp_path / "entropy_sum_expected_identical.json"
    scenario.write_text(json.dumps(spec))
    junit, pages = tmp_path / "junit.xml", tmp_path / "pages"
    # One check (its drill-down takes minutes on 2 cores): the JSON line's `detail` is the
    # text report's.
    line = check_json(detcheck_bin, "--junit", junit, "--report-dir", pages, scenario, code=1)
    sentence = "`detcheck_examples.entropy_sum.default` (call #3 in `block`"
    assert "first differing operator: " + sentence in line["detail"], line["detail"]
    assert "the operator itself is nondeterministic" in line["detail"]

    failure = ET.parse(junit).getroot().find(".//failure")
    assert sentence in failure.text, failure.text

    page = (pages / "entropy_sum_expected_identical.repeat.html").read_text()
    assert '<h3 id="operator">First differing operator</h3>' in page, page
    assert "detcheck_examples.entropy_sum.default" in page

    first = line["first_divergence"]
    operator = first["operator"]
    assert operator["finding"] == "nondeterministic", operator
    assert operator["call"]["operator"] == "detcheck_examples.entropy_sum.default", operator
    # one rank: the whole batch of 16 (each of two ranks has 8)
    assert operator["call"]["module"] == "block" and operator["call"]["inputs"] == ["f64[16,64]"]
    assert operator["hint"] is None, "a program's own operator is in no table"
    assert first["cause"]["kind"] == "nondeterministic_operator", first["cause"]
