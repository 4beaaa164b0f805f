#!/usr/bin/env bash
# The program-diagnosis controls, each caught and diagnosed RUNS times (default 20): the numpy
# set-order control (processes), the mpi4py ANY_SOURCE control (mpirun), the torch numpy-noise
# control (torchrun) and the torch custom-operator control (processes), through
# python/tests/test_diagnosis.py; and the controls of the unmodified scripts (zero-change
# recording: clock reseed, set order, the Trainer's clock-seeded dropout), through
# python/tests/test_zero_change.py; and the controls of the corpus of real-style scripts
# (examples/programs/python/corpus), through python/tests/test_real_scripts.py, with the
# drill-down of the controls planted inside a sharded module (FSDP2, FSDP1, tensor parallel);
# and the planted bugs of every cause class (examples/programs/python/causes, docs/causes.md),
# each diagnosed with its class and line, through python/tests/test_causes.py. .ci/run runs the
# torch ones twice; this runs them all at the count given (`--causes-only`: just the planted
# bugs).
#
#   bash scripts/diagnosis-controls.sh [RUNS] [--causes-only]
#
# Needs scripts/install-python.sh --torch (target/venv) and, for mpi4py, scripts/install-mpi.sh
# and `target/venv/bin/python -m pip install mpi4py==4.1.2`.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
causes_only=${2:-}
cargo build --release --quiet --bin detcheck
DETCHECK_BIN=target/release/detcheck DETCHECK_REQUIRE_TORCH=1 DETCHECK_CAUSE_RUNS="$runs" \
    DETCHECK_COMPILED_CAUSE_RUNS="$runs" DETCHECK_TWIN_RUNS="$runs" \
    target/venv/bin/pytest python/tests/test_causes.py -q -rfEs -n 2 -k "planted or thread_counts"
[ "$causes_only" = --causes-only ] && exit 0
DETCHECK_BIN=target/release/detcheck DETCHECK_REQUIRE_TORCH=1 DETCHECK_REQUIRE_MPI4PY=1 \
    DETCHECK_CONTROL_RUNS="$runs" DETCHECK_TORCH_CONTROL_RUNS="$runs" \
    target/venv/bin/pytest python/tests/test_diagnosis.py python/tests/test_zero_change.py -q -rfEs \
    -k "not zero_change or controls or reseed_control or dropout"
DETCHECK_BIN=target/release/detcheck DETCHECK_REQUIRE_TORCH=1 DETCHECK_CORPUS_CONTROL_RUNS="$runs" \
    target/venv/bin/pytest python/tests/test_real_scripts.py -q -rfEs -s \
    -k "corpus_passes or inside_a_sharded_module"
