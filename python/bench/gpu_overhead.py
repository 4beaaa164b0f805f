#!/usr/bin/env python3
"""Recording a GPU training step: step time with recording off, through the host (a copy per
record), and with device digests (``detcheck._torch.device``'s Triton kernels), side by side.

    python python/bench/gpu_overhead.py [--rounds 7] [--steps 10] [--warmup 3] [--json OUT]

The model is GPT-2 124M built from its config (transformers' ``GPT2LMHeadModel``, no download:
12 layers, 768 wide, 50257 tokens; the same shapes in plain torch where transformers is
missing), batch 8 x 512 of fixed random tokens, bf16 autocast, AdamW, on one CUDA device.
Contenders (``--contenders``):

- ``off`` and ``off2`` (the same again: the noise);
- ``host-md5`` / ``host-stats``: ``detcheck.torch.watch(..., device_digests=False)``, the path
  before device digests: every record copied to the host and hashed there;
- ``device-md5`` / ``device-stats``: ``watch(..., device_digests=True)``;
- any of these with ``-RECORDS`` after it records only those kinds (``watch``'s ``records``,
  joined by ``+``): ``device-md5-grad+param`` leaves out the module outputs, ``device-md5-param``
  records the parameters alone. What recording every k-th step costs follows from a contender's
  ratio r: about 1 + (r - 1) / k.

Every watched step records every module's output, every gradient and every parameter
(``records`` all) into a ``detcheck.TraceWriter`` in a fresh temporary folder. A trial runs
``--warmup`` steps, then times ``--steps`` steps (``torch.cuda.synchronize()`` before the clock
starts and before it stops, and the writer's ``flush()`` inside the timed span: the records of
the last step are paid for). Rounds run every contender once, in an order rotated by one each
round, in this one process (the model and optimizer are built once; each trial starts from the
same weights); a contender's ratio is its median step time over ``off``'s in the same round,
reported as the median and min-max over rounds.

With ``--profile DIR``, first one step each of ``off``, ``device-md5`` and ``device-stats``
under ``torch.profiler`` (after the warmup): Chrome traces, ``key_averages`` tables and a
summary per step (GPU busy time by category: detcheck's digest and statistics kernels, copies,
the program's kernels; each stream's busy time; the GPU span; host launch calls; host waits).

Then the throughputs: the tree digest of 1-256 MiB buffers on the device (GB/s) against a device
copy of the same bytes (``torch.clone``: read + write), and the totals kernel likewise.

Nothing here runs without CUDA: the script says so and exits 2.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

CONTENDERS = ["off", "host-md5", "host-stats", "device-md5", "device-stats", "off2"]


def gpt2_without_transformers():
    """GPT-2 124M's shapes in plain torch (pre-norm blocks, causal attention through
    ``scaled_dot_product_attention``, tied head), for a machine without transformers."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(768), nn.LayerNorm(768)
            self.c_attn, self.c_proj = nn.Linear(768, 3 * 768), nn.Linear(768, 768)
            self.mlp = nn.Sequential(nn.Linear(768, 3072), nn.GELU("tanh"), nn.Linear(3072, 768))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).view(b, t, 3, 12, 64).permute(2, 0, 3, 1, 4)
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(a.transpose(1, 2).reshape(b, t, 768))
            return x + self.mlp(self.ln_2(x))

    class GPT2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(50257, 768), nn.Embedding(1024, 768)
            self.h = nn.ModuleList(Block() for _ in range(12))
            self.ln_f = nn.LayerNorm(768)
            for p in self.parameters():  # GPT-2's initialisation: N(0, 0.02) weights
                if p.dim() > 1:
                    nn.init.normal_(p, std=0.02)

        def forward(self, input_ids, labels):
            x = self.wte(input_ids) + self.wpe(
                torch.arange(input_ids.shape[1], device=input_ids.device)
            )
            for block in self.h:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.T
            loss = nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, 50257).float(), labels[:, 1:].reshape(-1)
            )
            return type("Output", (), {"loss": loss})()

    return GPT2()


def build(device):
    import torch

    torch.manual_seed(0)
    try:
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config()).to(device)
    except ImportError:
        print("transformers is not installed: GPT-2 124M in plain torch", flush=True)
        model = gpt2_without_transformers().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 50257, (8, 512), device=device)
    state = ({k: v.clone() for k, v in model.state_dict().items()}, optimizer.state_dict())
    return model, optimizer, tokens, state


def step(model, optimizer, tokens):
    import torch

    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    optimizer.step()


@contextlib.contextmanager
def recording(contender, model, optimizer, state):
    """The model and optimizer back at ``state``, and recorded as ``contender`` says (``off*``:
    not at all) until the block ends; yields the writer (``None`` when off)."""
    import detcheck
    import detcheck.torch as dt

    model.load_state_dict(state[0])
    optimizer.load_state_dict(state[1])
    if contender.startswith("off"):
        yield None
        return
    path, mode, *which = contender.split("-")
    records = which[0].split("+") if which else dt.RECORDS
    with tempfile.TemporaryDirectory() as folder:
        writer = detcheck.TraceWriter(folder, 0, 1, mode)
        handle = dt.watch(
            model, writer, optimizer, device_digests=(path == "device"), records=records
        )
        try:
            yield writer
        finally:
            handle.remove()
            writer.close()


def trial(contender, model, optimizer, tokens, state, steps, warmup):
    import torch

    with recording(contender, model, optimizer, state) as writer:
        times = []
        for i in range(warmup + steps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            step(model, optimizer, tokens)
            if i == warmup + steps - 1 and writer is not None:
                writer.flush()
            torch.cuda.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - start)
    return statistics.median(times)


