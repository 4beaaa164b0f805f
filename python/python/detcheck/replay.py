"""Replay of msprobe's API calls: each call of run A run again here on run B's recorded inputs, so
that its error is its own by construction.

    python -m detcheck.replay A B [--out R] [--device cpu|cuda|...] [--format text|json]

A and B are msprobe dumps in tensor mode (level L1 or mix: ``stepN/rankM/dump.json`` or
``stepN/procPID/dump.json`` with ``dump_tensor_data/`` beside it); B is the reference. Run it on
A's machine (the device whose kernels are in question, with its torch): every forward API call
of A (``Functional.*``, ``Torch.*``, ``Tensor.*``) that B also made is called again with B's
recorded tensors and A's own other arguments (``approximate="tanh"``, a dtype, a dim), on
``--device``. The results go into R, a dump in msprobe's layout holding, per replayed call, B's
inputs and the replayed outputs under B's names; then ``detcheck compare --align R B`` judges R
with the one alignment engine (docs/align.md): a replayed output beyond its rounding allowance
is an error the call makes on identical inputs, never one it inherited. This is what
``compare --align A B`` decides by its error-growth rule where inputs differ, decided here by
running the call (msprobe's ``acc_check`` does the like for single APIs on two devices).

Exit codes: 0 every replayed call reproduces B to rounding, 1 one does not (the first culprit is
named), 2 bad input (a dump without tensors, nothing to replay, no ``detcheck`` command), as
``detcheck compare`` (the README's exit-code table).

Determinism: calls are replayed in A's call order, one at a time, with torch's deterministic
algorithms asked for (``warn_only``), so R is the same on a machine each time it is made.

Limits: forward calls only (a backward's inputs are the gradients the autograd graph held, not
arguments to call again); module calls (``Module.*``, ``Cell.*``) are not replayed (their
parameters are not all in a dump); a call whose arguments are not all recorded or of a kind
this module reads (tensors, numbers, strings, None, dtypes, slices and lists of them), or whose
arguments differ in kind between the runs, is listed as not replayed, with why. MindSpore's
``.npy`` dumps are not replayed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: msprobe's prefixes of API calls that are replayed, and where the API is looked up.
NAMESPACES = ("Functional", "Torch", "Tensor")


class NotReplayable(Exception):
    """Why one call is not replayed (a line of the report, never a failure)."""


class ReplayError(Exception):
    """Bad input: the message names the file or folder (exit 2)."""


def dump_files(root: Path) -> dict[tuple[str, int], Path]:
    """The dump.json files of an msprobe dump by (step folder, rank), ranks numbered as
    ``detcheck compare`` numbers them: ``rankM`` is M (a bare ``rank`` 0), a step's ``procPID``
    folders 0, 1, ... in increasing process id."""
    if not root.is_dir():
        raise ReplayError(f"{root}: not a folder (an msprobe dump folder is needed)")
    files = {}
    for step in sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step")):
        ranked, procs = {}, []
        for folder in step.iterdir():
            if not (folder / "dump.json").is_file():
                continue
            if folder.name.startswith("proc") and folder.name[4:].isdigit():
                procs.append((int(folder.name[4:]), folder))
            elif (
                folder.name == "rank"
                or folder.name.startswith("rank")
                and folder.name[4:].isdigit()
            ):
                ranked[int(folder.name[4:] or 0)] = folder
        ranked.update((i, folder) for i, (_, folder) in enumerate(sorted(procs)))
        for rank, folder in ranked.items():
            files[step.name, rank] = folder / "dump.json"
    if not files:
        raise ReplayError(f"{root}: no step<N>/rank<M>/dump.json or step<N>/proc<PID>/dump.json")
    return files


def read_dump(path: Path) -> dict[str, Any]:
    try:
        with open(path) as f:
            dump = json.load(f)
    except (OSError, ValueError) as e:
        raise ReplayError(f"{path}: {e}") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("data"), dict):
        raise ReplayError(f"{path}: no `data` object")
    if dump.get("task") != "tensor":
        raise ReplayError(
            f"{path}: task `{dump.get('task')}`: replay needs the tensors (msprobe's task tensor)"
        )
    return dump


def resolve(call: str):
    """The function a forward API call names (``Functional.gelu.0.forward``: F.gelu)."""
    import torch

    parts = call.split(".")
    if len(parts) < 4 or parts[-1] != "forward" or not parts[-2].isdigit():
        raise NotReplayable("not an API's forward call")
    space, api = parts[0], ".".join(parts[1:-2])
    if space not in NAMESPACES:
        raise NotReplayable(f"{space} calls are not replayed")
    owner = {"Functional": torch.nn.functional, "Torch": torch, "Tensor": torch.Tensor}[space]
    function = getattr(owner, api, None)
    if not callable(function):
        raise NotReplayable(f"this torch has no {space} API `{api}`")
    return function


def tensor_file(folder: Path, name: str) -> Path:
    for path in (folder / "dump_tensor_data" / name, folder / name):
        if path.is_file():
            return path
    raise NotReplayable(f"its tensor file {name} is not in the dump")


def value(a_entry, b_entry, b_folder: Path, device):
    """An argument as A gives it, with B's tensor where A has a tensor."""
    import torch

    if isinstance(a_entry, list):
        if not isinstance(b_entry, list) or len(a_entry) != len(b_entry):
            raise NotReplayable("the runs pass it different arguments")
        return [value(a, b, b_folder, device) for a, b in zip(a_entry, b_entry)]
    if a_entry is None:
        return None
    kind = a_entry.get("type")
    if kind == "torch.Tensor":
        if not isinstance(b_entry, dict) or b_entry.get("type") != "torch.Tensor":
            raise NotReplayable("the runs pass it different arguments")
        if "data_name" not in b_entry:
            raise NotReplayable("B's dump holds no tensor for an argument")
        path = tensor_file(b_folder, b_entry["data_name"])
        return torch.load(path, map_location=device, weights_only=True)
    if kind in ("int", "float", "bool", "str"):
        return a_entry.get("value")
    if kind in (None, "NoneType"):
        return None
    if kind == "torch.dtype":
        dtype = getattr(torch, str(a_entry.get("value")).replace("torch.", ""), None)
        if not isinstance(dtype, torch.dtype):
            raise NotReplayable(f"an unknown dtype {a_entry.get('value')}")
        return dtype
    if kind == "slice":
        return slice(*a_entry.get("value"))
    raise NotReplayable(f"an argument of type {kind}")


