"""What a passing `detcheck check` of a program costs against one plain run of it (issue 53:
<= 3x), measured side by side: pairs of (plain run, check), interleaved, wall time of the whole
processes; prints each pair's ratio, the median and the range. docs/benchmarks.md keeps the
figures. The program is synchronous (one process on the CPU), so the check makes no unperturbed
run unless `--unperturbed` (3 launches: run 1 and two unperturbed runs in run 2's place) is given; `--no-unperturbed` passes that flag instead.

    target/venv/bin/python scripts/verdict_cost.py [--pairs N] [--unperturbed | --no-unperturbed]

The program is pytorch/examples' word_language_model (examples/zoo), run to its end (one
epoch on a small corpus made here, its model saved and loaded back), as the check runs it
with --run-to-end.
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORD_LM = (
    ROOT / "examples" / "zoo" / "pytorch-examples" / "word_language_model" / "main.py"
)


def timed(argv, cwd):
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(
            f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout}{done.stderr}"
        )
    return took


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=7)
    flags = parser.add_mutually_exclusive_group()
    flags.add_argument("--no-unperturbed", action="store_true")
    flags.add_argument("--unperturbed", action="store_true")
    args = parser.parse_args()
    detcheck = ROOT / "target" / "release" / "detcheck"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = tmp / "data"
        subprocess.run(
            [
                sys.executable,
                ROOT / "examples" / "zoo" / "word_lm_data.py",
                data,
                "--train-lines",
                "600",
            ],
            check=True,
        )
        program = [
            sys.executable,
            WORD_LM,
            "--data",
            data,
            "--epochs",
            "1",
            "--emsize",
            "32",
        ]
        program += [
            "--nhid",
            "32",
            "--batch_size",
            "8",
            "--bptt",
            "10",
            "--save",
            tmp / "m.pt",
        ]
        check = [detcheck, "check", "--no-progress", "--run-to-end"]
        if args.no_unperturbed:
            check.append("--no-unperturbed")
        if args.unperturbed:
            check.append("--unperturbed")
        check += ["--", *program]
        timed(program, tmp)  # warm-up: the page cache, the first import of torch
        ratios = []
        for i in range(args.pairs):
            plain = timed(program, tmp)
            checked = timed(check, tmp)
            ratios.append(checked / plain)
            print(
                f"pair {i}: plain {plain:.2f} s, check {checked:.2f} s, {checked / plain:.2f}x"
            )
        print(
            f"median {statistics.median(ratios):.2f}x, range {min(ratios):.2f}x-"
            f"{max(ratios):.2f}x over {len(ratios)} pairs"
        )


if __name__ == "__main__":
    main()
