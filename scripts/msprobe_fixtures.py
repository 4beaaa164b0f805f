#!/usr/bin/env python3
"""Generates the msprobe dumps under tests/fixtures/msprobe/ with a real mindstudio-probe.

    /work/torchvenv/bin/python scripts/msprobe_fixtures.py [OUT]     # default tests/fixtures/msprobe

Needs torch and mindstudio-probe (26.2 made the checked-in files: torch 2.15, CPU only). Each case
runs in its own process (msprobe's PrecisionDebugger is a singleton configured once per process):
a tiny model, Linear(3, 2) -> relu -> sum, forward and backward, seeded, so two runs write the
same values. What each case leaves, as msprobe 26.2 writes it:

  md5_L1/      task statistics, summary_mode md5, level L1 (APIs), one process, 2 steps:
               step{0,1}/proc{PID}/dump.json (no rank is known without torch.distributed)
  stats_L0/    task statistics, summary_mode statistics, level L0 (modules: parameters,
               parameters_grad), one process, 1 step
  tensor_L1/   task tensor, level L1, one process, 1 step: dump.json (statistics, no md5) and
               dump_tensor_data/{record}.pt, one torch.save zip per tensor, named in the record's
               `data_name`; dump_data_dir in dump.json is the absolute path at dump time
  nan_L1/      task statistics, summary_mode statistics: a tensor holding Inf and NaN, an empty
               one and a bfloat16 one; Python's json writes the literals NaN and Infinity
  dist_md5_L1/ task statistics, summary_mode md5, level L1, 2 processes under torch.distributed
               (gloo, on this host), one all_reduce: step0/rank{0,1}/dump.json

stack.json (call stacks with this machine's paths) is deleted; construct.json (module tree) is
kept. The process ids in proc{PID} are whatever this run got: tests never depend on them.
msprobe's PyTorch tensor mode writes .pt files, not .npy (.npy is what its MindSpore side and
its numpy arrays of strings write); tests/fixtures/msprobe/npy/ is made by numpy here (np.save,
the call msprobe uses), in the layouts detcheck reads.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile


def run_case(out, task, mode, level, steps, tensor_list=None):
    import torch
    from msprobe.pytorch import PrecisionDebugger

    cfg = {
        "task": task,
        "dump_path": out,
        "rank": [],
        "step": [],
        "level": level,
        "async_dump": False,
        "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": mode},
        "tensor": {"scope": [], "list": tensor_list or [], "data_mode": ["all"]},
    }
    config = out + ".config.json"
    with open(config, "w") as f:
        json.dump(cfg, f)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
    debugger = PrecisionDebugger(config_path=config)
    for _ in range(steps):
        debugger.start(model)
        x = torch.randn(2, 3)
        model(x).sum().backward()
        model.zero_grad()
        debugger.stop()
        debugger.step()


def run_nan(out):
    import torch
    from msprobe.pytorch import PrecisionDebugger

    cfg = {
        "task": "statistics",
        "dump_path": out,
        "rank": [],
        "step": [],
        "level": "L1",
        "async_dump": False,
        "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
    }
    config = out + ".config.json"
    with open(config, "w") as f:
        json.dump(cfg, f)
    debugger = PrecisionDebugger(config_path=config)
    debugger.start()
    torch.nn.functional.relu(torch.tensor([1.0, float("inf")]))
    torch.nn.functional.relu(torch.tensor([1.0, float("nan")]))
    torch.tensor([], dtype=torch.float16).exp()
    torch.ones(2, dtype=torch.bfloat16) * 3
    debugger.stop()
    debugger.step()


def run_dist(out):
    import torch
    import torch.distributed as dist
    from msprobe.pytorch import PrecisionDebugger

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = {
        "task": "statistics",
        "dump_path": out,
        "rank": [],
        "step": [],
        "level": "L1",
        "async_dump": False,
        "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "md5"},
    }
    config = f"{out}.config{rank}.json"
    with open(config, "w") as f:
        json.dump(cfg, f)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    debugger = PrecisionDebugger(config_path=config)
    debugger.start(model)
    x = torch.randn(2, 3) + rank
    model(x).sum().backward()
    dist.all_reduce(model.weight.grad)
    debugger.stop()
    debugger.step()
    dist.destroy_process_group()


def write_npy(out):
    """Tensor-mode dumps with .npy files (as msprobe's MindSpore side writes them)."""
    import numpy as np

    def one(name, a, b_change):
        rank = os.path.join(out, name, "step0", "rank0")
        data = os.path.join(rank, "dump_tensor_data")
        os.makedirs(data)
        x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=np.float32)
        y = np.maximum(x - 3.0, 0.0).astype(np.float32)
        if b_change:
            y = y.copy()
            y[1, 2] = np.float32(3.0009)
        # A bfloat16 tensor: msprobe converts bf16 to float32 before np.save.
        h = np.array([1.0, -2.5, 65504.0], dtype=np.float16)
        i = np.array([3, -7], dtype=np.int64)
        # Fortran order: the same 2x3 values, column-major on disk.
        f = np.asfortranarray(x)
        np.save(os.path.join(data, "Functional.relu.0.forward.input.0.npy"), x)
        np.save(os.path.join(data, "Functional.relu.0.forward.output.0.npy"), y)
        np.save(os.path.join(data, "Functional.cast.0.forward.output.0.npy"),
                np.array([1.0, 0.5], dtype=np.float32))
        np.save(os.path.join(data, "Functional.half.0.forward.output.0.npy"), h)
        np.save(os.path.join(data, "Functional.index.0.forward.output.0.npy"), i)
        np.save(os.path.join(data, "Functional.fortran.0.forward.output.0.npy"), f)

        def tensor(dtype, arr, data_name):
            a64 = arr.astype(np.float64)
            return {
                "type": "mindspore.Tensor",
                "dtype": dtype,
                "shape": list(arr.shape),
                "Max": float(a64.max()),
                "Min": float(a64.min()),
                "Mean": float(a64.mean()),
                "Norm": float(np.sqrt((a64 * a64).sum())),
                "data_name": data_name,
            }

        doc = {
            "task": "tensor",
            "level": "L1",
            "framework": "mindspore",
            "dump_data_dir": data,
            "data": {
                "Functional.relu.0.forward": {
                    "input_args": [tensor("Float32", x, "Functional.relu.0.forward.input.0.npy")],
                    "input_kwargs": {},
                    "output": [tensor("Float32", y, "Functional.relu.0.forward.output.0.npy")],
                },
                "Functional.cast.0.forward": {
                    "input_args": [],
                    "input_kwargs": {},
                    "output": [tensor("BFloat16", np.array([1.0, 0.5], dtype=np.float32),
                                      "Functional.cast.0.forward.output.0.npy")],
                },
                "Functional.half.0.forward": {
                    "input_args": [],
                    "input_kwargs": {},
                    "output": [tensor("Float16", h, "Functional.half.0.forward.output.0.npy")],
                },
                "Functional.index.0.forward": {
                    "input_args": [],
                    "input_kwargs": {},
                    "output": [tensor("Int64", i, "Functional.index.0.forward.output.0.npy")],
                },
                "Functional.fortran.0.forward": {
                    "input_args": [],
                    "input_kwargs": {},
                    "output": [tensor("Float32", f, "Functional.fortran.0.forward.output.0.npy")],
                },
            },
        }
        with open(os.path.join(rank, "dump.json"), "w") as fp:
            json.dump(doc, fp, indent=1)

    one("a", None, False)
    one("b", None, True)


