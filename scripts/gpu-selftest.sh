#!/usr/bin/env bash
# The GPU half of issue 26's checks, on a GPU machine without a Rust toolchain: runs the carried
# binaries (scripts/build-gpu-carry.sh) and prints one line per item of the issue, PASS or FAIL
# (with the output's tail), then the benchmark's figures. Exits 1 when an item fails.
#
#   here:  bash scripts/build-gpu-carry.sh
#   there: bash scripts/gpu-selftest.sh [target/gpu-carry]      # from the repository root
#
# CUDA's libraries: the driver's libcuda.so.1 from the machine; NVRTC and NCCL from pip's wheels
# (nvidia-cuda-nvrtc, nvidia-nccl-cu13) in the machine's Python, found under its site-packages.
# cudarc never tries the NCCL wheel's libnccl.so.2, so a libnccl.so link to it is made in a
# folder of our own (the site-packages are not touched). The GPU tests run with
# DETCHECK_REQUIRE_GPU=1 and DETCHECK_REQUIRE_NVRTC=1: without a GPU they fail, never skip.
set -uo pipefail
cd "$(dirname "$0")/.."
carry=${1:-target/gpu-carry}
for binary in detcheck detcheck-lib gpu-bench; do
    if [ ! -x "$carry/$binary" ]; then
        echo "gpu-selftest.sh: $carry/$binary is missing: run scripts/build-gpu-carry.sh where cargo is" >&2
        exit 2
    fi
done
carry=$(cd "$carry" && pwd)

source scripts/gpu-libraries.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
export DETCHECK_REQUIRE_GPU=1 DETCHECK_REQUIRE_NVRTC=1

failed=0
item() {
    local name=$1
    shift
    local out code
    out=$("$@" 2>&1)
    code=$?
    if [ "$code" = 0 ]; then
        echo "PASS $name"
    else
        echo "FAIL $name (exit $code)"
        echo "$out" | tail -40 | sed 's/^/    /'
        failed=1
    fi
}
tests() { # the carried unit tests whose names start with one of the given paths; a filter
    # that matches no test fails the item (a PASS must have run something)
    local out code
    out=$("$carry/detcheck-lib" --test-threads 1 "$@" 2>&1)
    code=$?
    echo "$out"
    if echo "$out" | grep -q '^running 0 tests$'; then
        echo "no test matches: $*"
        return 1
    fi
    return "$code"
}
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)

# The host emulation's tests (`*_on_the_host`: the kernels compiled by g++ for the CPU) are CI's,
# not the GPU's: a GPU machine need not have g++, and DETCHECK_REQUIRE_NVRTC=1 makes them fail
# without it.
item "1 feature nccl: driver, NVRTC and NCCL found before cudarc loads them; kernels compile" \
    tests device::cuda::tests device::kernels::tests --skip _on_the_host
item "2 kernels with the CPU's bits: reductions (every dtype, op, order) and the reproducible sum" \
    tests device::gpu::tests device::reprosum::tests::every_reprosum_kernel_compiles_with_nvrtc
item "3 NCCL communicator: world size 1 on this GPU, every collective and mode" \
    tests comm::nccl
if [ "$gpus" -gt 1 ] && command -v mpirun >/dev/null && [ -x "$carry/nccl_allreduce" ]; then
    item "3 NCCL communicator: mpirun -n $gpus, one rank per GPU, unique id over MPI" \
        mpirun --allow-run-as-root -n "$gpus" "$carry/nccl_allreduce"
else
    echo "SKIP 3 NCCL under mpirun: needs more than one GPU, mpirun and the carried example ($gpus GPU(s) here)"
fi
item "4 thread ranks sharing one GPU: world sizes 1-8, every collective, the CPU's bits" \
    tests comm::gpu_threads
item "4 world_sizes check on one GPU (train, reproducible, 1 2 3 4 8 ranks)" \
    "$carry/detcheck" check --no-progress scenarios/gpu/gpu_train_reproducible_world_sizes.json
item "5 devices check: every scenarios/gpu scenario, GPU against CPU thread ranks" \
    "$carry/detcheck" check --no-progress scenarios/gpu
item "5 devices check from a CPU scenario (library test)" \
    tests check::tests::devices
item "6 GPU operator kind: atomicAdd scatter caught, segmented twin = CPU bits" \
    tests device::ops --skip _on_the_host
item "6 scatter scenarios: atomic control caught by repeat, segmented repeats and matches the CPU" \
    "$carry/detcheck" check --no-progress scenarios/gpu/gpu_control_scatter_atomic.json \
    scenarios/gpu/gpu_scatter_segmented_2ranks.json
if ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then
    echo "SKIP 7 exit 4 with NVRTC hidden: this machine's loader finds NVRTC without LD_LIBRARY_PATH (the no-library exit is tested in CI)"
else
    item "7 exit 4 and its message when a library is missing (NVRTC hidden)" \
        bash -c 'out=$(LD_LIBRARY_PATH=/nonexistent "'"$carry"'/detcheck" check --no-progress scenarios/gpu/gpu_collective_ring_4ranks.json 2>&1); code=$?; echo "$out" | tail -3; [ $code = 4 ] && echo "$out" | grep -q libnvrtc'
fi

echo "== benchmarks (docs/benchmarks.md, issue 26)"
if bench=$("$carry/gpu-bench" 2>&1); then
    echo "$bench"
    [ -n "${OUT:-}" ] && echo "$bench" >"$OUT/gpu-bench.txt"
else
    echo "FAIL benchmarks"
    echo "$bench" | tail -20
    failed=1
fi
exit $failed
