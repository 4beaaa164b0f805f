"""The layout of the tests, checked on their source (parsed with ast, never imported): what tests
share lives in the `support` package, so no test module imports `conftest` or another test
module (pytest's docs: conftest.py is not for importing, and a test module imported twice runs
its top level twice); and a test skips only through `support.requires`, which fails instead
where a DETCHECK_REQUIRE_* variable is set."""

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "support"

#: Ways to skip other than `requires`: pytest.importorskip, pytest.skip, pytest.mark.skipif.
SKIPS = {"importorskip", "skip", "skipif"}


def modules():
    """Every Python file of the tests: conftest.py, the test modules, the support package."""
    found = sorted(TESTS.glob("*.py")) + sorted(SUPPORT.rglob("*.py"))
    assert TESTS / "conftest.py" in found and SUPPORT / "__init__.py" in found, found
    assert len([p for p in found if p.name.startswith("test_")]) >= 10, found
    return found


def imported(tree):
    """The module names a parsed file imports, anywhere in it (functions included)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.ImportFrom):  # relative: `from . import x`, `from .x import y`
            names += [alias.name for alias in node.names] if not node.module else [node.module]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("import_module", "importorskip", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.append(node.args[0].value)
    return names


def bad_imports(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        name
        for name in imported(tree)
        if name.split(".")[0] == "conftest" or name.split(".")[0].startswith("test_")
    ]


def other_skips(path):
    """Where ``path`` skips other than through `requires` (line numbers and names)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in SKIPS:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"DETCHECK_REQUIRE_\w+", node.value):
                found.append((node.lineno, node.value))  # read where `required` reads it
    return found


def test_no_test_module_imports_conftest_or_another_test_module():
    bad = {p.relative_to(TESTS).as_posix(): bad_imports(p) for p in modules()}
    bad = {path: names for path, names in bad.items() if names}
    assert not bad, f"import these from `support` instead: {bad}"


def test_tests_skip_only_through_requires():
    bad = {
        p.relative_to(TESTS).as_posix(): other_skips(p)
        for p in modules()
        if p.parent != SUPPORT and p.name != "test_layout.py"
    }
    bad = {path: found for path, found in bad.items() if found}
    assert not bad, f"skip with support.requires(name) instead: {bad}"


def test_the_checks_find_what_they_look_for(tmp_path):
    # The checks above pass when they find nothing: here they must find each thing once.
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import conftest\n"
        "from test_other import helper\n"
        "import test_third.sub\n"
        "def f():\n"
        "    from conftest import ROOT\n"
        "    importlib.import_module('test_fourth')\n"
        "torch = pytest.importorskip('torch')\n"
        "pytest.skip('no', allow_module_level=True)\n"
        "@pytest.mark.skipif(True, reason='no')\n"
        "def test_x():\n"
        "    os.environ.get('DETCHECK_REQUIRE_TORCH')\n"
        "from support import requires, ROOT\n"
        "import testing_helpers, support.sub\n"
    )
    assert sorted(bad_imports(sample)) == sorted(
        ["conftest", "test_other", "test_third.sub", "conftest", "test_fourth"]
    )
    assert sorted(name for _, name in other_skips(sample)) == [
        "DETCHECK_REQUIRE_TORCH",
        "importorskip",
        "skip",
        "skipif",
    ]
