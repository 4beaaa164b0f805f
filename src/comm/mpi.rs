//! MPI ranks: one process per rank under `mpirun`, through rsmpi (cargo feature `mpi`).
//!
//! [`MpiComm`] implements [`Communicator`] on an MPI communicator. Every collective except
//! `native` allreduce is built from point-to-point messages that detcheck schedules itself, so it
//! can keep the promises of the thread backend that MPI's own collectives cannot:
//! - **the same bits as thread ranks**: an allreduce sends chunk `c` of every contribution to rank
//!   `c`, which reduces it with the shared arithmetic of [`crate::value::reduce`] in the mode's order and
//!   sends the result to every rank: the schedule of `comm/threads.rs`, element for element;
//! - **deadlines**: nothing blocks. Sends are immediate and every wait polls (`MPI_Improbe` on
//!   `MPI_ANY_SOURCE`) until the messages it needs are in, a peer is known to have failed or
//!   exited, or the deadline passes. A wait spins, then yields, and sleeps between polls only
//!   after 2 ms (`Backoff`): a sleep on the critical path costs more than a small message;
//! - **small messages**: a payload of up to `INLINE_MAX_BYTES` (32 KiB) travels in its header's
//!   message (one message per peer and round), larger ones as a typed message after it; receive
//!   buffers are reused from one collective to the next. Same elements, so the same bits;
//! - **contained failures**: a rank whose program ends, by returning, erroring or panicking, sends
//!   every peer a *done* message after its last data message (MPI keeps the order of messages
//!   between two ranks on one tag). A peer waiting for data from it then fails with
//!   [`CommError::PeerFailed`] or [`CommError::PeerExited`] instead of hanging, and
//!   [`MpiComm::finish`] drains every message still addressed to this rank, so the communicator
//!   is clean for the next run: no `MPI_ERR_TRUNCATE`, no abort.
//!
//! `arrival_order` is the negative control. In a plain run it reduces in the order this rank
//! received the messages (from `MPI_ANY_SOURCE`, itself counted when it sent); under a check's
//! [`Perturbation`] it reduces in the round's seeded order, as thread ranks do, because the
//! received order does not follow the senders' timing (`round_order` says why). Runs 1 and 2 of
//! a check therefore add in different orders in every round, for certain, not by timing luck.
//! A perturbation's seeded delays still shift when ranks send. `native` calls `MPI_Allreduce` after a handshake that proves every rank
//! entered the collective (so a rank that failed before it is reported, not waited for); the
//! settings of `detcheck env` pin the algorithm the MPI library uses.
//!
//! What cannot be contained: a rank that never arrives (stalled, killed) leaves this rank's sends
//! to it incomplete, and MPI offers no way to take a buffer back. When the deadline passes in that
//! state, the rank prints what it waited for, naming the missing ranks, and aborts the job
//! (`MPI_Abort`, exit code 3 from `mpirun`).
//!
//! Invariant (MPI ranks compute what thread ranks compute): an allreduce in a detcheck schedule
//! sends chunk c to rank c, which calls `reduce_chunk` in `summation_order`, exactly as a thread
//! rank does; `backends` checks it on every deterministic scenario under MPI.
//!
//! Invariant (no MPI wait without a deadline): sends are immediate, receives are probed; a peer's
//! *done* notice follows its last message on the same tag, so "done and missing" means "never
//! coming". A run ends with every peer's done received and every message drained, so the next run
//! starts on a clean communicator. Only `native`'s `MPI_Allreduce` blocks, after a handshake; only
//! incomplete sends at a deadline abort the job.
//!
//! Determinism: only `arrival_order` reads the order messages arrived in, and only in a plain
//! run; every other result is a function of the contributions. Waits use the monotonic clock, never on a data path.
//!
//! Dtypes: every dtype is broadcast and gathered (f16 and bf16 travel as bytes, the others as
//! MPI's typed elements); allreduce and reduce-scatter, `native` included, refuse f16, bf16 and
//! bool with [`CommError::InvalidArgument`] before any message is sent, as thread ranks do (why:
//! `value/reduce.rs`).
//!
//! Limits: messages carry native-endian element bytes (a homogeneous cluster, as MPI's typed
//! messages assume); each message is one point-to-point send, so very large worlds pay
//! O(ranks) messages per rank and collective.

use super::threads::{check_reducible, copy_into, describe, Perturbation};
use super::{CollectiveId, CollectiveKind, CommError, Communicator};
use crate::file::format;
use crate::value::reduce::{chunk_range, reduce_chunk, summation_order, ReduceOp, ReductionMode};
use crate::value::tensor::{DType, Tensor, TensorData};
use mpi::collective::SystemOperation;
use mpi::point_to_point::Message;
use mpi::request::{LocalScope, Request};
use mpi::topology::Communicator as _;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

/// The tag of every message of a run: data headers, payloads and done notices share it so MPI
/// delivers them from one sender in the order they were sent.
const TAG_DATA: i32 = 17;

const KIND_HEADER: u8 = 1;
const KIND_DONE: u8 = 2;
/// A header with its payload's bytes after it, in one message.
const KIND_INLINE: u8 = 3;

/// Payloads of at most this many bytes travel in their header's message (the latency path): one
/// message per peer and round instead of two, for one copy on each side. The bytes are the same
/// native-endian elements a typed message carries, so the results are too.
const INLINE_MAX_BYTES: usize = 32 << 10;

/// Waits politely: spins briefly for latency, then yields, so that ranks oversubscribed on few
/// cores leave the CPU to the rank they wait for; only a wait longer than [`Backoff::SLEEP_AFTER`]
/// sleeps between polls. Why not sleep sooner: a sleep costs its whole length plus the timer's
/// slack (tens of µs) on a message that takes a few µs, and it was on the critical path of every
/// small allreduce; a yield costs about a microsecond when nobody else wants the core.
pub(crate) struct Backoff {
    polls: u32,
    since: Option<Instant>,
    sleeping: bool,
}

impl Backoff {
    /// Waits longer than this sleep [`Backoff::SLEEP`] between polls. A wait that long is a
    /// peer computing (a large chunk) or stalled, and sleeping gives a rank that shares its core
    /// the whole core; a sleep (with the timer's slack, ~100 µs) then adds at most ~5% to it.
    const SLEEP_AFTER: Duration = Duration::from_millis(2);
    const SLEEP: Duration = Duration::from_micros(50);

    pub(crate) fn new() -> Self {
        Backoff {
            polls: 0,
            since: None,
            sleeping: false,
        }
    }

    pub(crate) fn wait(&mut self) {
        self.polls = self.polls.saturating_add(1);
        if self.polls < 64 {
            std::hint::spin_loop();
            return;
        }
        if self.sleeping {
            std::thread::sleep(Self::SLEEP);
            return;
        }
        // The clock is read once per 64 polls: a yield is about a microsecond.
        if self.polls.is_multiple_of(64) {
            let since = *self.since.get_or_insert_with(Instant::now);
            self.sleeping = since.elapsed() >= Self::SLEEP_AFTER;
        }
        std::thread::yield_now();
    }
}

