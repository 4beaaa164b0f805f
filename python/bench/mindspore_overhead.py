#!/usr/bin/env python3
"""Recording overhead on a MindSpore model: an unmodified PyNative training loop recorded by the
start-up hook (zero-change recording, ``detcheck._mindspore.auto``) against the same loop
unrecorded, step time side by side (docs/benchmarks.md, "MindSpore").

    target/venv-ms/bin/python python/bench/mindspore_overhead.py [--rounds 7] [--steps 20]

The model is an MLP (``--sizes``: ``nn.Dense`` layers with ReLU between them, 784-1024-1024-10 by
default), batch ``--batch`` (256), one fixed batch of random data, cross-entropy,
``ms.value_and_grad`` and ``nn.Momentum``, on the CPU (``OMP_NUM_THREADS=1``). Contenders:

- ``off``: the loop unrecorded; ``off2``: the same again, a control that shows the noise;
- ``auto-md5``: no detcheck code in the trial: the process is started with a launch's variables
  (``DETCHECK_TRACE_DIR`` and the rest), so the start-up hook records it: the model's input,
  every cell's output, the loss, every gradient and every parameter, every step, md5 mode,
  with the evidence of causes;
- ``watch-md5``: the loop calls ``detcheck.mindspore.watch(model, writer, optimizer)``.

Method (python/bench/overhead.py's, for torch): every trial is a fresh process; it builds the
model (same seed), runs ``--warmup`` steps, then times ``--steps`` steps with ``perf_counter``;
for detcheck the timed span ends with ``writer.flush()`` (every record hashed and written).
Rounds run every contender once, in an order rotated by one each round; a contender's ratio is
its time over ``off``'s in the same round, reported as the median and the min-max over rounds.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONTENDERS = ["off", "auto-md5", "watch-md5", "off2"]


def build(args):
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    ms.set_seed(0)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    sizes = [int(s) for s in args.sizes.split(",")]
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Dense(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    model = nn.SequentialCell(layers)
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((args.batch, sizes[0])).astype(np.float32))
    y = ms.Tensor(rng.integers(0, sizes[-1], size=args.batch).astype(np.int32))
    return ms, model, x, y


def run_trial(args, folder):
    ms, model, x, y = build(args)
    from mindspore import nn

    loss_fn = nn.CrossEntropyLoss()
    optimizer = nn.Momentum(model.trainable_params(), learning_rate=0.01, momentum=0.9)

    def forward(x, y):
        return loss_fn(model(x), y)

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)
    writer = handle = None
    if args.trial == "watch-md5":
        import detcheck
        import detcheck.mindspore

        writer = detcheck.TraceWriter(folder, 0, 1, mode="md5")
        handle = detcheck.mindspore.watch(model, writer, optimizer)

    def step():
        loss, grads = grad_fn(x, y)
        optimizer(grads)
        return loss

    for _ in range(args.warmup):
        step().asnumpy()
    if args.trial.startswith("auto-"):
        writer = sys.modules["detcheck._mindspore.auto"]._recorder._writer
    if writer is not None:
        writer.flush()
    before = writer.num_records if writer is not None else 0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step().asnumpy()  # a loop reads its loss: the step's work is done when it returns
    if writer is not None:
        writer.flush()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    result = {"seconds_per_step": wall / args.steps, "cpu_per_step": cpu / args.steps}
    if writer is not None:
        result["records_per_step"] = (writer.num_records - before) / args.steps
    if handle is not None:
        handle.remove()
        writer.close()
    return result


def run_child(args, contender):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    folder = tempfile.mkdtemp(prefix="detcheck-ms-overhead-")
    cmd = [sys.executable, __file__, "--trial", contender, "--out", out]
    cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    cmd += ["--sizes", args.sizes, "--batch", str(args.batch)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DETCHECK_")}
    env.update(OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    if contender.startswith("auto-"):
        env.update(
            DETCHECK_TRACE_DIR=folder,
            DETCHECK_WORLD_SIZE="1",
            DETCHECK_RANK="0",
            DETCHECK_MODE="md5",
        )
    try:
        done = subprocess.run(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=folder
        )
        if done.returncode != 0:
            raise SystemExit(f"trial {contender} failed:\n{done.stderr[-4000:]}")
        return json.loads(Path(out).read_text())
    finally:
        os.unlink(out)
        shutil.rmtree(folder, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per trial")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    parser.add_argument("--sizes", default="784,1024,1024,10", help="the MLP's layer widths")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--trial", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial:
        folder = Path(tempfile.mkdtemp(prefix="detcheck-ms-trial-"))
        try:
            result = run_trial(args, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        Path(args.out).write_text(json.dumps(result))
        return

    contenders = args.contenders.split(",")
    if "off" not in contenders or any(c not in CONTENDERS for c in contenders):
        parser.error(f"contenders from {CONTENDERS}, `off` among them")
    import mindspore

    print(
        f"MLP {args.sizes.replace(',', '-')}, batch {args.batch}, Momentum, PyNative, "
        f"OMP_NUM_THREADS=1; mindspore {mindspore.__version__}; {args.rounds} rounds x "
        f"{args.steps} timed steps (after {args.warmup}), rotated order",
        flush=True,
    )
    per = {c: [] for c in contenders}
    ratios = {c: [] for c in contenders}
    for r in range(args.rounds):
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        got = {c: run_child(args, c) for c in order}
        for c in contenders:
            per[c].append(got[c])
            ratios[c].append(got[c]["seconds_per_step"] / got["off"]["seconds_per_step"])
        print(
            f"round {r + 1}: "
            + ", ".join(f"{c} {got[c]['seconds_per_step'] * 1e3:.2f} ms" for c in contenders),
            flush=True,
        )
    print()
    print(
        "| contender | ms/step (median) | vs off (median of rounds) | range | CPU / off's |", end=""
    )
    print(" records/step |")
    print("| --- | ---: | ---: | --- | ---: | ---: |")
    off_cpu = statistics.median(t["cpu_per_step"] for t in per["off"])
    for c in contenders:
        ms_step = statistics.median(t["seconds_per_step"] for t in per[c]) * 1e3
        ratio = statistics.median(ratios[c])
        lo, hi = min(ratios[c]), max(ratios[c])
        cpu = statistics.median(t["cpu_per_step"] for t in per[c]) / off_cpu
        recs = per[c][0].get("records_per_step", 0)
        print(f"| {c} | {ms_step:.2f} | {ratio:.3f}x | {lo:.3f}-{hi:.3f} | {cpu:.3f}x | {recs:g} |")


if __name__ == "__main__":
    main()
