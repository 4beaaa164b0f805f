//! The writer's own thread: records are hashed and written there, while the program goes on.
//!
//! `TraceWriter.record` checks the record (dtype, shape, bool bytes, step order) and copies the
//! array's bytes into a buffer the writer owns; the records gather into a batch ([`BATCH_BYTES`]
//! or [`BATCH_RECORDS`]) that goes to this thread, which computes the statistics (stats and full
//! modes), the digests (the chunks of many buffers at once in SIMD lanes, the library's
//! `detcheck::value::TreeLanes`: the more chunks, the fuller the lanes) and writes the records in
//! the order they were given, with the sequence numbers
//! given to them. So the program's own thread pays for a copy (memcpy speed) rather than for md5
//! (one core's ~600 MB/s), and the array may change as soon as `record` returns. A torch
//! tensor's copy-on-write snapshot (`TraceWriter._record_lent`, [`RecordBytes::Lent`]) costs the
//! program not even the copy: the thread reads it in place and gives it back to be dropped (a
//! module's output, whose next write, if any, gives the program's tensor memory of its own).
//! Batches also spare the program a wake-up of the thread per record (about 15 us, as much as
//! the copy of a 256 KiB array), and so does the thread, which looks for work on its own for a
//! while before it sleeps on the queue ([`POLL_FOR`]); a lent record goes at once, as its
//! memory is the program's (and still in the cache).
//!
//! Memory: at most [`LIMIT`] bytes of copies and lent snapshots are in flight (one larger array
//! alone); `record` waits, with the GIL released, for the thread to catch up beyond that.
//! Buffers come back to the Python side and are reused, so a training loop does not fault in
//! fresh pages every step.
//!
//! Errors: the checks that `record` can make are made there and raised at once. A failure of the
//! thread (writing the file) is raised by the next `record`, `flush` or `close`; the file is then
//! never finished, as when the writer is dropped.
//!
//! Determinism: the records, their order, sequence numbers, md5s and statistics are those the
//! writer would produce called in place (`TraceWriter::record_view`), so the files are the same.

use crate::buffer::Lent;
use detcheck::file::{DumpError, DumpMode, TraceWriter as RustWriter};
use detcheck::record::Record;
use detcheck::value::{
    tree_digest, DType, Md5Digest, Placement, PositionDigest, Shard, Stats, TensorView, TreeLanes,
};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// At most this many bytes of copied arrays wait for the thread.
pub(crate) const LIMIT: usize = 64 << 20;

/// Buffers at least this large are kept for reuse when they come back.
const REUSE_BYTES: usize = 64 << 10;

/// Blocks per lane hashed between two looks at the queue.
const BUDGET: usize = 64;

/// Records go to the thread once this many bytes of them wait ...
const BATCH_BYTES: usize = LIMIT / 4;

/// ... or this many records (or when `flush`, `close` or a `record` short of room waits).
const BATCH_RECORDS: usize = 256;

/// The forks of this process that Python's `os.register_at_fork` told of, in the child
/// ([`note_fork`]): a handle made before one of them is in a child whose thread is not there.
/// Read at every record instead of asking the kernel for the process id (a system call).
static FORKS: AtomicU64 = AtomicU64::new(0);

/// This process is a child forked by Python (`os.fork`, multiprocessing's fork).
pub(crate) fn note_fork() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// The idle thread looks for records this often at first, then twice as long each time up to
/// [`POLL_MAX`] ...
const POLL_MIN: Duration = Duration::from_micros(50);
const POLL_MAX: Duration = Duration::from_millis(1);

/// ... and blocks on the queue once it was idle this long: a program that records many times
/// a second hands its records over without a system call (a blocked thread is woken by the
/// sender: a `futex` call, about 15 us on a virtual machine, a third of a lent record's cost);
/// one that records seldom pays the wake-up, and its thread sleeps.
const POLL_FOR: Duration = Duration::from_millis(100);