/// How long a rank waits between printing why it aborts and `MPI_Abort`. The launcher forwards
/// a rank's stderr through its own process; MPICH's Hydra tears the job down on an abort without
/// forwarding what is still in that pipe, so without the pause the message could be lost (1 run
/// in 8 of the stall test lost every rank's message).
const ABORT_GRACE: Duration = Duration::from_millis(500);

/// Prints why this rank cannot go on and aborts the whole MPI job with exit code 3.
pub(crate) fn abort_job(context: &str, reason: &str) -> ! {
    let world = SimpleCommunicator::world();
    eprintln!(
        "detcheck: MPI rank {} of {}: {context}: {reason}; aborting the MPI job",
        world.rank(),
        world.size()
    );
    // This rank said why: its watcher must not name it again when the abort ends it.
    super::watcher::leaving();
    std::thread::sleep(ABORT_GRACE);
    world.abort(3)
}

/// What a data message says about its payload.
#[derive(Debug, Clone, PartialEq)]
struct Header {
    round: u64,
    dtype: Option<DType>,
    shape: Vec<usize>,
    signature: String,
}

impl Header {
    fn len(&self) -> usize {
        if self.dtype.is_none() {
            0
        } else {
            self.shape.iter().product()
        }
    }

    /// The header alone (`KIND_HEADER`: a payload, if any, follows as its own message), or with
    /// `inline` payload bytes after it (`KIND_INLINE`).
    fn encode(&self, inline: Option<&[u8]>) -> Vec<u8> {
        let kind = if inline.is_some() {
            KIND_INLINE
        } else {
            KIND_HEADER
        };
        let mut out = Vec::with_capacity(64 + inline.map_or(0, <[u8]>::len));
        out.push(kind);
        out.extend_from_slice(&self.round.to_le_bytes());
        // The trace format's dtype codes (0: no tensor), one table for both.
        out.push(self.dtype.map_or(0, format::dtype_code));
        out.extend_from_slice(&(self.shape.len() as u32).to_le_bytes());
        for &d in &self.shape {
            out.extend_from_slice(&(d as u64).to_le_bytes());
        }
        out.extend_from_slice(&(self.signature.len() as u32).to_le_bytes());
        out.extend_from_slice(self.signature.as_bytes());
        out.extend_from_slice(inline.unwrap_or_default());
        out
    }

    /// Decodes a header and the bytes after it (an inline payload); `None` for bytes no
    /// detcheck rank sends.
    fn decode(bytes: &[u8]) -> Option<(Header, &[u8])> {
        let mut at = 1;
        let mut take = |n: usize| -> Option<&[u8]> {
            let part = bytes.get(at..at + n)?;
            at += n;
            Some(part)
        };
        let round = u64::from_le_bytes(take(8)?.try_into().ok()?);
        let dtype = match take(1)?[0] {
            0 => None,
            code => Some(format::dtype_from_code(code)?),
        };
        let ndim = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let mut shape = Vec::with_capacity(ndim.min(64));
        for _ in 0..ndim {
            shape.push(usize::try_from(u64::from_le_bytes(take(8)?.try_into().ok()?)).ok()?);
        }
        let signature_len = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let signature = String::from_utf8(take(signature_len)?.to_vec()).ok()?;
        let header = Header {
            round,
            dtype,
            shape,
            signature,
        };
        Some((header, bytes.get(at..)?))
    }
}

/// A data message: its header, and its payload once that has arrived.
struct Incoming {
    header: Header,
    data: Option<TensorData>,
}

/// A header whose payload is its sender's next message.
#[derive(Debug, Clone, Copy, PartialEq)]
struct AwaitedPayload {
    round: u64,
    dtype: DType,
    len: usize,
}

/// Everything received and not yet consumed, plus what is known about each peer.
struct Inbox {
    messages: BTreeMap<(u64, usize), Incoming>,
    /// Per round, the sources whose message is complete, in the order they completed.
    arrival: BTreeMap<u64, Vec<usize>>,
    /// Per source: the header whose payload is the source's next message. It outlives its round:
    /// a round that ended early (a peer failed) still receives, and discards, the payloads in flight.
    awaiting_payload: Vec<Option<AwaitedPayload>>,
    /// Per source: its done notice (`Some(failed)`) once received.
    done: Vec<Option<bool>>,
    /// The bytes of the last header or notice received, kept for the next one.
    scratch: Vec<u8>,
    /// Receive buffers given back after their collective, taken again by later messages.
    spare: Vec<TensorData>,
}

impl Inbox {
    fn new(size: usize) -> Self {
        Inbox {
            messages: BTreeMap::new(),
            arrival: BTreeMap::new(),
            awaiting_payload: vec![None; size],
            done: vec![None; size],
            scratch: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// A buffer of `len` elements of `dtype`: a spare one when there is one of that dtype (its
    /// old elements are overwritten by the message received into it), a new one otherwise. The
    /// spare that fits best is taken (at least `len`, closest), so that buffers of a run's
    /// different sizes keep their sizes instead of being zeroed again as they grow.
    fn buffer(&mut self, dtype: DType, len: usize) -> TensorData {
        let best = self
            .spare
            .iter()
            .enumerate()
            .filter(|(_, d)| d.dtype() == dtype)
            .min_by_key(|(_, d)| (d.len() < len, d.len().abs_diff(len)))
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let mut data = self.spare.swap_remove(i);
                resize_data(&mut data, len);
                data
            }
            None => empty_like(dtype, len),
        }
    }

    /// Files a header from `source` with its payload, received in the same message.
    fn accept_inline(&mut self, source: usize, header: Header, data: TensorData) {
        let round = header.round;
        self.arrival.entry(round).or_default().push(source);
        self.messages.insert(
            (round, source),
            Incoming {
                header,
                data: Some(data),
            },
        );
    }

    fn is_complete(&self, round: u64, source: usize) -> bool {
        self.messages
            .get(&(round, source))
            .is_some_and(|m| m.header.len() == 0 || m.data.is_some())
    }

    /// Files a header from `source`; a typed, non-empty one makes its payload awaited.
    fn accept_header(&mut self, source: usize, header: Header) {
        let round = header.round;
        match header.dtype.filter(|_| header.len() > 0) {
            Some(dtype) => {
                self.awaiting_payload[source] = Some(AwaitedPayload {
                    round,
                    dtype,
                    len: header.len(),
                });
            }
            None => self.arrival.entry(round).or_default().push(source),
        }
        self.messages
            .insert((round, source), Incoming { header, data: None });
    }

    /// Files the payload of `awaited` from `source`. A round that already ended (its exchange
    /// failed on another peer and took its messages) gets nothing: the payload is dropped.
    fn accept_payload(&mut self, source: usize, awaited: AwaitedPayload, data: TensorData) {
        if let Some(incoming) = self.messages.get_mut(&(awaited.round, source)) {
            incoming.data = Some(data);
            self.arrival.entry(awaited.round).or_default().push(source);
        }
    }

