#!/usr/bin/env bash
# Device digests on a GPU machine without a Rust toolchain (issue 27): the Triton kernels against
# the Rust digest on CUDA tensors, watch's device path against its host path, the unmodified DDP
# script recorded with device digests, and the benchmark. One line per item; non-zero exit when
# one fails. The benchmark's figures go to $OUT/gpu_overhead.json when OUT is set.
#
#   here:  (cd python && maturin build --release -o ../target/wheels)   # the abi3 wheel
#   there: bash scripts/gpu-device-digests.sh target/wheels/detcheck-*.whl
#
# The machine's Python must have torch with CUDA and Triton; the wheel goes into a venv that sees
# them (--system-site-packages).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-prelude.sh "$@"
# The tests' `detcheck` is the wheel's command (there is no cargo here to build one).
export DETCHECK_BIN="$venv/bin/detcheck"
"$venv/bin/python" -c 'import torch, triton; assert torch.cuda.is_available(); print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())' || exit 1
if "$venv/bin/python" -c 'import pytest' 2>/dev/null; then
    item "Triton digests and totals on CUDA tensors = the Rust digest (every dtype, odd and large sizes)" 0 \
        "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests/test_device_digest.py
    item "watch(device_digests=True) on CUDA: the host path's digests, record by record" 0 \
        "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests/test_device_records.py
else
    echo "SKIP pytest items: pytest is not installed on this machine"
fi
script=examples/programs/python/unmodified/ddp_train.py
item "unmodified DDP on CUDA with device digests: repeat" 0 \
    detcheck check --no-progress --ranks 1 --steps 3 -- python3 "$script" --device cuda
item "clock-reseed control on CUDA with device digests: caught" 0 \
    detcheck check --no-progress --ranks 1 --steps 2 --expect diverges -- \
    python3 "$script" --device cuda --reseed-from-clock
# DETCHECK_GPU_BENCH_ARGS (e.g. "--rounds 3 --steps 5") shortens the benchmark to fit a lease.
# shellcheck disable=SC2086
item "benchmark: GPT-2 124M, batch 8 x 512, bf16 autocast, AdamW" 0 \
    "$venv/bin/python" python/bench/gpu_overhead.py --json "${OUT:-/tmp}/gpu_overhead.json" \
    ${DETCHECK_GPU_BENCH_ARGS:-}
echo "$out" | tail -20
exit $failed