/// A record for the thread: everything but its md5 and statistics.
pub(crate) struct Job {
    pub(crate) step: u64,
    pub(crate) seq: u32,
    pub(crate) name: String,
    pub(crate) replicated: bool,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
    /// The array's canonical bytes, copied or lent (empty for a digested record).
    pub(crate) data: RecordBytes,
    pub(crate) digest: JobDigest,
    /// A shard's placement (checked against `shape` by `record`): the thread computes its
    /// position digest from `data`.
    pub(crate) placement: Option<Placement>,
}

/// A record's canonical bytes on their way to the thread, and back.
pub(crate) enum RecordBytes {
    /// Copied into a buffer of the writer's, which comes back to be reused.
    Copied(Vec<u8>),
    /// Read in place: a torch tensor's copy-on-write snapshot (`buffer::Lent`), which comes
    /// back to be dropped on the program's side (no copy at all).
    Lent(Lent),
}

impl Default for RecordBytes {
    fn default() -> Self {
        RecordBytes::Copied(Vec::new())
    }
}

impl AsRef<[u8]> for RecordBytes {
    fn as_ref(&self) -> &[u8] {
        match self {
            RecordBytes::Copied(data) => data,
            RecordBytes::Lent(lent) => lent.bytes(),
        }
    }
}

impl RecordBytes {
    fn len(&self) -> usize {
        self.as_ref().len()
    }
}

/// Where a record's digest and statistics come from.
pub(crate) enum JobDigest {
    /// The thread computes them from `data`.
    Compute,
    /// Computed elsewhere (a GPU) and given with the record: the thread reads no bytes.
    Given([u8; 16], Stats),
    /// Computed elsewhere and given later ([`Background::fill`], by the record's id): the
    /// record holds its place, and the records after it wait for it.
    Later,
}

enum Msg {
    Records(Vec<Job>),
    /// Answer once every record sent before is written.
    Flush(Sender<()>),
    /// The digest and statistics of the [`JobDigest::Later`] record of this id.
    Fill(u64, [u8; 16], Stats),
}

/// A failure of the thread, as it is raised on the Python side (a `DumpError` is not `Clone`).
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    /// The OS error number of an I/O error.
    pub(crate) errno: Option<i32>,
    /// An I/O error (`OSError`), otherwise detcheck's (`DetcheckError`).
    pub(crate) io: bool,
    pub(crate) message: String,
}

impl Failure {
    fn of(e: &DumpError) -> Self {
        match e {
            DumpError::Io { source, .. } => Failure {
                errno: source.raw_os_error(),
                io: true,
                message: e.to_string(),
            },
            _ => Failure {
                errno: None,
                io: false,
                message: e.to_string(),
            },
        }
    }

    fn other(message: &str) -> Self {
        Failure {
            errno: None,
            io: false,
            message: message.to_owned(),
        }
    }
}

/// The Python side's handle on the thread.
pub(crate) struct Background {
    tx: Option<Sender<Msg>>,
    /// Buffers the thread is done with (in a `Mutex` only to make the writer `Sync`, as PyO3
    /// asks; it is reached through `&mut self`, never locked).
    returned: Mutex<Receiver<RecordBytes>>,
    thread: Option<JoinHandle<Result<(), Failure>>>,
    abort: Arc<AtomicBool>,
    failure: Arc<Mutex<Option<Failure>>>,
    pool: Vec<Vec<u8>>,
    pool_bytes: usize,
    /// Bytes handed over (batched or sent) and not back yet.
    in_flight: usize,
    /// The batch being gathered, and its bytes.
    batch: Vec<Job>,
    batch_bytes: usize,
    /// The process that started the thread, and the forks counted then ([`FORKS`]): a forked
    /// child has the handle but not the thread.
    pid: u32,
    forks: u64,
    /// [`JobDigest::Later`] records not filled yet: while there are any, `record` never waits
    /// for room (the thread may be waiting for the fill, which only the caller can give).
    unfilled: u64,
}