    /// Takes round `round`'s messages from `sources` and its arrival order; whatever is still in
    /// flight for that round is discarded when it arrives.
    fn take_round(
        &mut self,
        round: u64,
        sources: &[usize],
    ) -> (BTreeMap<usize, Incoming>, Vec<usize>) {
        let arrival = self.arrival.remove(&round).unwrap_or_default();
        let received = sources
            .iter()
            .filter_map(|&source| Some((source, self.messages.remove(&(round, source))?)))
            .collect();
        (received, arrival)
    }
}

/// The order in which round `round`'s contributions count as arrived: `arrival`, the order
/// this rank received them in, for a plain run; under a perturbation, the same ranks in the
/// round's seeded order ([`Perturbation::arrival_order`], the order thread ranks deposit in).
///
/// Why not the received order under a check: it does not follow the senders' timing. A rank
/// counts itself when it sends, after its own delay, without polling during it; and messages
/// that are all in by its first poll come out of an `MPI_ANY_SOURCE` probe in the library's
/// order (Open MPI's matching scans peers by rank), whatever order they were sent in. Two runs
/// then summed in the same order in most rounds, and the 4-rank `arrival_order` control was
/// missed in 1 to 3 checks of 26 on 2 loaded cores. The seeded orders of runs 1 and 2 differ
/// in every round (their rotations differ), so a check sees two different orders for certain.
fn round_order(
    perturbation: Option<&Perturbation>,
    size: usize,
    round: u64,
    arrival: Vec<usize>,
) -> Vec<usize> {
    match perturbation {
        None => arrival,
        Some(p) => p
            .arrival_order(size, round)
            .into_iter()
            .filter(|rank| arrival.contains(rank))
            .collect(),
    }
}

/// Resizes `data` to `len` elements, writing defaults only where it grows.
fn resize_data(data: &mut TensorData, len: usize) {
    match data {
        TensorData::F32(v) => v.resize(len, 0.0),
        TensorData::F64(v) => v.resize(len, 0.0),
        TensorData::I64(v) => v.resize(len, 0),
        TensorData::U8(v) => v.resize(len, 0),
        TensorData::F16(v) => v.resize(len, half::f16::ZERO),
        TensorData::BF16(v) => v.resize(len, half::bf16::ZERO),
        TensorData::I32(v) => v.resize(len, 0),
        TensorData::Bool(v) => v.resize(len, false),
        TensorData::I8(v) => v.resize(len, 0),
        TensorData::I16(v) => v.resize(len, 0),
        TensorData::U16(v) => v.resize(len, 0),
        TensorData::F8E4M3(v) | TensorData::F8E5M2(v) => v.resize(len, 0),
        TensorData::C64(v) => v.resize(len, [0.0; 2]),
        TensorData::C128(v) => v.resize(len, [0.0; 2]),
    }
}

/// The native-endian bytes of elements `range` of `data`: what a typed message carries.
fn payload_bytes(data: &TensorData, range: Range<usize>) -> &[u8] {
    match data {
        TensorData::F32(v) => bytemuck::cast_slice(&v[range]),
        TensorData::F64(v) => bytemuck::cast_slice(&v[range]),
        TensorData::I64(v) => bytemuck::cast_slice(&v[range]),
        TensorData::U8(v) => &v[range],
        TensorData::F16(v) => bytemuck::cast_slice(&v[range]),
        TensorData::BF16(v) => bytemuck::cast_slice(&v[range]),
        TensorData::I32(v) => bytemuck::cast_slice(&v[range]),
        TensorData::Bool(v) => bytemuck::cast_slice(&v[range]),
        TensorData::I8(v) => bytemuck::cast_slice(&v[range]),
        TensorData::I16(v) => bytemuck::cast_slice(&v[range]),
        TensorData::U16(v) => bytemuck::cast_slice(&v[range]),
        TensorData::F8E4M3(v) | TensorData::F8E5M2(v) => &v[range],
        TensorData::C64(v) => bytemuck::cast_slice(&v[range]),
        TensorData::C128(v) => bytemuck::cast_slice(&v[range]),
    }
}

/// Overwrites `data`'s elements with `bytes` (as [`payload_bytes`] gives them); `false` when
/// the lengths differ or a bool byte is neither 0 nor 1.
fn fill_from_bytes(data: &mut TensorData, bytes: &[u8]) -> bool {
    fn copy(out: &mut [u8], bytes: &[u8]) -> bool {
        let fits = out.len() == bytes.len();
        if fits {
            out.copy_from_slice(bytes);
        }
        fits
    }
    match data {
        TensorData::F32(v) => copy(bytemuck::cast_slice_mut(v), bytes),
        TensorData::F64(v) => copy(bytemuck::cast_slice_mut(v), bytes),
        TensorData::I64(v) => copy(bytemuck::cast_slice_mut(v), bytes),
        TensorData::U8(v) => copy(v, bytes),
        TensorData::F16(v) => copy(bytemuck::cast_slice_mut(v), bytes),
        TensorData::BF16(v) => copy(bytemuck::cast_slice_mut(v), bytes),
        TensorData::I32(v) => copy(bytemuck::cast_slice_mut(v), bytes),
        TensorData::I8(v) => copy(bytemuck::cast_slice_mut(v), bytes),
        TensorData::I16(v) => copy(bytemuck::cast_slice_mut(v), bytes),
        TensorData::U16(v) => copy(bytemuck::cast_slice_mut(v), bytes),
        TensorData::F8E4M3(v) | TensorData::F8E5M2(v) => copy(v, bytes),
        TensorData::C64(v) => copy(bytemuck::cast_slice_mut(v), bytes),
        TensorData::C128(v) => copy(bytemuck::cast_slice_mut(v), bytes),
        TensorData::Bool(v) => {
            let fits = v.len() == bytes.len() && bytes.iter().all(|&b| b <= 1);
            if fits {
                for (out, &b) in v.iter_mut().zip(bytes) {
                    *out = b == 1;
                }
            }
            fits
        }
    }
}

fn empty_like(dtype: DType, len: usize) -> TensorData {
    match dtype {
        DType::F32 => TensorData::F32(vec![0.0; len]),
        DType::F64 => TensorData::F64(vec![0.0; len]),
        DType::I64 => TensorData::I64(vec![0; len]),
        DType::U8 => TensorData::U8(vec![0; len]),
        DType::F16 => TensorData::F16(vec![half::f16::ZERO; len]),
        DType::BF16 => TensorData::BF16(vec![half::bf16::ZERO; len]),
        DType::I32 => TensorData::I32(vec![0; len]),
        DType::Bool => TensorData::Bool(vec![false; len]),
        DType::I8 => TensorData::I8(vec![0; len]),
        DType::I16 => TensorData::I16(vec![0; len]),
        DType::U16 => TensorData::U16(vec![0; len]),
        DType::F8E4M3 => TensorData::F8E4M3(vec![0; len]),
        DType::F8E5M2 => TensorData::F8E5M2(vec![0; len]),
        DType::C64 => TensorData::C64(vec![[0.0; 2]; len]),
        DType::C128 => TensorData::C128(vec![[0.0; 2]; len]),
    }
}

