"""Invariances of a PyTorch model's inference (issue 56; python/README.md, "Batch invariance",
is the long form): does a sample's output depend on what else is in its batch
(``detcheck.torch.batch_invariance``), and does decoding with a KV cache compute what one
forward over the whole sequence does (``prefill_decode_parity``: a sampler's logprobs against a
trainer's)?

The same ``N`` samples are run through the model in batches of each size (consecutive samples,
``samples[i:i + size]``), under ``torch.no_grad()``; every module's tensor outputs are kept row
by row (dim 0: one row per sample, or ``k`` rows per sample where an output has ``k * size``
rows, as a ``[B, T, D]`` input viewed as ``[B * T, D]``). Each sample's rows are then compared
with its rows at the first size, bitwise, in the order the sample's records were made, and the
first that differs is named: the sample, the record (``fwd/<module>`` as ``watch`` names it),
the sizes, the largest difference. The culprit is the first record whose output row differs
while the rows of its inputs are equal (else: code between modules, before it, made the
difference); inside that module the operator is named the same way, by ``aten`` operator
(``torch.utils._python_dispatch.TorchDispatchMode``), on a second run of both sizes.

Main types: ``BatchInvariance`` (``holds``, ``first``, ``culprit``, ``operator``; ``str()`` is
the report) and ``PrefillDecodeParity`` (``holds``, ``aligned``: within 16 units of roundoff, as
``compare --align`` allows; ``first``, ``culprit``, the logits per decoded token).

Determinism: nothing here draws a random number or reads a clock; the samples, the
sizes and the model decide the finding (and the number of threads, which splits a batch too:
the report names it). Limits: batch-first outputs (dim 0); every record of every module is held
in memory for all sizes (a tool for a model in a test, not a production batch); a model that
changes its state in ``forward`` (batch norm in training mode) is compared as it runs, in
``eval()`` mode if the caller put it there.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._python_dispatch
from torch.utils import _pytree as pytree

from .._core import evidence as _evidence
from .._core.contract import ROOT
from .frontend import TORCH

__all__ = [
    "BatchInvariance",
    "BatchRecord",
    "batch_invariance",
    "batch_invariant",
    "ParityRecord",
    "PrefillDecodeParity",
    "prefill_decode_parity",
]


@dataclass(frozen=True)
class BatchRecord:
    """One record of one sample at two batch sizes: where it differs first."""

    #: The sample's index in the samples given.
    sample: int
    #: The record, ``fwd/<module>`` (``.N`` for the N-th tensor of a tuple output), its
    #: module's label (``fwd/<module>``), and which call of the module in the sample's batch
    #: (0: the first).
    name: str
    module: str
    occurrence: int
    #: The two batch sizes compared: the first size given, and the other.
    sizes: tuple[int, int]
    #: max |a - b| over the sample's row (``None`` for integer or boolean rows: they differ).
    max_abs_diff: float | None


@dataclass
class BatchInvariance:
    """What ``batch_invariance`` found (module doc)."""

    #: The batch sizes, as given, and the rows each batch was padded to (``None``: none).
    batch_sizes: tuple[int, ...]
    pad_to: int | None
    #: How many samples, and how many (sample, record) rows were compared.
    num_samples: int
    num_compared: int
    #: ``torch.get_num_threads()`` during the runs: the threads split a batch too.
    threads: int
    #: The first differing record of the first sample that differs, in the order the sample's
    #: records were made; ``None`` when every row is bitwise equal.
    first: BatchRecord | None = None
    #: The first record whose output differs while its inputs are equal (the module that
    #: breaks invariance), or ``None`` when the difference entered between modules.
    culprit: BatchRecord | None = None
    #: Inside the culprit: the first ``aten`` operator whose output rows differ while its
    #: input rows are equal, and the sizes of its inputs at each batch size.
    operator: str | None = None
    operator_inputs: tuple[str, str] | None = None
    #: Records kept at one size only (a tensor broadcast along dim 0, as a position embedding
    #: of one row; or a module that runs at one size only), not compared: at most 20.
    unmatched: list[str] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        """Every sample's every record is bitwise equal at every size."""
        return self.first is None

    def __str__(self) -> str:
        sizes = ", ".join(map(str, self.batch_sizes))
        if self.pad_to is not None:
            sizes += f" (each padded to {self.pad_to} rows)"
        if self.holds:
            return (
                f"batch invariant: {self.num_samples} samples at batch sizes {sizes}, "
                f"{self.num_compared} rows bitwise equal ({self.threads} threads)"
            )
        lines = [f"not batch invariant at batch sizes {sizes} ({self.threads} threads):"]
        if self.first is not None:
            f = self.first
            diff = "" if f.max_abs_diff is None else f", max |diff| {f.max_abs_diff:.3e}"
            lines.append(
                f"  first difference: sample {f.sample}, `{f.name}` (call {f.occurrence}), "
                f"batch {f.sizes[0]} vs {f.sizes[1]}{diff}"
            )
        if self.culprit is not None:
            lines.append(
                f"  the module that breaks it: `{self.culprit.module}` (call "
                f"{self.culprit.occurrence}): its output differs while its inputs are equal"
            )
        elif self.first is not None:
            lines.append(
                f"  no module's output differs on equal inputs: code between modules, before "
                f"`{self.first.name}`, made the difference (a functional call in a forward)"
            )
        if self.operator is not None:
            inputs = ""
            if self.operator_inputs is not None:
                inputs = f" (inputs {self.operator_inputs[0]} vs {self.operator_inputs[1]})"
            lines.append(f"  operator: `{self.operator}`{inputs}")
            same = self.operator_inputs is not None and len(set(self.operator_inputs)) == 1
            if same:
                lines.append(
                    "  why: its inputs have the same shapes at both sizes, but the sample sits at "
                    "another row of the batch, and the kernel splits the batch over "
                    f"{self.threads} threads by position; fix: one thread for it "
                    "(`torch.set_num_threads(1)`), or the model run one sample at a time "
                    "(`detcheck.torch.batch_invariant()`)"
                )
            else:
                lines.append(
                    "  why: the kernel's reduction order depends on the batch's shape (how it is "
                    "tiled and split over threads); fix: pad every batch to one fixed size "
                    "(`pad_to`; on one thread), or the model run one sample at a time "
                    "(`detcheck.torch.batch_invariant()`)"
                )
        return "\n".join(lines)