impl Background {
    /// Starts the thread that writes into `writer`.
    pub(crate) fn start(writer: RustWriter, rank: u32, mode: DumpMode) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let (back, returned) = mpsc::channel();
        let abort = Arc::new(AtomicBool::new(false));
        let failure = Arc::new(Mutex::new(None));
        let thread = {
            let abort = Arc::clone(&abort);
            let failure = Arc::clone(&failure);
            std::thread::Builder::new()
                .name(format!("detcheck-writer-{rank}"))
                .spawn(move || {
                    Thread {
                        rank,
                        mode,
                        rx,
                        back,
                        abort,
                        failure,
                    }
                    .run(writer)
                })?
        };
        Ok(Background {
            tx: Some(tx),
            returned: Mutex::new(returned),
            thread: Some(thread),
            abort,
            failure,
            pool: Vec::new(),
            pool_bytes: 0,
            in_flight: 0,
            batch: Vec::new(),
            batch_bytes: 0,
            pid: std::process::id(),
            forks: FORKS.load(Ordering::Relaxed),
            unfilled: 0,
        })
    }

    /// Whether this is a forked child of the process that started the thread: every record
    /// asks Python's fork count; `ask_kernel`, before a wait for the thread, also the process
    /// id (a fork Python did not make).
    fn forked(&self, ask_kernel: bool) -> bool {
        FORKS.load(Ordering::Relaxed) != self.forks
            || (ask_kernel && std::process::id() != self.pid)
    }

    /// The thread's failure, if it had one; in a forked child (`forked`, asking the kernel
    /// too when `ask_kernel`), that the thread is not there.
    pub(crate) fn failure(&self, ask_kernel: bool) -> Option<Failure> {
        if self.forked(ask_kernel) {
            return Some(Failure::other(&format!(
                "this trace writer belongs to process {} (a writer cannot be used across fork)",
                self.pid
            )));
        }
        self.failure.lock().ok().and_then(|f| f.clone())
    }

    /// Takes back the buffers the thread is done with; a lent snapshot is let go (where the
    /// GIL is released, PyO3 drops it the next time a thread holds it).
    fn reclaim(&mut self, data: RecordBytes) {
        self.in_flight -= data.len();
        let data = match data {
            RecordBytes::Copied(data) => data,
            RecordBytes::Lent(_) => return, // dropped here: the snapshot is let go
        };
        let capacity = data.capacity();
        if capacity >= REUSE_BYTES && self.pool_bytes + capacity <= LIMIT {
            self.pool_bytes += capacity;
            self.pool.push(data);
        }
    }

    fn returned(&mut self) -> &Receiver<RecordBytes> {
        match self.returned.get_mut() {
            Ok(rx) => rx,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn reclaim_ready(&mut self) {
        while let Ok(data) = self.returned().try_recv() {
            self.reclaim(data);
        }
    }

    /// An empty buffer of at least `len` bytes: the smallest one that fits from those that came
    /// back, or a new one.
    pub(crate) fn buffer(&mut self, len: usize) -> Vec<u8> {
        self.reclaim_ready();
        let best = self
            .pool
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let mut data = self.pool.swap_remove(i);
                self.pool_bytes -= data.capacity();
                data.clear();
                data
            }
            None => Vec::with_capacity(len),
        }
    }

    /// `true` when `len` more bytes would go beyond [`LIMIT`] (and something is in flight).
    pub(crate) fn must_wait(&mut self, len: usize) -> bool {
        self.reclaim_ready();
        self.unfilled == 0 && self.in_flight > 0 && self.in_flight + len > LIMIT
    }

    /// Waits until `len` more bytes fit (call it with the GIL released); never while a record
    /// waits for its digest (the memory may then go beyond [`LIMIT`] by a step's records).
    pub(crate) fn wait_room(&mut self, len: usize) {
        if self.unfilled > 0 || self.forked(true) {
            return; // in a forked child, no thread gives room: `flush` and `close` say why
        }
        if self.in_flight > 0 && self.in_flight + len > LIMIT && self.send_batch().is_err() {
            return; // the thread is gone; `submit` reports why
        }
        while self.in_flight > 0 && self.in_flight + len > LIMIT {
            match self.returned().recv() {
                Ok(data) => self.reclaim(data),
                Err(_) => return, // the thread is gone; `submit` reports why
            }
        }
    }

    /// Hands a record to the thread (in a batch).
    pub(crate) fn submit(&mut self, job: Job) -> Result<(), Failure> {
        if matches!(job.digest, JobDigest::Later) {
            self.unfilled += 1;
        }
        let len = job.data.len();
        // A lent record goes at once: its memory is the program's, which torch frees (and
        // reuses) when the program drops the tensor, unless the snapshot still holds it; and
        // it is hashed while the program's write of it is still in the cache. Gathered 4 MiB
        // at a time, the recorded FSDP2 program was slower in each of 5 paired runs
        // (`--record-ab`, median ratio 1.064x against 1.045x).
        let lent = matches!(job.data, RecordBytes::Lent(_));
        self.in_flight += len;
        self.batch_bytes += len;
        self.batch.push(job);
        if lent || self.batch_bytes >= BATCH_BYTES || self.batch.len() >= BATCH_RECORDS {
            self.send_batch()?;
        }
        Ok(())
    }

    /// Gives the [`JobDigest::Later`] record `id` (its index among this writer's records) its
    /// digest and statistics; the batch that holds it goes first.
    pub(crate) fn fill(&mut self, id: u64, digest: [u8; 16], stats: Stats) -> Result<(), Failure> {
        self.send_batch()?;
        self.unfilled = self.unfilled.saturating_sub(1);
        match self
            .tx
            .as_ref()
            .map(|tx| tx.send(Msg::Fill(id, digest, stats)))
        {
            Some(Ok(())) => Ok(()),
            _ => Err(self.gone()),
        }
    }

    /// Sends the batch gathered so far.
    fn send_batch(&mut self) -> Result<(), Failure> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.batch);
        self.batch_bytes = 0;
        match self.tx.as_ref().map(|tx| tx.send(Msg::Records(batch))) {
            Some(Ok(())) => Ok(()),
            _ => Err(self.gone()),
        }
    }

    /// Waits until every record handed over is written (call it with the GIL released).
    pub(crate) fn flush(&mut self) -> Result<(), Failure> {
        if let Some(f) = self.failure(true) {
            return Err(f);
        }
        self.send_batch()?;
        let (ack, done) = mpsc::channel();
        let sent = self.tx.as_ref().map(|tx| tx.send(Msg::Flush(ack)));
        if !matches!(sent, Some(Ok(()))) || done.recv().is_err() {
            return Err(self.gone());
        }
        self.reclaim_ready();
        match self.failure(false) {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    /// Why the thread stopped taking records: its failure, or a panic.
    fn gone(&mut self) -> Failure {
        if let Some(f) = self.failure(false) {
            return f;
        }
        match self.join() {
            Err(f) => f,
            Ok(()) => Failure::other("the writer's thread has stopped"),
        }
    }

    fn join(&mut self) -> Result<(), Failure> {
        self.tx = None;
        if self.forked(true) {
            // A forked child: the thread is the parent's; there is nothing here to wait for.
            std::mem::forget(self.thread.take());
            return Err(self.failure(true).expect("another process"));
        }
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .unwrap_or_else(|_| Err(Failure::other("the writer's thread panicked"))),
            None => Ok(()),
        }
    }

    /// Writes what is left, then the footer; syncs and renames the file (call it with the GIL
    /// released).
    pub(crate) fn finish(mut self) -> Result<(), Failure> {
        self.send_batch()?;
        self.join()
    }

    /// Stops at once; the unfinished file is removed.
    pub(crate) fn abort(mut self) {
        self.abort.store(true, Ordering::SeqCst);
        let _ = self.join();
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.abort.store(true, Ordering::SeqCst);
            let _ = self.join();
        }
    }
}

