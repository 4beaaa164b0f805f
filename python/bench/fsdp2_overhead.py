#!/usr/bin/env python3
"""Recording an FSDP2 training step without a change to the program: step time unrecorded and
recorded by the wheel's start-up hook, side by side (issue 35: <= 1.05x of unrecorded, the
zero-change path's figure for DDP).

    python python/bench/fsdp2_overhead.py [--rounds 5] [--steps 20] [--ranks 2]

The program (this file, run by torchrun with ``--child``) is a transformer of 4 blocks, 256 wide,
each block ``fully_shard``-ed, then the root; batch 8 x 64 per rank of fixed random tokens;
AdamW; gloo on the CPU, one torch thread per rank. Contenders:

- ``off`` and ``off2`` (the same again: the noise);
- ``auto-md5``: the same program started with a launch's variables (``DETCHECK_TRACE_DIR``, its
  world size, mode md5), so the start-up hook records it as ``detcheck check -- torchrun ...``
  does: every module's output, every gradient and parameter (DTensors: their local shards), the
  model's input, every step.

Every trial is a fresh torchrun; rank 0 times ``--steps`` steps after ``--warmup`` with
``perf_counter`` around the loop, with ``torch.distributed.barrier()`` before the clock starts and
stops (the recorder's writer flushes nothing inside the span: its background thread hashes on
the idle core, as in the DDP figure). Rounds run every contender once, rotated; a contender's
ratio is its step time (the mean over the timed steps; ``--median-step``: the median step, which
a step stalled by another machine's load does not move) over ``off``'s in the same round, and
over the mean of ``off`` and ``off2`` (the baseline sampled twice a round), reported as the
median and min-max; and the
CPU time of rank 0's program thread a step (``time.thread_time``), over the same mean: the
cost the program itself pays, the writer's hashing being on another thread.

``--lend-ab`` measures, inside one recorded process, what lending records to the writer saves
(``detcheck._torch.tensors.lendable``: a copy-on-write snapshot read in place instead of a copy):
the steps alternate in blocks of 4 between lending and copying every record (``--state-only``: the
gradient and parameter shards alone, module outputs lent in both arms), and rank 0 prints each
arm's median program-thread CPU time a step and their ratio. One process, so the
machine's drift between trials does not enter the ratio.

``--record-ab [--trials 3] [--rounds 15]`` measures the recording's cost the same way, inside
each of ``--trials`` recorded processes: blocks of 6 steps alternate between recording and
every hook of detcheck's set aside (the model's module hooks, the optimizer's step hooks, the
``Tensor.backward`` replacement: the step runs no line of detcheck, and the recorder does not
count it), ``--rounds`` pairs of blocks a process; the writer is flushed between blocks and a
block's first step is not timed. It prints the ratio of each pair's median steps (recorded over
aside), pooled, with a bootstrap interval of the median (seeded draws). What stays in the
process while the hooks are aside: detcheck's import, its audit hook (about 95 events a step,
none of them ``open``) and the writer's idle thread.
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CONTENDERS = ["off", "auto-md5", "off2"]


def child(args):
    import torch
    import torch.distributed as dist
    from torch import nn

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    width, vocab = 256, 512

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(width)
            self.mlp = nn.Sequential(
                nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
            )

        def forward(self, x):
            return x + self.mlp(self.norm(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, width)
            self.blocks = nn.ModuleList(Block() for _ in range(4))
            self.head = nn.Linear(width, vocab)

        def forward(self, idx):
            x = self.tok(idx)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    model = Model()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    tokens = torch.randint(0, vocab, (8, 64), generator=g)

    def step():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    if args.lend_ab:
        return lend_ab(args, step, dist)
    if args.record_ab:
        return record_ab(args, step, dist)
    dist.barrier()
    start, cpu = time.perf_counter(), time.thread_time()
    walls, cpus = [], []
    for _ in range(args.steps):
        began, began_cpu = time.perf_counter(), time.thread_time()
        step()
        walls.append(time.perf_counter() - began)
        cpus.append(time.thread_time() - began_cpu)
    cpu = time.thread_time() - cpu
    dist.barrier()
    elapsed = time.perf_counter() - start
    if dist.get_rank() == 0:
        report = {
            "ms_per_step": elapsed / args.steps * 1e3,
            "cpu_ms_per_step": cpu / args.steps * 1e3,
            # The median step: a step the machine stalled (another VM) does not move it.
            "median_ms": statistics.median(walls) * 1e3,
            "median_cpu_ms": statistics.median(cpus) * 1e3,
        }
        print(json.dumps(report), flush=True)
    dist.destroy_process_group()


def lend_ab(args, step, dist):
    """The steps alternate, 4 at a time, between lending and copying: module outputs and the
    step's gradients and parameters (``lendable``'s two rules), or with ``--state-only`` the
    gradients and parameters alone (module outputs lent in both arms)."""
    import detcheck._torch.tensors as tensors

    switch = "_USE_COUNT" if args.state_only else "_LAZY_CLONE"
    lend = getattr(tensors, switch)
    if lend is None:
        raise SystemExit("this torch has no copy-on-write clone: nothing is lent")
    import resource

    arms = {"lend": [], "copy": []}
    faults = {"lend": [], "copy": []}
    for block in range(max(2, args.steps // 4)):
        arm = "lend" if block % 2 == 0 else "copy"
        setattr(tensors, switch, lend if arm == "lend" else None)
        for _ in range(4):
            # Minor page faults of the program's thread: memory torch could not reuse.
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            cpu = time.thread_time()
            step()
            arms[arm].append(time.thread_time() - cpu)
            faults[arm].append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
    setattr(tensors, switch, lend)
    if dist.get_rank() == 0:
        report = {arm: statistics.median(t) * 1e3 for arm, t in arms.items()}
        report.update({f"{arm}_faults": statistics.median(f) for arm, f in faults.items()})
        print(json.dumps(report), flush=True)
    dist.destroy_process_group()


#: Steps in a block of ``--record-ab`` (the first is the change-over, not timed).
AB_BLOCK = 6


class _HooksAside:
    """Every hook of detcheck's zero-change recorder out of the program's way, and back: the
    model's module hooks (``_torch.tensors._set_hooks_aside``), the optimizer's global step hooks
    and the ``Tensor.backward`` replacement (``_torch.frontend.BackwardHook``). While aside, a step
    runs no line of detcheck (the recorder does not see the step: its count stays)."""

    def __init__(self):
        import detcheck._torch.auto as auto

        self.recorder = auto._recorder
        if self.recorder is None or self.recorder.status != "recording":
            raise SystemExit("--record-ab: the zero-change recorder is not recording")
        self.model = self.recorder._handle._model

    def __enter__(self):
        import torch
        from detcheck._torch.tensors import _set_hooks_aside

        self.put_back = _set_hooks_aside(self.model)
        for hook in self.recorder._step_hooks:
            hook.remove()
        self.backward = torch.Tensor.backward
        torch.Tensor.backward = self.backward.__wrapped__
        return self

    def __exit__(self, *exc):
        import torch
        from torch.optim import optimizer

        torch.Tensor.backward = self.backward
        self.recorder._step_hooks = [
            optimizer.register_optimizer_step_pre_hook(self.recorder._before_step),
            optimizer.register_optimizer_step_post_hook(self.recorder._after_step),
        ]
        self.put_back()


def record_ab(args, step, dist):
    """Inside one recorded process, blocks of ``AB_BLOCK`` steps alternate between recording
    and every hook of detcheck's set aside (``_HooksAside``); between blocks the writer is
    flushed (its hashing of one block does not reach into the next) and a block's first step,
    the change-over, is not timed. Prints each block pair's ratio."""
    aside = _HooksAside()
    writer = aside.recorder._writer
    walls = {"on": [], "off": []}
    cpus = {"on": [], "off": []}
    counted = {"on": 0, "off": 0}
    for block in range(2 * args.rounds):
        arm = "on" if block % 2 == 0 else "off"
        before = aside.recorder._steps
        context = aside if arm == "off" else contextlib.nullcontext()
        with context:
            block_walls, block_cpus = [], []
            for i in range(AB_BLOCK):
                began, began_cpu = time.perf_counter(), time.thread_time()
                step()
                if i > 0:
                    block_walls.append(time.perf_counter() - began)
                    block_cpus.append(time.thread_time() - began_cpu)
        counted[arm] += aside.recorder._steps - before
        writer.flush()
        walls[arm].append(statistics.median(block_walls))
        cpus[arm].append(statistics.median(block_cpus))
    if counted != {"on": args.rounds * AB_BLOCK, "off": 0}:
        raise SystemExit(f"--record-ab: the recorder saw {counted} steps")
    if dist.get_rank() == 0:
        print(json.dumps({"walls": walls, "cpus": cpus}), flush=True)
    dist.destroy_process_group()


