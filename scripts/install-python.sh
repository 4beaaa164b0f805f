#!/usr/bin/env bash
# Installs the Python package of detcheck (python/) into a virtual environment, with maturin,
# numpy and pytest at pinned versions; used by .ci/run. Idempotent: a second run reuses the
# environment and rebuilds the package incrementally.
#
#   bash scripts/install-python.sh [--torch] [--frameworks] [--trl] [--deepspeed] [--mindspore] [--deps-only] [VENV]   # default target/venv
#   target/venv/bin/pytest python/tests                                               # then
#
# --torch also installs PyTorch (torch==2.15.0 from the Python registry, ~5 GB with its CUDA
# libraries, about 70 s; it runs on the CPU): the torch tests, the operator drill-down's controls
# and its benchmark need it; and torchvision==0.29.2 (a few MB), which the zoo's pytorch/examples
# programs import, requests==2.32.5, which nanoGPT's data/shakespeare_char/prepare.py imports
# (it downloads nothing when its input.txt exists: examples/zoo/README.md), and
# gymnasium==1.4.0 (pure Python, on numpy), whose CartPole the zoo's reinforcement-learning
# programs train on. .ci/run passes it.
#
# --frameworks (implies --torch) also installs transformers==5.24.0, accelerate==1.15.0,
# lightning==2.6.6, jsonargparse[signatures]==4.53.0 (LightningCLI's parser: the zoo's Lightning
# autoencoder) and timm==1.0.31 (accelerate's cv_example.py in examples/zoo builds its model
# with it; about 30 s; Python 3.11 or later), the versions
# python/tests/test_wrapped_optimizers.py was last run with: its tests of detcheck.torch.watch
# with the real optimizer wrappers (accelerate's, a Trainer callback's, Lightning's) run where
# they are installed, and cannot skip when DETCHECK_REQUIRE_FRAMEWORKS is set. .ci/run does not
# pass it.
#
# --trl (implies --frameworks) also installs trl==1.10.0 and datasets==5.2.0, which the zoo's
# TRL SFT script runs on, tensorboard==2.21.0, which the zoo's Lightning PPO logs to, and
# matplotlib==3.11.2, with which pytorch/examples' time_sequence_prediction plots, and six==1.17.0,
# which pytorch/examples' super_resolution imports (examples/zoo: scripts/zoo.sh); CI does not install them (those zoo rows are of the full tier;
# datasets installed changes what transformers finds, tensorboard Lightning's default logger).
#
# --deepspeed (implies --torch) also installs deepspeed==0.19.8 (its source distribution, no op
# built ahead: DS_BUILD_OPS=0; on the CPU, DS_ACCELERATOR=cpu, its first run compiles its shared
# memory op with ninja, about 90 s, cached in ~/.cache/torch_extensions). .ci/run installs it
# after the other Python tests, for python/tests/test_verdicts.py's ZeRO job: installed, it
# changes what accelerate and transformers find.
#
# --mindspore installs MindSpore instead of PyTorch (mindspore==2.10.0 from the Python registry,
# its CPU build, about 1 GB, under a minute) with numpy 1.26.4: MindSpore 2.10 is built against
# NumPy 1.x (under numpy 2 it prints a NumPy 1.x ABI error). So it goes in a venv of its own,
# conventionally target/venv-ms (docs/mindspore.md); python/tests/test_mindspore.py needs it, and
# .ci/run passes it. It cannot be combined with --torch or --frameworks (their numpy is 2.x).
#
# pip installs without compiling the packages' bytecode (--no-compile): Python compiles and caches
# a module when it is first imported, which costs the few that are (a fraction of torch's and
# transformers' thousands of files) instead of all of them (issue 55: CI's time).
#
# --deps-only installs the packages but not detcheck itself (no Rust build): .ci/run downloads
# them in the background while its Rust sections use the cores, and builds the extension later.
#
# Needs python3 (3.9 or later) with its venv module (python3-venv is installed with apt-get when
# missing) and a Rust toolchain. The extension is built by maturin in the root's target folder
# ($CARGO_TARGET_DIR if set), so it reuses what `cargo build --release` already compiled.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
torch=0
frameworks=0
mindspore=0
deepspeed=0
trl=0
deps_only=0
while [ $# -gt 0 ]; do
    case "$1" in
        --torch) torch=1 ;;
        --frameworks) torch=1 frameworks=1 ;;
        --trl) torch=1 frameworks=1 trl=1 ;;
        --deepspeed) torch=1 deepspeed=1 ;;
        --mindspore) mindspore=1 ;;
        --deps-only) deps_only=1 ;;
        -*) echo "install-python.sh: unknown option $1 (--torch, --frameworks, --trl, --deepspeed, --mindspore, --deps-only)" >&2; exit 2 ;;
        *) break ;;
    esac
    shift