/// The lanes the thread hashes in: as many as the CPU's vectors hold (16 with AVX-512, 8 with
/// AVX2, 4 without), capped by `DETCHECK_MD5_LANES` (`8`, or `0`: md-5 one buffer after the
/// other), for tests and comparisons.
fn lanes_from_env() -> Option<TreeLanes<RecordBytes, u64>> {
    let cap = std::env::var("DETCHECK_MD5_LANES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(16);
    (cap > 0).then(|| TreeLanes::with_max_lanes(cap))
}

/// A record in the thread, waiting for its md5 to be written in order.
struct Slot {
    job: Job,
    stats: Stats,
    md5: Option<[u8; 16]>,
    shard: Option<Shard>,
}

/// The thread's records and lanes.
struct State {
    lanes: Option<TreeLanes<RecordBytes, u64>>,
    /// The records not yet written, in order; `first` is the id of the front one.
    queue: VecDeque<Slot>,
    first: u64,
    /// Flushes to answer once the record of that id is written.
    flushes: Vec<(u64, Sender<()>)>,
}

impl State {
    fn has_lane_work(&self) -> bool {
        self.lanes.as_ref().is_some_and(|l| !l.is_idle())
    }
}

struct Thread {
    rank: u32,
    mode: DumpMode,
    rx: Receiver<Msg>,
    back: Sender<RecordBytes>,
    abort: Arc<AtomicBool>,
    failure: Arc<Mutex<Option<Failure>>>,
}

impl Thread {
    fn run(self, mut writer: RustWriter) -> Result<(), Failure> {
        let mut st = State {
            lanes: lanes_from_env(),
            queue: VecDeque::new(),
            first: 0,
            flushes: Vec::new(),
        };
        let mut open = true;
        let mut failed: Option<Failure> = None;
        loop {
            if !st.has_lane_work() {
                if !open && st.queue.is_empty() {
                    break;
                }
                if !open {
                    // Nothing more can come: a record that still waits for its digest never
                    // gets it, and the file is not finished without it.
                    if let Some(slot) = st.queue.front().filter(|s| s.md5.is_none()) {
                        let f = Failure::other(&format!(
                            "the trace was closed while `{}` (step {}) still waited for its \
                             device digest",
                            slot.job.name, slot.job.step
                        ));
                        if let Ok(mut shared) = self.failure.lock() {
                            shared.get_or_insert_with(|| f.clone());
                        }
                        failed.get_or_insert(f);
                        break;
                    }
                } else {
                    match self.next_message() {
                        Some(msg) => self.take(msg, &mut st),
                        None => open = false,
                    }
                }
            }
            loop {
                match self.rx.try_recv() {
                    Ok(msg) => self.take(msg, &mut st),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            if self.abort.load(Ordering::SeqCst) {
                return Ok(()); // dropping `writer` removes its temporary file
            }
            let State {
                lanes,
                queue,
                first,
                ..
            } = &mut st;
            if let Some(lanes) = lanes.as_mut() {
                lanes.run(BUDGET, |data, id, md5| {
                    let slot = &mut queue[(id - *first) as usize];
                    slot.job.data = data;
                    slot.md5 = Some(md5.0);
                });
            }
            while st.queue.front().is_some_and(|s| s.md5.is_some()) {
                let slot = st.queue.pop_front().expect("checked");
                st.first += 1;
                let data = self.write(&mut writer, slot, &mut failed);
                let _ = self.back.send(data);
            }
            let first = st.first;
            st.flushes.retain(|(upto, ack)| {
                let done = first >= *upto;
                if done {
                    let _ = ack.send(());
                }
                !done
            });
        }
        match failed {
            Some(f) => Err(f),
            None => writer.finish().map(|_| ()).map_err(|e| self.fail(&e)),
        }
    }

    /// The next message, waiting for it (polling, then blocked: [`POLL_FOR`]); `None` once the
    /// program's side is gone.
    fn next_message(&self) -> Option<Msg> {
        let mut pause = POLL_MIN;
        let mut idle = Duration::ZERO;
        while idle < POLL_FOR {
            match self.rx.try_recv() {
                Ok(msg) => return Some(msg),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) => {}
            }
            std::thread::sleep(pause);
            idle += pause;
            pause = (pause * 2).min(POLL_MAX);
        }
        self.rx.recv().ok()
    }

    /// Takes a message: each record is queued (with its statistics) and handed to the lanes,
    /// or hashed here when there are none.
    fn take(&self, msg: Msg, st: &mut State) {
        let jobs = match msg {
            Msg::Records(jobs) => jobs,
            Msg::Flush(ack) => {
                st.flushes.push((st.first + st.queue.len() as u64, ack));
                return;
            }
            Msg::Fill(id, digest, stats) => {
                // Checked by the caller: an id it was given and has not filled yet.
                let slot = id
                    .checked_sub(st.first)
                    .and_then(|at| st.queue.get_mut(at as usize));
                if let Some(slot) = slot.filter(|s| matches!(s.job.digest, JobDigest::Later)) {
                    slot.md5 = Some(digest);
                    slot.stats = stats;
                }
                return;
            }
        };
        for job in jobs {
            let id = st.first + st.queue.len() as u64;
            let given = match &job.digest {
                JobDigest::Compute => None,
                JobDigest::Given(digest, stats) => Some((Some(*digest), *stats)),
                JobDigest::Later => Some((None, Stats::default())),
            };
            if let Some((md5, stats)) = given {
                st.queue.push_back(Slot {
                    job,
                    stats,
                    md5,
                    shard: None,
                });
                continue;
            }
            let view = TensorView::new(job.dtype, &job.shape, job.data.as_ref());
            let stats = match view {
                Ok(view) if self.mode.has_stats() => Stats::of_view(view),
                _ => Stats::default(), // checked by `record` already
            };
            // Beside the tree digest, off the program's thread (placement checked by `record`).
            let shard =
                match (&job.placement, view) {
                    (Some(placement), Ok(view)) => PositionDigest::of_shard(view, placement)
                        .ok()
                        .map(|digest| Shard {
                            placement: placement.clone(),
                            digest,
                        }),
                    _ => None,
                };
            let mut slot = Slot {
                job,
                stats,
                md5: None,
                shard,
            };
            match st.lanes.as_mut() {
                Some(lanes) => lanes.push(std::mem::take(&mut slot.job.data), id),
                None => slot.md5 = Some(tree_digest(slot.job.data.as_ref()).0),
            }
            st.queue.push_back(slot);
        }
    }

    /// Writes a record (unless an earlier one failed); gives its buffer back.
    fn write(
        &self,
        writer: &mut RustWriter,
        slot: Slot,
        failed: &mut Option<Failure>,
    ) -> RecordBytes {
        let Slot {
            job,
            stats,
            md5,
            shard,
        } = slot;
        if failed.is_none() {
            let record = Record {
                rank: self.rank,
                step: job.step,
                seq: job.seq,
                name: job.name,
                replicated: job.replicated,
                dtype: job.dtype,
                shape: job.shape,
                md5: Md5Digest(md5.expect("hashed")),
                stats,
                shard,
            };
            // The bytes go with every record: full mode writes them, and a capture a re-run
            // asks for (`DETCHECK_CAPTURE`) keeps the matching record's; otherwise the writer
            // only looks at them when it matches a capture.
            let view = match job.digest {
                JobDigest::Compute => {
                    TensorView::new(record.dtype, &record.shape, job.data.as_ref()).ok()
                }
                JobDigest::Given(..) | JobDigest::Later => None,
            };
            if let Err(e) = writer.write_record_view(&record, view) {
                *failed = Some(self.fail(&e));
            }
        }
        job.data
    }

    fn fail(&self, e: &DumpError) -> Failure {
        let f = Failure::of(e);
        if let Ok(mut slot) = self.failure.lock() {
            slot.get_or_insert_with(|| f.clone());
        }
        f
    }
}