def _rows(tensor: torch.Tensor, sample: int, size: int) -> torch.Tensor | None:
    """The rows of ``sample`` (its place in a batch of ``size``) in a batch-first tensor: one
    row, or ``k`` where dim 0 holds ``k * size`` rows; ``None`` when dim 0 is not the batch."""
    if tensor.dim() == 0 or tensor.shape[0] % size != 0:
        return None
    k = tensor.shape[0] // size
    return tensor[sample * k : (sample + 1) * k]


def _bits(row: torch.Tensor) -> bytes:
    """A row's bytes: two rows are bitwise equal when these are (NaN payloads and -0 too)."""
    row = row.detach().to("cpu").contiguous()
    return row.view(-1).view(torch.uint8).numpy().tobytes() if row.numel() else b""


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float | None:
    if not (a.is_floating_point() and b.is_floating_point()) or a.shape != b.shape:
        return None
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def _slice(samples: Any, start: int, stop: int) -> Any:
    if isinstance(samples, torch.Tensor):
        return samples[start:stop]
    if isinstance(samples, dict):
        return {k: _slice(v, start, stop) for k, v in samples.items()}
    if isinstance(samples, (tuple, list)):
        return type(samples)(_slice(v, start, stop) for v in samples)
    return samples


def _pad(samples: Any, rows: int) -> Any:
    """A batch padded to ``rows`` rows with copies of its first sample (a valid input: token
    ids stay token ids)."""
    if isinstance(samples, torch.Tensor):
        extra = rows - samples.shape[0]
        return (
            torch.cat([samples, samples[:1].expand(extra, *samples.shape[1:])])
            if extra
            else samples
        )
    if isinstance(samples, dict):
        return {k: _pad(v, rows) for k, v in samples.items()}
    if isinstance(samples, (tuple, list)):
        return type(samples)(_pad(v, rows) for v in samples)
    return samples


def _count(samples: Any) -> int:
    if isinstance(samples, torch.Tensor):
        return int(samples.shape[0])
    values = samples.values() if isinstance(samples, dict) else samples
    for v in values:
        if isinstance(v, torch.Tensor):
            return int(v.shape[0])
    raise ValueError("samples: give a tensor, or a dict, tuple or list of tensors (dim 0: samples)")


