#!/usr/bin/env bash
# Installs what the `mpi` cargo feature needs: an MPI library with its launcher, and libclang for
# rsmpi's bindgen. Used by .ci/run and by people setting up a machine by hand.
#
#   scripts/install-mpi.sh            # Open MPI (the default stack)
#   scripts/install-mpi.sh mpich      # MPICH as well, for `scripts/mpirun-smoke.sh --mpich`
#
# Needs root and Debian/Ubuntu apt. Idempotent: packages already present are left alone.
set -euo pipefail

packages=(libopenmpi-dev openmpi-bin libclang-dev pkg-config)
if [[ "${1:-}" == "mpich" ]]; then
    packages+=(libmpich-dev mpich)
fi

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
    echo "install-mpi: already installed: ${packages[*]}"
    exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-mpi: installed ${missing[*]}"
