#!/usr/bin/env bash
# Prints the library folders of the CUDA wheels from the Python registry installed in a virtual
# environment, as one LD_LIBRARY_PATH value (folders joined by ':'): NVRTC's (nvidia-cuda-nvrtc,
# nvidia/cu13/lib/libnvrtc.so.13) and NCCL's (nvidia-nccl-cu13, nvidia/nccl/lib/libnccl.so.2),
# where each is installed. detcheck's `nccl` feature (cudarc) finds them there at run time.
#
#   scripts/find-cuda-libs.sh [--link-nccl] [VENV]        # default VENV: target/venv-cuda
#   LD_LIBRARY_PATH=$(scripts/find-cuda-libs.sh) cargo test --features nccl --lib device::
#
# --link-nccl: cudarc 0.19 looks for libnccl.so (and libnccl.so.13, ...), never for the wheel's
# libnccl.so.2, so this links libnccl.so -> libnccl.so.2 in the wheel's folder (once; an
# existing libnccl.so is left alone).
#
# Exits 1, saying so on stderr, when the environment holds neither library.
set -euo pipefail
cd "$(dirname "$0")/.."
link_nccl=0
while [ $# -gt 0 ]; do
    case "$1" in
        --link-nccl) link_nccl=1 ;;
        -*) echo "find-cuda-libs.sh: unknown option $1 (--link-nccl)" >&2; exit 2 ;;
        *) break ;;
    esac
    shift
done
venv=${1:-target/venv-cuda}
if [ ! -d "$venv" ]; then
    echo "find-cuda-libs.sh: no virtual environment at $venv (scripts/install-nvrtc.sh makes one)" >&2
    exit 1
fi
venv=$(cd "$venv" && pwd)

# The wheels unpack to site-packages/nvidia/<part>/lib (the layout of pip's NVIDIA wheels).
mapfile -t folders < <(
    find "$venv" -path '*-packages/nvidia/*/lib/*' \
        \( -name 'libnvrtc.so*' -o -name 'libnccl.so*' \) -printf '%h\n' | sort -u
)
if [ ${#folders[@]} -eq 0 ]; then
    echo "find-cuda-libs.sh: neither libnvrtc.so* nor libnccl.so* under $venv" \
        "(pip install nvidia-cuda-nvrtc==13.0.88 nvidia-nccl-cu13 there)" >&2
    exit 1
fi

if [ "$link_nccl" = 1 ]; then
    for folder in "${folders[@]}"; do
        if [ -e "$folder/libnccl.so.2" ] && [ ! -e "$folder/libnccl.so" ]; then
            ln -s libnccl.so.2 "$folder/libnccl.so"
            echo "find-cuda-libs.sh: linked $folder/libnccl.so -> libnccl.so.2" >&2
        fi
    done
fi

(IFS=:; echo "${folders[*]}")
