"""detcheck's pytest plugin (detcheck/pytest_plugin.py), run by pytest's own `pytester` on
small test files: a check that holds passes the test, one that does not FAILS it (not an error
in its setup) with the report as its message, a skipped test runs no check, and a bad option is
a failure that names it."""

import re
from pathlib import Path

from support import requires

pytest_plugins = ["pytester"]

PROGRAM = (
    Path(__file__).resolve().parents[2] / "examples" / "programs" / "python" / "numpy_ranks.py"
)


def _test_file(pytester, body):
    pytester.makepyfile(
        f"""
        import sys
        import pytest

        PROGRAM = [sys.executable, {str(PROGRAM)!r}, "--steps", "2"]

        {body}
        """
    )


def _outcomes(pytester):
    # A subprocess: the plugin is loaded through the package's `pytest11` entry point, as a
    # user's pytest loads it.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    return result, result.parseoutcomes()


def test_a_check_that_holds_passes_and_its_report_is_given(pytester):
    _test_file(
        pytester,
        """
        @pytest.mark.detcheck(program=PROGRAM, ranks=2, checks=["repeat"])
        def test_marker(detcheck_report):
            assert detcheck_report.passed
            assert detcheck_report.scenarios[0].status == "passed"

        def test_fixture(detcheck_check):
            report = detcheck_check(program=PROGRAM, ranks=1, checks=["repeat"])
            assert report.exit_code == 0

        def test_no_marker(detcheck_report):
            assert detcheck_report is None
        """,
    )
    result, outcomes = _outcomes(pytester)
    assert outcomes == {"passed": 3}, result.stdout.str()


def test_a_check_that_does_not_hold_fails_the_test_with_the_report(pytester):
    _test_file(
        pytester,
        """
        CONTROL = PROGRAM + ["--plant-set-order"]

        @pytest.mark.detcheck(program=CONTROL, ranks=2, checks=["repeat"])
        def test_marker():
            raise AssertionError("the body must not run when the check fails")

        def test_fixture(detcheck_check):
            detcheck_check(program=CONTROL, ranks=2, checks=["repeat"])
        """,
    )
    result, outcomes = _outcomes(pytester)
    assert outcomes == {"failed": 2}, result.stdout.str()
    out = result.stdout.str()
    assert "error" not in outcomes and "ERROR" not in out, out
    # At the start of a line: each failure's own section, not the short summary's copy of its
    # first line (which pytest adds when the terminal is wide enough).
    assert len(re.findall(r"^detcheck check failed \(exit 1\):$", out, re.M)) == 2, out
    assert "first divergence" in out, out
    assert "the body must not run" not in out, out


def test_a_skipped_test_runs_no_check(pytester):
    _test_file(
        pytester,
        """
        @pytest.mark.skip(reason="not today")
        @pytest.mark.detcheck(program=[sys.executable, "-c", "raise SystemExit(9)"])
        def test_skipped():
            pass

        @pytest.mark.skipif(True, reason="never")
        @pytest.mark.detcheck(program=[sys.executable, "-c", "raise SystemExit(9)"])
        def test_skipped_if():
            pass
        """,
    )
    result, outcomes = _outcomes(pytester)
    assert outcomes == {"skipped": 2}, result.stdout.str()
    assert "detcheck check failed" not in result.stdout.str()


def test_a_bad_option_fails_the_test_and_names_the_option(pytester):
    _test_file(
        pytester,
        """
        @pytest.mark.detcheck(program=PROGRAM, checks=["no_such_check"])
        def test_bad_check():
            pass

        @pytest.mark.detcheck(program=PROGRAM, no_such_option=1)
        def test_bad_keyword():
            pass
        """,
    )
    result, outcomes = _outcomes(pytester)
    assert outcomes == {"failed": 2}, result.stdout.str()
    out = result.stdout.str()
    assert "no_such_check" in out and "no_such_option" in out, out
    assert "ERROR" not in out, out


def test_a_model_that_is_not_batch_invariant_fails_the_test_with_the_operator(pytester):
    """The `detcheck_batch_invariant` fixture (issue 56): a linear layer fails with the report
    naming its `addmm`; a row-wise model passes and its finding is returned."""
    requires("torch")
    _test_file(
        pytester,
        """
        import torch

        def test_linear(detcheck_batch_invariant):
            torch.manual_seed(0)
            detcheck_batch_invariant(torch.nn.Linear(64, 64).eval(), torch.randn(8, 64), (1, 8))

        def test_rowwise(detcheck_batch_invariant):
            found = detcheck_batch_invariant(torch.nn.Tanh(), torch.randn(8, 64), (1, 4, 8))
            assert found.holds and found.num_compared == 16
        """,
    )
    result, outcomes = _outcomes(pytester)
    assert outcomes == {"failed": 1, "passed": 1}, result.stdout.str()
    out = result.stdout.str()
    assert re.search(r"^not batch invariant at batch sizes 1, 8", out, re.M), out
    assert "operator: `aten.addmm.default`" in out, out
