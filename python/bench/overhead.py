#!/usr/bin/env python3
"""Recording overhead on a PyTorch model: detcheck's Python writer against the same model
unrecorded and against msprobe's dump (mindstudio-probe), step time side by side.

    python python/bench/overhead.py [--rounds 10] [--steps 30] [--sizes 784,1024,1024,10]

The model is an MLP (``--sizes``: Linear layers with ReLU between them), batch ``--batch`` (256),
one fixed batch of random data, cross-entropy, SGD with momentum (or ``--optimizer adam``), on
the CPU with one torch thread. With ``--numpy-batch`` the batch is a numpy array that enters
torch at every step, as a loop that reads its data with numpy does (``torch.from_numpy`` for
the inputs, ``torch.as_tensor`` for the labels): what the zero-change recorder's digest of
values entering torch costs (docs/causes.md, ``data/outside``). Contenders (``--contenders``,
comma-separated):

- ``off``: the model unrecorded; ``off2``: the same again, a control that shows the noise;
- ``detcheck-stats`` / ``detcheck-md5``: ``detcheck.torch.watch(model, writer, optimizer)`` on a
  ``detcheck.TraceWriter`` in that mode: every module's output, every gradient and every
  parameter, every step;
- ``auto-md5`` / ``auto-stats``: no detcheck code in the trial: the process is started with a
  launch's variables (``DETCHECK_TRACE_DIR`` and the rest), so the wheel's start-up hook records
  the unmodified program (zero-change recording, ``detcheck._torch.auto``): ``watch``'s records plus
  the model's input, every step, and the evidence of causes (docs/causes.md);
  ``auto-md5-plain``: the same without that evidence (``DETCHECK_EVIDENCE=0``);
- ``msprobe-L0-md5`` / ``msprobe-L1-md5`` / ``msprobe-mix-md5`` / ``msprobe-L0-stats``:
  msprobe's ``PrecisionDebugger`` (task ``statistics``, that level and ``summary_mode``),
  ``debugger.start(model)`` at the top of each step, ``debugger.stop()`` and
  ``debugger.step()`` at its end.

Method: every trial is a fresh process (msprobe's debugger is a process-wide singleton that
patches torch) writing into a fresh temporary folder, removed afterwards. A trial builds the
model (same seed), runs ``--warmup`` steps, then times ``--steps`` steps with ``perf_counter``
inside the training loop; for detcheck the timed span ends with ``writer.flush()`` (the records
handed to the background thread are all hashed and written), so a backlog is paid for, while
the writer's ``close()`` (footer, fsync, rename) and process start are not timed. The trial's
figure is that span divided by the steps. Rounds run every contender once, in an order rotated
by one each round; a contender's ratio is its time over ``off``'s in the same round, reported as
the median and the min-max over the rounds; ``best`` is the contender's fastest trial over
``off``'s fastest (the least disturbed of each, on a shared machine). A ratio below 1.0 for a
contender that does more work than ``off`` is noise, and a warning line says so. ``cpu`` is the
process CPU time per step over ``off``'s (the cost where no core is idle), ``cores`` the CPU
time of the timed span over its wall time (above 1: a second core was used).

``--quiet-wait S`` waits before each trial, up to S seconds, for a second in which the machine is
at most 15% busy (/proc/stat), so that on a shared machine trials start when others are idle.

Once (the first detcheck trial of each mode), the trace is read back with scripts/dctrace.py:
records per step must be modules + 2 x parameters, and the last step's ``param/*`` md5s must
be ``hashlib.md5`` of the parameters' bytes at the end.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DCTRACE = ROOT / "scripts" / "dctrace.py"

CONTENDERS = [
    "off",
    "detcheck-stats",
    "detcheck-md5",
    "msprobe-L0-md5",
    "msprobe-L1-md5",
    "msprobe-L0-stats",
    "off2",
]
ALL_CONTENDERS = CONTENDERS + ["msprobe-mix-md5", "auto-md5", "auto-stats", "auto-md5-plain"]

RECORD = re.compile(
    r"^step (?P<step>\d+) seq \d+ (?P<name>\S+) (?P<dtype>\w+)\[(?P<shape>[^\]]*)\] "
    r"md5 (?P<md5>[0-9a-f]{32})"
)
DTYPE_BYTES = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "u8": 1, "bool": 1}


# ----------------------------------------------------------------------------------------------
# One trial (a child process)


def build(args):
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)
    sizes = [int(s) for s in args.sizes.split(",")]
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        if i:
            layers.append(torch.nn.ReLU())
        layers.append(torch.nn.Linear(a, b))
    model = torch.nn.Sequential(*layers)
    if args.optimizer == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch, sizes[0])
    y = torch.randint(0, sizes[-1], (args.batch,))
    return torch, model, optimizer, x, y


def msprobe_debugger(contender, folder):
    _, level, summary = contender.split("-")
    config = {
        "task": "statistics",
        "dump_path": str(folder / "dump"),
        "rank": [],
        "step": [],
        "level": level,
        "async_dump": False,
        "statistics": {
            "scope": [],
            "list": [],
            "data_mode": ["all"],
            "summary_mode": "statistics" if summary == "stats" else "md5",
        },
    }
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    from msprobe.pytorch import PrecisionDebugger

    return PrecisionDebugger(config_path=str(path))


def count_msprobe_tensors(folder):
    """Tensors per step (and their bytes) in the last step's dump.json."""
    dumps = sorted(folder.glob("dump/step*/*/dump.json"), key=lambda p: int(p.parts[-3][4:]))
    if not dumps:
        return None, None
    data = json.loads(dumps[-1].read_text())["data"]
    count, nbytes = 0, 0

    def walk(value):
        nonlocal count, nbytes
        if isinstance(value, dict):
            if value.get("type") == "torch.Tensor":
                count += 1
                n = 1
                for d in value.get("shape", []):
                    n *= d
                nbytes += n * {"torch.float32": 4}.get(value.get("dtype"), 4)
                return
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(data)
    return count, nbytes


