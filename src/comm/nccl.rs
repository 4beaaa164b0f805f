//! NCCL ranks (feature `nccl`): one process and one GPU per rank, the collectives on device
//! buffers through NCCL.
//!
//! [`NcclComm`] is one rank of an NCCL communicator (`ncclCommInitRank` on its [`Gpu`]'s stream),
//! made from an [`NcclId`] that one rank creates and every rank receives (under MPI:
//! `nccl_comm_over_mpi`, `comm/nccl_mpi.rs`); [`NcclComm::single`] is world size 1 on a one-GPU
//! machine. It implements [`Communicator`] on host tensors (upload, collective on the device,
//! download) and [`NcclComm::allreduce_device`] on a [`DeviceTensor`] in place.
//!
//! Schedules:
//! - `rank_ordered`, `ring`, `reproducible` allreduce are detcheck's, as on thread and MPI
//!   ranks: an all-to-all of chunks (grouped `ncclSend`/`ncclRecv` of bytes) gives rank `r` chunk
//!   `r` ([`chunk_range`]) of every rank in a staging buffer; rank `r` reduces it with
//!   [`Gpu::reduce`] (the kernels of `GpuThreadComm`, with the bits of the CPU's `reduce_chunk`)
//!   in [`summation_order`]; a second grouped exchange gives every rank every reduced chunk.
//!   Reduce-scatter is the first round alone.
//! - `native` is `ncclAllReduce` (sum and max of f32, f64, i32, i64, u8); reduce-scatter in
//!   `native` is a full `ncclAllReduce` of which the rank keeps its chunk, as on MPI ranks.
//! - `arrival_order` is refused ([`CommError::InvalidArgument`]): it is the thread and MPI ranks'
//!   negative control, which reads the order contributions arrive in on the host; NCCL's
//!   transfers have no such order to read.
//! - broadcast and allgather are `ncclBroadcast` and `ncclAllGather` of the tensors' bytes
//!   (every dtype); a barrier is the signature check below, which every rank waits for.
//!
//! Mismatches: before each collective the ranks allgather a fixed-size record of what they
//! called (the collective, op, mode, root, dtype and length: its md5 and its text), so a rank
//! that called something else is [`CommError::Mismatch`] naming it, not a hang; arguments are
//! refused (an unreducible dtype, a root out of range, `arrival_order`) only after that check,
//! so every rank refuses together.
//!
//! Determinism: `rank_ordered`, `ring` and `reproducible` give every rank the bits the CPU's
//! communicators give (each element reduced once, by one rank, with the CPU's arithmetic).
//! `native`'s bits are NCCL's: its algorithm and protocol are chosen at run time (message size,
//! topology, tuning), so they are deterministic only under the settings `detcheck env --stack
//! nccl` pins (`comm/pinning.rs`), for one world size and topology, and never promised equal to
//! the CPU's (NCCL's max need not prefer +0.0 or give a canonical NaN).
//!
//! Limits: one GPU per rank (NCCL refuses two ranks on one GPU; thread ranks sharing a GPU are
//! `GpuThreadComm`). Only functions of NCCL 2.28's API are called (cudarc binds 2.30's). NCCL
//! has no deadline of its own: each collective's host wait polls the stream and NCCL's
//! asynchronous error up to the deadline ([`NcclComm::with_deadline`], 60 s unless set), then
//! aborts the communicator (`ncclCommAbort`; every later call is refused) and returns
//! [`CommError::Timeout`] naming every other rank, because NCCL cannot say which one never came.
//! A communicator is dropped with `ncclCommDestroy`, which NCCL makes an intra-node collective:
//! the ranks of a node drop theirs together. Host tensors cross PCIe twice per collective; the
//! device API does not. Broadcast and allgather give tensors this rank's shape (the signature
//! checks dtype and length, not shape).

// NCCL's C API (cudarc's `nccl::result` and `sys`) takes raw device pointers and a raw
// communicator. Every `unsafe` block says why it holds.
#![allow(unsafe_code)]

use super::threads::describe;
use super::{CollectiveId, CollectiveKind, CommError, Communicator};
use crate::device::gpu::driver;
use crate::device::{locate_library, CudaError, CudaLibrary, DeviceChunk, DeviceTensor, Gpu};
use crate::value::digest::Md5Digest;
use crate::value::reduce::{chunk_range, summation_order, unreducible, ReduceOp, ReductionMode};
use crate::value::tensor::{DType, Tensor, TensorView};
use cudarc::nccl::result::{self as nccl, NcclError, NcclStatus};
use cudarc::nccl::sys;
use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The size of an NCCL unique id (`ncclUniqueId`, `NCCL_UNIQUE_ID_BYTES`).
pub const NCCL_ID_BYTES: usize = 128;

/// The default collective deadline, as thread ranks' ([`super::LaunchConfig::new`]).
const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// The bytes of one rank's signature record: md5 (16), the text's length (4), the stored text's
/// length (2), the text (truncated at a character boundary).
const SIGNATURE_BYTES: usize = 256;
const SIGNATURE_TEXT_AT: usize = 22;

