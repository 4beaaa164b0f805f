#!/usr/bin/env bash
# Allreduce on MPI ranks: detcheck's modes against native MPI_Allreduce, side by side.
#   scripts/mpi-bench.sh [NP [REPS [KIB...]]]
#   (default 4 processes, 7 repetitions, 4 KiB-64 MiB; Open MPI; settings of `detcheck env --stack mpi`)
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:-4}
shift || true
cargo build --release --quiet --features mpi --bench mpi_allreduce --bin detcheck
bin=$(ls -t target/release/deps/mpi_allreduce-* | grep -v '\.d$' | head -1)
eval "$(target/release/detcheck env --export --stack mpi)"
flags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then flags+=(--allow-run-as-root); fi
mpirun "${flags[@]}" -n "$np" "$bin" "$@"
