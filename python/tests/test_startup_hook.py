"""The wheel's start-up hook (data/purelib/detcheck.pth) never breaks `python`: when what it
runs fails (here: a `detcheck` package that raises on import shadows the real one), the
interpreter starts, runs the program, and says in one line why this process is not recorded."""

import os
import subprocess
import sys
from pathlib import Path

PTH = Path(__file__).resolve().parents[1] / "data" / "purelib" / "detcheck.pth"


def _run_with_hook(tmp_path, broken, trace_dir):
    site_dir = tmp_path / "site"
    site_dir.mkdir(parents=True)
    (site_dir / "detcheck.pth").write_text(PTH.read_text())
    shadow = tmp_path / "shadow" / "detcheck"
    (shadow / "_launch").mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    (shadow / "_launch" / "__init__.py").write_text("")
    (shadow / "_launch" / "startup.py").write_text(
        "raise ImportError('a broken install')\n"
        if broken
        else "def activate():\n    print('activated')\n"
    )
    env = dict(os.environ)
    env.pop("DETCHECK_TRACE_DIR", None)
    if trace_dir:
        env["DETCHECK_TRACE_DIR"] = str(tmp_path / "trace")
    # -S: no site-packages of this environment; the test's site folder is processed as
    # site.py processes site-packages, after the shadow package is first on sys.path.
    code = (
        f"import sys, site; sys.path.insert(0, {str(shadow.parent)!r}); "
        f"site.addsitedir({str(site_dir)!r}); print('the program ran')"
    )
    return subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, timeout=60
    )


def test_a_failing_start_up_hook_leaves_python_running_and_says_why(tmp_path):
    done = _run_with_hook(tmp_path, broken=True, trace_dir=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "the program ran\n", done.stdout
    assert done.stderr == (
        "detcheck: the start-up hook cannot run, this process is not recorded: "
        "ImportError('a broken install')\n"
    ), done.stderr


def test_the_hook_runs_under_detcheck_only(tmp_path):
    done = _run_with_hook(tmp_path, broken=False, trace_dir=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "activated\nthe program ran\n", "")
    outside = _run_with_hook(tmp_path / "outside", broken=True, trace_dir=False)
    assert (outside.returncode, outside.stdout, outside.stderr) == (0, "the program ran\n", "")
