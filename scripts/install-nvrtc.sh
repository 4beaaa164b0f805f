#!/usr/bin/env bash
# Installs NVRTC, CUDA's runtime compiler, from the Python registry into a virtual environment,
# and prints the folder holding libnvrtc.so.13 (its last line on stdout; everything else goes to
# stderr). No GPU, driver or CUDA toolkit is needed: NVRTC compiles detcheck's kernels to PTX and
# cubins on any x86-64 Linux. Used by .ci/run; idempotent.
#
#   scripts/install-nvrtc.sh [VENV]                  # default target/venv-cuda
#   LD_LIBRARY_PATH=$(scripts/install-nvrtc.sh) DETCHECK_REQUIRE_NVRTC=1 \
#       cargo test --features nccl --lib device::
#
# The package is nvidia-cuda-nvrtc (nvidia-cuda-nvrtc-cu13 is an empty stub that points to it),
# pinned to 13.0.88: CUDA 13.0, the version of cudarc's `cuda-13000` bindings and of the lent
# H100's driver (a newer NVRTC's PTX would need a newer driver to load). The wheel is ~90 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-target/venv-cuda}
package="nvidia-cuda-nvrtc==13.0.88"

python=${PYTHON:-python3}
bash scripts/ensure-python-venv.sh "$python"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import pip' 2>/dev/null; then
    echo "== creating the virtual environment $venv" >&2
    rm -rf "$venv"
    "$python" -m venv "$venv" >&2
fi

echo "== pip install $package into $venv" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$package" >&2

folder=""
IFS=: read -r -a folders <<<"$(bash scripts/find-cuda-libs.sh "$venv")"
for f in "${folders[@]}"; do
    if compgen -G "$f/libnvrtc.so*" >/dev/null; then folder=$f; fi
done
if [ -z "$folder" ]; then
    echo "install-nvrtc.sh: $package installed, but no libnvrtc.so* under $venv" >&2
    exit 1
fi
echo "== NVRTC: $(cd "$folder" && ls libnvrtc.so*) in $folder" >&2
echo "$folder"
