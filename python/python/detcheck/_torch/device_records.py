"""Records whose digests and statistics are computed on the device, read by the host once a step.

``DeviceRecords`` sits between ``detcheck.torch.watch``'s hooks and a ``TraceWriter``. A record
of a tensor that Triton can run on (a CUDA tensor; a CPU tensor under ``TRITON_INTERPRET=1``)
costs no host copy and no synchronisation. On a GPU, the hook takes a snapshot of the tensor on
its own stream (a device copy, at memory bandwidth: nothing later on that stream can change the
snapshot, in place or not). Snapshots are digested in batches: when the step ends, or sooner
once a batch holds ``_BATCH_BYTES`` of snapshots, ``detcheck._torch.device`` computes the batch's
tree digests (one launch a level of the deepest tree, ``tree_digests_into``; in stats mode also each
snapshot's statistics' totals) on a digest stream of detcheck's that waits for the copies, into
slots of a device buffer; a snapshot's memory goes back to PyTorch's allocator once the digest
stream is done with it (``record_stream``). Why a second stream: md5 is a chain of 64-byte
blocks, so a chunk's digest takes 65 dependent block steps in one GPU thread (tens of
microseconds) however many threads run; on the program's stream every record would hold the
step that long, on the digest stream it overlaps the program's kernels. Why batches: digested
one by one, a GPT-2 step's ~450 records queued ~1,000 such launches on the digest stream, 80 ms
of chains behind a 36 ms step (3.1x, measured on an H200); batched, a step pays a few chains
(docs/benchmarks.md). On the CPU (Triton's interpreter, for tests) the same snapshots and
batches are digested in place, in order, with no streams. When the step ends (``end_step``) one
copy per device takes the step's slots to pinned host memory on the digest stream, behind an
event; the records are filled one step late, when the next step ends
(or at ``drain``), after that event, so the host never waits for the step it has just launched.

Order: each device record holds its place in the writer at once (``TraceWriter._record_later``
gives a token; ``_fill`` gives the digest later), so records written from the host (a CPU
tensor, a record that needs its bytes: full mode, or the record a re-run captures; also a
program's own ``writer.record`` calls) go to the writer at once, in call order, and its thread
writes them after the places before them are filled.

The writer calls ``drain`` before its own ``flush`` and ``close`` (``TraceWriter._add_drain``), so
a trace is never finished without the records still on a device (a place never filled fails the
file rather than finishing it without the record); ``Recording.remove`` drains too.

Determinism: digests are the host's, bit for bit (``detcheck._torch.device``); statistics are summed
on the device in a fixed order (deterministic there, not bit-equal to the host's: they are
summaries, runs are compared by digest). Records, their order and steps are those of the host
path.

Limits: the snapshot is taken on the stream current when the hook runs; work that another
stream does on the tensor without waiting (a program's own side streams) is the program's race,
as it would be for any reader. A snapshot costs the tensor's size in device memory until the
digest stream has read it, and twice its size in memory traffic: a batch holds at most
``_BATCH_BYTES`` of snapshots (a larger record is a batch of its own) beside those the digest
stream is still reading. Slots are double-buffered, so one step's buffers are read while the
next step writes the other set.
"""

import torch

from .._core import arrays as _arrays

#: Slots per device buffer block (grown block by block as a step records more).
_BLOCK = 256
#: Bytes of snapshots a batch holds before it is digested (device memory held for them).
_BATCH_BYTES = 256 << 20


class _Batch:
    """One device's snapshots not yet digested: the snapshots, their slots' digest and totals
    rows, their bytes, and the streams they were copied on (by handle)."""

    def __init__(self):
        self.snapshots = []
        self.digests = []
        self.totals = []
        self.bytes = 0
        self.streams = {}


