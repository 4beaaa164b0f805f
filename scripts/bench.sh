#!/usr/bin/env bash
# Runs the benchmarks and prints the markdown tables kept in docs/benchmarks.md.
# Usage: scripts/bench.sh [md5|allreduce|record]...
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --quiet --bench detcheck -- "$@"
