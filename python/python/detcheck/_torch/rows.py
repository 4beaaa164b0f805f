"""Rows: each sample's rows of a model's records, written as that sample's own records, for
the ``batch_sizes`` check (``DETCHECK_RECORD=rows``; docs/checks.md, "batch_sizes").

A *batch* is one call of the model at the top level, or one call of Hugging Face's
``generate`` (every forward it makes, the prefill and each decoding step, belongs to the
batch it was given). Its rows are the first dimension of its first tensor argument (a
positional argument, else a keyword argument, in their order). A *sample* is a row's place in
the stream of samples the program feeds its model: the first batch's rows are samples 0 to
R - 1, the next batch's follow. A row whose ``attention_mask`` (a keyword argument of the
batch's call, Hugging Face's convention) is all zero is padding, no sample: a program that pads
every batch to one size (the fix for shape dependence) is compared sample by sample, its
padding rows left out. ``RowsSink`` stands between the recording engine and its sink:
it keeps the records of a batch (a copy of each) and, when the batch ends, writes sample
``s``'s row of each record (``tensor[i:i + 1]``) at step ``s``, in the order the records were
made. So the trace of a run at batch size 1 and the trace at batch size 8 hold, at each step,
the records of one sample, and the one comparison engine compares them record by record.

A recorder that writes samples says so in the trace's environment (``detcheck.rows:
samples``): a run of the check without it is n/a there. A record the batch shares may still be
a sample's at the one size whose rows its first dimension equals; the check leaves a record one
size holds alone out of its comparison, and counts it (``src/check/kinds/batch_sizes.rs``).

Main types: ``Batches`` (``BATCHES``: where a batch begins and ends), ``RowsSink``,
``Inside`` (the drill-down's re-run: one module call's operators, ``DETCHECK_ROWS_INSIDE``); and
``wrap_generate`` (``generate``'s batch, installed when ``transformers.generation.utils`` is
imported into a rows launch).

Determinism: a sample's records are written in the order the program made them; nothing here
reads a clock, a random number or a hash order.

Limits: a record is split into samples only where its first dimension is the batch's number of
rows (a tensor shared by the batch, ``[1, T, D]`` or a position vector, is not: it is counted,
once a name, in the environment's ``detcheck.rows.unsplit``); a ``[B * T, D]`` view of a batch is
split only where ``T`` is 1 (a decoding step). Gradients, parameters and evidence are not
recorded (an update between batches would change what each batch computes: the check is for
inference). A batch's records are held in memory until it ends.
"""

import functools
import os

import torch
from torch.utils import _python_dispatch

from .._detcheck import operator_record_name, window_record_name
from .tensors import host

__all__ = ["BATCHES", "Batches", "Inside", "RowsSink", "batch_of", "rows_of", "wrap_generate"]


def rows_of(args, kwargs):
    """The rows of a call's batch: the first dimension of its first tensor argument with one
    (positional arguments first, then keyword arguments in their order); ``None`` if none."""
    for value in (*args, *(kwargs or {}).values()):
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            return int(value.shape[0])
    return None


def batch_of(args, kwargs):
    """A call's batch: its rows (``rows_of``) and which of them are samples, as a tuple of row
    indices, or ``None`` when all are: the rows whose ``attention_mask`` keyword argument is not
    all zero (module doc: padding rows are no samples)."""
    rows = rows_of(args, kwargs)
    mask = (kwargs or {}).get("attention_mask")
    if rows is None or not isinstance(mask, torch.Tensor) or mask.dim() < 2:
        return rows, None
    if mask.shape[0] != rows:
        return rows, None
    with _python_dispatch._disable_current_modes():  # no operator of the model's
        padding = ~mask.reshape(rows, -1).bool().any(dim=1)
        if not bool(padding.any()):
            return rows, None
        return rows, tuple(int(i) for i in (~padding).nonzero().flatten().tolist())


class Batches:
    """Where batches begin and end (module doc): nested calls (the model's forwards inside
    ``generate``) belong to the outermost one, whose rows count."""

    def __init__(self):
        self.depth = 0
        #: The rows of the open batch (``None``: no tensor argument gave them).
        self.rows = None
        #: Which rows of the open batch are samples (``None``: all; ``batch_of``).
        self.samples = None
        #: The sink that writes a batch's samples when it ends.
        self.sink = None

    def begin(self, rows, samples=None):
        if self.depth == 0:
            self.rows, self.samples = rows, samples
        self.depth += 1

    def sample_rows(self):
        """The open batch's rows that are samples, in order (all of them when no row is
        padding); empty when its rows are unknown."""
        if self.rows is None:
            return ()
        return range(self.rows) if self.samples is None else self.samples

    def end(self):
        self.depth = max(0, self.depth - 1)
        if self.depth == 0 and self.sink is not None:
            self.sink.flush(self.rows, self.sample_rows())