type Scoped<'a, 'b, T> = Request<'a, [T], &'b LocalScope<'a>>;

/// An incomplete immediate operation of any element type.
enum Pending<'a, 'b> {
    Bytes(Scoped<'a, 'b, u8>),
    F32(Scoped<'a, 'b, f32>),
    F64(Scoped<'a, 'b, f64>),
    I64(Scoped<'a, 'b, i64>),
    I32(Scoped<'a, 'b, i32>),
    Bool(Scoped<'a, 'b, bool>),
}

impl Pending<'_, '_> {
    /// `None` once complete, the request otherwise.
    fn test(self) -> Option<Self> {
        match self {
            Pending::Bytes(r) => r.test().err().map(Pending::Bytes),
            Pending::F32(r) => r.test().err().map(Pending::F32),
            Pending::F64(r) => r.test().err().map(Pending::F64),
            Pending::I64(r) => r.test().err().map(Pending::I64),
            Pending::I32(r) => r.test().err().map(Pending::I32),
            Pending::Bool(r) => r.test().err().map(Pending::Bool),
        }
    }
}

/// Posts an immediate send of `range` of `data`'s elements, typed, to `dest`.
fn send_data<'a, 'b>(
    comm: &SimpleCommunicator,
    scope: &'b LocalScope<'a>,
    dest: usize,
    data: &'a TensorData,
    range: Range<usize>,
) -> Pending<'a, 'b> {
    let process = comm.process_at_rank(dest as i32);
    match data {
        TensorData::F32(v) => {
            Pending::F32(process.immediate_send_with_tag(scope, &v[range], TAG_DATA))
        }
        TensorData::F64(v) => {
            Pending::F64(process.immediate_send_with_tag(scope, &v[range], TAG_DATA))
        }
        TensorData::I64(v) => {
            Pending::I64(process.immediate_send_with_tag(scope, &v[range], TAG_DATA))
        }
        TensorData::U8(v) => {
            Pending::Bytes(process.immediate_send_with_tag(scope, &v[range], TAG_DATA))
        }
        TensorData::F16(v) => Pending::Bytes(process.immediate_send_with_tag(
            scope,
            bytemuck::cast_slice::<_, u8>(&v[range]),
            TAG_DATA,
        )),
        TensorData::BF16(v) => Pending::Bytes(process.immediate_send_with_tag(
            scope,
            bytemuck::cast_slice::<_, u8>(&v[range]),
            TAG_DATA,
        )),
        TensorData::I32(v) => {
            Pending::I32(process.immediate_send_with_tag(scope, &v[range], TAG_DATA))
        }
        TensorData::Bool(v) => {
            Pending::Bool(process.immediate_send_with_tag(scope, &v[range], TAG_DATA))
        }
        // The newer dtypes travel as their bytes, as f16 and bf16 do.
        TensorData::I8(_)
        | TensorData::I16(_)
        | TensorData::U16(_)
        | TensorData::F8E4M3(_)
        | TensorData::F8E5M2(_)
        | TensorData::C64(_)
        | TensorData::C128(_) => Pending::Bytes(process.immediate_send_with_tag(
            scope,
            payload_bytes(data, range),
            TAG_DATA,
        )),
    }
}

/// One outgoing message of a round: where it goes and what it carries (elements `range` of
/// `data`, sent in place).
struct Outgoing<'t> {
    dest: usize,
    data: Option<(&'t TensorData, Range<usize>)>,
    shape: Vec<usize>,
}

impl<'t> Outgoing<'t> {
    /// All of `tensor`, to `dest`.
    fn whole(dest: usize, tensor: &'t Tensor) -> Self {
        Outgoing {
            dest,
            data: Some((tensor.data(), 0..tensor.len())),
            shape: tensor.shape().to_vec(),
        }
    }

    /// Elements `range` of `data`, to `dest`, as a 1-D tensor.
    fn part(dest: usize, data: &'t TensorData, range: Range<usize>) -> Self {
        Outgoing {
            dest,
            shape: vec![range.len()],
            data: Some((data, range)),
        }
    }
}

/// The communicator of one MPI rank of a run.
pub(crate) struct MpiComm<'c> {
    comm: &'c SimpleCommunicator,
    rank: usize,
    size: usize,
    deadline: Duration,
    perturbation: Option<Perturbation>,
    /// Names the run in messages printed before an abort.
    context: String,
    inbox: RefCell<Inbox>,
    next_call: Cell<u64>,
    next_round: Cell<u64>,
    /// The collective this rank last left because peers never arrived, in words: `finish`
    /// names it when those peers never finish either, so the abort says where they stalled
    /// whichever rank's message the launcher forwards (MPICH's Hydra often forwards only the
    /// aborting rank's).
    timed_out: RefCell<Option<String>>,
}

impl std::fmt::Debug for MpiComm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl<'c> MpiComm<'c> {
    /// A communicator over `comm`, whose ranks all run the same program.
    pub(crate) fn new(
        comm: &'c SimpleCommunicator,
        deadline: Duration,
        perturbation: Option<Perturbation>,
        context: String,
    ) -> Self {
        let size = comm.size() as usize;
        MpiComm {
            comm,
            rank: comm.rank() as usize,
            size,
            deadline,
            perturbation,
            context,
            inbox: RefCell::new(Inbox::new(size)),
            next_call: Cell::new(0),
            next_round: Cell::new(0),
            timed_out: RefCell::new(None),
        }
    }

    /// How long a collective waits for the other ranks.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))] // comm/nccl_mpi.rs's
    pub(crate) fn deadline(&self) -> Duration {
        self.deadline
    }

    fn begin(&self, kind: CollectiveKind) -> CollectiveId {
        let call = self.next_call.get();
        self.next_call.set(call + 1);
        CollectiveId { kind, call }
    }

    fn others(&self) -> Vec<usize> {
        (0..self.size).filter(|&r| r != self.rank).collect()
    }