/// The id that names one NCCL communicator: created by one rank ([`NcclId::new`]) and given to
/// every rank of the world (as bytes: [`NcclId::as_bytes`], [`NcclId::from_bytes`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclId([u8; NCCL_ID_BYTES]);

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclId({NCCL_ID_BYTES} bytes)")
    }
}

impl NcclId {
    /// A new id (`ncclGetUniqueId`, which opens the bootstrap socket the ranks will meet on).
    ///
    /// # Errors
    /// [`CudaError::LibraryMissing`] without NCCL (found before cudarc touches it: cudarc would
    /// panic); [`CudaError::Nccl`] when NCCL fails.
    pub fn new() -> Result<NcclId, CudaError> {
        locate_library(CudaLibrary::Nccl)?;
        let id = nccl::get_uniqueid().map_err(nccl_failed("ncclGetUniqueId"))?;
        Ok(NcclId(id.internal.map(|c| c as u8)))
    }

    /// The id's bytes, to send to the other ranks.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8; NCCL_ID_BYTES] {
        &self.0
    }

    /// The id from the bytes [`NcclId::as_bytes`] gave on the rank that created it.
    ///
    /// # Errors
    /// [`CudaError::Nccl`] when there are not exactly [`NCCL_ID_BYTES`] bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<NcclId, CudaError> {
        let bytes: [u8; NCCL_ID_BYTES] = bytes.try_into().map_err(|_| CudaError::Nccl {
            call: "NcclId::from_bytes",
            message: format!("an NCCL id is {NCCL_ID_BYTES} bytes, not {}", bytes.len()),
        })?;
        Ok(NcclId(bytes))
    }

    fn raw(&self) -> sys::ncclUniqueId {
        sys::ncclUniqueId {
            internal: self.0.map(|b| b as c_char),
        }
    }
}

/// NCCL's words for `result`: its code and `ncclGetErrorString`.
fn nccl_message(result: sys::ncclResult_t) -> String {
    // SAFETY: only called with a result NCCL returned, so the library is loaded; NCCL returns a
    // static NUL-terminated string (or null) for any code, never freed.
    let text = unsafe { sys::ncclGetErrorString(result) };
    if text.is_null() {
        format!("{result:?}")
    } else {
        // SAFETY: non-null, NUL-terminated and static (above).
        let text = unsafe { CStr::from_ptr(text) };
        format!("{result:?}: {}", text.to_string_lossy())
    }
}

/// `call` failed in NCCL: [`CudaError::Nccl`].
fn nccl_failed(call: &'static str) -> impl FnOnce(NcclError) -> CudaError {
    move |e| CudaError::Nccl {
        call,
        message: nccl_message(e.0),
    }
}

/// NCCL's element type for a reducible dtype (`native` allreduce).
fn nccl_type(dtype: DType) -> Option<sys::ncclDataType_t> {
    Some(match dtype {
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        DType::F64 => sys::ncclDataType_t::ncclFloat64,
        DType::I32 => sys::ncclDataType_t::ncclInt32,
        DType::I64 => sys::ncclDataType_t::ncclInt64,
        DType::U8 => sys::ncclDataType_t::ncclUint8,
        _ => return None,
    })
}

fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
    }
}

/// One rank of an NCCL communicator, on its own GPU.
pub struct NcclComm {
    gpu: Arc<Gpu>,
    raw: sys::ncclComm_t,
    rank: usize,
    size: usize,
    deadline: Duration,
    next_call: Cell<u64>,
    /// Why the communicator was aborted, once it was: every later call is refused with it.
    aborted: RefCell<Option<String>>,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("gpu", &self.gpu)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl NcclComm {
    /// Rank `rank` of the `size` ranks that call this with the same `id`, on `gpu`
    /// (`ncclCommInitRank`: returns once every rank has joined).
    ///
    /// # Errors
    /// [`CudaError::LibraryMissing`] without NCCL; [`CudaError::Nccl`] when `rank` is not below
    /// `size` or NCCL refuses (two ranks on one GPU, for instance).
    pub fn new(
        gpu: Arc<Gpu>,
        rank: usize,
        size: usize,
        id: &NcclId,
    ) -> Result<NcclComm, CudaError> {
        locate_library(CudaLibrary::Nccl)?;
        let (Ok(nranks), Ok(my_rank)) = (c_int::try_from(size), c_int::try_from(rank)) else {
            return Err(CudaError::Nccl {
                call: "ncclCommInitRank",
                message: format!("rank {rank} of {size} is beyond NCCL's int"),
            });
        };
        if rank >= size {
            return Err(CudaError::Nccl {
                call: "ncclCommInitRank",
                message: format!("rank {rank} is not a rank of a world of {size}"),
            });
        }
        // NCCL (through the CUDA runtime) works on the calling thread's current device.
        gpu.stream()
            .context()
            .bind_to_thread()
            .map_err(driver("cuCtxSetCurrent"))?;
        let mut raw = MaybeUninit::<sys::ncclComm_t>::uninit();
        // SAFETY: `raw` is a valid place for the communicator handle, which NCCL writes before it
        // returns success; the id is 128 bytes as NCCL expects; rank < size (checked above).
        unsafe { nccl::comm_init_rank(raw.as_mut_ptr(), nranks, id.raw(), my_rank) }
            .map_err(nccl_failed("ncclCommInitRank"))?;
        // SAFETY: ncclCommInitRank succeeded, so it wrote the handle.
        let raw = unsafe { raw.assume_init() };
        Ok(NcclComm {
            gpu,
            raw,
            rank,
            size,
            deadline: DEFAULT_DEADLINE,
            next_call: Cell::new(0),
            aborted: RefCell::new(None),
        })
    }

    /// A world of one rank on `gpu`: NCCL on a one-GPU machine.
    ///
    /// # Errors
    /// As [`NcclId::new`] and [`NcclComm::new`].
    pub fn single(gpu: Arc<Gpu>) -> Result<NcclComm, CudaError> {
        NcclComm::new(gpu, 0, 1, &NcclId::new()?)
    }

    /// Sets how long a collective waits for the other ranks before it aborts the communicator.
    #[must_use]
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline.min(super::MAX_DEADLINE);
        self
    }