#: The batches of this process (one model is recorded: ``_torch.auto``).
BATCHES = Batches()


class RowsSink:
    """A ``TensorSink`` that writes each sample's rows as that sample's records (module doc),
    through ``inner`` (the engine's own sink)."""

    def __init__(self, inner, writer, batches=BATCHES):
        self._inner = inner
        self._writer = writer
        self._batches = batches
        batches.sink = self
        # What tells the `batch_sizes` check that this trace holds samples (`ROWS_KEY`).
        writer.add_environment("detcheck.rows", "samples")
        #: The records of the open batch: (name, a copy of the tensor).
        self._held = []
        #: The first sample of the next batch.
        self._next = 0
        #: Names recorded whole in no sample (module doc, limits).
        self._unsplit = set()
        #: Records of one sample each (``put_sample``): (sample, name, tensor).
        self._own = []

    def put(self, step, name, tensor, replicated=False, state=False):
        rows = self._batches.rows
        shape = getattr(tensor, "shape", None)
        if self._batches.depth == 0 or rows is None or not shape or shape[0] != rows:
            self._unsplit.add(name)
            return
        try:
            with _python_dispatch._disable_current_modes():  # no operator of the model's
                self._held.append((name, tensor.detach().clone()))
        except Exception:
            self._unsplit.add(name)

    def put_sample(self, sample, name, tensor):
        """A record of one sample only (an operator's rows, ``Inside``), written after the
        sample's rows of the batch's records."""
        self._own.append((sample, name, tensor))

    def put_state(self, step, items, replicated):
        """Gradients and parameters are no sample's (module doc, limits)."""

    def end_step(self):
        """The engine's steps are not samples: a sample's step is its place in the stream."""

    def flush(self, rows, sample_rows=None):
        """The batch ended: each sample's rows of its records, at the sample's step (the rows
        ``sample_rows`` names, all ``rows`` when ``None``)."""
        held, self._held = self._held, []
        own, self._own = self._own, []
        if not held or rows is None:
            return
        sample_rows = range(rows) if sample_rows is None else sample_rows
        # A dense CPU tensor of a numpy dtype goes to the writer as numpy rows (no call of the
        # sink's per record: a batch of 64 rows is 64 records a tensor); any other through the
        # sink, row by row.
        held = [(name, tensor, host(tensor)) for name, tensor in held]
        record = self._writer.record
        for k, i in enumerate(sample_rows):
            step = self._next + k
            for name, tensor, array in held:
                if isinstance(array, torch.Tensor):
                    self._inner.put(step, name, tensor[i : i + 1])
                else:
                    try:
                        record(step, name, array[i : i + 1])
                    except Exception as e:  # never into the program (`TorchSink.put`'s promise)
                        self._unsplit.add(f"{name} (recording it failed: {e!r})")
            for sample, name, tensor in own:
                if sample == step:
                    self._inner.put(step, name, tensor)
            self._inner.end_step()
        self._next += len(sample_rows)

    @property
    def first_sample(self):
        """The sample of the open batch's first row."""
        return self._next

    def close(self):
        if self._held:
            self.flush(self._batches.rows, self._batches.sample_rows())
        if self._batches.sink is self:
            self._batches.sink = None
        if self._unsplit:
            try:
                self._writer.add_environment(
                    "detcheck.rows.unsplit",
                    f"{len(self._unsplit)} name(s) whose first dimension is not the batch's "
                    f"rows, recorded in no sample: {', '.join(sorted(self._unsplit)[:5])}",
                )
            except Exception:
                pass
        self._inner.close()


def wrap_generate(module, batches=BATCHES):
    """``GenerationMixin.generate`` of ``transformers.generation.utils`` (``module``) as one
    batch: its rows are its prompts' (module doc). Wrapping twice does nothing."""
    mixin = getattr(module, "GenerationMixin", None)
    original = getattr(mixin, "generate", None)
    if original is None or getattr(original, "_detcheck_batch", False):
        return

    @functools.wraps(original)
    def generate(self, *args, **kwargs):
        batches.begin(*batch_of(args, kwargs))
        try:
            return original(self, *args, **kwargs)
        finally:
            batches.end()

    generate._detcheck_batch = True
    mixin.generate = generate


#: The launch's request for one module call's operators (``DETCHECK_ROWS_INSIDE``:
#: ``<sample>:<call>:<record name>``, ``detcheck::launch``).
INSIDE_VAR = "DETCHECK_ROWS_INSIDE"


