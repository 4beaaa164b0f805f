#!/usr/bin/env bash
# Installs msprobe (mindstudio-probe 26.2.0, Ascend's precision tool, from the Python registry)
# into its own virtual environment, for python/tests/test_msprobe_align.py, which checks
# `detcheck compare --align` against msprobe's own compare (docs/align.md, "Checked against
# msprobe"); used by .ci/run. Idempotent: a second run only checks the pins.
#
#   bash scripts/install-msprobe.sh [VENV]       # default target/venv-msprobe
#   VENV/bin/msprobe compare -tp A/step0/proc1/dump.json -gp B/step0/proc2/dump.json -o out
#   bash scripts/install-msprobe.sh --mindspore [VENV]   # default target/venv-msprobe-ms
#
# --mindspore: msprobe for MindSpore programs (python/tests/test_msprobe_mindspore.py), on
# target/venv-ms (scripts/install-python.sh --mindspore: MindSpore 2.10, numpy 1.26) instead of
# target/venv, pinned by scripts/msprobe-ms-constraints.txt.
#
# Its own environment, not target/venv: msprobe pulls in pandas, matplotlib, tensorboard,
# skl2onnx (scikit-learn, scipy, onnx) and protobuf, which the tests of detcheck's package do
# not need and must not be run with. It shares target/venv's packages (torch==2.15.0, numpy,
# pytest and detcheck, from scripts/install-python.sh --torch) instead of installing torch a
# second time (~5 GB): a .pth file in its site-packages appends target/venv's site-packages to
# sys.path, after its own, so what is installed here wins and pip never writes into target/venv
# (it does not uninstall outside its environment). So it is made with target/venv's Python
# (the wheel of mindstudio-probe 26.2.0 is for CPython 3.11; its extension must match).
#
# Every package installed here is pinned by scripts/msprobe-constraints.txt (made with
# `pip list --path <its site-packages> --format=freeze` after an install; about 40 s from the
# registry, ~300 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
framework=torch
if [ "${1:-}" = --mindspore ]; then
    framework=mindspore
    shift
fi
if [ "$framework" = mindspore ]; then
    venv=${1:-target/venv-msprobe-ms}
    base=target/venv-ms
    constraints=scripts/msprobe-ms-constraints.txt
else
    venv=${1:-target/venv-msprobe}
    base=target/venv
    constraints=scripts/msprobe-constraints.txt
fi

if ! "$base/bin/python" -c "import $framework, numpy, detcheck" 2>/dev/null; then
    echo "== $base lacks $framework or detcheck: bash scripts/install-python.sh --$framework"
    bash scripts/install-python.sh "--$framework" "$base"
fi
if ! "$base/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    echo "install-msprobe.sh: $base is $("$base/bin/python" --version 2>&1); mindstudio-probe 26.2.0's wheel is for Python 3.11" >&2
    exit 1
fi
# The interpreter the base venv was made from (a venv's python is a link to it).
python=$("$base/bin/python" -c 'import sys; print(sys._base_executable)')

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import pip' 2>/dev/null; then
    echo "== creating the virtual environment $venv (with $python)"
    rm -rf "$venv"
    "$python" -m venv "$venv"
fi
own=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
shared=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
shared=$(cd "$shared" && pwd)
echo "$shared" > "$own/detcheck-venv.pth"

echo "== pip install mindstudio-probe==26.2.0 (constraints: $constraints)"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
    -c "$constraints" "mindstudio-probe==26.2.0"

# msprobe imports the framework from the base venv, and its own modules from here.
"$venv/bin/python" - "$own" "$shared" "$framework" <<'EOF'
import importlib
import sys
from importlib import metadata

import msprobe

own, shared, name = sys.argv[1:]
framework = importlib.import_module(name)
assert msprobe.__file__.startswith(own), msprobe.__file__
assert framework.__file__.startswith(shared), framework.__file__
print("msprobe", metadata.version("mindstudio-probe"), "in", own, "with", name,
      framework.__version__, "of", shared)
EOF