def decode(path):
    out = subprocess.run(
        [sys.executable, str(DCTRACE), str(path)], capture_output=True, text=True, check=True
    ).stdout
    records = []
    for line in out.splitlines():
        if not line.startswith("step "):
            continue
        m = RECORD.match(line)
        step, name, dtype, md5 = int(m["step"]), m["name"], m["dtype"], m["md5"]
        n = 1
        for d in m["shape"].split(","):
            if d.strip():
                n *= int(d)
        records.append((step, name, n * DTYPE_BYTES[dtype], md5))
    return records


def tree_digest(data):
    """A record's digest (docs/trace-format.md, "The digest"): md5 of each 4096-byte chunk,
    concatenated, again, until one chunk remains, whose plain md5 is the digest."""
    while len(data) > 4096:
        data = b"".join(hashlib.md5(data[i : i + 4096]).digest() for i in range(0, len(data), 4096))
    return hashlib.md5(data).digest()


def check_trace(path, model, steps):
    """Records per step = modules + 2 x parameters; the last param/* digests are the
    parameters'."""
    records = decode(path)
    modules = len(list(model.named_modules()))
    params = list(model.named_parameters())
    expected = modules + 2 * len(params)
    per_step = {}
    for step, *_ in records:
        per_step[step] = per_step.get(step, 0) + 1
    assert sorted(per_step) == list(range(steps)), sorted(per_step)
    bad = {s: n for s, n in per_step.items() if n != expected}
    assert not bad, f"records per step {bad}, expected {expected}"
    last = {name: md5 for step, name, _, md5 in records if step == steps - 1}
    for name, p in params:
        want = tree_digest(p.detach().numpy().tobytes()).hex()
        assert last["param/" + name] == want, name
    return expected, modules, len(params)