def trial(args, contender, extra=()):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for name in list(env):
        if name.startswith("DETCHECK_"):
            del env[name]
    folder = tempfile.TemporaryDirectory()
    if contender.startswith("auto"):
        env.update(
            {
                "DETCHECK_TRACE_DIR": folder.name,
                "DETCHECK_WORLD_SIZE": str(args.ranks),
                "DETCHECK_MODE": contender.split("-")[1],
                "DETCHECK_SEED": "0",
            }
        )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={args.ranks}",
            __file__,
            "--child",
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    lines = [t for t in done.stdout.splitlines() if t.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(
            f"{contender}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
    if contender.startswith("auto"):
        traces = sorted(p for p in os.listdir(folder.name) if p.endswith(".dctrace"))
        if len(traces) != args.ranks:
            raise SystemExit(f"{contender}: expected {args.ranks} traces, found {traces}")
    folder.cleanup()
    report = json.loads(lines[-1])
    if extra:
        return report
    if args.median_step:
        return report["median_ms"], report["median_cpu_ms"]
    return report["ms_per_step"], report["cpu_ms_per_step"]


def record_ab_main(args):
    """``--record-ab``: ``--trials`` recorded processes, each alternating ``--rounds`` block
    pairs; the ratio of each pair (recorded over hooks aside, the blocks' median steps), pooled
    over the trials, with a bootstrap interval of the median."""
    from overhead import median_interval  # this folder's: the script's own is on sys.path

    walls, cpus = [], []
    for t in range(args.trials):
        found = trial(args, "auto-md5", ["--record-ab", "--rounds", str(args.rounds)])
        pairs = list(zip(found["walls"]["on"], found["walls"]["off"]))
        cpu_pairs = list(zip(found["cpus"]["on"], found["cpus"]["off"]))
        walls += [on / off for on, off in pairs]
        cpus += [on / off for on, off in cpu_pairs]
        off = statistics.median(o for _, o in pairs) * 1e3
        print(
            f"trial {t}: hooks aside {off:.1f} ms a step; recorded / aside, median of "
            f"{len(pairs)} block pairs: wall {statistics.median(on / o for on, o in pairs):.3f}x, "
            f"program-thread CPU {statistics.median(on / o for on, o in cpu_pairs):.3f}x",
            flush=True,
        )
    for label, ratios in (("wall", walls), ("program-thread CPU", cpus)):
        low, high = median_interval(ratios)
        print(
            f"{label}: recorded / hooks aside {statistics.median(ratios):.3f}x over "
            f"{len(ratios)} block pairs (95% bootstrap interval of the median "
            f"{low:.3f}-{high:.3f}; {sum(r <= 1.05 for r in ratios)} pairs at or below 1.05x)"
        )
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--lend-ab", action="store_true")
    parser.add_argument(
        "--state-only",
        action="store_true",
        help="--lend-ab: toggle only the lending of gradients and parameters",
    )
    parser.add_argument("--record-ab", action="store_true")
    parser.add_argument(
        "--median-step",
        action="store_true",
        help="a trial's time is its median step, not its mean (robust to a stalled step)",
    )
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.record_ab:
        return record_ab_main(args)
    if args.lend_ab:
        for r in range(args.rounds):
            extra = ["--state-only"] if args.state_only else []
            found = trial(args, "auto-md5", ["--lend-ab", *extra])
            print(
                f"round {r}: lend {found['lend']:.1f} ms, copy {found['copy']:.1f} ms a step "
                f"(program thread CPU, medians): copy/lend {found['copy'] / found['lend']:.3f}x; "
                f"minor page faults a step: lend {found['lend_faults']:.0f}, "
                f"copy {found['copy_faults']:.0f}",
                flush=True,
            )
        return 0
    rounds, cpus = [], []
    for r in range(args.rounds):
        order = CONTENDERS[r % len(CONTENDERS) :] + CONTENDERS[: r % len(CONTENDERS)]
        measured = {c: trial(args, c) for c in order}
        times = {c: wall for c, (wall, _) in measured.items()}
        rounds.append(times)
        cpus.append({c: cpu for c, (_, cpu) in measured.items()})
        print(
            f"round {r}: "
            + ", ".join(f"{c} {times[c]:.1f} ms ({cpus[-1][c]:.1f} ms CPU)" for c in CONTENDERS),
            flush=True,
        )
    for c in CONTENDERS:
        # The program's own thread's CPU time a step: what recording costs the program where
        # a core is free for the writer, less moved by other processes than the wall time.
        ratios = [t[c] / ((t["off"] + t["off2"]) / 2) for t in cpus]
        print(
            f"{c:>9}: program thread {statistics.median(t[c] for t in cpus):6.1f} ms CPU/step, "
            f"{statistics.median(ratios):.3f}x the mean of off and off2 "
            f"({min(ratios):.3f}-{max(ratios):.3f})"
        )
    for c in CONTENDERS:
        ratios = [t[c] / t["off"] for t in rounds]
        # Against both unrecorded trials of the round: the baseline sampled twice.
        both = [t[c] / ((t["off"] + t["off2"]) / 2) for t in rounds]
        print(
            f"{c:>9}: {statistics.median(t[c] for t in rounds):8.1f} ms/step, "
            f"{statistics.median(ratios):.3f}x off ({min(ratios):.3f}-{max(ratios):.3f}), "
            f"{statistics.median(both):.3f}x the mean of off and off2 "
            f"({min(both):.3f}-{max(both):.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
