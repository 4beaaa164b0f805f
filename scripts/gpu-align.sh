#!/usr/bin/env bash
# Precision alignment across real devices, on a GPU machine without a Rust toolchain
# (docs/align.md): the two-device test program's CPU run is the reference; its CUDA run with
# TF32 off must be aligned with it, and with TF32 on too (TF32's rounding is a dtype's rounding
# for `compare --align --precision tf32`, never a culprit); an approximate GELU on CUDA is the
# first culprit. Prints one line per item, exits non-zero when one fails.
#
#   here:  (cd python && maturin build --release -o ../target/wheels)   # the abi3 wheel
#   there: bash scripts/gpu-align.sh target/wheels/detcheck-*.whl
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-prelude.sh "$@"
script=examples/programs/python/align/two_devices.py
work=$(mktemp -d)
dump() { local dir=$1; shift; detcheck run --dump "$work/$dir" --mode full -- python3 "$script" "$@" >/dev/null; }
dump cpu || failed=1
dump cuda --device cuda || failed=1
dump cuda_tf32 --device cuda --tf32 || failed=1
dump cuda_gelu --device cuda --device-kind other --bug approx_gelu --bug-block 0 || failed=1
item "CUDA (TF32 off) against the CPU: aligned" 0 detcheck compare --align "$work/cuda" "$work/cpu"
item "CUDA (TF32 on) against the CPU at TF32's rounding: aligned" 0 \
    detcheck compare --align --precision tf32 "$work/cuda_tf32" "$work/cpu"
item "CUDA with an approximate GELU: not aligned" 1 \
    detcheck compare --align "$work/cuda_gelu" "$work/cpu"
# The report is read whole before grep: `compare | grep -q` under pipefail fails by itself, as
# compare exits 1 (not aligned) or dies of SIGPIPE when grep stops reading.
report=$(detcheck compare --align "$work/cuda_gelu" "$work/cpu")
if grep -q "first culprit: step 0 rank 0 \`fwd/blocks.0.act\`" <<<"$report"; then
    echo "PASS the culprit is fwd/blocks.0.act"
else
    echo "FAIL the culprit is not fwd/blocks.0.act"; echo "$report" | head -12; failed=1
fi
detcheck compare --align "$work/cuda_tf32" "$work/cpu" | head -8
exit $failed