def tensors_of(result) -> list:
    if isinstance(result, (list, tuple)):
        return [t for item in result for t in tensors_of(item)]
    return [result]


def statistics(t) -> dict[str, Any]:
    import torch

    entry = {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape)}
    if t.numel() and not t.is_complex():
        f = t.detach().double()
        entry |= {
            "Max": f.max().item(),
            "Min": f.min().item(),
            "Mean": f.mean().item(),
            "Norm": torch.linalg.vector_norm(f).item(),
        }
    return entry


def replay_call(name, a_call, b_call, b_folder, device):
    """The call run again with B's tensors and A's other arguments: its tensor outputs."""
    import torch

    function = resolve(name)
    a_args, b_args = a_call.get("input_args", []), b_call.get("input_args", [])
    if len(a_args) != len(b_args):
        raise NotReplayable("the runs pass it different arguments")
    a_kwargs, b_kwargs = a_call.get("input_kwargs", {}), b_call.get("input_kwargs", {})
    if set(a_kwargs) != set(b_kwargs):
        raise NotReplayable("the runs pass it different keyword arguments")
    args = [value(a, b, b_folder, device) for a, b in zip(a_args, b_args)]
    kwargs = {k: value(a_kwargs[k], b_kwargs[k], b_folder, device) for k in a_kwargs}
    with torch.no_grad():
        try:
            result = function(*args, **kwargs)
        except Exception as e:  # the call's own failure on this machine: a line of the report
            raise NotReplayable(f"it raised {type(e).__name__}: {e}") from None
    outputs = [t for t in tensors_of(result) if isinstance(t, torch.Tensor)]
    wanted = [e for e in b_call.get("output", []) if isinstance(e, dict)]
    if len(outputs) != len(wanted):
        raise NotReplayable(f"it gave {len(outputs)} tensors where B recorded {len(wanted)}")
    return outputs


