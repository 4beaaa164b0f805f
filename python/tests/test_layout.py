"""The layout of the tests, checked on their source (parsed with ast, never imported): what tests
share lives in the `support` package, so no test module imports `conftest` or another test
module (pytest's docs: conftest.py is not for importing, and a test module imported twice runs
its top level twice); a test skips only through `support.requires`, which fails instead
where a DETCHECK_REQUIRE_* variable is set; and a test of the full tier (`pytest.mark.full`,
left out of CI: docs/testing.md) names the CI test that covers its capability, which exists and
is not of the full tier itself (and, checked by conftest at collection, has a case outside it:
`support.covers_without_a_ci_case`, where a cover's every parameter is full)."""

import ast
import re
from pathlib import Path

import pytest
from support import covers_without_a_ci_case

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


def full_marks(path):
    """Where ``path`` marks a test `full`: (line, its ``covered_by`` or None) for each
    `pytest.mark.full(...)`, and (line, None) for a bare `pytest.mark.full`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    calls = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    found = []
    for node in ast.walk(tree):
        if is_full_mark(node) and id(node) not in calls:  # a call is found as its call
            words = {k.arg: k.value for k in node.keywords} if isinstance(node, ast.Call) else {}
            cover = words.get("covered_by")
            found.append((node.lineno, cover.value if isinstance(cover, ast.Constant) else None))
    return sorted(found, key=lambda found: found[0])


def is_full_mark(node):
    """Whether ``node`` is `pytest.mark.full` (or `mark.full`), called or not."""
    if isinstance(node, ast.Call):
        node = node.func
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "full"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
    )


def functions_of(path):
    """The names of the test functions ``path`` defines, and those it marks `full` as a whole."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names, full = set(), set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            names.add(node.name)
            if any(is_full_mark(d) for d in node.decorator_list):
                full.add(node.name)
    return names, full


def bad_covers(path, root=TESTS.parent.parent):
    """The `full` marks of ``path`` whose ``covered_by`` is missing, names no test, or names a
    test of the full tier: (line, what is wrong). A Python test is `test_module.py::test_name`;
    a Rust test of ``root``'s `tests/` (which CI runs whole), `tests/file.rs::test_name`."""
    bad = []
    for line, cover in full_marks(path):
        if cover is None:
            bad.append((line, "no covered_by='test_module.py::test_name'"))
            continue
        module, _, name = cover.partition("::")
        if module.startswith("tests/") and module.endswith(".rs"):
            rust = root / module
            text = rust.read_text() if rust.is_file() else ""
            if not re.search(rf"#\[test\]\s*(#\[[^\]]*\]\s*)*fn {re.escape(name)}\(", text):
                bad.append((line, f"{cover!r}: no such Rust test"))
            continue
        target = path.parent / module
        if not (module.startswith("test_") and target.is_file() and name):
            bad.append((line, f"{cover!r}: no such test module"))
            continue
        names, full = functions_of(target)
        if name not in names:
            bad.append((line, f"{cover!r}: no such test"))
        elif name in full:
            bad.append((line, f"{cover!r} is of the full tier itself"))
    return bad


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


def test_every_full_test_names_the_ci_test_that_covers_it():
    bad = {
        p.relative_to(TESTS).as_posix(): bad_covers(p)
        for p in modules()
        if p.name.startswith("test_") and p.name != "test_layout.py"
    }
    bad = {path: found for path, found in bad.items() if found}
    assert not bad, f"a full test names the CI test that covers it: {bad}"


def test_a_cover_whose_every_case_is_full_is_found_at_collection():
    """conftest's collection check (`covers_without_a_ci_case`), on pytest's own items' shape:
    a cover with one case outside the full tier passes; one whose cases are all full, whether
    marked as a whole or parameter by parameter, is named; a cover not collected is left alone."""

    class Item:
        def __init__(self, module, function, param=None, covered_by=None, full=False):
            self.path, self.originalname = Path(module), function
            self.name = function if param is None else f"{function}[{param}]"
            self.nodeid = f"{module}::{self.name}"
            marked = full or covered_by is not None
            self.mark = pytest.mark.full(covered_by=covered_by).mark if marked else None

        def get_closest_marker(self, name):
            return self.mark if name == "full" else None

    items = [
        Item("test_a.py", "test_cover", "1"),
        Item("test_a.py", "test_cover", "2", full=True),
        Item("test_a.py", "test_all_full", "1", full=True),
        Item("test_a.py", "test_all_full", "2", full=True),
        Item("test_b.py", "test_fine", covered_by="test_a.py::test_cover"),
        Item("test_b.py", "test_uncovered", covered_by="test_a.py::test_all_full"),
        Item("test_b.py", "test_elsewhere", covered_by="test_c.py::test_x"),
    ]
    assert covers_without_a_ci_case(items) == [
        "test_b.py::test_uncovered: its cover test_a.py::test_all_full has no case outside the "
        "full tier"
    ]


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
    (tmp_path / "test_cover.py").write_text(
        "@pytest.mark.full(covered_by='test_cover.py::test_b')\n"
        "def test_a(): pass\n"
        "def test_b(): pass\n"
    )
    full = tmp_path / "test_full.py"
    full.write_text(
        "@pytest.mark.full(covered_by='test_cover.py::test_b')\n"
        "def test_fine(): pass\n"
        "@pytest.mark.full\n"
        "def test_bare(): pass\n"
        "P = [pytest.param(1, marks=pytest.mark.full(covered_by='test_cover.py::test_a'))]\n"
        "@pytest.mark.full(covered_by='test_cover.py::test_c')\n"
        "def test_unknown(): pass\n"
        "@pytest.mark.full(covered_by='test_none.py::test_b')\n"
        "def test_no_module(): pass\n"
        "@pytest.mark.full(covered_by='tests/it.rs::a_rust_test')\n"
        "def test_rust(): pass\n"
        "@pytest.mark.full(covered_by='tests/it.rs::not_a_test')\n"
        "def test_rust_helper(): pass\n"
        "@pytest.mark.full(covered_by='tests/none.rs::a_rust_test')\n"
        "def test_no_rust_file(): pass\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "it.rs").write_text("#[test]\nfn a_rust_test() {}\nfn not_a_test() {}\n")
    assert [line for line, _ in bad_covers(full, tmp_path)] == [3, 5, 6, 8, 12, 14], bad_covers(
        full, tmp_path
    )