    /// The GPU.
    #[must_use]
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Replaces `tensor` with the elementwise reduction of every rank's `tensor`, on the device
    /// (see the module docs for each mode's schedule and bits).
    ///
    /// # Errors
    /// As [`Communicator::allreduce`]; [`CommError::InvalidArgument`] for `arrival_order`;
    /// [`CommError::Device`] when the GPU or NCCL fails.
    pub fn allreduce_device(
        &self,
        tensor: &mut DeviceTensor,
        op: ReduceOp,
        mode: ReductionMode,
    ) -> Result<(), CommError> {
        let id = self.begin(CollectiveKind::Allreduce)?;
        let signature = format!("{op} in {mode}, {}[{}]", tensor.dtype(), tensor.len());
        self.check_signature(&id, &signature)?;
        self.check_reduction(&id, tensor.dtype(), mode)?;
        self.allreduce_in_place(&id, tensor, op, mode)?;
        self.wait(&id)
    }

    /// Numbers this rank's next collective; refuses every call once the communicator was aborted.
    fn begin(&self, kind: CollectiveKind) -> Result<CollectiveId, CommError> {
        let call = self.next_call.get();
        self.next_call.set(call + 1);
        let id = CollectiveId { kind, call };
        match &*self.aborted.borrow() {
            // NCCL works on the calling thread's current context: this GPU's.
            None => self
                .gpu
                .stream()
                .context()
                .bind_to_thread()
                .map_err(driver("cuCtxSetCurrent"))
                .map_err(self.failed(&id))
                .map(|()| id),
            Some(why) => Err(CommError::Device {
                rank: self.rank,
                collective: id,
                message: format!("the NCCL communicator was aborted earlier: {why}"),
            }),
        }
    }