    /// Receives every message that has arrived, without blocking.
    fn progress(&self) {
        let mut inbox = self.inbox.borrow_mut();
        while let Some((message, status)) = self
            .comm
            .any_process()
            .immediate_matched_probe_with_tag(TAG_DATA)
        {
            let source = status.source_rank() as usize;
            // Nothing between the probe and the receive may panic: a matched message dropped
            // unreceived panics in rsmpi's destructor, and a second panic aborts the process.
            if let Some(awaited) = inbox.awaiting_payload[source].take() {
                let mut data = inbox.buffer(awaited.dtype, awaited.len);
                receive_into(message, &mut data);
                inbox.accept_payload(source, awaited, data);
                continue;
            }
            let count = usize::try_from(status.count(u8::equivalent_datatype())).unwrap_or(0);
            let mut bytes = std::mem::take(&mut inbox.scratch);
            bytes.resize(count, 0);
            message.matched_receive_into(&mut bytes[..]);
            match bytes.first() {
                Some(&KIND_DONE) => inbox.done[source] = Some(bytes.get(1) == Some(&1)),
                Some(&kind @ (KIND_HEADER | KIND_INLINE)) => {
                    let decoded = Header::decode(&bytes).and_then(|(header, rest)| {
                        match (kind, header.dtype) {
                            (KIND_HEADER, _) if rest.is_empty() => Some((header, None)),
                            (KIND_INLINE, Some(dtype)) => {
                                let mut data = inbox.buffer(dtype, header.len());
                                fill_from_bytes(&mut data, rest).then_some((header, Some(data)))
                            }
                            _ => None,
                        }
                    });
                    match decoded {
                        Some((header, None)) => inbox.accept_header(source, header),
                        Some((header, Some(data))) => inbox.accept_inline(source, header, data),
                        None => abort_job(
                            &self.context,
                            &format!("malformed header from rank {source}"),
                        ),
                    }
                }
                _ => abort_job(
                    &self.context,
                    &format!("malformed message from rank {source}"),
                ),
            }
            inbox.scratch = bytes;
        }
    }

    /// Gives the buffers of `received` messages back, for later messages to be received into.
    fn recycle(&self, received: impl IntoIterator<Item = Incoming>) {
        let mut inbox = self.inbox.borrow_mut();
        inbox
            .spare
            .extend(received.into_iter().filter_map(|m| m.data));
    }

    /// Sleeps the perturbation's seeded delay for `round`, as a thread rank does. The delay
    /// perturbs timing only: the arrival order a check compares is forced by [`round_order`],
    /// never left to when the messages happen to come in.
    fn perturb(&self, round: u64) {
        if let Some(p) = &self.perturbation {
            let delay = p.delay(self.rank, round);
            if !delay.is_zero() {
                std::thread::sleep(delay);
            }
        }
    }