class Inside:
    """The ``batch_sizes`` check's drill-down to the operator (``DETCHECK_ROWS_INSIDE``): in
    call ``call`` (counted within the batch) of the module that made record ``name``, in the
    batch that holds ``sample``, every ``aten`` operator that reads the batch
    (``_torch.batch._OperatorRows``: the module's inputs or what such operators made), the sample's
    rows of its outputs written at the sample's step as the operator trace names a call's
    first output (``operator_record_name``: ``op/NNNN/<module>/<operator>/out0``), after the
    sample's rows of the module's tensor inputs (``window/inN``, as the operator trace names a
    window's inputs),
    with its input shapes (``detcheck.rows.op:N``) and the program's line (``site:rows:N``) in
    the environment, and the sample's row, the batch's rows, the samples before it in the
    batch and the intra-op threads (``detcheck.rows.row``, ``.of``, ``.before``,
    ``.threads``). ``install`` hooks the module, or hooks nothing."""

    #: The drill-down of this process, once installed.
    current = None

    def __init__(self, sink, writer, label, sample, call):
        self.module = None
        self._sink, self._writer = sink, writer
        self._label = label
        self._sample, self._call = sample, call
        self._calls = 0
        self._batch = None
        self._mode = None

    @classmethod
    def install(cls, model, sink, writer, hooks):
        """From the launch's ``DETCHECK_ROWS_INSIDE``: the module found by its record's name
        (``fwd/<module>``, or ``fwd/<module>.N`` for a tuple's N-th tensor) in ``model``,
        hooked through ``hooks`` (``_torch.tensors.MODULE_HOOKS``); the hooks' handles, or
        ``[]``."""
        asked = os.environ.get(INSIDE_VAR)
        if not asked:
            return []
        try:
            sample, call, name = asked.split(":", 2)
            label = name[len("fwd/") :]
            modules = dict(model.named_modules())
            modules["(model)"] = model
            if label not in modules and "." in label:
                label = label.rsplit(".", 1)[0]
            module = modules[label]
            inside = cls(sink, writer, label, int(sample), int(call))
            inside.module = module
            cls.current = inside
        except Exception as e:
            writer.add_environment("detcheck.rows.inside", f"not traced: {asked}: {e!r}")
            return []
        return [
            hooks.before(module, inside._begins, with_kwargs=True),
            hooks.after(module, inside._ends, first=True),
        ]

    def first_call(self, module, args, kwargs):
        """The model's call during which the recording began: its pre-hooks were collected
        before the hooks were added, so the traced module's is run here when it is the model."""
        if module is self.module:
            self._begins(module, args, kwargs)

    def _begins(self, module, args, kwargs):
        batch = (BATCHES.rows, self._sink.first_sample)
        if batch != self._batch:  # a new batch: its calls are counted anew
            self._batch, self._calls = batch, 0
        rows, first = batch
        samples = BATCHES.sample_rows()
        call, self._calls = self._calls, self._calls + 1
        if rows is None or not first <= self._sample < first + len(samples) or call != self._call:
            return
        from .batch import _bits, _OperatorRows, _rows

        row = samples[self._sample - first]
        # Where the sample sits in this batch (its row, the batch's rows, the samples before
        # it) and the threads that split the batch: the report's `SampleRows`.
        where = {"row": row, "of": rows, "before": self._sample - first}
        where["threads"] = torch.get_num_threads()
        for key, value in where.items():
            self._writer.add_environment(f"detcheck.rows.{key}", str(value))
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        # The sample's rows of the module's inputs (`window/inN`): where they already differ,
        # no operator inside the module made the difference.
        with _python_dispatch._disable_current_modes():
            for j, t in enumerate(x for x in leaves if isinstance(x, torch.Tensor)):
                rows_of_input = _rows(t, row, rows)
                if rows_of_input is not None:
                    name = window_record_name("in", j)
                    self._sink.put_sample(self._sample, name, _bytes(_bits(rows_of_input)))
        self._mode = _OperatorRows(row, rows)
        self._mode.holds(leaves)
        self._mode.sites = []
        self._mode.__enter__()

    def _ends(self, module, args, output):
        mode, self._mode = self._mode, None
        if mode is None:
            return
        mode.__exit__(None, None, None)
        for i, (operator, bits, shapes) in enumerate(mode.calls):
            name = operator_record_name(i, self._label, operator, "out", 0)
            self._sink.put_sample(self._sample, name, _bytes(bits))
            self._writer.add_environment(f"detcheck.rows.op:{i}", shapes)
            site = mode.sites[i] if i < len(mode.sites) else None
            if site is not None:
                self._writer.add_environment(f"site:rows:{i}", site)


def _bytes(bits):
    """A sample's rows as a record: their bytes, a ``uint8`` tensor (two records are equal when
    the rows are bitwise)."""
    return torch.frombuffer(bytearray(bits), dtype=torch.uint8) if bits else torch.zeros(0)