    /// [`CommError::Device`] for `id`.
    fn failed(&self, id: &CollectiveId) -> impl Fn(CudaError) -> CommError + '_ {
        let id = id.clone();
        move |e| CommError::Device {
            rank: self.rank,
            collective: id.clone(),
            message: e.to_string(),
        }
    }

    fn stream(&self) -> sys::cudaStream_t {
        self.gpu.stream().cu_stream() as sys::cudaStream_t
    }

    /// Element `index` of `tensor` as NCCL's buffer argument.
    fn pointer(&self, tensor: &DeviceTensor, index: usize) -> *mut c_void {
        tensor.address(self.gpu.stream(), index) as *mut c_void
    }

    /// Runs NCCL's `call` (enqueued on the GPU's stream), naming it on failure.
    fn nccl(
        &self,
        id: &CollectiveId,
        call: &'static str,
        result: Result<NcclStatus, NcclError>,
    ) -> Result<(), CommError> {
        result
            .map(drop)
            .map_err(nccl_failed(call))
            .map_err(self.failed(id))
    }

    /// Enqueues `sends` (buffer, bytes, peer) and `receives` as one NCCL group, so that no
    /// rank's send waits for a receive posted after it. Empty transfers are left out on both
    /// sides (each side computes the same lengths).
    fn exchange_bytes(
        &self,
        id: &CollectiveId,
        sends: &[(*mut c_void, usize, usize)],
        receives: &[(*mut c_void, usize, usize)],
    ) -> Result<(), CommError> {
        self.nccl(id, "ncclGroupStart", nccl::group_start())?;
        let mut enqueued = Ok(());
        for &(buffer, bytes, peer) in sends.iter().filter(|s| s.1 > 0) {
            // SAFETY: `buffer` points at `bytes` bytes inside a live device tensor of this GPU
            // (the callers take them from `pointer` within bounds), kept alive by the caller
            // until the stream has run the transfer (the callers wait before they return or
            // drop); `peer` < size; `self.raw` is a live communicator.
            let result = unsafe {
                nccl::send(
                    buffer,
                    bytes,
                    sys::ncclDataType_t::ncclUint8,
                    peer as c_int,
                    self.raw,
                    self.stream(),
                )
            };
            enqueued = enqueued.and(self.nccl(id, "ncclSend", result));
        }
        for &(buffer, bytes, peer) in receives.iter().filter(|r| r.1 > 0) {
            // SAFETY: as for the sends; the receive buffer is written by this GPU's stream only.
            let result = unsafe {
                nccl::recv(
                    buffer,
                    bytes,
                    sys::ncclDataType_t::ncclUint8,
                    peer as c_int,
                    self.raw,
                    self.stream(),
                )
            };
            enqueued = enqueued.and(self.nccl(id, "ncclRecv", result));
        }
        // The group is closed whatever failed inside it: NCCL keeps a group open per thread.
        let ended = self.nccl(id, "ncclGroupEnd", nccl::group_end());
        enqueued.and(ended)
    }

    /// Allgathers this rank's record of `signature` and compares it with every rank's: the
    /// first rank (in rank order) that called something else is a [`CommError::Mismatch`].
    /// Waits for the exchange, so it is also a barrier.
    fn check_signature(&self, id: &CollectiveId, signature: &str) -> Result<(), CommError> {
        let failed = self.failed(id);
        let text = if signature.is_empty() {
            id.kind.to_string()
        } else {
            format!("{} of {signature}", id.kind)
        };
        let mine = Tensor::from_vec(signature_record(&text).to_vec());
        let mine = self.gpu.upload(&mine).map_err(&failed)?;
        let all = self
            .gpu
            .zeros(DType::U8, &[SIGNATURE_BYTES * self.size])
            .map_err(&failed)?;
        // SAFETY: `mine` holds SIGNATURE_BYTES bytes and `all` size times as many, both live
        // until the wait below has seen the stream run the allgather.
        let result = unsafe {
            nccl::all_gather(
                self.pointer(&mine, 0),
                self.pointer(&all, 0),
                SIGNATURE_BYTES,
                sys::ncclDataType_t::ncclUint8,
                self.raw,
                self.stream(),
            )
        };
        self.nccl(id, "ncclAllGather", result)?;
        self.wait(id)?;
        let all = self.gpu.download(&all).map_err(&failed)?;
        let mismatch = all.with_view(|view| first_mismatch(view.bytes(), self.rank));
        match mismatch {
            None => Ok(()),
            Some((other_rank, theirs)) => Err(CommError::Mismatch {
                rank: self.rank,
                collective: id.clone(),
                mine: text,
                other_rank,
                theirs,
            }),
        }
    }

    /// The refusals of a reduction, after the signature check (so every rank refuses together):
    /// an unreducible dtype, `arrival_order`.
    fn check_reduction(
        &self,
        id: &CollectiveId,
        dtype: DType,
        mode: ReductionMode,
    ) -> Result<(), CommError> {
        let reason = unreducible(dtype).or_else(|| {
            (mode == ReductionMode::ArrivalOrder).then(|| {
                "arrival_order is the thread and MPI ranks' negative control (the order \
                 contributions arrive in on the host); NCCL ranks have no such order to read: \
                 use rank_ordered, ring, reproducible or native"
                    .to_owned()
            })
        });
        match reason {
            None => Ok(()),
            Some(reason) => Err(CommError::InvalidArgument {
                rank: self.rank,
                collective: id.clone(),
                reason,
            }),
        }
    }

    /// Waits until the stream has run everything enqueued so far, polling it and NCCL's
    /// asynchronous error; at the deadline, or on an error, the communicator is aborted.
    fn wait(&self, id: &CollectiveId) -> Result<(), CommError> {
        let failed = self.failed(id);
        let done = self
            .gpu
            .stream()
            .record_event(None)
            .map_err(driver("cuEventRecord"))
            .map_err(&failed)?;
        let started = Instant::now();
        let mut pause = Duration::from_micros(1);
        loop {
            match done.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    let message = format!("cuEventQuery: {e:?}");
                    self.abort(&message);
                    return Err(failed(CudaError::Driver {
                        call: "cuEventQuery",
                        message: format!("{e:?}"),
                    }));
                }
            }
            let mut status = sys::ncclResult_t::ncclSuccess;
            // SAFETY: `self.raw` is a live communicator (an aborted one refuses calls in
            // `begin`) and `status` a valid place for the result.
            let queried = unsafe { sys::ncclCommGetAsyncError(self.raw, &mut status) };
            let error = match (queried, status) {
                (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclSuccess)
                | (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclInProgress) => None,
                (sys::ncclResult_t::ncclSuccess, error) | (error, _) => Some(error),
            };
            if let Some(error) = error {
                let message = nccl_message(error);
                self.abort(&message);
                return Err(failed(CudaError::Nccl {
                    call: "ncclCommGetAsyncError",
                    message,
                }));
            }
            if started.elapsed() >= self.deadline {
                self.abort(&format!("{id} waited {:?}", self.deadline));
                return Err(CommError::Timeout {
                    rank: self.rank,
                    collective: id.clone(),
                    waited: self.deadline,
                    // NCCL cannot say which rank never came: every other rank could be it.
                    missing: (0..self.size).filter(|&r| r != self.rank).collect(),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// Aborts the communicator (`ncclCommAbort`), which ends its kernels still waiting for
    /// peers; every later call is refused with `why`.
    fn abort(&self, why: &str) {
        let mut aborted = self.aborted.borrow_mut();
        if aborted.is_some() {
            return;
        }
        // SAFETY: `self.raw` is live and not aborted (checked above); it is never used again,
        // since `aborted` is set and every call and the drop check it.
        let _ignored = unsafe { nccl::comm_abort(self.raw) };
        *aborted = Some(why.to_owned());
    }

    /// An allreduce of `tensor` in place, enqueued (the caller waits); arguments checked.
    fn allreduce_in_place(
        &self,
        id: &CollectiveId,
        tensor: &mut DeviceTensor,
        op: ReduceOp,
        mode: ReductionMode,
    ) -> Result<(), CommError> {
        if mode == ReductionMode::Native {
            return self.native_allreduce(id, tensor, op);
        }
        let part = self.reduce_own_chunk(id, tensor, op, mode)?;
        // Round 2: every rank's reduced chunk to every rank, received in place into `tensor`.
        // This rank's own sends of round 1 read `tensor` earlier on the same stream.
        let (len, size) = (tensor.len(), self.size);
        let bytes = tensor.dtype().size_of();
        let others: Vec<usize> = (0..size).filter(|&r| r != self.rank).collect();
        let part_start = self.pointer(&part, 0);
        let sends: Vec<_> = others
            .iter()
            .map(|&peer| (part_start, part.byte_len(), peer))
            .collect();
        let receives: Vec<_> = others
            .iter()
            .map(|&peer| {
                let theirs = chunk_range(len, size, peer);
                (
                    self.pointer(tensor, theirs.start),
                    theirs.len() * bytes,
                    peer,
                )
            })
            .collect();
        self.exchange_bytes(id, &sends, &receives)?;
        let mine = chunk_range(len, size, self.rank);
        self.gpu
            .copy(&part, 0..part.len(), tensor, mine.start)
            .map_err(self.failed(id))?;
        // `part` is freed in stream order, after the sends and the copy that read it.
        Ok(())
    }

    /// `ncclAllReduce` in place.
    fn native_allreduce(
        &self,
        id: &CollectiveId,
        tensor: &mut DeviceTensor,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let dtype = nccl_type(tensor.dtype())
            .expect("check_reduction refused the dtypes NCCL is not asked to reduce");
        if tensor.is_empty() {
            return Ok(());
        }
        let buffer = self.pointer(tensor, 0);
        // SAFETY: `buffer` holds `len` elements of `dtype` (a live tensor, borrowed mutably
        // until the caller's wait); in place is allowed (send == receive buffer).
        let result = unsafe {
            nccl::all_reduce(
                buffer,
                buffer,
                tensor.len(),
                dtype,
                nccl_op(op),
                self.raw,
                self.stream(),
            )
        };
        self.nccl(id, "ncclAllReduce", result)
    }

    /// Round 1 of an allreduce in a detcheck mode: chunk `r` of every rank to rank `r` (an
    /// all-to-all into a staging buffer), reduced there in the mode's summation order. Returns
    /// this rank's reduced chunk (enqueued; the caller waits).
    fn reduce_own_chunk(
        &self,
        id: &CollectiveId,
        tensor: &DeviceTensor,
        op: ReduceOp,
        mode: ReductionMode,
    ) -> Result<DeviceTensor, CommError> {
        let failed = self.failed(id);
        let (rank, size, len, dtype) = (self.rank, self.size, tensor.len(), tensor.dtype());
        let bytes = dtype.size_of();
        let mine = chunk_range(len, size, rank);
        let chunk_len = mine.len();
        // Rank p's chunk `rank` lands at p * chunk_len; this rank's own is read in place.
        let staging = self
            .gpu
            .zeros(dtype, &[chunk_len * size])
            .map_err(&failed)?;
        let others: Vec<usize> = (0..size).filter(|&r| r != rank).collect();
        let sends: Vec<_> = others
            .iter()
            .map(|&peer| {
                let theirs = chunk_range(len, size, peer);
                (
                    self.pointer(tensor, theirs.start),
                    theirs.len() * bytes,
                    peer,
                )
            })
            .collect();
        let receives: Vec<_> = others
            .iter()
            .map(|&peer| {
                (
                    self.pointer(&staging, peer * chunk_len),
                    chunk_len * bytes,
                    peer,
                )
            })
            .collect();
        self.exchange_bytes(id, &sends, &receives)?;
        let chunks: Vec<DeviceChunk<'_>> = summation_order(mode, size, rank, &[])
            .into_iter()
            .map(|r| {
                if r == rank {
                    DeviceChunk {
                        tensor,
                        start: mine.start,
                    }
                } else {
                    DeviceChunk {
                        tensor: &staging,
                        start: r * chunk_len,
                    }
                }
            })
            .collect();
        let mut part = self.gpu.zeros(dtype, &[chunk_len]).map_err(&failed)?;
        self.gpu
            .reduce(op, mode, &chunks, chunk_len, &mut part, 0)
            .map_err(&failed)?;
        Ok(part)
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if self.aborted.get_mut().is_some() {
            return;
        }
        // Nothing of this communicator may still run when it is destroyed.
        let _ignored = self.gpu.synchronize();
        // SAFETY: `self.raw` is live (not aborted) and never used after this.
        let _ignored = unsafe { nccl::comm_destroy(self.raw) };
    }
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn gpu(&self) -> Option<&Arc<Gpu>> {
        Some(&self.gpu)
    }

    fn size(&self) -> usize {
        self.size
    }

    fn barrier(&self) -> Result<(), CommError> {
        let id = self.begin(CollectiveKind::Barrier)?;
        // The signature check is an allgather every rank waits for: a barrier.
        self.check_signature(&id, "")
    }

    fn broadcast(&self, tensor: &mut Tensor, root: usize) -> Result<(), CommError> {
        let id = self.begin(CollectiveKind::Broadcast)?;
        self.check_signature(&id, &format!("root {root}, {}", describe(tensor)))?;
        if root >= self.size {
            return Err(CommError::InvalidArgument {
                rank: self.rank,
                collective: id,
                reason: format!("root {root} is not a rank of a world of {}", self.size),
            });
        }
        let failed = self.failed(&id);
        let device = if self.rank == root {
            self.gpu.upload(tensor)
        } else {
            self.gpu.zeros(tensor.dtype(), tensor.shape())
        }
        .map_err(&failed)?;
        if device.byte_len() > 0 {
            let buffer = self.pointer(&device, 0);
            // SAFETY: `buffer` holds `byte_len` bytes of a live tensor, kept until the wait
            // below; in place is allowed on every rank.
            let result = unsafe {
                nccl::broadcast(
                    buffer,
                    buffer,
                    device.byte_len(),
                    sys::ncclDataType_t::ncclUint8,
                    root as c_int,
                    self.raw,
                    self.stream(),
                )
            };
            self.nccl(&id, "ncclBroadcast", result)?;
            self.wait(&id)?;
        }
        if self.rank != root {
            *tensor = self.gpu.download(&device).map_err(&failed)?;
        }
        Ok(())
    }

    fn allgather(&self, tensor: &Tensor) -> Result<Vec<Tensor>, CommError> {
        let id = self.begin(CollectiveKind::Allgather)?;
        self.check_signature(&id, &describe(tensor))?;
        let failed = self.failed(&id);
        let mine = self.gpu.upload(tensor).map_err(&failed)?;
        let all = self
            .gpu
            .zeros(tensor.dtype(), &[tensor.len() * self.size])
            .map_err(&failed)?;
        if mine.byte_len() > 0 {
            // SAFETY: `mine` holds `byte_len` bytes and `all` size times as many, both live
            // until the wait below.
            let result = unsafe {
                nccl::all_gather(
                    self.pointer(&mine, 0),
                    self.pointer(&all, 0),
                    mine.byte_len(),
                    sys::ncclDataType_t::ncclUint8,
                    self.raw,
                    self.stream(),
                )
            };
            self.nccl(&id, "ncclAllGather", result)?;
            self.wait(&id)?;
        }
        let all = self.gpu.download(&all).map_err(&failed)?;
        let part = mine.byte_len();
        Ok(all.with_view(|view| {
            (0..self.size)
                .map(|r| {
                    TensorView::new(
                        tensor.dtype(),
                        tensor.shape(),
                        &view.bytes()[r * part..(r + 1) * part],
                    )
                    .expect("a gathered part has this rank's dtype and length")
                    .to_tensor()
                })
                .collect()
        }))
    }

    fn reduce_scatter(
        &self,
        tensor: &Tensor,
        op: ReduceOp,
        mode: ReductionMode,
    ) -> Result<Tensor, CommError> {
        let id = self.begin(CollectiveKind::ReduceScatter)?;
        self.check_signature(&id, &format!("{op} in {mode}, {}", describe(tensor)))?;
        self.check_reduction(&id, tensor.dtype(), mode)?;
        let failed = self.failed(&id);
        let mut device = self.gpu.upload(tensor).map_err(&failed)?;
        let part = if mode == ReductionMode::Native {
            // NCCL's reduce-scatter wants equal parts; ours differ by one: a full allreduce of
            // which this rank keeps its chunk, as MPI ranks do.
            self.native_allreduce(&id, &mut device, op)?;
            let mine = chunk_range(tensor.len(), self.size, self.rank);
            let mut part = self
                .gpu
                .zeros(tensor.dtype(), &[mine.len()])
                .map_err(&failed)?;
            self.gpu
                .copy(&device, mine, &mut part, 0)
                .map_err(&failed)?;
            part
        } else {
            self.reduce_own_chunk(&id, &device, op, mode)?
        };
        self.wait(&id)?;
        let part = self.gpu.download(&part).map_err(&failed)?;
        Ok(Tensor::new(vec![part.len()], part.into_data()).expect("a chunk is 1-D"))
    }

    fn allreduce(
        &self,
        tensor: &mut Tensor,
        op: ReduceOp,
        mode: ReductionMode,
    ) -> Result<(), CommError> {
        let id = self.begin(CollectiveKind::Allreduce)?;
        self.check_signature(&id, &format!("{op} in {mode}, {}", describe(tensor)))?;
        self.check_reduction(&id, tensor.dtype(), mode)?;
        let failed = self.failed(&id);
        let mut device = self.gpu.upload(tensor).map_err(&failed)?;
        self.allreduce_in_place(&id, &mut device, op, mode)?;
        self.wait(&id)?;
        *tensor = self.gpu.download(&device).map_err(&failed)?;
        Ok(())
    }
}

/// The fixed-size record of a collective's signature that the ranks allgather: the text's md5
/// (compared), its length and as much of the text as fits (for the error message).
fn signature_record(signature: &str) -> [u8; SIGNATURE_BYTES] {
    let mut record = [0u8; SIGNATURE_BYTES];
    record[..16].copy_from_slice(&Md5Digest::of_bytes(signature.as_bytes()).0);
    record[16..20].copy_from_slice(&(signature.len() as u32).to_le_bytes());
    let room = SIGNATURE_BYTES - SIGNATURE_TEXT_AT;
    let mut stored = signature.len().min(room);
    while !signature.is_char_boundary(stored) {
        stored -= 1;
    }
    record[20..22].copy_from_slice(&(stored as u16).to_le_bytes());
    record[SIGNATURE_TEXT_AT..SIGNATURE_TEXT_AT + stored]
        .copy_from_slice(&signature.as_bytes()[..stored]);
    record
}

/// The text of a signature record (`…` where it was cut).
fn signature_text(record: &[u8]) -> String {
    let full = u32::from_le_bytes(record[16..20].try_into().expect("4 bytes")) as usize;
    let stored = u16::from_le_bytes(record[20..22].try_into().expect("2 bytes")) as usize;
    let stored = stored.min(SIGNATURE_BYTES - SIGNATURE_TEXT_AT);
    let mut text = String::from_utf8_lossy(&record[SIGNATURE_TEXT_AT..SIGNATURE_TEXT_AT + stored])
        .into_owned();
    if full > stored {
        text.push('…');
    }
    text
}

/// The first rank (in rank order) whose record in `records` (every rank's, in rank order)
/// differs from `rank`'s, with its signature's text.
fn first_mismatch(records: &[u8], rank: usize) -> Option<(usize, String)> {
    let records: Vec<&[u8]> = records.chunks_exact(SIGNATURE_BYTES).collect();
    let mine = records[rank];
    records
        .iter()
        .enumerate()
        .find(|&(_, theirs)| *theirs != mine)
        .map(|(other, theirs)| (other, signature_text(theirs)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{launch_threads, LaunchConfig};
    use crate::device::gpu::gpu_for_test;
    use crate::value::seed::{derive_stream, Stream};
    use crate::value::tensor::TensorData;

    #[test]
    fn a_missing_nccl_is_an_error_naming_libnccl_not_a_panic() {
        if locate_library(CudaLibrary::Nccl).is_ok() {
            println!("NCCL loads here: the missing-library error is checked on machines without");
            return;
        }
        let err = NcclId::new().unwrap_err();
        assert!(
            matches!(
                err,
                CudaError::LibraryMissing {
                    library: CudaLibrary::Nccl,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("libnccl"), "{err}");
    }

    #[test]
    fn ids_round_trip_as_bytes_and_wrong_lengths_are_refused() {
        let bytes: Vec<u8> = (0..NCCL_ID_BYTES).map(|i| (i * 7) as u8).collect();
        let id = NcclId::from_bytes(&bytes).unwrap();
        assert_eq!(&id.as_bytes()[..], &bytes[..]);
        assert_eq!(id.raw().internal.map(|c| c as u8), *id.as_bytes());
        for len in [0, 127, 129] {
            let err = NcclId::from_bytes(&vec![0; len]).unwrap_err();
            assert!(err.to_string().contains(&format!("not {len}")), "{err}");
        }
    }

    #[test]
    fn signature_records_name_the_first_rank_that_called_something_else() {
        let same = signature_record("allreduce of sum in ring, f32[10]");
        let other = signature_record("broadcast of root 0, f32[10]");
        let records = |ranks: &[&[u8; SIGNATURE_BYTES]]| -> Vec<u8> {
            ranks.iter().flat_map(|r| r.iter().copied()).collect()
        };
        assert_eq!(first_mismatch(&records(&[&same, &same, &same]), 1), None);
        assert_eq!(
            first_mismatch(&records(&[&same, &same, &other]), 0),
            Some((2, "broadcast of root 0, f32[10]".to_owned()))
        );
        // Seen from the odd rank out, the first other rank is named.
        assert_eq!(
            first_mismatch(&records(&[&same, &same, &other]), 2),
            Some((0, "allreduce of sum in ring, f32[10]".to_owned()))
        );
        // A long signature is cut (at a character boundary) for the message, compared whole.
        let long = format!("allgather of {}", "é".repeat(300));
        let longer = format!("{long}x");
        let (a, b) = (signature_record(&long), signature_record(&longer));
        assert_ne!(a, b);
        let text = signature_text(&a);
        assert!(
            text.ends_with('…') && text.starts_with("allgather of é"),
            "{text}"
        );
        assert!(text.len() <= SIGNATURE_BYTES);
    }

    fn seeded(rank: usize, len: usize) -> Tensor {
        let mut rng = derive_stream(23, Stream::Data, rank as u64, 0);
        Tensor::from_vec(
            (0..len)
                .map(|_| rng.normal_f32() * 1e3)
                .collect::<Vec<f32>>(),
        )
    }

    fn bits(tensor: &Tensor) -> Vec<u8> {
        tensor.with_view(|v| v.bytes().to_vec())
    }

    /// World size 1 through NCCL: every collective and deterministic mode gives the CPU thread
    /// rank's bits; `native` runs; `arrival_order` and unreducible dtypes are refused.
    #[test]
    fn one_nccl_rank_gets_the_cpus_bits_in_every_collective() {
        let Some(gpu) = gpu_for_test(
            "an NcclComm of world size 1 gives the CPU's bits in allreduce (device and host), \
             reduce-scatter, broadcast and allgather for rank_ordered, ring and reproducible; \
             native allreduce runs; arrival_order and f16 are refused after the signature check",
        ) else {
            return;
        };
        let comm = match NcclComm::single(Arc::clone(&gpu)) {
            Ok(comm) => comm,
            Err(e) => {
                assert!(
                    !crate::device::gpu::gpu_required(),
                    "DETCHECK_REQUIRE_GPU=1: {e}"
                );
                println!("no NCCL ({e}): would check one NCCL rank's collectives");
                return;
            }
        };
        let cpu = |op: ReduceOp, mode: ReductionMode| {
            launch_threads(&LaunchConfig::new(1), move |host| {
                let mut t = seeded(0, 1001);
                host.allreduce(&mut t, op, mode)?;
                let scattered = host.reduce_scatter(&seeded(0, 1001), op, mode)?;
                Ok((bits(&t), bits(&scattered)))
            })
            .unwrap()
            .remove(0)
        };
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            for mode in [
                ReductionMode::RankOrdered,
                ReductionMode::Ring,
                ReductionMode::Reproducible,
            ] {
                let (want, want_scattered) = cpu(op, mode);
                let mut host = seeded(0, 1001);
                comm.allreduce(&mut host, op, mode).unwrap();
                assert!(bits(&host) == want, "{op} in {mode}, host");
                let mut device = gpu.upload(&seeded(0, 1001)).unwrap();
                comm.allreduce_device(&mut device, op, mode).unwrap();
                assert!(
                    bits(&gpu.download(&device).unwrap()) == want,
                    "{op} in {mode}"
                );
                let scattered = comm.reduce_scatter(&seeded(0, 1001), op, mode).unwrap();
                assert!(
                    bits(&scattered) == want_scattered,
                    "{op} in {mode}, scatter"
                );
            }
            let mut native = seeded(0, 1001);
            comm.allreduce(&mut native, op, ReductionMode::Native)
                .unwrap();
            assert_eq!(native.len(), 1001);
        }
        let mut b = seeded(0, 7);
        comm.broadcast(&mut b, 0).unwrap();
        assert!(bits(&b) == bits(&seeded(0, 7)));
        let gathered = comm.allgather(&seeded(0, 7)).unwrap();
        assert!(gathered.len() == 1 && bits(&gathered[0]) == bits(&seeded(0, 7)));
        comm.barrier().unwrap();
        let err = comm
            .allreduce(
                &mut seeded(0, 3),
                ReduceOp::Sum,
                ReductionMode::ArrivalOrder,
            )
            .unwrap_err();
        assert!(matches!(err, CommError::InvalidArgument { .. }), "{err}");
        let mut half = Tensor::new(vec![2], TensorData::F16(vec![half::f16::ONE; 2])).unwrap();
        let err = comm
            .allreduce(&mut half, ReduceOp::Sum, ReductionMode::Ring)
            .unwrap_err();
        assert!(matches!(err, CommError::InvalidArgument { .. }), "{err}");
        // Still usable after refusals: they come after the signature check, on every rank.
        comm.barrier().unwrap();
        println!("one NCCL rank on {} gives the CPU's bits", gpu.name());
    }
}
