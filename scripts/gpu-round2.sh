#!/usr/bin/env bash
# Issue 57's next items on a lent GPU machine (no Rust toolchain there), as one prepared run that
# fits a lease: each item has its own time limit and prints PASS or FAIL; the figures go to $OUT.
#
#   here:  bash scripts/build-gpu-carry.sh && (cd python && maturin build --release -o ../target/wheels)
#   there: OUT=$OUT bash scripts/gpu-round2.sh target/gpu-carry target/wheels/detcheck-*.whl
#
# 1. The reproducible sum in one launch (the last block to arrive finishes): the GPU's bits
#    against the CPU's on both paths (one launch; the fixup and finish kernels for mixed
#    scales), then `gpu-bench reprosum` (1-256 MiB and 64 MiB of mixed scales against the
#    plain device sum).
# 2. A recorded GPT-2 124M step: one step each of off, device-md5 and device-stats under
#    torch.profiler (traces and summaries in $OUT/profile), then the step-time benchmark with
#    the statistics batched like the digests.
# 3. The batched statistics on CUDA with host synchronisation an error.
# 4. The pending proofs: the recording-perturbation check (`test_verdicts.py -k timing`) and
#    the batch-size check on CUDA (generate.py, cuBLAS or attention kernels named).
# 5. A planted CUDA nondeterminism (causes/index_add.py: `index_add_`'s float atomics) caught
#    with its class, and `--deterministic` naming the setting that fixes it.
set -uo pipefail
cd "$(dirname "$0")/.."
carry=${1:?usage: $0 CARRY-FOLDER WHEEL}
wheel=${2:?usage: $0 CARRY-FOLDER WHEEL}
carry=$(cd "$carry" && pwd)
out_dir=${OUT:-/tmp/detcheck-gpu-round2}
mkdir -p "$out_dir"
source scripts/gpu-libraries.sh
source scripts/gpu-prelude.sh "$wheel"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
export DETCHECK_REQUIRE_GPU=1 DETCHECK_REQUIRE_NVRTC=1
export DETCHECK_BIN="$carry/detcheck"

echo "== 1 the reproducible sum in one launch"
item "1 the GPU's one-buffer sums = the CPU's bits (one launch, and pending for mixed scales)" 0 \
    timeout 120 "$carry/detcheck-lib" --test-threads 1 \
    device::gpu::tests::the_gpus_reproducible_sum_has_the_cpus_bits
timeout 120 "$carry/gpu-bench" reprosum 2>&1 | tee "$out_dir/reprosum.txt"

echo "== 2 a recorded GPT-2 step: profile, then step times"
timeout 360 python python/bench/gpu_overhead.py --profile "$out_dir/profile" --rounds 3 \
    --steps 5 --warmup 2 \
    --contenders off,device-md5,device-stats,device-md5-grad+param,device-md5-param,off2 \
    --json "$out_dir/gpu_overhead.json" 2>&1 | grep -v '^USDT' | tee "$out_dir/gpu_overhead.txt"

echo "== 3 batched statistics on CUDA"
item "3 statistics batched = each alone, every dtype, no host sync" 0 \
    timeout 180 python -m pytest -q -p no:cacheprovider python/tests/test_device_digest.py \
    -k "stats or batch"

echo "== 4 the pending proofs"
item "4 a result recording changes: repeat fails with the cause timing (CUDA)" 0 \
    timeout 180 python -m pytest -q -p no:cacheprovider python/tests/test_verdicts.py -k timing
timeout 180 "$carry/detcheck" check --no-progress --batch-sizes 1,8 --run-to-end -- \
    python examples/programs/python/batch/generate.py --batch-size '{batch}' --device cuda \
    2>&1 | tail -30 | tee "$out_dir/batch-check.txt"

echo "== 5 a CUDA kernel's atomics: caught with its class, the setting that fixes it found"
# shellcheck disable=SC2016
item "5 index_add_ on CUDA: a nondeterministic operator, fixed by torch.use_deterministic_algorithms" 0 \
    bash -c 'timeout 300 "$DETCHECK_BIN" check --no-progress --deterministic --expect diverges -- \
        python examples/programs/python/causes/index_add.py --device cuda >"$0/index_add.txt" 2>&1 &&
        grep -q "use_deterministic_algorithms" "$0/index_add.txt"' "$out_dir"
tail -20 "$out_dir/index_add.txt"
exit $failed