def _call(model: torch.nn.Module, batch: Any) -> Any:
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _hook_every_module(model, pre, post):
    """A pre-hook ``pre(label)`` and a hook ``post(label)`` (both with kwargs) on every module,
    labelled as ``watch`` names its records (``fwd/<module>``, the model ``fwd/(model)``): the
    handles, to remove."""
    hooks = []
    for name, module in model.named_modules():
        label = "fwd/" + (name if name else ROOT)
        hooks.append(module.register_forward_pre_hook(pre(label), with_kwargs=True))
        hooks.append(module.register_forward_hook(post(label), with_kwargs=True))
    return hooks


#: One size's records: sample -> [(name, module, call, output bits, output rows, input bits)],
#: in the order they were made.
_Records = dict[int, list[tuple[str, str, int, bytes, torch.Tensor, bytes]]]


def _run(model, samples, n, size, forward, pad_to) -> _Records:
    """Runs every batch of ``size`` (padded to ``pad_to`` rows) and keeps each sample's rows of
    each record."""
    records: _Records = {i: [] for i in range(n)}
    state = {"base": 0, "size": size, "real": size, "calls": {}, "inputs": {}}

    def pre(label):
        def hook(module, args, kwargs):
            rows = {}
            for i in range(state["size"]):
                parts = []
                for _, t in TORCH.outputs(label, (tuple(args), kwargs)):
                    r = _rows(t, i, state["size"])
                    if r is not None:
                        parts.append(_bits(r))
                rows[i] = b"\0".join(parts)
            state["inputs"].setdefault(label, []).append(rows)

        return hook

    def post(label):
        def hook(module, args, kwargs, output):
            inputs = state["inputs"].get(label)
            rows_in = inputs.pop() if inputs else {}
            k = state["calls"].get(label, 0)
            state["calls"][label] = k + 1
            for name, tensor in TORCH.outputs(label, output):
                for i in range(state["real"]):
                    r = _rows(tensor, i, state["size"])
                    if r is not None:
                        sample = state["base"] + i
                        clone = r.detach().to("cpu").clone()
                        records[sample].append(
                            (name, label, k, _bits(r), clone, rows_in.get(i, b""))
                        )

        return hook

    hooks = _hook_every_module(model, pre, post)
    try:
        with torch.no_grad():
            for start in range(0, n, size):
                stop = min(start + size, n)
                rows = max(pad_to or 0, stop - start)
                state.update(base=start, size=rows, real=stop - start, calls={}, inputs={})
                forward(model, _pad(_slice(samples, start, stop), rows))
    finally:
        for h in hooks:
            h.remove()
    return records


def _shapes(tensors: list[torch.Tensor]) -> str:
    """``"256, 8x64, 64x256"``: an operator's tensor inputs' shapes, as the reports show them."""
    return ", ".join("x".join(map(str, t.shape)) for t in tensors)


class _OperatorRows(torch.utils._python_dispatch.TorchDispatchMode):
    """Inside one call of one module: each ``aten`` operator that reads the batch (the
    module's inputs, or an output of such an operator), with the rows of one sample of its
    outputs (``_torch.rows``), in the order they run. Operators on parameters alone (a weight's
    transpose) are not the batch's and are left out."""

    def __init__(self, sample: int, size: int):
        super().__init__()
        self.sample, self.size = sample, size
        #: The tensors that hold the batch, by ``id`` (kept alive: no id is reused meanwhile).
        self.batch: dict[int, torch.Tensor] = {}
        self.calls: list[tuple[str, bytes, str]] = []
        #: Each call's line in the program (``_core.evidence.call_site``), when a list is given.
        self.sites: list[str | None] | None = None

    def holds(self, tensors) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self.batch[id(t)] = t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if not any(id(a) in self.batch for a in ins):
            return out
        outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.holds(outs)
        rows = [_rows(t, self.sample, self.size) for t in outs]
        shapes = _shapes(ins)
        self.calls.append((str(func), b"\0".join(_bits(r) for r in rows if r is not None), shapes))
        if self.sites is not None:
            self.sites.append(_evidence.call_site(sys._getframe(1)))
        return out


