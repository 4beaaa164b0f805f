#!/usr/bin/env bash
# The program-diagnosis controls, each caught and diagnosed RUNS times (default 20): the numpy
# set-order control (processes), the mpi4py ANY_SOURCE control (mpirun), the torch numpy-noise
# control (torchrun) and the torch custom-operator control (processes), through
# python/tests/test_diagnosis.py; and the controls of the unmodified scripts (zero-change
# recording: clock reseed, set order, the Trainer's clock-seeded dropout), through
# python/tests/test_zero_change.py; and the controls of the corpus of real-style scripts
# (examples/programs/python/corpus), through python/tests/test_real_scripts.py. .ci/run runs the torch ones 3 times (10 minutes for 20 here);
# this runs them all at the count given.
#
#   bash scripts/diagnosis-controls.sh [RUNS]
#
# Needs scripts/install-python.sh --torch (target/venv) and, for mpi4py, scripts/install-mpi.sh
# and `target/venv/bin/python -m pip install mpi4py==4.1.2`.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
cargo build --release --quiet --bin detcheck
DETCHECK_BIN=target/release/detcheck DETCHECK_REQUIRE_TORCH=1 DETCHECK_REQUIRE_MPI4PY=1 \
    DETCHECK_CONTROL_RUNS="$runs" DETCHECK_TORCH_CONTROL_RUNS="$runs" \
    target/venv/bin/pytest python/tests/test_diagnosis.py python/tests/test_zero_change.py -q -rs \
    -k "not zero_change or controls or dropout"
DETCHECK_BIN=target/release/detcheck DETCHECK_REQUIRE_TORCH=1 DETCHECK_CORPUS_CONTROL_RUNS="$runs" \
    target/venv/bin/pytest python/tests/test_real_scripts.py -q -rs -s -k corpus_passes
