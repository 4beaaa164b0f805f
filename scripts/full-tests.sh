#!/usr/bin/env bash
# The full tier of the Python tests (docs/testing.md): the tests marked `pytest.mark.full`, which
# CI leaves out of its budget because a CI test covers the same capability on another program,
# launcher or size. Run it before calling an issue that touches what they cover resolved.
#
#   bash scripts/full-tests.sh [PYTEST ARGS...]
#
# Needs scripts/install-python.sh --frameworks (target/venv); MindSpore's full tests run where
# target/venv-ms has MindSpore (scripts/install-python.sh --mindspore target/venv-ms), msprobe's
# where scripts/install-msprobe.sh installed it; MPICH's fault and smoke tests where
# scripts/install-mpi.sh mpich installed it. Exit code: the first failure's (0 all passed).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin detcheck
export DETCHECK_BIN=$PWD/target/release/detcheck DETCHECK_REQUIRE_TORCH=1 DETCHECK_REQUIRE_FRAMEWORKS=1

# pytest's exit 5: no test of the tier in the files given (not a failure here).
tier() {
    local rc=0
    "$@" -m full -q -rfEs || rc=$?
    ((rc == 0 || rc == 5)) || exit "$rc"
}

echo "== the main venv (target/venv)"
tier target/venv/bin/pytest python/tests -n 2 --dist loadgroup \
    --ignore python/tests/test_slurm.py \
    --ignore python/tests/test_mindspore.py --ignore python/tests/test_msprobe_align.py \
    --ignore python/tests/test_msprobe_mindspore.py "$@"
if target/venv-ms/bin/python -c "import mindspore" 2>/dev/null; then
    echo "== MindSpore (target/venv-ms)"
    DETCHECK_REQUIRE_MINDSPORE=1 tier target/venv-ms/bin/pytest python/tests/test_mindspore.py -n 2 "$@"
else
    echo "== MindSpore: not installed (scripts/install-python.sh --mindspore target/venv-ms), skipped"
fi
if [[ -x target/venv-msprobe/bin/python ]]; then
    echo "== msprobe (target/venv-msprobe)"
    DETCHECK_REQUIRE_MSPROBE=1 tier target/venv/bin/pytest python/tests/test_msprobe_align.py \
        python/tests/test_msprobe_mindspore.py -n 2 --dist loadgroup "$@"
else
    echo "== msprobe: not installed (scripts/install-msprobe.sh), skipped"
fi
if sinfo >/dev/null 2>&1; then
    echo "== Slurm (a running Slurm: scripts/slurm-local.sh start)"
    PATH="$PWD/target/venv/bin:$PATH" DETCHECK_REQUIRE_SLURM=1 \
        tier target/venv/bin/pytest python/tests/test_slurm.py "$@"
else
    echo "== Slurm: none running (scripts/slurm-local.sh start), its full tests skipped"
fi
if command -v mpicc.mpich >/dev/null && command -v mpirun.mpich >/dev/null; then
    echo "== MPICH (detcheck built against MPICH into target/mpich): its fault tests, its smoke test at 3 ranks"
    MPICC=mpicc.mpich CARGO_TARGET_DIR=target/mpich DETCHECK_MPIRUN=mpirun.mpich \
        cargo test --features mpi --test mpi -- --test-threads=1 failures_in_ranks a_rank_ a_scenario_larger
    DETCHECK_MPI=mpich DETCHECK_SMOKE_PROFILE=dev bash scripts/mpirun-smoke.sh 3
else
    echo "== MPICH: not installed (scripts/install-mpi.sh mpich), its fault tests skipped"
fi
