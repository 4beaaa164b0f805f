#!/usr/bin/env bash
# The wheel as a Python user gets it: built by maturin (abi3), installed with pip into a fresh
# virtual environment, then used with no Rust toolchain on PATH: `detcheck --version`,
# `python -m detcheck`, and `detcheck check -- python PROGRAM` (no scenario file) on the numpy
# example and its set-order control, which must be caught with its element, and checks that the
# wheel installs the start-up hook of zero-change recording (detcheck.pth). Used by .ci/run.
#
#   bash scripts/wheel-smoke.sh            # needs scripts/install-python.sh first (maturin)
#
# The wheel goes to target/wheels/, the environment to target/venv-wheel/ (made anew).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

echo "== maturin build --release (the wheel: the writer, detcheck.torch and the detcheck command)"
rm -rf target/wheels
PATH="$root/target/venv/bin:$PATH" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" \
    target/venv/bin/maturin build --release --quiet -m python/Cargo.toml -o target/wheels
wheel=$(ls target/wheels/detcheck-*.whl)
echo "built $wheel"

echo "== a fresh virtual environment: pip install the wheel (numpy comes from the registry)"
rm -rf target/venv-wheel
python3 -m venv target/venv-wheel
target/venv-wheel/bin/python -m pip install --quiet --disable-pip-version-check "$wheel"

# From here on nothing of the build is on PATH: the environment's bin and the system's.
user() {
    env -i HOME="$HOME" LANG=C.UTF-8 PATH="$root/target/venv-wheel/bin:/usr/local/bin:/usr/bin:/bin" "$@"
}
if user sh -c 'command -v cargo || command -v rustc'; then
    echo "wheel-smoke: a Rust toolchain is on the user's PATH; the smoke test would prove nothing" >&2
    exit 1
fi

echo "== detcheck --version, python -m detcheck --version"
user detcheck --version
user python -m detcheck --version

echo "== detcheck check -- python numpy_ranks.py (2 ranks, no scenario file)"
cd examples/programs/python
user detcheck check --no-progress --ranks 2 --steps 4 -- python numpy_ranks.py --steps 4

echo "== the set-order control from the command line: caught, with its element"
out=$(user detcheck check --no-progress --ranks 2 --expect diverges --checks repeat \
    -- python numpy_ranks.py --plant-set-order)
echo "$out"
grep -q "ok (caught)" <<<"$out"
grep -q "first differing element: \[" <<<"$out"

echo "== bad flags: exit 2 naming the flag"
set +e
user detcheck check --ranks 0 -- python numpy_ranks.py 2>/tmp/wheel-smoke-err
code=$?
set -e
if [ "$code" != 2 ] || ! grep -q -- "--ranks" /tmp/wheel-smoke-err; then
    echo "wheel-smoke: --ranks 0 gave exit $code: $(cat /tmp/wheel-smoke-err)" >&2
    exit 1
fi
echo "== the start-up hook of zero-change recording: detcheck.pth in site-packages, and a program"
echo "   without torch is a failed run (exit 3) whose note says why"
ls "$root"/target/venv-wheel/lib/python3*/site-packages/detcheck.pth
set +e
out=$(user detcheck check --no-progress -- python -c 'print("no torch")' 2>&1)
code=$?
set -e
if [ "$code" != 3 ] || ! grep -q "which never imported torch" <<<"$out"; then
    echo "wheel-smoke: a program without torch gave exit $code: $out" >&2
    exit 1
fi
echo "wheel-smoke: ok"