def _inside(model, label, occurrence, mode, run, entering=None, call=None):
    """Runs ``run()`` without gradients with the dispatch ``mode`` entered for call
    ``occurrence`` of module ``label`` (``fwd/<name>``), counted over the whole run, or, with
    ``call``, within the model's call ``call``; ``entering(inputs)`` is told that call's tensor
    inputs first."""
    name = label[len("fwd/") :]
    target = dict(model.named_modules())["" if name == ROOT else name]
    state = {"calls": -1 if call is not None else None, "n": 0, "in": False}

    def model_pre(module, args, kwargs):
        state["calls"] += 1
        state["n"] = 0

    def pre(module, args, kwargs):
        if state["calls"] == call and state["n"] == occurrence:
            if entering is not None:
                entering(pytree.tree_leaves((args, kwargs)))
            mode.__enter__()
            state["in"] = True

    def post(module, args, kwargs, output):
        if state["in"]:
            mode.__exit__(None, None, None)
            state["in"] = False
        if state["calls"] == call:
            state["n"] += 1

    hooks = []
    if call is not None:  # first: it counts the model's call before the target's hooks ask
        hooks.append(model.register_forward_pre_hook(model_pre, with_kwargs=True))
    hooks.append(target.register_forward_pre_hook(pre, with_kwargs=True))
    hooks.append(target.register_forward_hook(post, with_kwargs=True))
    try:
        with torch.no_grad():
            run()
    finally:
        for h in hooks:
            h.remove()