def trial(args):
    folder = Path(tempfile.mkdtemp(prefix="detcheck-overhead-"))
    try:
        result = run_trial(args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    Path(args.out).write_text(json.dumps(result))


def run_trial(args, folder):
    torch, model, optimizer, x, y = build(args)
    loss_fn = torch.nn.CrossEntropyLoss()
    contender = args.trial
    writer = handle = debugger = None
    if contender.startswith("detcheck-"):
        import detcheck
        import detcheck.torch

        writer = detcheck.TraceWriter(folder, 0, 1, mode=contender.split("-")[1])
        handle = detcheck.torch.watch(model, writer, optimizer)
    elif contender.startswith("msprobe-"):
        debugger = msprobe_debugger(contender, folder)

    if args.numpy_batch:
        x_numpy, y_numpy = x.numpy(), y.numpy()

    def step():
        if debugger is not None:
            debugger.start(model)
        optimizer.zero_grad()
        if args.numpy_batch:
            xb, yb = torch.from_numpy(x_numpy), torch.as_tensor(y_numpy)
        else:
            xb, yb = x, y
        loss_fn(model(xb), yb).backward()
        optimizer.step()
        if debugger is not None:
            debugger.stop()
            debugger.step()

    for _ in range(args.warmup):
        step()
    if contender.startswith("auto-"):
        # The zero-change recorder's writer: the start-up hook opened it at the first forward.
        writer = sys.modules["detcheck._torch.auto"]._recorder._writer
    if writer is not None and hasattr(writer, "flush"):
        writer.flush()
    records_before = writer.num_records if writer is not None else 0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    times = []
    for _ in range(args.steps):
        s = time.perf_counter()
        step()
        times.append(time.perf_counter() - s)
    if writer is not None and hasattr(writer, "flush"):
        writer.flush()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    result = {
        "seconds_per_step": wall / args.steps,
        "median_step": statistics.median(times),
        "cpu_per_step": cpu / args.steps,
        "cpu_ratio": cpu / wall,
        "load": os.getloadavg()[0],
    }
    if contender.startswith("auto-"):
        result["records_per_step"] = (writer.num_records - records_before) / args.steps
        return result  # the recorder finishes its trace at exit
    if writer is not None:
        records = writer.num_records - records_before
        handle.remove()
        writer.close()
        result["records_per_step"] = records / args.steps
        if args.check:
            expected, modules, params = check_trace(writer.path, model, args.warmup + args.steps)
            result["check"] = (
                f"{expected} records per step = {modules} modules + 2 x {params} "
                f"parameters; last step's param md5s = hashlib's"
            )
        last = [r for r in decode(writer.path) if r[0] == args.warmup + args.steps - 1]
        result["bytes_per_step"] = sum(r[2] for r in last)
    if debugger is not None:
        count, nbytes = count_msprobe_tensors(folder)
        result["records_per_step"] = count
        result["bytes_per_step"] = nbytes
    return result


# ----------------------------------------------------------------------------------------------
# The driver


def run_child(args, contender, check):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [
        sys.executable,
        __file__,
        "--trial",
        contender,
        "--out",
        out,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--sizes",
        args.sizes,
        "--batch",
        str(args.batch),
        "--optimizer",
        args.optimizer,
    ]
    if check:
        cmd.append("--check")
    if args.numpy_batch:
        cmd.append("--numpy-batch")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    launch = None
    if contender.startswith("auto-"):
        launch = tempfile.mkdtemp(prefix="detcheck-overhead-launch-")
        env.update(
            DETCHECK_TRACE_DIR=launch,
            DETCHECK_WORLD_SIZE="1",
            DETCHECK_RANK="0",
            DETCHECK_MODE=contender.split("-")[1],
        )
        if contender.endswith("-plain"):
            env["DETCHECK_EVIDENCE"] = "0"  # no evidence of causes (docs/causes.md)
    try:
        done = subprocess.run(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
        )
        if done.returncode != 0:
            raise SystemExit(f"trial {contender} failed:\n{done.stderr[-4000:]}")
        return json.loads(Path(out).read_text())
    finally:
        os.unlink(out)
        if launch is not None:
            shutil.rmtree(launch, ignore_errors=True)


def busy_fraction(seconds=1.0):
    """The fraction of the machine's CPU time that was busy over ``seconds`` (Linux), or None."""

    def sample():
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except OSError:
        return None
    total = total1 - total0
    return 1.0 - (idle1 - idle0) / total if total else None


def wait_for_quiet(max_wait, threshold=0.15):
    """Waits (up to ``max_wait`` seconds) for a second in which the machine was at most
    ``threshold`` busy; returns whether it found one."""
    deadline = time.monotonic() + max_wait
    while True:
        busy = busy_fraction()
        if busy is None or busy <= threshold:
            return True
        if time.monotonic() >= deadline:
            return False


def median_interval(values, reps=2000, seed=0):
    """A 95% bootstrap interval ``(low, high)`` of the median of ``values`` (seeded draws: the
    same values give the same interval)."""
    import random

    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(reps))
    return meds[int(0.025 * reps)], meds[int(0.975 * reps)]


def median_ci(values):
    """Half the width of ``median_interval``."""
    low, high = median_interval(values)
    return (high - low) / 2


