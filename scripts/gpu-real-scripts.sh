#!/usr/bin/env bash
# Real scripts on a GPU machine without a Rust toolchain (issue 35, item 9): the corpus's FSDP2
# and DDP scripts (examples/programs/python/corpus, `--device cuda`: NCCL) and its nanoGPT-style
# trainer (bf16 autocast on CUDA) checked by the carried wheel's `detcheck`, and their controls
# caught. One rank per GPU (NCCL refuses two ranks on one GPU): 2 ranks where there are 2 GPUs.
# One line per item; non-zero exit when one fails.
#
#   here:  (cd python && maturin build --release -o ../target/wheels)   # the abi3 wheel
#   there: bash scripts/gpu-real-scripts.sh target/wheels/detcheck-*.whl
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-prelude.sh "$@"
corpus=$PWD/examples/programs/python/corpus
gpus=$("$venv/bin/python" -c 'import torch; print(torch.cuda.device_count())')
ranks=$(( gpus >= 2 ? 2 : 1 ))
work=$(mktemp -d)
cd "$work" || exit 1
one=(detcheck check --no-progress --no-diagnosis --steps 3)
item "FSDP2 on CUDA (NCCL, $ranks rank(s), torchrun): repeat, replicas" 0 \
    "${one[@]}" --ranks "$ranks" --launcher torchrun --checks repeat,replicas -- \
    python3 "$corpus/fsdp2_train.py" --device cuda
item "FSDP2 on CUDA: clock-reseed control caught" 0 \
    "${one[@]}" --ranks "$ranks" --launcher torchrun --expect diverges -- \
    python3 "$corpus/fsdp2_train.py" --device cuda --reseed_from_clock
item "DDP with snapshots on CUDA (NCCL, $ranks rank(s), torchrun): repeat, replicas" 0 \
    "${one[@]}" --ranks "$ranks" --launcher torchrun --checks repeat,replicas -- \
    python3 "$corpus/ddp_snapshot.py" --device cuda
item "DDP with snapshots on CUDA: clock-reseed control caught" 0 \
    "${one[@]}" --ranks "$ranks" --launcher torchrun --expect diverges -- \
    python3 "$corpus/ddp_snapshot.py" --device cuda --reseed_from_clock
item "nanoGPT-style trainer on CUDA (one process, bf16 autocast): repeat" 0 \
    "${one[@]}" --ranks 1 -- python3 "$corpus/nanogpt_train.py" --device=cuda \
    --data_dir="$work/tokens"
[ -z "$(ls -A "$work" | grep -v '^tokens$')" ] && echo "PASS nothing left in the working directory" \
    || { echo "FAIL left in the working directory: $(ls -A "$work")"; failed=1; }
exit $failed
