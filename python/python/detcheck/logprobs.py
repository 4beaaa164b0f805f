"""Per-token logprobs in one file, and two such files compared (issue 56: trainer and sampler
parity). A sampler (an inference engine's ``generate``) and a trainer (one forward over the
sequence) each give the log-probabilities of the same tokens; RL that treats them as one
policy needs them equal, and where they are not, the first sequence and step where they part,
whether a token flipped, and how near its tie was, say why.

The format (version 1, docs/logprobs.md): a safetensors file whose ``__metadata__`` holds
``format = "detcheck-logprobs"`` and ``version = "1"`` (and ``source``, free text), and for each
sequence ``i`` (0, 1, ...) the tensors

- ``seq{i}.prompt``: int64 ``[p]``, the prompt's tokens (no padding);
- ``seq{i}.tokens``: int64 ``[n]``, the tokens scored, in order;
- ``seq{i}.logprobs``: float ``[n, vocab]`` (f32, f64, f16 or bf16), the log-probabilities over
  the whole vocabulary before token ``j`` was chosen.

Any engine's output converts to it with :func:`save` (numpy arrays); :func:`from_generate` is the
converter for a Hugging Face model's ``generate`` (the sampler's side) and :func:`from_forward`
for one forward over prompt and tokens (the trainer's side). :func:`compare` reads two files.

Determinism: a file's bytes are a function of its tensors and metadata (tensors in name order,
header keys sorted); a comparison is a pure function of the two files.

Limits: a file is held in memory; bf16 is compared by its bits and measured after widening.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "FORMAT",
    "Sequence",
    "SequenceComparison",
    "LogprobComparison",
    "save",
    "load",
    "compare",
    "from_generate",
    "from_forward",
    "main",
]

#: The ``format`` of a logprob file's metadata.
FORMAT = "detcheck-logprobs"
#: The version this module writes and reads.
VERSION = "1"
#: The roundoff units a difference may take and still be rounding (``compare --align``'s
#: default, ``--rounding-units``).
ALIGN_UNITS = 16.0

_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64}
# bf16 has no numpy dtype: its bits are kept as uint16 and widened to f32 to be measured.
_BF16 = "BF16"


@dataclass
class Sequence:
    """One sequence of a logprob file: its prompt, the tokens scored, and their logprobs
    (``[len(tokens), vocab]``; a bf16 file's are uint16 bits, ``bf16`` set)."""

    prompt: np.ndarray
    tokens: np.ndarray
    logprobs: np.ndarray
    bf16: bool = False

    def widened(self) -> np.ndarray:
        """The logprobs as float64 (bf16 bits widened exactly)."""
        if self.bf16:
            return (self.logprobs.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return self.logprobs.astype(np.float64)

    def unit(self) -> float:
        """The unit roundoff of the logprobs' dtype."""
        if self.bf16:
            return 2.0**-8
        return float(np.finfo(self.logprobs.dtype).eps) / 2


def _bad(path: Any, what: str) -> ValueError:
    return ValueError(f"{path}: not a detcheck logprob file: {what} (docs/logprobs.md)")


def save(
    path: str | os.PathLike[str],
    sequences: list[tuple[Any, Any, Any]],
    source: str = "",
    bf16: bool = False,
) -> None:
    """Writes ``sequences``, each ``(prompt, tokens, logprobs)`` as arrays (numpy, or anything
    ``np.asarray`` takes), to ``path`` in the format above. ``bf16``: the logprobs are bf16 bits
    (uint16). Written under a temporary name and renamed, so a file that exists is complete."""
    tensors: dict[str, tuple[str, np.ndarray]] = {}
    for i, (prompt, tokens, logprobs) in enumerate(sequences):
        prompt = np.ascontiguousarray(np.asarray(prompt, dtype=np.int64).reshape(-1))
        tokens = np.ascontiguousarray(np.asarray(tokens, dtype=np.int64).reshape(-1))
        lp = np.ascontiguousarray(np.asarray(logprobs))
        if lp.ndim != 2 or lp.shape[0] != tokens.shape[0]:
            raise ValueError(
                f"sequence {i}: logprobs must be [tokens, vocab] = [{tokens.shape[0]}, V], "
                f"not {list(lp.shape)}"
            )
        if bf16:
            name = _BF16
            lp = lp.astype(np.uint16)
        else:
            names = {np.dtype(v): k for k, v in _DTYPES.items() if k != "I64"}
            if lp.dtype not in names:
                raise ValueError(f"sequence {i}: logprobs of dtype {lp.dtype} (f32, f64, f16)")
            name = names[lp.dtype]
        tensors[f"seq{i}.prompt"] = ("I64", prompt)
        tensors[f"seq{i}.tokens"] = ("I64", tokens)
        tensors[f"seq{i}.logprobs"] = (name, lp)
    header: dict[str, Any] = {
        "__metadata__": {"format": FORMAT, "version": VERSION, "source": source}
    }
    offset = 0
    for name in sorted(tensors):
        dtype, array = tensors[name]
        size = array.nbytes
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in sorted(tensors):
            f.write(tensors[name][1].astype(tensors[name][1].dtype.newbyteorder("<")).tobytes())
    os.replace(tmp, path)


def load(path: str | os.PathLike[str]) -> list[Sequence]:
    """The sequences of the logprob file at ``path``; a ``ValueError`` naming the file and what
    is wrong with it (not safetensors, another format or version, a missing or misshapen
    tensor)."""
    data = open(path, "rb").read()
    if len(data) < 8:
        raise _bad(path, "shorter than a safetensors header")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise _bad(path, f"its header claims {n} bytes, the file has {len(data) - 8}")
    try:
        header = json.loads(data[8 : 8 + n])
    except ValueError as e:
        raise _bad(path, f"its header is not JSON ({e})") from None
    meta = header.pop("__metadata__", None) or {}
    if meta.get("format") != FORMAT:
        raise _bad(path, f"metadata `format` is {meta.get('format')!r}, not {FORMAT!r}")
    if meta.get("version") != VERSION:
        raise _bad(path, f"metadata `version` is {meta.get('version')!r}; this reads {VERSION!r}")
    body = memoryview(data)[8 + n :]

    def tensor(name: str, expect: tuple[str, ...]) -> tuple[np.ndarray, str]:
        entry = header.get(name)
        if entry is None:
            raise _bad(path, f"tensor `{name}` is missing")
        dtype = entry.get("dtype")
        if dtype not in expect:
            raise _bad(path, f"tensor `{name}` has dtype {dtype!r}, not one of {list(expect)}")
        start, stop = entry["data_offsets"]
        np_dtype = np.uint16 if dtype == _BF16 else _DTYPES[dtype]
        shape = tuple(entry["shape"])
        count = int(np.prod(shape)) if shape else 1
        if stop - start != count * np.dtype(np_dtype).itemsize or stop > len(body):
            raise _bad(path, f"tensor `{name}`'s offsets do not hold its shape {list(shape)}")
        array = np.frombuffer(body[start:stop], dtype=np.dtype(np_dtype).newbyteorder("<"))
        return array.reshape(shape).astype(np_dtype), dtype

    count = len([k for k in header if k.endswith(".logprobs")])
    sequences = []
    for i in range(count):
        prompt, _ = tensor(f"seq{i}.prompt", ("I64",))
        tokens, _ = tensor(f"seq{i}.tokens", ("I64",))
        lp, dtype = tensor(f"seq{i}.logprobs", ("F32", "F64", "F16", _BF16))
        if lp.ndim != 2 or lp.shape[0] != tokens.shape[0]:
            raise _bad(path, f"`seq{i}.logprobs` is {list(lp.shape)}, not [{len(tokens)}, vocab]")
        sequences.append(Sequence(prompt, tokens, lp, dtype == _BF16))
    return sequences


@dataclass
class SequenceComparison:
    """One sequence of two logprob files compared (``compare``)."""

    #: The sequence's index.
    index: int
    #: Steps compared (the shorter side's, up to the first token that differs, and that step).
    steps: int
    #: The first step whose logprobs differ bitwise (``None``: none does).
    first_logprobs: int | None = None
    #: The first step whose token differs (``None``: the tokens agree).
    first_token: int | None = None
    #: At ``first_token``: the left side's top-2 logprob gap (a near tie flips on rounding).
    top2_gap: float | None = None
    #: max |a - b| over the compared steps.
    max_abs: float = 0.0
    #: ``max_abs`` in units of roundoff of the logprobs' dtype at the largest |logprob|.
    units: float = 0.0
    #: Why it cannot be compared (other prompts, other vocabularies), else ``None``.
    mismatch: str | None = None

    @property
    def holds(self) -> bool:
        return self.mismatch is None and self.first_logprobs is None and self.first_token is None

    def describe(self) -> str:
        if self.mismatch:
            return f"sequence {self.index}: {self.mismatch}"
        if self.holds:
            return f"sequence {self.index}: bitwise equal over {self.steps} steps"
        parts = [
            f"sequence {self.index}: logprobs differ from step {self.first_logprobs} "
            f"(max |diff| {self.max_abs:.3g}, {self.units:.1f} units of roundoff: "
            f"{'within' if self.units <= ALIGN_UNITS else 'beyond'} rounding)"
        ]
        if self.first_token is None:
            parts.append(f"the tokens agree over {self.steps} steps")
        else:
            parts.append(
                f"the token differs from step {self.first_token}, where the left side's top-2 "
                f"gap was {self.top2_gap:.3g}"
                + (" (a near tie)" if self.top2_gap is not None and self.top2_gap < 1e-3 else "")
            )
        return "; ".join(parts)


@dataclass
class LogprobComparison:
    """Two logprob files compared sequence by sequence (``compare``)."""

    left: str
    right: str
    sequences: list[SequenceComparison] = field(default_factory=list)
    #: Sequences one file has and the other has not.
    unpaired: int = 0

    @property
    def holds(self) -> bool:
        """Every sequence is bitwise equal, and both files have the same sequences."""
        return self.unpaired == 0 and all(s.holds for s in self.sequences)

    @property
    def aligned(self) -> bool:
        """No token differs and every difference is within rounding (``ALIGN_UNITS``)."""
        return (
            self.unpaired == 0
            and all(s.mismatch is None and s.first_token is None for s in self.sequences)
            and all(s.units <= ALIGN_UNITS for s in self.sequences)
        )

    @property
    def first(self) -> SequenceComparison | None:
        """The first sequence that does not hold."""
        return next((s for s in self.sequences if not s.holds), None)

    def __str__(self) -> str:
        head = f"{self.left} vs {self.right}: {len(self.sequences)} sequences, " + (
            "bitwise equal"
            if self.holds
            else "aligned within rounding"
            if self.aligned
            else "NOT aligned"
        )
        if self.unpaired:
            head += f"; {self.unpaired} sequences in one file only"
        lines = [head] + [f"  {s.describe()}" for s in self.sequences if not s.holds]
        return "\n".join(lines)


def _compare_one(index: int, a: Sequence, b: Sequence) -> SequenceComparison:
    if not np.array_equal(a.prompt, b.prompt):
        return SequenceComparison(index, 0, mismatch="the prompts differ: nothing to pair")
    if a.logprobs.shape[1] != b.logprobs.shape[1] or a.bf16 != b.bf16:
        return SequenceComparison(
            index,
            0,
            mismatch=f"vocabularies or dtypes differ ({a.logprobs.shape[1]} "
            f"{a.logprobs.dtype} vs {b.logprobs.shape[1]} {b.logprobs.dtype})",
        )
    n = min(len(a.tokens), len(b.tokens))
    token = next((j for j in range(n) if a.tokens[j] != b.tokens[j]), None)
    # After a token differs the two sides score different sequences: compare up to it.
    steps = n if token is None else token + 1
    found = SequenceComparison(index, steps, first_token=token)
    la, lb = a.logprobs[:steps], b.logprobs[:steps]
    rows = [j for j in range(steps) if la[j].tobytes() != lb[j].tobytes()]
    found.first_logprobs = rows[0] if rows else None
    wa, wb = a.widened()[:steps], b.widened()[:steps]
    finite = np.isfinite(wa) & np.isfinite(wb)
    diff = np.abs(wa - wb)[finite]
    found.max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(wb[finite]).max()) if finite.any() else 0.0
    found.units = found.max_abs / (a.unit() * scale) if scale > 0 else 0.0
    if token is not None:
        top = np.sort(wa[token])[-2:]
        found.top2_gap = float(top[1] - top[0]) if top.size == 2 else None
    return found


def compare(left: str | os.PathLike[str], right: str | os.PathLike[str]) -> LogprobComparison:
    """Compares two logprob files sequence by sequence: bitwise, and in units of roundoff at
    the logprobs' magnitude (``compare --align``'s measure); for each sequence that differs, the
    first step whose logprobs differ, the first step whose token differs and the left side's
    top-2 gap there."""
    a, b = load(left), load(right)
    found = LogprobComparison(os.fspath(left), os.fspath(right), unpaired=abs(len(a) - len(b)))
    found.sequences = [_compare_one(i, x, y) for i, (x, y) in enumerate(zip(a, b))]
    return found


def _log_softmax(logits: Any) -> np.ndarray:
    import torch

    return torch.log_softmax(logits.float(), dim=-1).detach().cpu().numpy()


def from_generate(
    model: Any,
    input_ids: Any,
    path: str | os.PathLike[str],
    attention_mask: Any = None,
    batch_size: int | None = None,
    **generate_kwargs: Any,
) -> list[Sequence]:
    """The sampler's side: runs ``model.generate(input_ids, ...)`` (a Hugging Face model; greedy
    unless ``generate_kwargs`` say otherwise) keeping each step's logits, and writes each row's
    prompt (its unmasked tokens), generated tokens and their logprobs (float32
    ``log_softmax`` of the logits) to ``path``. ``batch_size``: generate the rows in batches of
    that many, in order (the same prompts at two batch sizes, compared, is the batch-size check
    of generation: the first step whose logprobs differ, the first token that flips). Returns
    what it wrote."""
    import torch

    rows = input_ids.shape[0]
    size = batch_size or rows
    width = input_ids.shape[1]
    sequences = []
    for start in range(0, rows, size):
        ids = input_ids[start : start + size]
        mask = None if attention_mask is None else attention_mask[start : start + size]
        out = model.generate(
            ids,
            attention_mask=mask,
            output_logits=True,
            return_dict_in_generate=True,
            **generate_kwargs,
        )
        steps = _log_softmax(torch.stack(out.logits, dim=1))  # [batch, steps, vocab]
        for row in range(ids.shape[0]):
            prompt = ids[row] if mask is None else ids[row][mask[row].bool()]
            tokens = out.sequences[row, width:].cpu().numpy()
            sequences.append((prompt.cpu().numpy(), tokens, steps[row, : len(tokens)]))
    save(path, sequences, source=f"generate of {type(model).__name__} in batches of {size}")
    return load(path)


def from_forward(
    model: Any,
    prompts: list[Any],
    tokens: list[Any],
    path: str | os.PathLike[str],
) -> list[Sequence]:
    """The trainer's side: one forward of ``model`` (a Hugging Face causal LM) over each prompt
    followed by its tokens, one sequence at a time (no padding), and the logprobs the logits give
    each token (position ``p + j - 1`` predicts token ``j``), written to ``path``."""
    import torch

    sequences = []
    with torch.no_grad():
        for prompt, scored in zip(prompts, tokens):
            prompt = torch.as_tensor(prompt).reshape(-1)
            scored = torch.as_tensor(scored).reshape(-1)
            ids = torch.cat([prompt, scored]).unsqueeze(0)
            logits = model(ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(scored)]
            sequences.append((prompt.numpy(), scored.numpy(), _log_softmax(logits)))
    save(path, sequences, source=f"forward of {type(model).__name__}")
    return load(path)


def main(argv: list[str] | None = None) -> int:
    """``python -m detcheck.logprobs LEFT RIGHT [--aligned]``: prints the comparison; exits 0
    when the files are bitwise equal (with ``--aligned``: within rounding, no token flipped), 1
    when not, 2 when a file cannot be read (the message names it)."""
    parser = argparse.ArgumentParser(
        prog="python -m detcheck.logprobs",
        description="Compare two per-token logprob files (docs/logprobs.md).",
    )
    parser.add_argument("left")
    parser.add_argument("right")
    parser.add_argument(
        "--aligned", action="store_true", help="pass when within rounding, not only when bitwise"
    )
    args = parser.parse_args(argv)
    try:
        found = compare(args.left, args.right)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(found)
    return 0 if (found.aligned if args.aligned else found.holds) else 1


if __name__ == "__main__":
    sys.exit(main())
