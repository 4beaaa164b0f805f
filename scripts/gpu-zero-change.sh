#!/usr/bin/env bash
# Zero-change recording on a GPU machine without a Rust toolchain: the unmodified DDP script
# (examples/programs/python/unmodified/ddp_train.py --device cuda, NCCL) checked by the carried
# wheel's `detcheck` command, and its clock-reseed control caught. Prints one line per item and
# exits non-zero when one fails.
#
#   here:  (cd python && maturin build --release -o ../target/wheels)   # the abi3 wheel
#   there: bash scripts/gpu-zero-change.sh target/wheels/detcheck-*.whl
#
# The machine's Python must have torch with CUDA; the wheel goes into a venv that sees it
# (--system-site-packages). One rank per GPU (NCCL refuses two ranks on one GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-prelude.sh "$@"
gpus=$("$venv/bin/python" -c 'import torch; print(torch.cuda.device_count())')
ranks=$(( gpus >= 2 ? 2 : 1 ))
script=examples/programs/python/unmodified/ddp_train.py
item "unmodified DDP on CUDA ($ranks rank(s)): repeat" 0 \
    detcheck check --no-progress --ranks "$ranks" --steps 3 -- python3 "$script" --device cuda
item "clock-reseed control on CUDA: caught" 0 \
    detcheck check --no-progress --ranks "$ranks" --steps 2 --expect diverges -- \
    python3 "$script" --device cuda --reseed-from-clock
exit $failed
