"""detcheck's pytest plugin, loaded by pytest when the package is installed (entry point
``pytest11``): a check of a program or scenario as a test.

- The ``detcheck_check`` fixture: a function that takes ``detcheck.check``'s arguments, runs the
  check, and fails the test with the report's text (what ``detcheck check`` prints: the first
  divergence, its element and operator, the environment differences) unless every check holds;
  it returns the ``CheckReport``.
- The ``detcheck`` marker: ``@pytest.mark.detcheck(program=[...], ranks=2)`` (or scenario paths
  as positional arguments) runs that check before the test's body, failing the test the same
  way; the body can inspect the report through the ``detcheck_report`` fixture.

Example (python/README.md)::

    import sys
    import pytest

    def test_training_is_reproducible(detcheck_check):
        detcheck_check(program=[sys.executable, "train.py"], ranks=2, steps=3)

    @pytest.mark.detcheck(program=[sys.executable, "train.py", "--plant-bug"],
                          expect="diverges", checks=["repeat"])
    def test_the_control_is_caught(detcheck_report):
        assert detcheck_report.scenarios[0].first_divergence.element is not None
"""

import pytest

from ._api import check


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "detcheck(*scenarios, program=None, **options): run `detcheck check` (the arguments of "
        "detcheck.check) before the test; it fails with the report unless every check holds",
    )


def _checked(*args, **kwargs):
    report = check(*args, **kwargs)
    if not report.passed:
        text = report.text or repr(report)
        pytest.fail(f"detcheck check failed (exit {report.exit_code}):\n{text}", pytrace=False)
    return report


@pytest.fixture
def detcheck_check():
    """``detcheck_check(...)``: ``detcheck.check(...)`` that fails the test unless it passes."""
    return _checked


@pytest.fixture
def detcheck_report(request):
    """The report of the test's ``detcheck`` marker (``None`` without one)."""
    return getattr(request.node, "_detcheck_report", None)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    marker = item.get_closest_marker("detcheck")
    if marker is not None:
        item._detcheck_report = _checked(*marker.args, **marker.kwargs)
