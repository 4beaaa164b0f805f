#!/usr/bin/env python3
"""The operator drill-down's cost: `detcheck check` of a diverging PyTorch program with its
diagnosis (the two re-runs that capture the divergent record and trace its module's operators)
against the same check without it (`--no-diagnosis`: the check's own two runs only).

    python python/bench/drilldown.py [--rounds 5] [--steps 3] [--models mlp,transformer]

The program is python/bench/drilldown_program.py (an MLP of 6 x 512, a 4-block transformer), one
rank (`processes` launcher), with numpy noise planted in one module. Method: every round runs both
contenders once, in an order that alternates by round, each a fresh `detcheck check` process timed
from outside (wall clock, process start to exit). Reported per model: the check alone (its own
runs), and `diagnosis / check`, the drill-down's extra time over the check's own run time, as the
median and min-max over the rounds (each round's pair measured side by side). The diagnosis must
have named the operator in every round, or the benchmark fails.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).resolve().parent / "drilldown_program.py"


def scenario(folder, model, steps, deterministic=False):
    """The check of ``model``; ``deterministic``: launched with `--deterministic`'s settings,
    which make its runs identical (the finding then re-runs it without them)."""
    path = Path(folder) / f"drilldown_{model}{'_deterministic' if deterministic else ''}.json"
    path.write_text(
        json.dumps(
            {
                "description": f"drill-down benchmark: {model} with numpy noise in one module",
                "kind": "command",
                "world_size": 1,
                "steps": steps,
                "seed": 1,
                "expect": "identical" if deterministic else "diverges",
                "checks": ["repeat"],
                "params": {
                    "command": [
                        sys.executable,
                        str(PROGRAM),
                        "--model",
                        model,
                        "--steps",
                        "{steps}",
                    ],
                    "launcher": "processes",
                    "timeout_secs": 600,
                    "deterministic": deterministic,
                },
            }
        )
    )
    return path


def timed_settings_check(detcheck, path):
    """`--deterministic`'s check and its finding (which settings fix it): seconds, finding."""
    args = [detcheck, "check", "--no-progress", "--format", "json", str(path)]
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - start
    line = next(json.loads(t) for t in done.stdout.splitlines() if '"type":"scenario"' in t)
    finding = line.get("deterministic") or {}
    if done.returncode != 0 or finding.get("fixed_by") != ["numpy.random.seed"]:
        raise SystemExit(f"drilldown.py: the settings' finding is not numpy's seed:\n{done.stdout}")
    return elapsed


def timed_check(detcheck, path, diagnose):
    args = [detcheck, "check", "--no-progress", "--format", "json", str(path)]
    if not diagnose:
        args.append("--no-diagnosis")
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - start
    line = next(json.loads(t) for t in done.stdout.splitlines() if '"type":"scenario"' in t)
    if done.returncode != 0 or line["verdict"] != "ok (caught)":
        raise SystemExit(f"drilldown.py: the check failed:\n{done.stdout}{done.stderr}")
    first = line["first_divergence"]
    if diagnose and first.get("operator", {}).get("finding") != "input_from_outside":
        raise SystemExit(f"drilldown.py: no operator named: {json.dumps(first)}")
    return elapsed, first


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--models", default="mlp,transformer")
    parser.add_argument("--detcheck", default=str(ROOT / "target" / "release" / "detcheck"))
    args = parser.parse_args()
    env_path = os.path.dirname(sys.executable)
    os.environ["PATH"] = env_path + os.pathsep + os.environ.get("PATH", "")
    print(f"# drill-down cost, {args.rounds} rounds, {args.steps} steps, 1 rank, CPU")
    print(
        "| model | first divergence | check alone (s, median) | diagnosis / check (median) "
        "| range | `--deterministic` finding / check (median) | range |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as folder:
        for model in args.models.split(","):
            path = scenario(folder, model, args.steps)
            settings = scenario(folder, model, args.steps, deterministic=True)
            alone, ratios, settings_ratios, where = [], [], [], None
            for r in range(args.rounds):
                # Three contenders, in an order rotated by round.
                order = ["alone", "diagnosis", "settings"]
                order = order[r % 3 :] + order[: r % 3]
                times = {}
                for contender in order:
                    if contender == "settings":
                        times[contender] = timed_settings_check(args.detcheck, settings)
                        continue
                    diagnose = contender == "diagnosis"
                    times[contender], first = timed_check(args.detcheck, path, diagnose)
                    if diagnose:
                        where = f"`{first['name']}` -> `{first['operator']['call']['operator']}`"
                alone.append(times["alone"])
                ratios.append((times["diagnosis"] - times["alone"]) / times["alone"])
                # The finding's runs are the settings check's extra over its own two runs,
                # which cost what the check alone does.
                settings_ratios.append((times["settings"] - times["alone"]) / times["alone"])
            print(
                f"| {model} | {where} | {statistics.median(alone):.1f} | "
                f"{statistics.median(ratios):.2f}x | {min(ratios):.2f}x-{max(ratios):.2f}x | "
                f"{statistics.median(settings_ratios):.2f}x | "
                f"{min(settings_ratios):.2f}x-{max(settings_ratios):.2f}x |"
            )


if __name__ == "__main__":
    main()