class _Slots:
    """One device's slot blocks for one step parity: digests (uint8 [_BLOCK, 16]) and totals
    (float64 [_BLOCK, 7])."""

    def __init__(self, device):
        self.device = device
        self.digests = []
        self.totals = []
        self.used = 0

    def take(self):
        """The next slot's (digest, totals) views."""
        block, row = divmod(self.used, _BLOCK)
        if block == len(self.digests):
            self.digests.append(torch.empty((_BLOCK, 16), dtype=torch.uint8, device=self.device))
            self.totals.append(torch.empty((_BLOCK, 7), dtype=torch.float64, device=self.device))
        self.used += 1
        return self.digests[block][row], self.totals[block][row]

    def to_host(self):
        """Starts the copies of the used slots to host memory (pinned for CUDA, on the digest
        stream, which must be current); returns ``(digests, totals, event)``: host tensors of
        ``used`` rows, valid once ``event`` (or nothing, on the CPU) has completed."""
        n = self.used
        blocks = -(-n // _BLOCK)
        digests = torch.cat(self.digests[:blocks])[:n] if blocks > 1 else self.digests[0][:n]
        totals = torch.cat(self.totals[:blocks])[:n] if blocks > 1 else self.totals[0][:n]
        if self.device.type == "cpu":
            return digests.clone(), totals.clone(), None
        pinned_d = torch.empty(digests.shape, dtype=digests.dtype, pin_memory=True)
        pinned_t = torch.empty(totals.shape, dtype=totals.dtype, pin_memory=True)
        pinned_d.copy_(digests, non_blocking=True)
        pinned_t.copy_(totals, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return pinned_d, pinned_t, event


class DeviceRecords:
    """The records of a writer whose digests are computed on the device (see the module)."""

    def __init__(self, writer, run_on_cpu=False):
        from . import device as _device  # imports triton: only when device digests are asked for

        self._device = _device
        self._writer = writer
        self._stats = writer.mode != "md5"
        #: Whether CPU tensors go to the kernels too (Triton's interpreter, for tests).
        self._run_on_cpu = run_on_cpu and _device.INTERPRETED
        #: This step's device records, in call order: (token, slots, row).
        self._queue = []
        #: Slots by (device, parity); the parity flips every step.
        self._slots = {}
        #: The digest stream of each CUDA device.
        self._streams = {}
        #: Each device's snapshots waiting to be digested.
        self._batches = {}
        self._parity = 0
        #: The previous step's records and their host copies, waiting for their events.
        self._in_flight = None
        self._drain = self.drain
        writer._add_drain(self._drain)

    def handles(self, tensor):
        """Whether ``tensor``'s record goes through the device kernels."""
        if not isinstance(tensor, torch.Tensor) or tensor.is_nested:
            return False
        if tensor.layout is not torch.strided:
            return False
        if tensor.dtype not in self._device.SUPPORTED_DTYPES:
            return False
        kind = tensor.device.type
        return kind == "cuda" or (kind == "cpu" and self._run_on_cpu)

    def record(self, step, name, tensor, replicated, host_value):
        """Records ``tensor`` as ``name`` at ``step``: on its device when it can and the writer
        does not need its bytes (its place is held in the writer until the digest comes);
        otherwise from the host (``host_value()`` gives what the writer's ``record`` takes)."""
        if not (self.handles(tensor) and not self._writer.needs_tensor(step, name)):
            if replicated:
                self._writer.record_replicated(step, name, host_value())
            else:
                self._writer.record(step, name, host_value())
            return
        tensor = tensor.detach()
        dtype = _arrays.torch_dtype_name(tensor.dtype)
        token = self._writer._record_later(step, name, dtype, list(tensor.shape), replicated)
        slots = self._slots_of(tensor.device)
        digest, totals = slots.take()
        self._queue.append((token, slots, slots.used - 1))
        snapshot = tensor.clone(memory_format=torch.contiguous_format)
        batch = self._batches.get(tensor.device)
        if batch is None:
            batch = self._batches[tensor.device] = _Batch()
        batch.snapshots.append(snapshot)
        batch.digests.append(digest)
        batch.totals.append(totals)
        batch.bytes += snapshot.numel() * snapshot.element_size()
        if tensor.device.type == "cuda":
            stream = torch.cuda.current_stream(tensor.device)
            batch.streams.setdefault(stream.cuda_stream, stream)
        if batch.bytes >= _BATCH_BYTES:
            self._digest_batch(tensor.device)

    def _digest_batch(self, device):
        """Queues the digests of ``device``'s batch on its digest stream, behind the copies (on
        the CPU, Triton's interpreter: computes them)."""
        batch = self._batches.pop(device)
        if device.type == "cpu":
            self._digest(batch)
            return
        stream = self._stream_of(device)
        for program_stream in batch.streams.values():
            stream.wait_stream(program_stream)
        with torch.cuda.stream(stream):
            self._digest(batch)
        for snapshot in batch.snapshots:
            snapshot.record_stream(stream)

    def _digest(self, batch):
        self._device.tree_digests_into(batch.snapshots, batch.digests)
        if self._stats:
            self._device.stats_totals_batch_into(batch.snapshots, batch.totals)

    def end_step(self):
        """The step's records are all given: starts their copies to the host, and fills the
        previous step's places in the writer (their copies are done by now)."""
        self._finish_in_flight()
        for device in list(self._batches):
            self._digest_batch(device)
        if not self._queue:
            return
        copies = {}
        for (device, parity), slots in self._slots.items():
            if parity == self._parity and slots.used:
                if device.type == "cpu":
                    copies[id(slots)] = slots.to_host()
                    continue
                with torch.cuda.stream(self._stream_of(device)):
                    copies[id(slots)] = slots.to_host()
        self._in_flight = (self._queue, copies)
        self._queue = []
        self._parity ^= 1
        for (_, parity), slots in self._slots.items():
            if parity == self._parity:
                slots.used = 0

    def drain(self):
        """Fills every place held in the writer now (waits for the device)."""
        self.end_step()
        self._finish_in_flight()

    def close(self):
        """Drains, and stops being called by the writer."""
        self.drain()
        self._writer._remove_drain(self._drain)

    def _stream_of(self, device):
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        return stream

    def _slots_of(self, device):
        key = (device, self._parity)
        slots = self._slots.get(key)
        if slots is None:
            slots = self._slots[key] = _Slots(device)
        return slots

    def _finish_in_flight(self):
        if self._in_flight is None:
            return
        items, copies = self._in_flight
        self._in_flight = None
        for _, _, event in copies.values():
            if event is not None:
                event.synchronize()
        host = {key: (d.tolist(), t.tolist()) for key, (d, t, _) in copies.items()}
        for token, slots, row in items:
            digests, totals = host[id(slots)]
            stats = None
            if self._stats:
                t = totals[row]
                stats = (t[0], t[1], t[2], t[3], int(t[4]), int(t[5]), int(t[6]))
            self._writer._fill(token, bytes(digests[row]), stats)