    /// One exchange: sends `outgoing`, waits for a message of this round from every rank in
    /// `expect_from`, and returns them (by source) with the order they completed in, this rank
    /// counted as arriving when it sent.
    fn exchange(
        &self,
        id: &CollectiveId,
        signature: &str,
        dtype: Option<DType>,
        outgoing: &[Outgoing<'_>],
        expect_from: &[usize],
    ) -> Result<(BTreeMap<usize, Incoming>, Vec<usize>), CommError> {
        let round = self.next_round.get();
        self.next_round.set(round + 1);
        self.perturb(round);
        // A payload small enough travels inside its header's message; `None`: its own message.
        let headers: Vec<(Vec<u8>, bool)> = outgoing
            .iter()
            .map(|o| {
                let header = Header {
                    round,
                    dtype,
                    shape: o.shape.clone(),
                    signature: signature.to_owned(),
                };
                let payload = o
                    .data
                    .clone()
                    .filter(|(_, range)| !range.is_empty())
                    .map(|(data, range)| payload_bytes(data, range));
                match payload {
                    Some(bytes) if bytes.len() <= INLINE_MAX_BYTES => {
                        (header.encode(Some(bytes)), true)
                    }
                    _ => (header.encode(None), false),
                }
            })
            .collect();
        let deadline = Instant::now() + self.deadline;
        let waited = mpi::request::scope(|scope| {
            let mut pending = Vec::with_capacity(2 * outgoing.len());
            for (o, (header, inline)) in outgoing.iter().zip(&headers) {
                let process = self.comm.process_at_rank(o.dest as i32);
                pending.push(Pending::Bytes(process.immediate_send_with_tag(
                    scope,
                    &header[..],
                    TAG_DATA,
                )));
                if *inline {
                    continue;
                }
                if let Some((data, range)) = o.data.clone().filter(|(_, r)| !r.is_empty()) {
                    pending.push(send_data(self.comm, scope, o.dest, data, range));
                }
            }
            self.inbox
                .borrow_mut()
                .arrival
                .entry(round)
                .or_default()
                .push(self.rank);
            self.wait_for(id, round, expect_from, pending, deadline)
        });
        let (received, arrival) = self.inbox.borrow_mut().take_round(round, expect_from);
        waited?;
        let arrival = round_order(self.perturbation.as_ref(), self.size, round, arrival);
        for (&source, m) in &received {
            if m.header.signature != signature {
                return Err(CommError::Mismatch {
                    rank: self.rank,
                    collective: id.clone(),
                    mine: signature.to_owned(),
                    other_rank: source,
                    theirs: m.header.signature.clone(),
                });
            }
        }
        Ok((received, arrival))
    }

    /// Polls until the round's messages from `expect_from` are in and `pending` sends are
    /// complete. A peer that is done fails the wait (after the sends complete); so does the
    /// deadline, and when sends are still incomplete then, the job is aborted.
    fn wait_for(
        &self,
        id: &CollectiveId,
        round: u64,
        expect_from: &[usize],
        mut pending: Vec<Pending<'_, '_>>,
        deadline: Instant,
    ) -> Result<(), CommError> {
        let mut backoff = Backoff::new();
        let mut failure: Option<CommError> = None;
        loop {
            self.progress();
            pending = pending.into_iter().filter_map(Pending::test).collect();
            let inbox = self.inbox.borrow();
            let missing: Vec<usize> = expect_from
                .iter()
                .copied()
                .filter(|&source| !inbox.is_complete(round, source))
                .collect();
            if failure.is_none() {
                // A done notice follows a rank's last message, so a peer that is done and whose
                // message is missing will never send it.
                if let Some(&gone) = missing.iter().find(|&&r| inbox.done[r].is_some()) {
                    failure = Some(if inbox.done[gone] == Some(true) {
                        CommError::PeerFailed {
                            rank: self.rank,
                            collective: id.clone(),
                            failed_rank: gone,
                        }
                    } else {
                        CommError::PeerExited {
                            rank: self.rank,
                            collective: id.clone(),
                            exited_rank: gone,
                        }
                    });
                }
            }
            drop(inbox);
            if pending.is_empty() {
                if let Some(e) = failure {
                    return Err(e);
                }
                if missing.is_empty() {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                let timeout = CommError::Timeout {
                    rank: self.rank,
                    collective: id.clone(),
                    waited: self.deadline,
                    missing: missing.clone(),
                };
                if pending.is_empty() {
                    *self.timed_out.borrow_mut() = Some(timeout.to_string());
                    return Err(timeout);
                }
                abort_job(
                    &self.context,
                    &format!(
                        "{}, and {} of its sends in that collective never completed",
                        failure.unwrap_or(timeout),
                        pending.len()
                    ),
                );
            }
            backoff.wait();
        }
    }

    /// Ends this rank's part of the run: tells every peer it is done (and whether it failed),
    /// then receives and discards what peers still send it until every peer is done too, so the
    /// communicator carries no message into the next run.
    pub(crate) fn finish(&self, failed: bool) {
        let notice = [KIND_DONE, u8::from(failed)];
        let deadline = Instant::now() + self.deadline;
        mpi::request::scope(|scope| {
            let mut pending: Vec<_> = self
                .others()
                .into_iter()
                .map(|r| {
                    self.comm.process_at_rank(r as i32).immediate_send_with_tag(
                        scope,
                        &notice[..],
                        TAG_DATA,
                    )
                })
                .collect();
            let mut backoff = Backoff::new();
            loop {
                self.progress();
                pending = pending
                    .into_iter()
                    .filter_map(|request| request.test().err())
                    .collect();
                let not_done: Vec<usize> = {
                    let inbox = self.inbox.borrow();
                    self.others()
                        .into_iter()
                        .filter(|&r| inbox.done[r].is_none())
                        .collect()
                };
                if not_done.is_empty() && pending.is_empty() {
                    break;
                }
                if Instant::now() >= deadline {
                    let before = match self.timed_out.borrow().as_deref() {
                        Some(timeout) => format!("{timeout}; then "),
                        None => String::new(),
                    };
                    abort_job(
                        &self.context,
                        &format!(
                            "{before}rank {} finished, but rank(s) {not_done:?} did not finish within {:?}",
                            self.rank, self.deadline
                        ),
                    );
                }
                backoff.wait();
            }
        });
        let mut inbox = self.inbox.borrow_mut();
        inbox.messages.clear();
        inbox.arrival.clear();
        self.timed_out.take();
    }

    fn native_allreduce(
        &self,
        id: &CollectiveId,
        signature: &str,
        tensor: &mut Tensor,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        // Every rank proves it entered before any calls MPI_Allreduce, which cannot be left.
        self.handshake(id, signature)?;
        // Every rank is in: the blocking call completes unless a process dies, and then the
        // launcher ends the job.
        let input = tensor.data().clone();
        let op = system_op(op);
        match (&input, tensor.data_mut()) {
            (TensorData::F32(i), TensorData::F32(o)) => {
                self.comm.all_reduce_into(&i[..], &mut o[..], op)
            }
            (TensorData::F64(i), TensorData::F64(o)) => {
                self.comm.all_reduce_into(&i[..], &mut o[..], op)
            }
            (TensorData::I64(i), TensorData::I64(o)) => {
                self.comm.all_reduce_into(&i[..], &mut o[..], op)
            }
            (TensorData::U8(i), TensorData::U8(o)) => {
                self.comm.all_reduce_into(&i[..], &mut o[..], op)
            }
            (TensorData::I32(i), TensorData::I32(o)) => {
                self.comm.all_reduce_into(&i[..], &mut o[..], op)
            }
            _ => unreachable!("input is a copy of the tensor, of a dtype `check_reducible` passed"),
        }
        Ok(())
    }
}

fn system_op(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum => SystemOperation::sum(),
        ReduceOp::Max => SystemOperation::max(),
    }
}

fn receive_into(message: Message, data: &mut TensorData) {
    match data {
        TensorData::F32(v) => drop(message.matched_receive_into(&mut v[..])),
        TensorData::F64(v) => drop(message.matched_receive_into(&mut v[..])),
        TensorData::I64(v) => drop(message.matched_receive_into(&mut v[..])),
        TensorData::U8(v) => drop(message.matched_receive_into(&mut v[..])),
        // f16 and bf16 travel as their bytes (MPI has no standard type for them).
        TensorData::F16(v) => {
            let _ = message.matched_receive_into(bytemuck::cast_slice_mut::<_, u8>(&mut v[..]));
        }
        TensorData::BF16(v) => {
            let _ = message.matched_receive_into(bytemuck::cast_slice_mut::<_, u8>(&mut v[..]));
        }
        TensorData::I32(v) => drop(message.matched_receive_into(&mut v[..])),
        TensorData::Bool(v) => drop(message.matched_receive_into(&mut v[..])),
        TensorData::I8(v) => {
            let _ = message.matched_receive_into(bytemuck::cast_slice_mut::<_, u8>(&mut v[..]));
        }
        TensorData::I16(v) => {
            let _ = message.matched_receive_into(bytemuck::cast_slice_mut::<_, u8>(&mut v[..]));
        }
        TensorData::U16(v) => {
            let _ = message.matched_receive_into(bytemuck::cast_slice_mut::<_, u8>(&mut v[..]));
        }
        TensorData::F8E4M3(v) | TensorData::F8E5M2(v) => {
            let _ = message.matched_receive_into(&mut v[..]);
        }
        TensorData::C64(v) => {
            let _ = message.matched_receive_into(bytemuck::cast_slice_mut::<_, u8>(&mut v[..]));
        }
        TensorData::C128(v) => {
            let _ = message.matched_receive_into(bytemuck::cast_slice_mut::<_, u8>(&mut v[..]));
        }
    }
}

impl Communicator for MpiComm<'_> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn barrier(&self) -> Result<(), CommError> {
        let id = self.begin(CollectiveKind::Barrier);
        self.handshake(&id, "barrier")
    }

    fn broadcast(&self, tensor: &mut Tensor, root: usize) -> Result<(), CommError> {
        let id = self.begin(CollectiveKind::Broadcast);
        if root >= self.size {
            return Err(CommError::InvalidArgument {
                rank: self.rank,
                collective: id,
                reason: format!("root {root} is not a rank of a world of {}", self.size),
            });
        }
        let signature = format!("root {root}, {}", describe(tensor));
        if self.rank == root {
            let outgoing: Vec<Outgoing<'_>> = self
                .others()
                .into_iter()
                .map(|dest| Outgoing::whole(dest, tensor))
                .collect();
            self.exchange(&id, &signature, Some(tensor.dtype()), &outgoing, &[])?;
        } else {
            let (mut received, _) =
                self.exchange(&id, &signature, Some(tensor.dtype()), &[], &[root])?;
            *tensor = into_tensor(received.remove(&root).expect("the root's message is in"));
        }
        Ok(())
    }

    fn allgather(&self, tensor: &Tensor) -> Result<Vec<Tensor>, CommError> {
        let id = self.begin(CollectiveKind::Allgather);
        let others = self.others();
        let outgoing: Vec<Outgoing<'_>> = others
            .iter()
            .map(|&dest| Outgoing::whole(dest, tensor))
            .collect();
        let (mut received, _) = self.exchange(
            &id,
            &describe(tensor),
            Some(tensor.dtype()),
            &outgoing,
            &others,
        )?;
        Ok((0..self.size)
            .map(|r| {
                if r == self.rank {
                    tensor.clone()
                } else {
                    into_tensor(received.remove(&r).expect("every rank's message is in"))
                }
            })
            .collect())
    }

    fn reduce_scatter(
        &self,
        tensor: &Tensor,
        op: ReduceOp,
        mode: ReductionMode,
    ) -> Result<Tensor, CommError> {
        let id = self.begin(CollectiveKind::ReduceScatter);
        check_reducible(self.rank, &id, tensor)?;
        let signature = format!("{op} in {mode}, {}", describe(tensor));
        let mine = chunk_range(tensor.len(), self.size, self.rank);
        let part = if mode == ReductionMode::Native {
            // The library's own: a full MPI_Allreduce, of which this rank keeps its chunk.
            let mut full = tensor.clone();
            self.native_allreduce(&id, &signature, &mut full, op)?;
            slice_data(full.data(), mine)
        } else {
            self.reduce_own_chunk(&id, &signature, tensor, op, mode)?
        };
        Ok(Tensor::new(vec![part.len()], part).expect("a chunk is 1-D"))
    }

    fn allreduce(
        &self,
        tensor: &mut Tensor,
        op: ReduceOp,
        mode: ReductionMode,
    ) -> Result<(), CommError> {
        let id = self.begin(CollectiveKind::Allreduce);
        check_reducible(self.rank, &id, tensor)?;
        let signature = format!("{op} in {mode}, {}", describe(tensor));
        if mode == ReductionMode::Native {
            return self.native_allreduce(&id, &signature, tensor, op);
        }
        let (len, size, dtype) = (tensor.len(), self.size, tensor.dtype());
        let others = self.others();
        let reduced = self.reduce_own_chunk(&id, &signature, tensor, op, mode)?;

        // Round 2: every rank's reduced chunk goes to every rank.
        let outgoing: Vec<Outgoing<'_>> = others
            .iter()
            .map(|&dest| Outgoing::part(dest, &reduced, 0..reduced.len()))
            .collect();
        let (parts, _) = self.exchange(&id, &signature, Some(dtype), &outgoing, &others)?;
        let out = tensor.data_mut();
        for chunk in 0..size {
            let range = chunk_range(len, size, chunk);
            if chunk == self.rank {
                copy_into(out, range.start, &reduced);
            } else if let Some(part) = parts.get(&chunk).and_then(|m| m.data.as_ref()) {
                copy_into(out, range.start, part);
            }
        }
        self.recycle(parts.into_values());
        Ok(())
    }
}

