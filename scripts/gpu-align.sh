#!/usr/bin/env bash
# Precision alignment across real devices, on a GPU machine without a Rust toolchain
# (docs/align.md): the two-device test program's CPU run is the reference; its CUDA run with
# TF32 off must be aligned with it, and with TF32 on too (TF32's rounding is a dtype's rounding
# for `compare --align --precision tf32`, never a culprit); an approximate GELU on CUDA is the
# first culprit; inside the culprit (`run --inside`, `--replay`), the CUDA module run on the
# CPU's inputs names the approximate GELU with its argument, and TF32's matrix product. Prints
# one line per item, exits non-zero when one fails.
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
# `says WHAT PATTERN A B [FLAGS]`: compare --align's report of A against B holds PATTERN. The
# report is read whole before grep: `compare | grep -q` under pipefail fails by itself, as
# compare exits 1 (not aligned) or dies of SIGPIPE when grep stops reading.
says() {
    local what=$1 pattern=$2 a=$3 b=$4 report; shift 4
    report=$(detcheck compare --align "$@" "$a" "$b")
    if grep -q "$pattern" <<<"$report"; then
        echo "PASS $what"
    else
        echo "FAIL $what"; echo "$report" | head -12; failed=1
    fi
}
says "the culprit is fwd/blocks.0.act" "first culprit: step 0 rank 0 \`fwd/blocks.0.act\`" \
    "$work/cuda_gelu" "$work/cpu"
detcheck compare --align "$work/cuda_tf32" "$work/cpu" | head -8
# Inside the culprit across the two devices (docs/align.md, "Inside the culprit"): the CUDA
# module run on the CPU's own inputs (`--replay`), its operators judged one by one.
inside() { local dir=$1 record=$2; shift 2; detcheck run --dump "$work/$dir" --inside "$record" "$@" >/dev/null; }
inside in_cpu_act fwd/blocks.0.act -- python3 "$script" || failed=1
inside in_cuda_act fwd/blocks.0.act --replay "$work/in_cpu_act" -- python3 "$script" --device cuda || failed=1
inside in_gelu_act fwd/blocks.0.act --replay "$work/in_cpu_act" -- \
    python3 "$script" --device cuda --device-kind other --bug approx_gelu --bug-block 0 || failed=1
inside in_cpu_embed fwd/embed -- python3 "$script" || failed=1
inside in_tf32_embed fwd/embed --replay "$work/in_cpu_embed" -- python3 "$script" --device cuda --tf32 || failed=1
item "inside: CUDA's GELU on the CPU's inputs: aligned" 0 \
    detcheck compare --align "$work/in_cuda_act" "$work/in_cpu_act"
says "inside: the approximate GELU is named with its argument" \
    "A calls \`aten.gelu.default(float32\[64, 256\], approximate='tanh')\`" \
    "$work/in_gelu_act" "$work/in_cpu_act"
item "inside: TF32's product on the CPU's inputs at TF32's rounding: aligned" 0 \
    detcheck compare --align --precision tf32 "$work/in_tf32_embed" "$work/in_cpu_embed"
says "inside: at float32's rounding TF32's matrix product is the operator named" \
    "^  operator: \`aten\.\(addmm\|mm\|matmul\)" "$work/in_tf32_embed" "$work/in_cpu_embed"
exit $failed