def replay(a_root: Path, b_root: Path, out: Path, device: str) -> tuple[int, list[str]]:
    """Writes R into ``out``; returns (calls replayed, lines naming the calls not replayed)."""
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    a_files, b_files = dump_files(a_root), dump_files(b_root)
    common = sorted(set(a_files) & set(b_files))
    if not common:
        raise ReplayError(f"{a_root} and {b_root} have no step and rank folder in common")
    replayed, skipped, modules = 0, [], 0
    for step, rank in common:
        a_dump, b_dump = read_dump(a_files[step, rank]), read_dump(b_files[step, rank])
        b_folder = b_files[step, rank].parent
        folder = out / step / f"rank{rank}"
        (folder / "dump_tensor_data").mkdir(parents=True)
        data = {}
        for name, a_call in a_dump["data"].items():
            b_call = b_dump["data"].get(name)
            if b_call is None:
                continue
            if name.startswith(("Module.", "Cell.")) and ".forward." in name:
                modules += 1
                continue
            if not name.endswith(".forward"):
                continue  # a backward, or a module's parameters' gradients
            try:
                outputs = replay_call(name, a_call, b_call, b_folder, device)
            except NotReplayable as why:
                skipped.append(f"{step}/{rank} {name}: {why}")
                continue
            entry = {k: v for k, v in b_call.items() if k in ("input_args", "input_kwargs")}
            for path in _data_names(entry):
                target = folder / "dump_tensor_data" / path
                if not target.exists():
                    shutil.copyfile(tensor_file(b_folder, path), target)
            entry["output"] = []
            for i, t in enumerate(outputs):
                file = f"{name}.output.{i}.pt"
                torch.save(
                    t.detach().cpu().contiguous().clone(), folder / "dump_tensor_data" / file
                )
                entry["output"].append(statistics(t) | {"data_name": file})
            data[name] = entry
            replayed += 1
        header = {k: v for k, v in b_dump.items() if k != "data"}
        header["dump_data_dir"] = str(folder / "dump_tensor_data")
        with open(folder / "dump.json", "w") as f:
            json.dump(header | {"data": data}, f, indent=1)
    if modules:
        skipped.insert(
            0,
            f"{modules} module calls (a module's code is not in a dump; the API calls inside "
            "it are replayed, a fused kernel below the APIs is not seen)",
        )
    return replayed, skipped


def _data_names(entry):
    if isinstance(entry, dict):
        if "data_name" in entry:
            yield entry["data_name"]
        for v in entry.values():
            yield from _data_names(v)
    elif isinstance(entry, list):
        for v in entry:
            yield from _data_names(v)


def detcheck_command() -> str:
    command = os.environ.get("DETCHECK_BIN") or shutil.which("detcheck")
    if command is None:
        raise ReplayError("no `detcheck` command on PATH (pip install detcheck, or DETCHECK_BIN)")
    return command


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m detcheck.replay", description=__doc__)
    parser.add_argument("a", type=Path, help="the run in question: an msprobe tensor dump")
    parser.add_argument("b", type=Path, help="the reference: an msprobe tensor dump")
    parser.add_argument("--out", type=Path, help="keep the replayed dump here (a new folder)")
    parser.add_argument("--device", default="cpu", help="where the calls run (default: cpu)")
    parser.add_argument("--format", choices=["text", "json"], default="text")
    args = parser.parse_args(argv)
    try:
        command = detcheck_command()
        if args.out is not None and args.out.exists():
            raise ReplayError(f"{args.out}: exists (--out names a new folder)")
        with tempfile.TemporaryDirectory(prefix="detcheck-replay-") as scratch:
            out = args.out or Path(scratch) / "replayed"
            replayed, skipped = replay(args.a, args.b, out, args.device)
            if not replayed:
                raise ReplayError(
                    f"no call of {args.a} could be replayed on {args.b}'s inputs"
                    + (f" ({skipped[0]})" if skipped else "")
                )
            # Text: the report's head; JSON: stdout is compare's one line, so this goes to
            # stderr.
            say = sys.stdout if args.format == "text" else sys.stderr
            print(f"replayed {replayed} calls of A on B's inputs ({args.device})", file=say)
            for line in skipped[:10]:
                print(f"not replayed: {line}", file=say)
            if len(skipped) > 10:
                print(f"not replayed: and {len(skipped) - 10} more", file=say)
            say.flush()
            done = subprocess.run(
                [command, "compare", "--align", "--format", args.format, str(out), str(args.b)]
            )
            return done.returncode
    except ReplayError as e:
        print(f"detcheck replay: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