impl MpiComm<'_> {
    /// An empty message to and from every other rank: returns once all have entered.
    fn handshake(&self, id: &CollectiveId, signature: &str) -> Result<(), CommError> {
        let others = self.others();
        let outgoing: Vec<Outgoing<'_>> = others
            .iter()
            .map(|&dest| Outgoing {
                dest,
                data: None,
                shape: Vec::new(),
            })
            .collect();
        self.exchange(id, signature, None, &outgoing, &others)
            .map(drop)
    }

    /// Round 1 of an allreduce: chunk c of this rank's contribution goes to rank c, which
    /// reduces it in the mode's order; returns this rank's reduced chunk.
    fn reduce_own_chunk(
        &self,
        id: &CollectiveId,
        signature: &str,
        tensor: &Tensor,
        op: ReduceOp,
        mode: ReductionMode,
    ) -> Result<TensorData, CommError> {
        let (len, size, dtype) = (tensor.len(), self.size, tensor.dtype());
        let others = self.others();

        // Round 1: chunk c of this rank's contribution goes to rank c, which reduces it. The
        // chunks are sent in place; only this rank's own is copied, to sit beside the others.
        let mine = chunk_range(len, size, self.rank);
        let own = slice_data(tensor.data(), mine.clone());
        let outgoing: Vec<Outgoing<'_>> = others
            .iter()
            .map(|&dest| Outgoing::part(dest, tensor.data(), chunk_range(len, size, dest)))
            .collect();
        let (received, arrival) = self.exchange(id, signature, Some(dtype), &outgoing, &others)?;
        // An empty chunk travels without a payload: this rank's own chunk stands in for it.
        let contributions: Vec<&TensorData> = (0..size)
            .map(|r| match received.get(&r).and_then(|m| m.data.as_ref()) {
                Some(data) => data,
                None => &own,
            })
            .collect();
        let order = summation_order(mode, size, self.rank, &arrival);
        let reduced = reduce_chunk(&contributions, 0..mine.len(), &order, op, mode);
        self.recycle(received.into_values());
        Ok(reduced)
    }
}

fn into_tensor(incoming: Incoming) -> Tensor {
    let Incoming { header, data } = incoming;
    let data = data.unwrap_or_else(|| empty_like(header.dtype.unwrap_or(DType::U8), 0));
    Tensor::new(header.shape, data).expect("the header's shape matches its payload")
}

