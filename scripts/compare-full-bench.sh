#!/usr/bin/env bash
# Times `detcheck compare` of two identical dumps with two detcheck binaries (before and after a
# change), interleaved with the order rotated each round; prints the median and range of each
# and of the per-round ratio (new / old). Used for docs/benchmarks.md's full-mode compare line.
#
#   scripts/compare-full-bench.sh OLD_BINARY NEW_BINARY [ROUNDS] [MODE]
#
# The dumps (4 ranks, `collective` of 1,000,000 f32 elements, 8 steps; 256 MB of tensor files per
# dump in full mode) are written by NEW_BINARY into a temporary folder, removed at the end.
set -euo pipefail
old=$(realpath "$1"); new=$(realpath "$2"); rounds=${3:-15}; mode=${4:-full}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cd "$work"
cat > big.json <<'JSON'
{"kind": "collective", "world_size": 4, "steps": 8, "seed": 3, "reduction": "ring",
 "deterministic_comm": true, "expect": "identical", "params": {"elements": 1000000}}
JSON
"$new" run big.json --dump a --mode "$mode" > /dev/null
"$new" run big.json --dump b --mode "$mode" > /dev/null
for round in $(seq 1 "$rounds"); do
    if (( round % 2 )); then order="new old"; else order="old new"; fi
    for which in $order; do
        binary=$old; [[ $which == new ]] && binary=$new
        start=$(date +%s.%N)
        "$binary" compare a b > /dev/null
        echo "$round $which $(echo "$(date +%s.%N) - $start" | bc)"
    done
done > times
python3 - times <<'PY'
import statistics, sys
runs = {"old": {}, "new": {}}
for line in open(sys.argv[1]):
    round_, which, seconds = line.split()
    runs[which][round_] = float(seconds)
for which in ("old", "new"):
    t = list(runs[which].values())
    print(f"{which}: median {statistics.median(t):.4f} s, range {min(t):.4f}-{max(t):.4f} s")
ratios = sorted(runs["new"][r] / runs["old"][r] for r in runs["old"])
print(f"new/old per round: median {statistics.median(ratios):.2f}, range {ratios[0]:.2f}-{ratios[-1]:.2f}")
PY