def tidy(case_dir):
    for root, _dirs, files in os.walk(case_dir):
        for name in files:
            if name == "stack.json" or name.endswith(".config.json"):
                os.remove(os.path.join(root, name))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--case":
        case, out = sys.argv[2], sys.argv[3]
        if case == "nan":
            run_nan(out)
        elif case == "dist":
            run_dist(out)
        else:
            task, mode, level, steps, tensor_list = json.loads(case)
            run_case(out, task, mode, level, steps, tensor_list)
        return
    here = os.path.dirname(os.path.abspath(__file__))
    dest = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "fixtures", "msprobe")
    cases = {
        "md5_L1": ["statistics", "md5", "L1", 2, None],
        "stats_L0": ["statistics", "statistics", "L0", 1, None],
        "tensor_L1": ["tensor", "statistics", "L1", 1, ["relu", "linear"]],
    }
    with tempfile.TemporaryDirectory() as tmp:
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        for name, case in cases.items():
            out = os.path.join(tmp, name)
            subprocess.run([sys.executable, __file__, "--case", json.dumps(case), out], check=True, **quiet)
        subprocess.run([sys.executable, __file__, "--case", "nan", os.path.join(tmp, "nan_L1")], check=True, **quiet)
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--case", "dist", os.path.join(tmp, "dist_md5_L1")],
                env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                **quiet,
            )
            for r in range(2)
        ]
        if any(p.wait() != 0 for p in procs):
            sys.exit("the torch.distributed case failed")
        write_npy(os.path.join(tmp, "npy"))
        if os.path.exists(dest):
            shutil.rmtree(dest)
        os.makedirs(dest)
        for name in list(cases) + ["nan_L1", "dist_md5_L1", "npy"]:
            tidy(os.path.join(tmp, name))
            shutil.copytree(os.path.join(tmp, name), os.path.join(dest, name))
    print(f"wrote {os.path.normpath(dest)}")


if __name__ == "__main__":
    main()