def _operators(model, samples, label, occurrence, sample, size, forward, pad_to):
    """The batch's operators (``_OperatorRows``) in call ``occurrence`` of ``label``, in the
    batch of ``size`` that holds ``sample``."""
    start = (sample // size) * size
    stop = min(start + size, _count(samples))
    rows = max(pad_to or 0, stop - start)
    mode = _OperatorRows(sample - start, rows)
    batch = _slice(samples, start, stop)
    _inside(model, label, occurrence, mode, lambda: forward(model, _pad(batch, rows)), mode.holds)
    return mode.calls


class batch_invariant(torch.utils._python_dispatch.TorchDispatchMode):  # noqa: N801
    """``with detcheck.torch.batch_invariant(): model(batch)``: the operators whose arithmetic
    follows the batch's shape, computed one sample at a time, so that a sample's result does
    not depend on what else is in its batch, on any number of threads: ``aten.mm`` and
    ``aten.addmm`` one row at a time, ``aten.bmm``, the CPU's attention kernel
    (``_scaled_dot_product_flash_attention_for_cpu``) and ``aten.convolution`` one batch entry
    at a time. Each piece is one call of the same kernel with the same shapes at every batch
    size, so it is rounded the same way (the fix for shape dependence that needs no padding:
    docs/causes.md; verified on the CPU by python/tests/test_batch.py, a tiny GPT-2 and
    resnet18 at batch sizes 1, 4 and 8 on one and two threads).

    Slow (a matrix-vector product a row): for tests and reference runs, not for serving.
    Limits: other operators that reduce across the batch are left as they are; a row is the
    first dimension of a matrix product's left operand, so a ``[B * T, D]`` view is split by
    token (a finer split than the sample: still invariant)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # Inside this method the mode is off: `func` on a piece runs the kernel itself.
        if func is _ATEN.mm.default and args[0].shape[0] > 0:
            a, b = args
            return torch.cat([func(_piece(a, i), b) for i in range(a.shape[0])])
        if func is _ATEN.addmm.default and args[1].shape[0] > 0:
            bias, a, b = args
            m = a.shape[0]
            rows = (
                bias[i : i + 1] if bias.dim() == 2 and bias.shape[0] == m else bias
                for i in range(m)
            )
            return torch.cat([func(c, _piece(a, i), b, **kwargs) for i, c in enumerate(rows)])
        if func is _ATEN.bmm.default and args[0].shape[0] > 0:
            a, b = args
            return torch.stack(
                [self.__torch_dispatch__(_ATEN.mm.default, types, (x, y)) for x, y in zip(a, b)]
            )
        if func in _PER_ENTRY and args[0].shape[0] > 0:
            return _per_entry(func, args, kwargs)
        return func(*args, **kwargs)


_ATEN = torch.ops.aten

#: Operators computed one batch entry at a time by ``batch_invariant``, with the positions of
#: the arguments split with the batch (their dim 0: queries, keys and values; a convolution's
#: input, not its weight) and the keyword arguments split where they have as many entries.
_PER_ENTRY = {
    _ATEN._scaled_dot_product_flash_attention_for_cpu.default: ((0, 1, 2), ("attn_mask",)),
    _ATEN.convolution.default: ((0,), ()),
}


def _piece(t: torch.Tensor, i: int) -> torch.Tensor:
    """Row ``i`` of a matrix as a ``1 x K`` matrix laid out as at batch 1 (contiguous)."""
    return t[i : i + 1].contiguous()


def _per_entry(func, args, kwargs):
    """``func`` on each entry of its batch (``_PER_ENTRY``), the results joined along dim 0
    (each of a tuple's)."""
    n = args[0].shape[0]
    positions, keywords = _PER_ENTRY[func]

    def entry(x, j):
        batched = isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == n
        return x[j : j + 1].contiguous() if batched else x

    outs = [
        func(
            *(entry(a, j) if p in positions else a for p, a in enumerate(args)),
            **{k: entry(v, j) if k in keywords else v for k, v in kwargs.items()},
        )
        for j in range(n)
    ]
    if isinstance(outs[0], tuple):
        return tuple(torch.cat([o[k] for o in outs]) for k in range(len(outs[0])))
    return torch.cat(outs)


def batch_invariance(
    model: torch.nn.Module,
    samples: Any,
    batch_sizes: Sequence[int] = (1, 8),
    *,
    forward: Callable[[torch.nn.Module, Any], Any] | None = None,
    pad_to: int | None = None,
) -> BatchInvariance:
    """Runs ``samples`` (a tensor, or a dict, tuple or list of tensors; dim 0: the samples)
    through ``model`` in batches of each of ``batch_sizes`` and compares every module's output
    rows of each sample with those at the first size, bitwise (module doc). ``forward(model,
    batch)`` calls the model (default: ``model(batch)``, ``model(**batch)`` for a dict,
    ``model(*batch)`` for a tuple). ``pad_to``: every batch is padded to that many rows with
    copies of its first sample (the fixed-shape fix: the kernels then see one shape; the
    padding rows are not compared). Returns a ``BatchInvariance``; ``str()`` of it is the
    report. The model's mode (``eval()``) is the caller's."""
    sizes = tuple(int(s) for s in batch_sizes)
    if len(sizes) < 2 or any(s < 1 for s in sizes):
        raise ValueError(f"batch_sizes: give two or more sizes of at least 1, not {sizes}")
    forward = forward or _call
    n = _count(samples)
    if n < max(sizes):
        raise ValueError(f"samples: {n} samples, fewer than the largest batch size {max(sizes)}")
    if pad_to is not None and pad_to < max(sizes):
        raise ValueError(f"pad_to: {pad_to} rows, fewer than the largest batch size {max(sizes)}")
    runs = [_run(model, samples, n, s, forward, pad_to) for s in sizes]
    found = BatchInvariance(sizes, pad_to, n, 0, torch.get_num_threads())
    base = runs[0]
    for size, other in zip(sizes[1:], runs[1:]):
        for sample in range(n):
            mine = {(name, k) for name, _, k, *_ in base[sample]}
            theirs = {
                (name, k): (bits, row, bits_in) for name, _, k, bits, row, bits_in in other[sample]
            }
            for name, k in sorted(set(mine) ^ set(theirs)):
                if len(found.unmatched) < 20:
                    found.unmatched.append(f"sample {sample}: `{name}` call {k}")
            for name, module, k, bits, row, bits_in in base[sample]:
                if (name, k) not in theirs:
                    continue
                found.num_compared += 1
                other_bits, other_row, other_in = theirs[(name, k)]
                if bits == other_bits:
                    continue
                record = BatchRecord(
                    sample, name, module, k, (sizes[0], size), _max_abs(row, other_row)
                )
                if found.first is None:
                    found.first = record
                if found.culprit is None and bits_in == other_in:
                    found.culprit = record
            if found.first is not None:
                break
        if found.first is not None:
            break
    c = found.culprit
    if c is not None:
        left, right = (
            _operators(model, samples, c.module, c.occurrence, c.sample, s, forward, pad_to)
            for s in c.sizes
        )
        # The first of the batch's operators whose rows differ: its inputs are the module's
        # (equal rows: it is the culprit) or earlier operators' outputs (equal: not named).
        for (op, a_out, a_shapes), (other_op, b_out, b_shapes) in zip(left, right):
            if op != other_op:
                break  # another decomposition at the other size: the module is named alone
            if a_out != b_out:
                found.operator, found.operator_inputs = op, (f"[{a_shapes}]", f"[{b_shapes}]")
                break
    return found


@dataclass(frozen=True)
class ParityRecord:
    """One record at one position, from the full-sequence forward and from decoding."""

    #: The record (``fwd/<module>``, ``.N`` for a tuple's N-th tensor), its module's label, the
    #: positions in the sequence it covers (first, last), and the decoding call that computed it
    #: (0: the prefill, every position of the prompt; then one position a call).
    name: str
    module: str
    positions: tuple[int, int]
    call: int

    def where(self) -> str:
        """``position 7 (decoding step 2)`` or ``positions 0-5 (the prefill)``."""
        first, last = self.positions
        if self.call == 0:
            return f"positions {first}-{last} (the prefill)"
        return f"position {first} (decoding step {self.call})"

    #: max |decode - full| at that position, and it in units of the dtype's roundoff at the
    #: full forward's magnitude there (``compare --align``'s measure: 16 units are rounding).
    max_abs_diff: float | None
    rounding_units: float | None


@dataclass
class PrefillDecodeParity:
    """What ``prefill_decode_parity`` found: the logprobs a trainer computes (one forward over
    the whole sequence) against a sampler's (a prefill, then one decoding step a token with a
    KV cache), record by record at each position."""

    #: The prompt's length and the tokens decoded.
    prompt_length: int
    new_tokens: int
    num_compared: int
    #: The first record that differs, in the order decoding made them; ``None``: bitwise equal.
    first: ParityRecord | None = None
    #: The first record whose output differs at a position where its inputs are equal.
    culprit: ParityRecord | None = None
    #: Inside the culprit: the first ``aten`` operator whose output differs at its positions
    #: (in decoding against the forward, each operator paired with the same operator's call of
    #: the same rank in the other), and the shapes of its tensor inputs on each side.
    operator: str | None = None
    operator_inputs: tuple[str, str] | None = None
    #: Per decoded token: (position, max |logit diff|, its roundoff units, whether the argmax
    #: agrees), the last module's output (the logits) at that position.
    logits: list[tuple[int, float | None, float | None, bool]] = field(default_factory=list)
    #: The largest roundoff units of any differing record (``None`` when none differs), and the
    #: first record beyond ``ALIGN_UNITS`` (where the two part by more than rounding: a bug).
    worst_units: float | None = None
    first_beyond: ParityRecord | None = None

    @property
    def holds(self) -> bool:
        """Bitwise parity: every record equal at every position."""
        return self.first is None

    @property
    def aligned(self) -> bool:
        """Every difference is within 16 units of its dtype's roundoff (``compare --align``'s
        default allowance): the two paths differ by rounding, not by a bug."""
        return self.worst_units is None or self.worst_units <= ALIGN_UNITS

    def __str__(self) -> str:
        head = (
            f"prefill+decode vs one forward: a prompt of {self.prompt_length} tokens, "
            f"{self.new_tokens} decoded"
        )
        if self.holds:
            return f"{head}: bitwise equal, {self.num_compared} records at their positions"
        lines = [f"{head}: not bitwise equal"]
        f = self.first
        if f is not None:
            lines.append(
                f"  first difference: `{f.name}` at {f.where()}, max |diff| {f.max_abs_diff:.3e}"
            )
        if self.culprit is not None:
            c = self.culprit
            shape = (
                f"{c.positions[1] - c.positions[0] + 1} rows in the prefill against "
                f"{self.prompt_length + self.new_tokens - 1} in the forward"
                if c.call == 0
                else "one row in a decoding step against a matrix in the forward"
            )
            lines.append(
                f"  where they part: `{c.module}` at {c.where()}: its output differs while its "
                f"inputs there are equal: the same rows computed in another shape ({shape})"
            )
        if self.operator is not None:
            inputs = ""
            if self.operator_inputs is not None:
                inputs = (
                    f" (inputs {self.operator_inputs[0]} decoding vs "
                    f"{self.operator_inputs[1]} in the forward)"
                )
            lines.append(f"  operator: `{self.operator}`{inputs}")
        for position, diff, units, same in self.logits:
            if diff:
                token = "the same token" if same else "ANOTHER TOKEN"
                lines.append(
                    f"  logits at position {position}: max |diff| {diff:.3e} ({units:.1f} "
                    f"units of roundoff), {token}"
                )
        if self.first_beyond is not None:
            b = self.first_beyond
            lines.append(
                f"  first beyond rounding: `{b.name}` at {b.where()}: {b.rounding_units:.1f} units "
                f"of roundoff, max |diff| {b.max_abs_diff:.3e}: not rounding, another computation"
            )
        verdict = "within" if self.aligned else "beyond"
        lines.append(
            f"  {verdict} rounding: the worst record is {self.worst_units:.1f} units of its "
            f"dtype's roundoff (allowed {ALIGN_UNITS:.0f}, as `compare --align`)"
        )
        return "\n".join(lines)


#: The roundoff units a difference may take and still be rounding (``compare --align``'s
#: default, ``--rounding-units``).
ALIGN_UNITS = 16.0


def _units(a: torch.Tensor, b: torch.Tensor) -> tuple[float | None, float | None]:
    """max |a - b|, and it over (unit roundoff of a's dtype x max |b|)."""
    diff = _max_abs(a, b)
    if diff is None:
        return None, None
    scale = float(b.double().abs().max()) if b.numel() else 0.0
    unit = torch.finfo(a.dtype).eps / 2
    return diff, (diff / (unit * scale) if scale > 0 else float("inf") if diff else 0.0)


def _at(full: torch.Tensor, part: torch.Tensor, positions: int, first: int, count: int):
    """``full``'s slice that ``part`` holds: ``part`` covers ``count`` positions from ``first``
    (or the last ``k`` of them, where it kept fewer: logits of the last position only) along
    the dim where ``full`` has ``positions``; ``None`` when no dim lines up."""
    if full.dim() != part.dim():
        return None
    for d in range(full.dim()):
        if full.shape[d] != positions or part.shape[d] > count:
            continue
        if any(full.shape[i] != part.shape[i] for i in range(full.dim()) if i != d):
            continue
        k = part.shape[d]
        return full.narrow(d, first + count - k, k)
    return None


#: One call of the model: each module output (name, module, occurrence in the call, tensor,
#: the module's tensor inputs), in order.
_Call = list[tuple[str, str, int, torch.Tensor, list[torch.Tensor]]]


def _trace(model: torch.nn.Module, call: Callable[[], Any]) -> tuple[list[_Call], Any]:
    """Runs ``call()`` and keeps each call of the model (``_Call``), in order, and what
    ``call()`` returned."""
    calls: list[_Call] = []
    state: dict[str, Any] = {"depth": 0, "counts": {}, "inputs": {}}

    def pre(label):
        def hook(module, args, kwargs):
            if module is model:
                calls.append([])
                state["counts"] = {}
            leaves = pytree.tree_leaves((args, kwargs))
            tensors = [t.detach().clone() for t in leaves if isinstance(t, torch.Tensor)]
            state["inputs"].setdefault(label, []).append(tensors)

        return hook

    def post(label):
        def hook(module, args, kwargs, output):
            stack = state["inputs"].get(label)
            inputs = stack.pop() if stack else []
            k = state["counts"].get(label, 0)
            state["counts"][label] = k + 1
            for name, tensor in TORCH.outputs(label, output):
                calls[-1].append((name, label, k, tensor.detach().clone(), inputs))

        return hook

    hooks = _hook_every_module(model, pre, post)
    try:
        with torch.no_grad():
            result = call()
    finally:
        for h in hooks:
            h.remove()
    return calls, result


class _OperatorOutputs(torch.utils._python_dispatch.TorchDispatchMode):
    """Inside one call of one module: each ``aten`` operator's name, its tensor outputs and the
    shapes of its tensor inputs, in the order they run."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, list[torch.Tensor], str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        outs = [t.detach().clone() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        shapes = _shapes(ins)
        self.calls.append((str(func), outs, f"[{shapes}]"))
        return out


def _module_operators(model, label, call, occurrence, run):
    """The ``aten`` operators (``_OperatorOutputs``) of call ``occurrence`` of module ``label``
    during the model's call ``call`` of ``run()``, each paired with its rank among the calls of
    the same operator: ``{(operator, rank): (outputs, input shapes)}`` and their order."""
    mode = _OperatorOutputs()
    _inside(model, label, occurrence, mode, run, call=call)
    ranks: dict[str, int] = {}
    found = {}
    for op, outs, shapes in mode.calls:
        k = ranks.get(op, 0)
        ranks[op] = k + 1
        found[(op, k)] = (outs, shapes)
    return found


def _first_operator_apart(decoding, full, positions, first, count):
    """The first operator of ``decoding`` (in its order) whose output differs at the positions
    it covers from the same operator's call of the same rank in ``full``: (operator, input
    shapes in decoding, in the forward), or ``None``."""
    for (op, k), (outs, shapes) in decoding.items():
        if (op, k) not in full:
            continue
        whole_outs, whole_shapes = full[(op, k)]
        for part, whole in zip(outs, whole_outs):
            at = _at(whole, part, positions, first, count)
            if at is not None and _bits(at) != _bits(part):
                return op, shapes, whole_shapes
    return None


def _no_generate(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    raise ValueError(
        f"model: a {type(model).__name__} has no `generate` (a Hugging Face model's decoding "
        "with a KV cache is what is compared)"
    )


def prefill_decode_parity(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    new_tokens: int = 4,
    **generate_kwargs: Any,
) -> PrefillDecodeParity:
    """Decodes ``new_tokens`` greedily from ``input_ids`` (one prompt, ``[1, T]``) with the
    model's ``generate`` and its KV cache (a prefill, then one call a token), then runs one
    forward over the whole sequence, as a trainer computing the sampled tokens' logprobs does;
    compares every module's output at each position, bitwise and in units of roundoff, and
    names where the two part (the first module whose output differs while its inputs at that
    position are equal). ``generate_kwargs`` go to ``generate`` (``pad_token_id``, ...)."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids: one prompt, [1, T], not {list(input_ids.shape)}")
    if new_tokens < 1:
        raise ValueError(f"new_tokens: at least 1, not {new_tokens}")
    kwargs: dict[str, Any] = {
        "do_sample": False,
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
    }
    kwargs.update(generate_kwargs)
    generate: Callable[..., torch.Tensor] = getattr(model, "generate", None) or _no_generate(model)
    decoding, sequence = _trace(model, lambda: generate(input_ids, **kwargs))
    length = int(input_ids.shape[1])
    # The forward a trainer runs: every position whose next token was sampled.
    positions = int(sequence.shape[1]) - 1
    (full,), _ = _trace(model, lambda: model(sequence[:, :positions]))
    by_name = {(name, k): (tensor, inputs) for name, _, k, tensor, inputs in full}
    found = PrefillDecodeParity(length, positions - length + 1, 0)
    worst = None
    culprit_at = None
    for call, records in enumerate(decoding):
        first, count = (0, length) if call == 0 else (length + call - 1, 1)
        for name, module, k, tensor, inputs in records:
            if (name, k) not in by_name:
                continue
            whole, whole_inputs = by_name[(name, k)]
            expected = _at(whole, tensor, positions, first, count)
            if expected is None:
                continue
            found.num_compared += 1
            if _bits(expected) == _bits(tensor):
                continue
            diff, units = _units(tensor, expected)
            if units is not None:
                worst = units if worst is None else max(worst, units)
            record = ParityRecord(name, module, (first, first + count - 1), call, diff, units)
            if found.first_beyond is None and units is not None and units > ALIGN_UNITS:
                found.first_beyond = record
            if found.first is None:
                found.first = record
            if found.culprit is None and len(inputs) == len(whole_inputs):
                equal = True
                for a, b in zip(inputs, whole_inputs):
                    at = _at(b, a, positions, first, count)
                    if at is not None and _bits(at) != _bits(a):
                        equal = False
                if equal:
                    found.culprit = record
                    culprit_at = (module, call, k, first, count)
        # The logits: the model's own output at the call's last position.
        logits = [t for name, m, _, t, _ in records if m == f"fwd/{ROOT}"]
        full_logits = [t for name, m, _, t, _ in full if m == f"fwd/{ROOT}"]
        if call > 0 and logits and full_logits:
            at = _at(full_logits[0], logits[0], positions, first, count)
            if at is not None:
                diff, units = _units(logits[0], at)
                same = bool(logits[0].flatten().argmax() == at.flatten().argmax())
                found.logits.append((first, diff or None, units, same))
    found.worst_units = worst
    if culprit_at is not None:
        # Inside the culprit, on a second run of both paths: the first operator apart.
        module, call, k, first, count = culprit_at
        decoding_ops = _module_operators(
            model, module, call, k, lambda: generate(input_ids, **kwargs)
        )
        full_ops = _module_operators(model, module, 0, k, lambda: model(sequence[:, :positions]))
        apart = _first_operator_apart(decoding_ops, full_ops, positions, first, count)
        if apart is not None:
            found.operator, left, right = apart
            found.operator_inputs = (left, right)
    return found
