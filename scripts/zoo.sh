#!/usr/bin/env bash
# The zoo (issue 54): every upstream program of examples/zoo/zoo.toml checked as its README runs
# it, beside a plain run, and every planted bug diagnosed; writes docs/zoo.md (the table) and
# exits 1 when an expectation did not hold. CI runs the entries marked `ci` (python/tests/test_zoo.py).
#
#   bash scripts/zoo.sh                  # all of it, then docs/zoo.md is rewritten
#   bash scripts/zoo.sh --only NAME      # one program (the table is not written)
#   bash scripts/zoo.sh --update NAME    # one program, its rows of docs/zoo.md replaced (the
#                                        # others kept from the table's last run)
#   bash scripts/zoo.sh --deterministic  # each planted bug with --deterministic: which setting
#                                        # fixes it, in how many runs (docs/zoo-deterministic.md)
#
# after scripts/install-python.sh --trl (--frameworks and TRL), --deepspeed (TRL's DeepSpeed rows), and
# --mindspore target/venv-ms (the zoo's mindcv).
#
# About 40-60 minutes on the 2-core VM (accelerate's resnet50d rows alone about 20).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin detcheck
table=(--table docs/zoo.md)
[ "$*" = --deterministic ] && table=(--table docs/zoo-deterministic.md)
(($# == 0)) || [ "$*" = --deterministic ] || table=()
if (($# == 2)) && [ "$1" = --update ]; then
    set -- --only "$2"
    table=(--table docs/zoo.md)
fi
exec target/venv/bin/python examples/zoo/zoo.py --detcheck target/release/detcheck "${table[@]}" "$@"