fn slice_data(data: &TensorData, range: Range<usize>) -> TensorData {
    match data {
        TensorData::F32(v) => TensorData::F32(v[range].to_vec()),
        TensorData::F64(v) => TensorData::F64(v[range].to_vec()),
        TensorData::I64(v) => TensorData::I64(v[range].to_vec()),
        TensorData::U8(v) => TensorData::U8(v[range].to_vec()),
        TensorData::F16(v) => TensorData::F16(v[range].to_vec()),
        TensorData::BF16(v) => TensorData::BF16(v[range].to_vec()),
        TensorData::I32(v) => TensorData::I32(v[range].to_vec()),
        TensorData::Bool(v) => TensorData::Bool(v[range].to_vec()),
        TensorData::I8(v) => TensorData::I8(v[range].to_vec()),
        TensorData::I16(v) => TensorData::I16(v[range].to_vec()),
        TensorData::U16(v) => TensorData::U16(v[range].to_vec()),
        TensorData::F8E4M3(v) => TensorData::F8E4M3(v[range].to_vec()),
        TensorData::F8E5M2(v) => TensorData::F8E5M2(v[range].to_vec()),
        TensorData::C64(v) => TensorData::C64(v[range].to_vec()),
        TensorData::C128(v) => TensorData::C128(v[range].to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(round: u64, len: usize) -> Header {
        Header {
            round,
            dtype: Some(DType::F32),
            shape: vec![len],
            signature: format!("sum in ring, f32[{len}]"),
        }
    }

    /// MPICH delivered a peer's *done* before another peer's payload: the round failed and took
    /// its messages, and the payload that came next hit "a payload follows its header" (then a
    /// second panic in rsmpi's destructor of the unreceived message, and an abort).
    #[test]
    fn a_payload_whose_round_already_failed_is_discarded_not_a_panic() {
        let mut inbox = Inbox::new(3);
        inbox.accept_header(2, header(5, 4));
        let awaited = inbox.awaiting_payload[2]
            .take()
            .expect("the payload is awaited");
        assert_eq!((awaited.round, awaited.len), (5, 4));
        assert!(!inbox.is_complete(5, 2));
        // Rank 1 is done: the exchange of round 5 fails and takes what it has.
        let (taken, _) = inbox.take_round(5, &[1, 2]);
        assert_eq!(taken.len(), 1);
        inbox.accept_payload(2, awaited, TensorData::F32(vec![1.0; 4]));
        assert!(inbox.messages.is_empty() && inbox.arrival.is_empty());

        // A round that is still open gets its payload, and the source counts as arrived.
        inbox.accept_header(1, header(6, 2));
        let awaited = inbox.awaiting_payload[1].take().expect("awaited");
        inbox.accept_payload(1, awaited, TensorData::F32(vec![2.0; 2]));
        assert!(inbox.is_complete(6, 1));
        let (mut taken, arrival) = inbox.take_round(6, &[1]);
        assert_eq!(arrival, vec![1]);
        assert_eq!(
            taken.remove(&1).and_then(|m| m.data),
            Some(TensorData::F32(vec![2.0; 2]))
        );
        // An empty message is complete with its header.
        inbox.accept_header(0, header(7, 0));
        assert!(inbox.awaiting_payload[0].is_none() && inbox.is_complete(7, 0));
    }

    /// Issue 16: under mpirun the 4-rank `arrival_order` control was sometimes missed, because
    /// both runs of a check received the messages in the same order (the reducer first, then
    /// by rank). Under a check, the received order no longer matters: runs 1 and 2 add the same
    /// ranks in different orders in every round, whatever order the messages came in.
    #[test]
    fn a_checks_two_runs_add_in_different_orders_in_every_round_whatever_was_received() {
        let run = |rotation| Perturbation {
            seed: 3 ^ 0x9e37_79b9_7f4a_7c15,
            rotation,
            max_delay: Duration::from_micros(100),
        };
        let (first, second) = (run(0), run(1));
        for size in 2..=9 {
            for round in 0..500 {
                let received: Vec<usize> = (0..size).collect();
                let one = round_order(Some(&first), size, round, received.clone());
                let two = round_order(Some(&second), size, round, received.clone());
                assert_ne!(one, two, "size {size}, round {round}");
                // The same order from any received order: a function of the seed alone.
                let mut reversed = received.clone();
                reversed.reverse();
                assert_eq!(one, round_order(Some(&first), size, round, reversed));
                let mut sorted = one.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, received, "every rank once");
            }
        }
        // The ranks of the round only (a broadcast's: the root and this rank), in seeded order.
        let partial = round_order(Some(&first), 4, 7, vec![2, 0]);
        let seeded = first.arrival_order(4, 7);
        let expected: Vec<usize> = seeded.into_iter().filter(|r| [0, 2].contains(r)).collect();
        assert_eq!(partial, expected);
        // A plain run (no check) keeps the order the messages really arrived in.
        assert_eq!(round_order(None, 4, 7, vec![3, 0, 2, 1]), vec![3, 0, 2, 1]);
    }

    #[test]
    fn receive_buffers_are_reused_best_fit_first() {
        let mut inbox = Inbox::new(2);
        inbox.spare = vec![
            TensorData::F32(vec![1.0; 8]),
            TensorData::F32(vec![2.0; 100]),
            TensorData::F64(vec![3.0; 10]),
        ];
        // 10 f32: the 100-element buffer fits (the 8 would grow), truncated to 10.
        assert_eq!(inbox.buffer(DType::F32, 10), TensorData::F32(vec![2.0; 10]));
        // 12 f32: only the 8 is left; it grows, the new elements zeroed.
        let mut grown = vec![1.0; 8];
        grown.extend([0.0; 4]);
        assert_eq!(inbox.buffer(DType::F32, 12), TensorData::F32(grown));
        // No spare of the dtype: a new buffer.
        assert_eq!(inbox.buffer(DType::I32, 2), TensorData::I32(vec![0; 2]));
        assert_eq!(inbox.spare.len(), 1);
    }

    /// The latency path's bytes give back the elements a typed message would: every dtype,
    /// bit for bit (NaN payloads, -0.0); wrong lengths and non-0/1 bools are refused.
    #[test]
    fn inline_payloads_round_trip_every_dtype_bit_for_bit() {
        let samples = [
            TensorData::F32(vec![
                -0.0,
                f32::from_bits(0x7fc0_1234),
                1.5,
                f32::MIN_POSITIVE,
            ]),
            TensorData::F64(vec![f64::from_bits(0xfff8_0000_0000_0001), -0.0, 2.25]),
            TensorData::I64(vec![i64::MIN, -1, 7]),
            TensorData::U8(vec![0, 255, 3]),
            TensorData::F16(vec![half::f16::from_bits(0x7e01), half::f16::NEG_ZERO]),
            TensorData::BF16(vec![half::bf16::from_bits(0xffc1), half::bf16::ONE]),
            TensorData::I32(vec![i32::MAX, -5]),
            TensorData::Bool(vec![true, false, true]),
            TensorData::I8(vec![i8::MIN, -1, 7]),
            TensorData::I16(vec![i16::MIN, 300]),
            TensorData::U16(vec![u16::MAX, 1]),
            TensorData::F8E4M3(vec![0x7f, 0x80, 0x38]),
            TensorData::F8E5M2(vec![0x7d, 0xfc, 0x3c]),
            TensorData::C64(vec![[-0.0, f32::from_bits(0x7fc0_0001)], [1.5, 2.0]]),
            TensorData::C128(vec![[1.0, -0.0], [f64::INFINITY, 0.5]]),
        ];
        for data in &samples {
            let len = data.len();
            let bytes = payload_bytes(data, 1..len);
            let mut back = empty_like(data.dtype(), len - 1);
            assert!(fill_from_bytes(&mut back, bytes), "{:?}", data.dtype());
            assert_eq!(
                payload_bytes(&back, 0..len - 1),
                bytes,
                "{:?}",
                data.dtype()
            );
            let mut wrong = empty_like(data.dtype(), len);
            assert!(!fill_from_bytes(&mut wrong, bytes), "{:?}", data.dtype());
        }
        let mut flags = empty_like(DType::Bool, 2);
        assert!(!fill_from_bytes(&mut flags, &[1, 2]));
    }

    #[test]
    fn headers_round_trip_and_malformed_ones_are_refused() {
        let header = Header {
            round: 7,
            dtype: Some(DType::F64),
            shape: vec![3, 5],
            signature: "sum in ring, f64[15]".to_owned(),
        };
        let bytes = header.encode(None);
        assert_eq!(Header::decode(&bytes), Some((header.clone(), &[][..])));
        let inline = header.encode(Some(&[1, 2, 3]));
        assert_eq!(inline[0], KIND_INLINE);
        assert_eq!(
            Header::decode(&inline),
            Some((header.clone(), &[1, 2, 3][..]))
        );
        assert_eq!(header.len(), 15);
        let bare = Header {
            dtype: None,
            shape: Vec::new(),
            ..header
        };
        assert_eq!(bare.len(), 0);
        assert_eq!(Header::decode(&bare.encode(None)), Some((bare, &[][..])));
        // Truncated anywhere (the signature has its length), or an unknown dtype: refused, not
        // a panic.
        for cut in 1..bytes.len() {
            assert_eq!(Header::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut bad_dtype = bytes.clone();
        bad_dtype[9] = 16;
        assert_eq!(Header::decode(&bad_dtype), None);
        for dtype in DType::ALL {
            let typed = Header {
                round: 1,
                dtype: Some(dtype),
                shape: vec![2],
                signature: format!("allgather, {dtype}[2]"),
            };
            let bytes = typed.encode(None);
            assert_eq!(Header::decode(&bytes), Some((typed, &[][..])), "{dtype}");
        }
    }
}
