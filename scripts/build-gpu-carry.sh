#!/usr/bin/env bash
# Builds what scripts/gpu-selftest.sh runs on a GPU machine that has no Rust toolchain, into
# target/gpu-carry/ (stripped; about 30 MB, under the device tool's 64 MiB carry limit):
#   detcheck        the CLI with the `nccl` feature (CUDA, NVRTC and NCCL loaded at run time)
#   detcheck-lib    the library's unit tests with `nccl` (the GPU tests run with
#                   DETCHECK_REQUIRE_GPU=1 there: a missing GPU fails them instead of skipping)
#   gpu-bench       `cargo bench --bench gpu`: reproducible sum, allreduce among thread ranks
#   nccl_allreduce  (when MPI is installed here) examples/nccl_allreduce.rs, for mpirun -n GPUS
#
#   bash scripts/build-gpu-carry.sh [--debug]       # here
#   bash scripts/gpu-selftest.sh target/gpu-carry   # there, from the repository root
#
# --debug builds the dev profile instead of release: what .ci/run uses to check that the
# carry-over builds, reusing the debug builds its tests made (release takes minutes more; carry
# the release build to a GPU).
# Nothing CUDA is needed to build: cudarc loads its libraries at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
release=(--release)
profile=release
if [ "${1:-}" = --debug ]; then release=(); profile=debug; fi
out=target/gpu-carry
rm -rf "$out"
mkdir -p "$out"
executable() { # the executable cargo names in its JSON messages for the given build
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])' | tail -1
}
cargo build "${release[@]}" --features nccl --bin detcheck
cp "target/$profile/detcheck" "$out/detcheck"
# -p detcheck: the workspace's other members have unit tests too, and the last executable
# cargo names would be whichever of them finished last.
lib=$(cargo test "${release[@]}" -p detcheck --features nccl --lib --no-run \
    --message-format=json | executable)
cp "$lib" "$out/detcheck-lib"
bench=$(cargo test "${release[@]}" -p detcheck --features nccl --bench gpu --no-run \
    --message-format=json | executable)
cp "$bench" "$out/gpu-bench"
if command -v mpicc >/dev/null && [ -f examples/nccl_allreduce.rs ]; then
    cargo build "${release[@]}" --features mpi,nccl --example nccl_allreduce
    cp "target/$profile/examples/nccl_allreduce" "$out/nccl_allreduce"
fi
strip "$out"/*
ls -la "$out"
du -sh "$out"
