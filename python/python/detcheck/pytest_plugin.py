"""detcheck's pytest plugin, loaded by pytest when the package is installed (entry point
``pytest11``): a check of a program or scenario as a test.

- The ``detcheck_check`` fixture: a function that takes ``detcheck.check``'s arguments, runs the
  check, and fails the test with the report's text (what ``detcheck check`` prints: the first
  divergence, its element and operator, the environment differences) unless every check holds;
  it returns the ``CheckReport``.
- The ``detcheck_batch_invariant`` fixture: ``detcheck.torch.batch_invariance``'s arguments
  (a model in the test, its samples, the batch sizes); fails the test with the finding's report
  (the sample, the module and the ``aten`` operator that break invariance) unless every sample's
  every output row is bitwise equal at every size; returns the ``BatchInvariance``. torch is
  imported when it is called, never by the plugin itself.
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

from ._core.api import CheckReport, check

#: The report of an item's ``detcheck`` marker, and the failure it gave (``None``: it held).
_REPORT = pytest.StashKey[CheckReport]()
_FAILURE = pytest.StashKey[str]()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "detcheck(*scenarios, program=None, **options): run `detcheck check` (the arguments of "
        "detcheck.check) before the test; it fails with the report unless every check holds",
    )


def _failure(report):
    """The message of a check that did not hold, or ``None``."""
    if report.passed:
        return None
    return f"detcheck check failed (exit {report.exit_code}):\n{report.text or repr(report)}"


def _checked(*args, **kwargs):
    report = check(*args, **kwargs)
    failure = _failure(report)
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    return report


@pytest.fixture
def detcheck_check():
    """``detcheck_check(...)``: ``detcheck.check(...)`` that fails the test unless it passes."""
    return _checked


def _batch_invariant(*args, **kwargs):
    from .torch import batch_invariance

    found = batch_invariance(*args, **kwargs)
    if not found.holds:
        pytest.fail(str(found), pytrace=False)
    return found


@pytest.fixture
def detcheck_batch_invariant():
    """``detcheck_batch_invariant(model, samples, batch_sizes, ...)``:
    ``detcheck.torch.batch_invariance(...)`` that fails the test unless the model is batch
    invariant."""
    return _batch_invariant


@pytest.fixture
def detcheck_report(request):
    """The report of the test's ``detcheck`` marker (``None`` without one)."""
    return request.node.stash.get(_REPORT, None)


@pytest.hookimpl
def pytest_runtest_setup(item):
    # After pytest's skip and skipif markers (a skipped test runs no check) and before the
    # fixtures are set up (so that `detcheck_report` has its report). A check that does not
    # hold fails the test in its call phase (a failed test, not an error in its setup), before
    # the body runs.
    marker = item.get_closest_marker("detcheck")
    if marker is None:
        return
    try:
        report = check(*marker.args, **marker.kwargs)
    except (ValueError, TypeError) as e:  # a bad option: the test's own mistake
        item.stash[_FAILURE] = f"detcheck marker: {e}"
        return
    item.stash[_REPORT] = report
    failure = _failure(report)
    if failure is not None:
        item.stash[_FAILURE] = failure


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    failure = item.stash.get(_FAILURE, None)
    if failure is not None:
        pytest.fail(failure, pytrace=False)