def quantiles(values):
    values = sorted(values)
    return statistics.median(values), values[0], values[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per trial")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    parser.add_argument("--sizes", default="784,1024,1024,10", help="the MLP's layer widths")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    parser.add_argument(
        "--numpy-batch",
        action="store_true",
        help="the batch enters torch from numpy at every step (torch.from_numpy, as_tensor)",
    )
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help=f"comma-separated, from {','.join(ALL_CONTENDERS)}",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each trial, wait up to this long for a second in which the "
        "machine is at most 15%% busy (a shared machine)",
    )
    parser.add_argument("--json", help="also write every trial's figures to this file")
    parser.add_argument("--trial", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial:
        return trial(args)

    contenders = args.contenders.split(",")
    unknown = [c for c in contenders if c not in ALL_CONTENDERS]
    if unknown or "off" not in contenders:
        parser.error(f"unknown contenders {unknown} (and `off` is needed)")
    import torch

    print(
        f"MLP {args.sizes.replace(',', '-')}, batch {args.batch}"
        f"{' (from numpy each step)' if args.numpy_batch else ''}, {args.optimizer}, one thread; "
        f"torch {torch.__version__}; {args.rounds} rounds x {args.steps} timed steps "
        f"(+{args.warmup} warm-up) per trial; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    results = {c: [] for c in contenders}
    checked = set()
    noisy = 0
    for r in range(args.rounds):
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        line = []
        for c in order:
            check = c.startswith("detcheck-") and c not in checked
            if args.quiet_wait > 0 and not wait_for_quiet(args.quiet_wait):
                noisy += 1
            res = run_child(args, c, check)
            if "check" in res:
                checked.add(c)
                print(f"  check ({c}): {res['check']}", flush=True)
            results[c].append(res)
            line.append(f"{c} {res['seconds_per_step'] * 1e3:.1f}")
        print(
            f"round {r + 1}: " + ", ".join(line) + " ms/step"
            f" (load average {os.getloadavg()[0]:.2f})",
            flush=True,
        )

    off = [res["seconds_per_step"] for res in results["off"]]
    off_cpu = [res["cpu_per_step"] for res in results["off"]]
    print()
    print(
        "vs off: median of the rounds' ratios to off, +- half its 95% bootstrap interval, and "
        "their range; best: the fastest trial over off's fastest; cpu: process CPU time per "
        "step over off's (median ratio); cores: CPU time / wall time"
    )
    print(
        f"{'contender':<18} {'ms/step':>8} {'vs off':>7} {'+-':>6} {'range':>13} {'best':>6} "
        f"{'cpu':>6} {'cores':>5} {'tensors/step':>12} {'MB/step':>8} {'MB/s':>6}"
    )
    warnings = []
    for c in contenders:
        times = [res["seconds_per_step"] for res in results[c]]
        ratios = [t / o for t, o in zip(times, off)]
        med, lo, hi = quantiles(ratios)
        ci = median_ci(ratios)
        best = min(times) / min(off)
        cpu_ratio = statistics.median(
            res["cpu_per_step"] / o for res, o in zip(results[c], off_cpu)
        )
        ms = statistics.median(times) * 1e3
        cores = statistics.median(res["cpu_ratio"] for res in results[c])
        first = results[c][0]
        tensors = first.get("records_per_step")
        mb = first.get("bytes_per_step")
        mb = mb / 1e6 if mb else None
        rate = mb / (ms / 1e3) if mb and c.startswith("detcheck-") else None
        print(
            f"{c:<18} {ms:8.2f} {med:6.3f}x {ci:6.3f} {lo:6.3f}-{hi:<6.3f} {best:5.3f}x "
            f"{cpu_ratio:5.3f}x "
            f"{cores:5.2f} {tensors if tensors is not None else '':>12} "
            f"{f'{mb:.1f}' if mb else '':>8} {f'{rate:.0f}' if rate else '':>6}"
        )
        if c not in ("off", "off2") and med < 1.0:
            warnings.append(
                f"WARNING: {c} at {med:.3f}x off does more work than off: a ratio "
                f"below 1.0 is noise (its rounds range {lo:.3f}-{hi:.3f})"
            )
        elif c not in ("off", "off2") and lo < 1.0:
            warnings.append(
                f"WARNING: {c}: some rounds below 1.0x off ({lo:.3f}), which is "
                f"noise: it does more work than off"
            )
    if args.quiet_wait > 0:
        total = args.rounds * len(contenders)
        print(
            f"{noisy} of {total} trials started without a quiet second "
            f"(waited up to {args.quiet_wait:.0f} s for one)"
        )
    for w in warnings:
        print(w)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