#: What a GPU event of the trace is, by its name: detcheck's kernels, copies, the rest.
CATEGORIES = (
    ("digest kernels", ("_md5_chunks_kernel",)),
    ("statistics kernels", ("_stats_partials_kernel", "_stats_finish_kernel")),
    ("copies and fills", ("Memcpy", "Memset", "copy_kernel", "CatArrayBatchedCopy")),
)


def category(name):
    for label, parts in CATEGORIES:
        if any(part in name for part in parts):
            return label
    return "program's kernels"


def summarize_trace(path):
    """What one profiled step did, from its Chrome trace (Kineto's JSON): per category of GPU
    event the count and busy time, each stream's busy time, the span from the first GPU event
    to the last, the host's launch calls and the host's waits for the device."""
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    summary = {"categories": {}, "streams": {}, "launches": 0, "host_waits_ms": 0.0}
    for e in gpu:
        row = summary["categories"].setdefault(category(e["name"]), {"count": 0, "ms": 0.0})
        row["count"] += 1
        row["ms"] += e["dur"] / 1e3
        stream = str(e.get("args", {}).get("stream", e.get("tid")))
        summary["streams"][stream] = summary["streams"].get(stream, 0.0) + e["dur"] / 1e3
    if gpu:
        first = min(e["ts"] for e in gpu)
        summary["gpu_span_ms"] = (max(e["ts"] + e["dur"] for e in gpu) - first) / 1e3
    for e in events:
        if e.get("cat") not in ("cuda_runtime", "cuda_driver"):
            continue
        if "LaunchKernel" in e["name"]:
            summary["launches"] += 1
        if "Synchronize" in e["name"]:
            summary["host_waits_ms"] += e["dur"] / 1e3
    return summary


def profile(contenders, model, optimizer, tokens, state, warmup, directory):
    """One step of each contender under torch.profiler after ``warmup`` steps: its Chrome trace
    (``trace-CONTENDER.json``) and its summary (``summarize_trace``) in ``directory``; returns
    the summaries by contender."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    os.makedirs(directory, exist_ok=True)
    summaries = {}
    for contender in contenders:
        with recording(contender, model, optimizer, state) as writer:
            for _ in range(warmup):
                step(model, optimizer, tokens)
            torch.cuda.synchronize()
            activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
            with torch_profile(activities=activities) as prof:
                step(model, optimizer, tokens)
                if writer is not None:
                    writer.flush()
                torch.cuda.synchronize()
        trace = os.path.join(directory, f"trace-{contender}.json")
        prof.export_chrome_trace(trace)
        with open(os.path.join(directory, f"table-{contender}.txt"), "w") as f:
            f.write(prof.key_averages().table(sort_by="self_device_time_total", row_limit=40))
        summaries[contender] = summarize_trace(trace)
        s = summaries[contender]
        print(
            f"profile {contender}: GPU span {s.get('gpu_span_ms', 0.0):.1f} ms, "
            f"{s['launches']} launches, host waits {s['host_waits_ms']:.1f} ms; "
            + "; ".join(
                f"{label} {row['count']} x, {row['ms']:.1f} ms"
                for label, row in sorted(s["categories"].items())
            )
            + "; streams "
            + ", ".join(f"{k}: {v:.1f} ms" for k, v in sorted(s["streams"].items())),
            flush=True,
        )
    return summaries


def throughput(device):
    import torch
    from detcheck._torch import device as _device

    rows = []
    for mib in (1, 16, 64, 256):
        x = torch.randn(mib << 18, device=device)  # f32: mib MiB
        out = torch.empty(16, dtype=torch.uint8, device=device)
        totals = torch.empty(7, dtype=torch.float64, device=device)
        for name, fn in (
            ("copy", lambda x=x: x.clone()),
            ("digest", lambda x=x, out=out: _device.tree_digest_into(x, out)),
            ("totals", lambda x=x, totals=totals: _device.stats_totals_into(x, totals)),
        ):
            fn()
            torch.cuda.synchronize()
            runs = []
            for _ in range(7):
                start = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                runs.append(time.perf_counter() - start)
            rows.append(
                {"mib": mib, "kernel": name, "gb_s": (mib << 20) / statistics.median(runs) / 1e9}
            )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="first profile one step of off, device-md5 and device-stats (torch.profiler): "
        "Chrome traces, tables and summaries into DIR",
    )
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_overhead.py: no CUDA device: this benchmark runs on a GPU", file=sys.stderr)
        return 2
    contenders = args.contenders.split(",")
    model, optimizer, tokens, state = build("cuda")
    profiles = None
    if args.profile:
        profiled = ["off", "device-md5", "device-stats"]
        profiles = profile(profiled, model, optimizer, tokens, state, args.warmup, args.profile)
    rounds = []
    for r in range(args.rounds):
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        times = {
            c: trial(c, model, optimizer, tokens, state, args.steps, args.warmup) for c in order
        }
        rounds.append(times)
        print(
            f"round {r}: " + ", ".join(f"{c} {times[c] * 1e3:.1f} ms" for c in contenders),
            flush=True,
        )
    summary = {}
    for c in contenders:
        ratios = [t[c] / t["off"] for t in rounds]
        summary[c] = {
            "step_ms": statistics.median(t[c] for t in rounds) * 1e3,
            "ratio": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
        }
        s = summary[c]
        print(
            f"{c:>13}: {s['step_ms']:8.1f} ms/step, {s['ratio']:.3f}x off "
            f"({s['min']:.3f}-{s['max']:.3f})"
        )
    rows = throughput("cuda")
    for row in rows:
        print(f"{row['kernel']:>7} {row['mib']:4d} MiB: {row['gb_s']:8.1f} GB/s")
    if args.json:
        with open(args.json, "w") as f:
            figures = {"rounds": rounds, "summary": summary, "throughput": rows}
            json.dump(dict(figures, profiles=profiles), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