done
venv=${1:-target/venv}
if [ "$mindspore" = 1 ] && [ "$torch" = 1 ]; then
    echo "install-python.sh: --mindspore needs numpy 1.x and --torch/--frameworks numpy 2.x: use two venvs" >&2
    exit 2
fi

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))'; then
    echo "install-python.sh: $python is $("$python" --version 2>&1); detcheck needs Python 3.9 or later" >&2
    exit 1
fi

bash scripts/ensure-python-venv.sh "$python"

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import pip' 2>/dev/null; then
    echo "== creating the virtual environment $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv"
fi
venv=$(cd "$venv" && pwd)
if [ "$frameworks" = 1 ] && ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "install-python.sh: --frameworks needs Python 3.11 or later (torch 2.15.0 and transformers 5.24.0 do)" >&2
    exit 1
fi

# Versions that exist on PyPI for each Python: numpy 2.1+ needs 3.10, 2.3+ needs 3.11.
numpy=$("$venv/bin/python" -c 'import sys
v = sys.version_info[:2]
print("2.0.2" if v < (3, 10) else "2.2.6" if v < (3, 11) else "2.4.6")')
if [ "$mindspore" = 1 ]; then
    numpy=1.26.4 # MindSpore 2.10's extension is built against NumPy 1.x
fi
echo "== pip install maturin==1.16.0 numpy==$numpy pytest==8.4.2 pytest-xdist==3.8.0 ruff==0.17.6 mypy==2.4.1"
# ruff (format and lint) and mypy (types) check the package and its tests in .ci/run;
# pytest-xdist runs the tests on two workers there.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
    "maturin==1.16.0" "numpy==$numpy" "pytest==8.4.2" "pytest-xdist==3.8.0" "ruff==0.17.6" "mypy==2.4.1"

if [ "$torch" = 1 ]; then
    echo "== pip install torch==2.15.0 torchvision==0.29.2 requests==2.32.5 gymnasium==1.4.0 (CPU use; the registry's wheels)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile "torch==2.15.0" \
        "torchvision==0.29.2" "requests==2.32.5" "gymnasium==1.4.0"
fi

if [ "$mindspore" = 1 ]; then
    # pyyaml and tqdm: the requirements of the zoo's mindcv (examples/zoo/mindcv).
    echo "== pip install mindspore==2.10.0 numpy==$numpy pyyaml==6.0.4 tqdm==4.70.1 (CPU; the registry's wheels)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
        "mindspore==2.10.0" "numpy==$numpy" "pyyaml==6.0.4" "tqdm==4.70.1"
fi

if [ "$frameworks" = 1 ]; then
    echo "== pip install transformers==5.24.0 accelerate==1.15.0 lightning==2.6.6 jsonargparse==4.53.0 timm==1.0.31"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
        "torch==2.15.0" "transformers==5.24.0" "accelerate==1.15.0" "lightning==2.6.6" \
        "jsonargparse[signatures]==4.53.0" "timm==1.0.31"
fi

if [ "$trl" = 1 ]; then
    echo "== pip install trl==1.10.0 datasets==5.2.0 tensorboard==2.21.0 matplotlib==3.11.2 six==1.17.0"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
        "torch==2.15.0" "transformers==5.24.0" "trl==1.10.0" "datasets==5.2.0" \
        "tensorboard==2.21.0" "matplotlib==3.11.2" "six==1.17.0"
fi

if [ "$deepspeed" = 1 ]; then
    echo "== pip install deepspeed==0.19.8 (DS_BUILD_OPS=0: its ops are compiled when first used)"
    DS_BUILD_OPS=0 "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
        --no-build-isolation "torch==2.15.0" "deepspeed==0.19.8" "ninja==1.13.2"
fi

if [ "$deps_only" = 1 ]; then
    echo "== --deps-only: detcheck itself is not built or installed into $venv"
    exit 0
fi

echo "== pip install ./python (maturin, release build)"
# maturin's PEP 517 hooks call the `maturin` executable: the environment's, on PATH.
PATH="$venv/bin:$PATH" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" \
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
    --no-build-isolation --force-reinstall --no-deps ./python
"$venv/bin/python" -c 'import detcheck; print("detcheck", detcheck.__version__, "for Python, in", detcheck.__file__)'
