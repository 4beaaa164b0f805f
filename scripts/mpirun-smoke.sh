#!/usr/bin/env bash
# The cluster smoke test: detcheck's checks on MPI ranks through mpirun.
#
#   scripts/mpirun-smoke.sh NP [HOSTFILE] [-- SCENARIO...]
#
#   NP        number of MPI processes (ranks)
#   HOSTFILE  optional: the nodes to run on (Open MPI --hostfile, MPICH -f)
#   SCENARIO  scenario files or folders (default: scenarios/)
#
# Environment:
#   DETCHECK_MPI=openmpi|mpich   the MPI stack (default openmpi). MPICH is built with
#                                MPICC=mpicc.mpich into target/mpich and run with mpirun.mpich.
#   DETCHECK_DEADLINE=SECONDS    the collective deadline (default 60)
#   DETCHECK_SMOKE_PROFILE=release|dev   the build profile (default release; CI uses the dev
#                                builds its tests made, to save a build: docs/testing.md)
#   DETCHECK_SMOKE_FEATURES=F    the cargo features (default mpi; CI's Open MPI jobs: mpi,nccl,
#                                the build of its MPI tests)
#
# It builds `detcheck` with the `mpi` feature, applies the MPI settings of `detcheck env --stack mpi`
# (a forced allreduce algorithm for Open MPI and MPICH, I_MPI_CBWR for Intel MPI), runs
# `detcheck check` under mpirun, and prints the per-scenario table from rank 0. Scenarios that need
# more ranks than NP are skipped. Exit code: detcheck's (0 ok, 1 a check failed, 2 bad input or
# wrong usage, 3 a run failed or the job was aborted), or mpirun's when a process was killed.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: $0 NP [HOSTFILE] [-- SCENARIO...]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
np=$1; shift
[[ "$np" =~ ^[1-9][0-9]*$ ]] || { echo "error: NP must be a positive number, got '$np'" >&2; exit 2; }
hostfile=""
if [[ $# -ge 1 && "$1" != "--" ]]; then
    hostfile=$1; shift
    [[ -r "$hostfile" ]] || { echo "error: hostfile '$hostfile' cannot be read" >&2; exit 2; }
fi
if [[ $# -ge 1 && "$1" == "--" ]]; then shift; fi
scenarios=("$@")

flavour=${DETCHECK_MPI:-openmpi}
case "$flavour" in
    openmpi)
        mpicc=mpicc.openmpi; mpirun=mpirun.openmpi; target=target
        flags=(--oversubscribe)
        if [[ $(id -u) -eq 0 ]]; then flags+=(--allow-run-as-root); fi
        if [[ -n "$hostfile" ]]; then flags+=(--hostfile "$hostfile"); fi
        ;;
    mpich)
        mpicc=mpicc.mpich; mpirun=mpirun.mpich; target=target/mpich
        flags=()
        if [[ -n "$hostfile" ]]; then flags+=(-f "$hostfile"); fi
        ;;
    *) echo "error: DETCHECK_MPI must be openmpi or mpich, got '$flavour'" >&2; exit 2 ;;
esac
for tool in "$mpicc" "$mpirun"; do
    command -v "$tool" >/dev/null || {
        echo "error: $tool not found: install $flavour with scripts/install-mpi.sh${flavour/openmpi/}" >&2
        exit 2
    }
done

profile=${DETCHECK_SMOKE_PROFILE:-release}
case "$profile" in
    release) build=(--release); bin=$target/release/detcheck ;;
    dev) build=(); bin=$target/debug/detcheck ;;
    *) echo "error: DETCHECK_SMOKE_PROFILE must be release or dev, got '$profile'" >&2; exit 2 ;;
esac
features=${DETCHECK_SMOKE_FEATURES:-mpi}
case ",$features," in
    *,mpi,*) ;;
    *) echo "error: DETCHECK_SMOKE_FEATURES must include mpi, got '$features'" >&2; exit 2 ;;
esac
echo "== building detcheck with MPI ($flavour, $profile, features $features) into $target"
MPICC=$mpicc CARGO_TARGET_DIR=$target cargo build "${build[@]}" --quiet --features "$features"
if missing=$(ldd "$bin" 2>/dev/null | grep "not found"); then
    echo "error: $bin cannot find its MPI library at run time:" >&2
    echo "$missing" >&2
    exit 2
fi

# seed_all for the environment: pin the MPI libraries' allreduce algorithms.
eval "$("$bin" env --export --stack mpi)"

echo "== $mpirun ${flags[*]} -n $np $bin check"
set +e
"$mpirun" "${flags[@]}" -n "$np" "$bin" check --no-progress --deadline "${DETCHECK_DEADLINE:-60}" "${scenarios[@]}"
code=$?
set -e
echo "== mpirun-smoke: $np ranks, $flavour: exit code $code"
exit "$code"
