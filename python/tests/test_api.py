"""`detcheck.check`, `detcheck.compare` and the pytest plugin: the command's checks as Python
calls returning reports (a divergence is data, bad arguments raise), and a check as a test."""

import os
import subprocess
import sys
import textwrap

import detcheck
import numpy as np
import pytest
from support import PROGRAMS, ROOT

NUMPY = PROGRAMS / "numpy_ranks.py"


def program(*extra):
    return [sys.executable, str(NUMPY), *extra]


def test_a_program_passes_and_its_report_says_so():
    report = detcheck.check(program=program("--steps", "3"), ranks=2, steps=3)
    assert report.passed and report.exit_code == 0
    (s,) = report.scenarios
    assert (s.name, s.status, s.verdict) == ("numpy_ranks", "passed", "ok")
    assert [c.check for c in s.checks] == ["repeat", "replicas"]
    assert s.first_divergence is None
    assert report["numpy_ranks"] is s


def test_a_divergence_is_data_with_its_element_and_environment():
    report = detcheck.check(program=program("--plant-set-order"), ranks=2, checks=["repeat"])
    assert not report.passed and report.exit_code == 1
    (s,) = report.scenarios
    assert s.verdict == "FAIL"
    first = s.first_divergence
    assert (first.step, first.rank, first.name) == (0, 0, "grad/mix")
    assert first.element.found.left_bits != first.element.found.right_bits
    assert [e.key for e in s.environment] == ["PYTHONHASHSEED"]
    assert s.environment[0].hint.fix == "set PYTHONHASHSEED=0"
    assert "first differing element: [" in report.text
    # the same as a negative control: caught, so passed
    caught = detcheck.check(
        program=program("--plant-set-order"), ranks=2, checks="repeat", expect="diverges"
    )
    assert caught.passed and caught.scenarios[0].verdict == "ok (caught)"


def test_bad_arguments_raise_naming_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--ranks: must be between 1 and 1024"):
        detcheck.check(program=program(), ranks=0)
    with pytest.raises(ValueError, match="ranks: only with a program"):
        detcheck.check(ROOT / "scenarios", ranks=2)
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "command", "world_size": 2}')
    with pytest.raises(ValueError, match="bad.json"):
        detcheck.check(bad)


def test_scenario_files_are_checked_too():
    report = detcheck.check(ROOT / "scenarios" / "control_arrival_order_3ranks.json")
    assert report.passed
    assert report.scenarios[0].first_divergence.element.found.ulps >= 1


def test_compare_two_dumps(tmp_path):
    def dump(folder, value):
        for rank in range(2):
            with detcheck.TraceWriter(folder, rank, 2) as w:
                w.record(0, "w", np.full(4, value if rank == 1 else 1.0, dtype=np.float32))

    dump(tmp_path / "a", 1.0)
    dump(tmp_path / "b", 1.0)
    dump(tmp_path / "c", 2.0)
    same = detcheck.compare(tmp_path / "a", tmp_path / "b")
    assert same.identical and same.exit_code == 0 and same.first is None
    differ = detcheck.compare(tmp_path / "a", tmp_path / "c")
    assert not differ.identical and differ.exit_code == 1
    assert (differ.first.rank, differ.first.name) == (1, "w")
    assert "w" in differ.text
    with pytest.raises(ValueError, match="nowhere"):
        detcheck.compare(tmp_path / "a", tmp_path / "nowhere")


def test_the_pytest_plugin_fails_a_test_with_the_report(tmp_path):
    """The plugin loads from the installed package (entry point): the fixture and the marker."""
    test = tmp_path / "test_user.py"
    test.write_text(
        textwrap.dedent(f"""
        import sys
        import pytest

        PROGRAM = [sys.executable, {str(NUMPY)!r}]

        def test_clean(detcheck_check):
            report = detcheck_check(program=PROGRAM, ranks=2)
            assert report.passed

        def test_bug(detcheck_check):
            detcheck_check(program=PROGRAM + ["--plant-set-order"], ranks=2, checks=["repeat"])

        @pytest.mark.detcheck(program=PROGRAM + ["--plant-set-order"], ranks=2,
                              checks=["repeat"], expect="diverges")
        def test_control(detcheck_report):
            assert detcheck_report.scenarios[0].first_divergence.element is not None
    """)
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env={**os.environ, "PYTEST_ADDOPTS": ""},
    )
    out = done.stdout
    assert done.returncode == 1, out
    assert "1 failed, 2 passed" in out, out
    assert "detcheck check failed (exit 1)" in out and "first differing element" in out, out
