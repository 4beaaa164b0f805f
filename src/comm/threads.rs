//! Thread ranks: N ranks as threads of one process, the embedded default backend.
//!
//! [`launch_threads`] starts one named thread per rank (`rank-0`, `rank-1`, …), hands each a
//! [`ThreadComm`], and collects the results. Every collective is a sequence of *rounds*: each rank
//! deposits its contribution in the round's slot, waits until all ranks have, and reads them all.
//! An allreduce takes two rounds: each rank reduces one chunk of every contribution in the
//! mode's order, then all ranks gather the chunks. So each element is reduced exactly once and
//! every rank gets the same bits.
//!
//! Failure: every wait has a deadline ([`LaunchConfig::deadline`]), counted from the collective's
//! last progress (the latest rank to enter or deposit), not from the waiting rank's own arrival:
//! a world larger than the machine's cores arrives a few ranks at a time, and only a round where
//! nothing happens for a whole deadline is stuck. A rank that returns an error, panics, or
//! finishes without joining a collective releases the waiting ranks at once; a rank that never
//! arrives makes them fail a deadline after the last rank that did. The launch returns the first
//! failure, which names the rank and the collective. A rank thread that never returns is
//! detached, not joined, so the caller is never held by it.
//!
//! Cost: a round wakes each rank O(1) times (a deposit wakes the next rank of the order, the last
//! deposit everyone) and builds its result once, shared by an `Arc`, so a round's coordination is
//! O(ranks) and 1024 ranks (the scenario files' maximum) run in seconds on two cores
//! (docs/scaling.md).
//!
//! Perturbation: a [`Perturbation`] makes a run change what must not matter. Before each round a
//! rank sleeps a seeded delay, and contributions are deposited in a seeded, permuted order. Two
//! runs with different `rotation`s deposit in a different order in every round: this is how the
//! `arrival_order` control is caught every time rather than by luck.
//!
//! Dtypes: broadcast and allgather move tensors of every dtype; allreduce and reduce-scatter
//! refuse f16, bf16, f8e4m3fn, f8e5m2, bool, i8, i16, u16, c64 and c128 with
//! [`CommError::InvalidArgument`] before any data moves (why: `value/reduce.rs`).
//!
//! Invariant (every collective gives every rank identical bits): each element of an allreduce is
//! reduced once, by one rank, and shared. The arrival order is the only timing-dependent value and
//! only `arrival_order` reads it.
//!
//! Invariant (nothing hangs): every wait has a deadline; a rank that fails, exits or never arrives
//! releases the others at once or at the deadline, with the rank and collective named; a rank
//! thread that never returns is detached, never joined. The deadline counts from the collective's
//! last progress (the latest rank to enter or deposit), so large worlds on few cores are not failed
//! by their own queueing.
//!
//! Invariant (a thread round costs O(ranks) wakeups): a deposit wakes only the next rank of the
//! arrival order and the last deposit wakes everyone once; the round's result is built once and
//! shared. No wait recomputes a list of ranks unless it fails (docs/scaling.md).
//!
//! Determinism: the arrival order is the only timing-dependent value here, and only
//! `arrival_order` reads it. Deadlines use the monotonic clock, never on a data path.

use super::{CollectiveId, CollectiveKind, CommError, Communicator};
use crate::value::reduce::{
    chunk_range, reduce_chunk, summation_order, unreducible, ReduceOp, ReductionMode,
};
use crate::value::seed::{derive_stream, Stream};
use crate::value::tensor::{Tensor, TensorData};
use std::any::Any;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::error::Error;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Stream numbers of the perturbation's own random draws (kept apart from user streams).
const PERTURB_ORDER_STREAM: u64 = 0x7065_7274_6f72_6400;
const PERTURB_DELAY_STREAM: u64 = 0x7065_7274_646c_7900;

/// How to launch thread ranks.
#[derive(Debug, Clone)]
pub struct LaunchConfig {
    /// Number of ranks.
    pub world_size: usize,
    /// The longest a collective may go without progress: a waiting rank fails when no rank has
    /// entered or deposited in its collective for this long (and this long after its own
    /// arrival). Also how long the launcher waits for the remaining ranks after the latest one
    /// ended.
    pub deadline: Duration,
    /// The longest a whole run may take before the ranks still running are reported as stuck.
    pub run_timeout: Duration,
    /// Seeded changes to timing and arrival order, or `None` for a plain run.
    pub perturbation: Option<Perturbation>,
}

impl LaunchConfig {
    /// `world_size` ranks, a 60 s collective deadline, a 1 h run limit, no perturbation.
    #[must_use]
    pub fn new(world_size: usize) -> Self {
        LaunchConfig {
            world_size,
            deadline: Duration::from_secs(60),
            run_timeout: Duration::from_secs(3600),
            perturbation: None,
        }
    }

    /// Sets the collective deadline.
    #[must_use]
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Sets the perturbation.
    #[must_use]
    pub fn with_perturbation(mut self, perturbation: Perturbation) -> Self {
        self.perturbation = Some(perturbation);
        self
    }
}

/// Seeded changes to what must not matter: delays before each collective and the order in which
/// contributions arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Perturbation {
    /// Seed of the delays and orders.
    pub seed: u64,
    /// Rotates every round's arrival order: runs with different rotations (mod the world size)
    /// never see the same order in the same round.
    pub rotation: usize,
    /// Upper bound of each seeded delay.
    pub max_delay: Duration,
}

impl Perturbation {
    /// The order in which ranks deposit their contributions in `round`.
    pub(super) fn arrival_order(&self, size: usize, round: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..size).collect();
        derive_stream(self.seed, Stream::User(PERTURB_ORDER_STREAM), 0, round).shuffle(&mut order);
        order.rotate_left(self.rotation % size.max(1));
        order
    }

    /// How long `rank` sleeps before depositing in `round`.
    pub(super) fn delay(&self, rank: usize, round: u64) -> Duration {
        let stream = Stream::User(PERTURB_DELAY_STREAM ^ self.rotation as u64);
        let u = derive_stream(self.seed, stream, rank as u64, round).uniform_f64();
        self.max_delay.mul_f64(u)
    }
}

/// Why a launch of thread ranks failed: the first failure, by the rank where it happened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// A world needs at least one rank.
    #[error("cannot launch {world_size} ranks: a world needs at least one")]
    EmptyWorld {
        /// The requested size.
        world_size: usize,
    },
    /// The operating system refused a thread.
    #[error("cannot start the thread of rank {rank}: {message}")]
    Spawn {
        /// The rank.
        rank: usize,
        /// The OS error.
        message: String,
    },
    /// A collective failed (timeout, mismatch, a peer that exited).
    #[error(transparent)]
    Collective(CommError),
    /// A rank's program returned an error.
    #[error("rank {rank} failed: {message}")]
    RankFailed {
        /// The rank.
        rank: usize,
        /// The error, as displayed.
        message: String,
    },
    /// A rank's program panicked.
    #[error("rank {rank} panicked: {message}")]
    RankPanicked {
        /// The rank.
        rank: usize,
        /// The panic message.
        message: String,
    },
    /// Ranks were still running too long after the others finished, or past the run limit.
    #[error("rank(s) {ranks:?} still running {waited:?} after {after}")]
    Stuck {
        /// The ranks still running.
        ranks: Vec<usize>,
        /// How long the launcher waited for them.
        waited: Duration,
        /// What the wait was measured from.
        after: &'static str,
    },
}

impl LaunchError {
    /// The rank the failure is attributed to, where there is one.
    #[must_use]
    pub fn rank(&self) -> Option<usize> {
        match self {
            LaunchError::EmptyWorld { .. } => None,
            LaunchError::Spawn { rank, .. }
            | LaunchError::RankFailed { rank, .. }
            | LaunchError::RankPanicked { rank, .. } => Some(*rank),
            LaunchError::Collective(e) => Some(match e {
                CommError::Timeout { missing, .. } => missing.first().copied().unwrap_or(0),
                CommError::PeerFailed { failed_rank, .. } => *failed_rank,
                CommError::PeerExited { exited_rank, .. } => *exited_rank,
                CommError::Mismatch { rank, .. }
                | CommError::InvalidArgument { rank, .. }
                | CommError::Device { rank, .. } => *rank,
            }),
            LaunchError::Stuck { ranks, .. } => ranks.first().copied(),
        }
    }
}

/// The error type of a rank program.
pub type RankError = Box<dyn Error + Send + Sync>;

pub(super) type Payload = Arc<dyn Any + Send + Sync>;

/// What a completed round gives every rank: each rank's payload (in rank order) and the order
/// they arrived in. Built once, by the last rank to deposit, and shared: a rank takes one `Arc`,
/// not one per peer.
pub(super) struct Exchanged {
    pub(super) payloads: Vec<Payload>,
    pub(super) arrival: Vec<usize>,
}

/// One exchange among all ranks.
struct Round {
    /// What the first rank to arrive called, and with which arguments.
    signature: String,
    first_rank: usize,
    /// Ranks that have called the collective (some may still wait for their turn to deposit).
    entered: Vec<bool>,
    contributions: Vec<Option<Payload>>,
    arrival: Vec<usize>,
    /// Under a perturbation, the round's seeded arrival order and each rank's place in it
    /// (drawn once, by the first rank to enter); empty without one.
    order: Vec<usize>,
    turn: Vec<usize>,
    /// Set by the last rank to deposit.
    complete: Option<Arc<Exchanged>>,
    departed: usize,
    /// When a rank last entered or deposited: a waiting rank's deadline counts from here.
    last_progress: Instant,
}

impl Round {
    fn new(
        signature: &str,
        first_rank: usize,
        size: usize,
        order: Option<Vec<usize>>,
        now: Instant,
    ) -> Self {
        let order = order.unwrap_or_default();
        let mut turn = vec![0; order.len()];
        for (place, &rank) in order.iter().enumerate() {
            turn[rank] = place;
        }
        Round {
            signature: signature.to_owned(),
            first_rank,
            entered: vec![false; size],
            contributions: vec![None; size],
            arrival: Vec::with_capacity(size),
            order,
            turn,
            complete: None,
            departed: 0,
            last_progress: now,
        }
    }

    /// Ranks that have not deposited yet, in rank order.
    fn not_deposited(&self) -> Vec<usize> {
        (0..self.contributions.len())
            .filter(|&r| self.contributions[r].is_none())
            .collect()
    }
}

struct State {
    rounds: BTreeMap<u64, Round>,
    first_failure: Option<usize>,
    exited: Vec<bool>,
    num_exited: usize,
}

/// Who wakes whom. A rank sleeps on its own `turns` condvar while it waits for its turn to
/// deposit (under a perturbation), and on `completed` while it waits for the round to complete.
/// A deposit wakes only the next rank in the order; only the last deposit wakes everyone. So a
/// round costs O(ranks) wakeups, not O(ranks²) (every deposit waking every waiter), which is
/// what made 256 thread ranks take seconds per collective on two cores.
struct Shared {
    size: usize,
    deadline: Duration,
    perturbation: Option<Perturbation>,
    state: Mutex<State>,
    completed: Condvar,
    turns: Vec<Condvar>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn finish_rank(&self, rank: usize, failed: bool) {
        let mut state = self.lock();
        if !state.exited[rank] {
            state.exited[rank] = true;
            state.num_exited += 1;
        }
        if failed && state.first_failure.is_none() {
            state.first_failure = Some(rank);
        }
        // Ranks waiting for their turn may be waiting for this one: wake exactly those (a
        // completed round, still being left, has nobody waiting for a turn).
        for round in state.rounds.values().filter(|r| r.complete.is_none()) {
            for q in 0..self.size {
                if round.entered[q] && round.contributions[q].is_none() {
                    self.turns[q].notify_one();
                }
            }
        }
        // A waiting rank always waits in a live round: with none, nobody is waiting.
        let anyone_waiting = !state.rounds.is_empty();
        drop(state);
        if anyone_waiting {
            self.completed.notify_all();
        }
    }
}

/// The communicator of one thread rank.
pub struct ThreadComm {
    rank: usize,
    shared: Arc<Shared>,
    next_call: Cell<u64>,
    next_round: Cell<u64>,
}

impl std::fmt::Debug for ThreadComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadComm")
            .field("rank", &self.rank)
            .field("size", &self.shared.size)
            .finish_non_exhaustive()
    }
}

impl ThreadComm {
    /// Numbers this rank's next collective call.
    pub(super) fn begin(&self, kind: CollectiveKind) -> CollectiveId {
        let call = self.next_call.get();
        self.next_call.set(call + 1);
        CollectiveId { kind, call }
    }

    /// Waits on `wakeup` until `ready` holds, failing on a peer's failure or exit (as judged by
    /// `missing`, the ranks this wait needs) or at the deadline: `deadline` after the later of
    /// `entered_at` and the round's last progress (a rank entering or depositing).
    #[allow(clippy::too_many_arguments)]
    fn wait_until<'a>(
        &self,
        mut state: MutexGuard<'a, State>,
        wakeup: &Condvar,
        id: &CollectiveId,
        round_no: u64,
        entered_at: Instant,
        ready: impl Fn(&Round) -> bool,
        missing: impl Fn(&Round) -> Vec<usize>,
    ) -> Result<MutexGuard<'a, State>, CommError> {
        loop {
            let round = state
                .rounds
                .get(&round_no)
                .expect("a round stays until every rank has left it");
            if ready(round) {
                return Ok(state);
            }
            if let Some(failed_rank) = state.first_failure {
                return Err(CommError::PeerFailed {
                    rank: self.rank,
                    collective: id.clone(),
                    failed_rank,
                });
            }
            if state.num_exited > 0 {
                if let Some(exited_rank) = missing(round).into_iter().find(|&r| state.exited[r]) {
                    return Err(CommError::PeerExited {
                        rank: self.rank,
                        collective: id.clone(),
                        exited_rank,
                    });
                }
            }
            let deadline = round.last_progress.max(entered_at) + self.shared.deadline;
            let now = Instant::now();
            if now >= deadline {
                // Name the ranks that never called the collective, not those queued behind them.
                let never_entered: Vec<usize> = (0..round.entered.len())
                    .filter(|&q| !round.entered[q])
                    .collect();
                return Err(CommError::Timeout {
                    rank: self.rank,
                    collective: id.clone(),
                    waited: self.shared.deadline,
                    missing: if never_entered.is_empty() {
                        missing(round)
                    } else {
                        never_entered
                    },
                });
            }
            state = wakeup
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Deposits `payload` in the next round and returns every rank's payload (in rank order) and
    /// the order they arrived in.
    pub(super) fn exchange(
        &self,
        id: &CollectiveId,
        signature: &str,
        payload: Payload,
    ) -> Result<Arc<Exchanged>, CommError> {
        let round_no = self.next_round.get();
        self.next_round.set(round_no + 1);
        let (size, rank) = (self.shared.size, self.rank);
        let perturbation = self.shared.perturbation;

        if let Some(p) = &perturbation {
            std::thread::sleep(p.delay(rank, round_no));
        }
        let entered_at = Instant::now();
        let mut state = self.shared.lock();
        let round = state.rounds.entry(round_no).or_insert_with(|| {
            let order = perturbation.map(|p| p.arrival_order(size, round_no));
            Round::new(signature, rank, size, order, entered_at)
        });
        if round.signature != signature {
            return Err(CommError::Mismatch {
                rank,
                collective: id.clone(),
                mine: signature.to_owned(),
                other_rank: round.first_rank,
                theirs: round.signature.clone(),
            });
        }
        round.entered[rank] = true;
        round.last_progress = Instant::now();
        if let Some(&turn) = round.turn.get(rank) {
            // Deposits follow the order, so the ranks before this one have all deposited
            // exactly when `turn` ranks have.
            state = self.wait_until(
                state,
                &self.shared.turns[rank],
                id,
                round_no,
                entered_at,
                |r| r.arrival.len() >= turn,
                |r| r.order[r.arrival.len().min(turn)..turn].to_vec(),
            )?;
        }
        let round = state
            .rounds
            .get_mut(&round_no)
            .expect("a round stays until every rank has left it");
        round.contributions[rank] = Some(payload);
        round.arrival.push(rank);
        round.last_progress = Instant::now();
        if round.arrival.len() == size {
            let payloads = round
                .contributions
                .iter_mut()
                .map(|c| c.take().expect("every rank has contributed"))
                .collect();
            round.complete = Some(Arc::new(Exchanged {
                payloads,
                arrival: round.arrival.clone(),
            }));
            self.shared.completed.notify_all();
        } else if let Some(&next) = round.order.get(round.arrival.len()) {
            self.shared.turns[next].notify_one();
        }

        let mut state = self.wait_until(
            state,
            &self.shared.completed,
            id,
            round_no,
            entered_at,
            |r| r.complete.is_some(),
            Round::not_deposited,
        )?;
        let round = state
            .rounds
            .get_mut(&round_no)
            .expect("a round stays until every rank has left it");
        let exchanged = round
            .complete
            .clone()
            .expect("the wait returns once the round is complete");
        round.departed += 1;
        if round.departed == size {
            state.rounds.remove(&round_no);
        }
        Ok(exchanged)
    }
}

/// How a collective's signature names a tensor: dtype and length.
pub(super) fn describe(tensor: &Tensor) -> String {
    format!("{}[{}]", tensor.dtype(), tensor.len())
}

/// The error of a reduction (allreduce, reduce-scatter) of a dtype that is not reduced.
pub(super) fn check_reducible(
    rank: usize,
    id: &CollectiveId,
    tensor: &Tensor,
) -> Result<(), CommError> {
    match unreducible(tensor.dtype()) {
        None => Ok(()),
        Some(reason) => Err(CommError::InvalidArgument {
            rank,
            collective: id.clone(),
            reason,
        }),
    }
}

pub(super) fn downcast<T: 'static>(payload: &Payload) -> &T {
    payload
        .downcast_ref::<T>()
        .expect("matching signatures carry matching payload types")
}

/// Copies `part` into `out` starting at element `start` (both of one dtype).
pub(super) fn copy_into(out: &mut TensorData, start: usize, part: &TensorData) {
    match (out, part) {
        (TensorData::F32(o), TensorData::F32(p)) => o[start..start + p.len()].copy_from_slice(p),
        (TensorData::F64(o), TensorData::F64(p)) => o[start..start + p.len()].copy_from_slice(p),
        (TensorData::I64(o), TensorData::I64(p)) => o[start..start + p.len()].copy_from_slice(p),
        (TensorData::U8(o), TensorData::U8(p)) => o[start..start + p.len()].copy_from_slice(p),
        (TensorData::F16(o), TensorData::F16(p)) => o[start..start + p.len()].copy_from_slice(p),
        (TensorData::BF16(o), TensorData::BF16(p)) => o[start..start + p.len()].copy_from_slice(p),
        (TensorData::I32(o), TensorData::I32(p)) => o[start..start + p.len()].copy_from_slice(p),
        (TensorData::Bool(o), TensorData::Bool(p)) => o[start..start + p.len()].copy_from_slice(p),
        (TensorData::I8(o), TensorData::I8(p)) => o[start..start + p.len()].copy_from_slice(p),
        (TensorData::I16(o), TensorData::I16(p)) => o[start..start + p.len()].copy_from_slice(p),
        (TensorData::U16(o), TensorData::U16(p)) => o[start..start + p.len()].copy_from_slice(p),
        (TensorData::F8E4M3(o), TensorData::F8E4M3(p))
        | (TensorData::F8E5M2(o), TensorData::F8E5M2(p)) => {
            o[start..start + p.len()].copy_from_slice(p)
        }
        (TensorData::C64(o), TensorData::C64(p)) => o[start..start + p.len()].copy_from_slice(p),
        (TensorData::C128(o), TensorData::C128(p)) => o[start..start + p.len()].copy_from_slice(p),
        _ => unreachable!("matching signatures carry matching dtypes"),
    }
}

impl Communicator for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn barrier(&self) -> Result<(), CommError> {
        let id = self.begin(CollectiveKind::Barrier);
        self.exchange(&id, "barrier", Arc::new(())).map(drop)
    }

    fn broadcast(&self, tensor: &mut Tensor, root: usize) -> Result<(), CommError> {
        let id = self.begin(CollectiveKind::Broadcast);
        if root >= self.size() {
            return Err(CommError::InvalidArgument {
                rank: self.rank,
                collective: id,
                reason: format!("root {root} is not a rank of a world of {}", self.size()),
            });
        }
        let signature = format!("root {root}, {}", describe(tensor));
        let payload: Payload = if self.rank == root {
            Arc::new(tensor.clone())
        } else {
            Arc::new(())
        };
        let exchanged = self.exchange(&id, &signature, payload)?;
        if self.rank != root {
            *tensor = downcast::<Tensor>(&exchanged.payloads[root]).clone();
        }
        Ok(())
    }

    fn allgather(&self, tensor: &Tensor) -> Result<Vec<Tensor>, CommError> {
        let id = self.begin(CollectiveKind::Allgather);
        let exchanged = self.exchange(&id, &describe(tensor), Arc::new(tensor.clone()))?;
        Ok(exchanged
            .payloads
            .iter()
            .map(|p| downcast::<Tensor>(p).clone())
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
        let (len, size) = (tensor.len(), self.size());
        // Round 1 of an allreduce: this rank reduces its own chunk of everyone's contribution.
        let exchanged = self.exchange(&id, &signature, Arc::new(tensor.data().clone()))?;
        let contributions: Vec<&TensorData> = exchanged.payloads.iter().map(downcast).collect();
        let order = summation_order(mode, size, self.rank, &exchanged.arrival);
        let part = reduce_chunk(
            &contributions,
            chunk_range(len, size, self.rank),
            &order,
            op,
            mode,
        );
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
        let len = tensor.len();
        let size = self.size();
        let mine = Arc::new(std::mem::replace(
            tensor.data_mut(),
            TensorData::U8(Vec::new()),
        ));
        let restore = |tensor: &mut Tensor, mine: Arc<TensorData>| {
            *tensor.data_mut() = Arc::try_unwrap(mine).unwrap_or_else(|shared| (*shared).clone());
        };

        // Round 1: everyone's contribution; this rank reduces chunk `rank`.
        let part = match self.exchange(&id, &signature, mine.clone()) {
            Ok(exchanged) => {
                let contributions: Vec<&TensorData> =
                    exchanged.payloads.iter().map(downcast).collect();
                let order = summation_order(mode, size, self.rank, &exchanged.arrival);
                reduce_chunk(
                    &contributions,
                    chunk_range(len, size, self.rank),
                    &order,
                    op,
                    mode,
                )
            }
            Err(e) => {
                restore(tensor, mine);
                return Err(e);
            }
        };

        // Round 2: everyone's reduced chunk. Once it completes, no rank reads round 1 any more,
        // so this rank's own buffer is free to hold the result.
        match self.exchange(&id, &signature, Arc::new(part)) {
            Ok(exchanged) => {
                let mut out = Arc::try_unwrap(mine).unwrap_or_else(|shared| (*shared).clone());
                for (chunk, part) in exchanged.payloads.iter().enumerate() {
                    copy_into(
                        &mut out,
                        chunk_range(len, size, chunk).start,
                        downcast(part),
                    );
                }
                *tensor.data_mut() = out;
                Ok(())
            }
            Err(e) => {
                restore(tensor, mine);
                Err(e)
            }
        }
    }
}

/// What a rank thread reports when it ends.
enum Ending<R> {
    Returned(R),
    Failed(RankError),
    Panicked(String),
}

/// The message of a caught panic.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Runs `program` on `config.world_size` thread ranks and returns each rank's result, in rank
/// order.
///
/// # Errors
/// The first failure ([`LaunchError`]): a rank's error or panic, a collective that failed, or
/// ranks still running one deadline after the latest other rank ended (or past `run_timeout`).
pub fn launch_threads<R, F>(config: &LaunchConfig, program: F) -> Result<Vec<R>, LaunchError>
where
    R: Send + 'static,
    F: Fn(&ThreadComm) -> Result<R, RankError> + Send + Sync + 'static,
{
    let size = config.world_size;
    if size == 0 {
        return Err(LaunchError::EmptyWorld { world_size: size });
    }
    // Cut to a week, and so is the run limit: both are added to the clock, which an unbounded
    // duration from a library caller would overflow.
    let deadline = config.deadline.min(super::MAX_DEADLINE);
    let run_timeout = config.run_timeout.min(super::MAX_DEADLINE);
    let shared = Arc::new(Shared {
        size,
        deadline,
        perturbation: config.perturbation,
        state: Mutex::new(State {
            rounds: BTreeMap::new(),
            first_failure: None,
            exited: vec![false; size],
            num_exited: 0,
        }),
        completed: Condvar::new(),
        turns: (0..size).map(|_| Condvar::new()).collect(),
    });
    let program = Arc::new(program);
    let (sender, receiver) = mpsc::channel::<(usize, Ending<R>)>();
    let mut handles = Vec::with_capacity(size);
    for rank in 0..size {
        let (rank_shared, program, sender) = (shared.clone(), program.clone(), sender.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("rank-{rank}"))
            .spawn(move || {
                let comm = ThreadComm {
                    rank,
                    shared: rank_shared.clone(),
                    next_call: Cell::new(0),
                    next_round: Cell::new(0),
                };
                let ending = match catch_unwind(AssertUnwindSafe(|| program(&comm))) {
                    Ok(Ok(value)) => Ending::Returned(value),
                    Ok(Err(error)) => Ending::Failed(error),
                    Err(payload) => Ending::Panicked(panic_message(payload.as_ref())),
                };
                rank_shared.finish_rank(rank, !matches!(ending, Ending::Returned(_)));
                // The launcher may have given up on this run; nobody to tell then.
                let _ = sender.send((rank, ending));
            });
        match spawned {
            Ok(handle) => handles.push(Some(handle)),
            Err(e) => {
                // Release the ranks already started: they fail as if this rank had failed.
                shared.finish_rank(rank, true);
                return Err(LaunchError::Spawn {
                    rank,
                    message: e.to_string(),
                });
            }
        }
    }
    drop(sender);

    let mut endings: Vec<Option<Ending<R>>> = (0..size).map(|_| None).collect();
    let started = Instant::now();
    let mut grace: Option<Instant> = None;
    let mut pending = size;
    // What a stuck rank's wait is measured from, and how long it was.
    let mut stuck_after = ("the run started", run_timeout);
    while pending > 0 {
        let limit = grace.unwrap_or(started + run_timeout);
        let Some(wait) = limit.checked_duration_since(Instant::now()) else {
            break;
        };
        match receiver.recv_timeout(wait) {
            Ok((rank, ending)) => {
                endings[rank] = Some(ending);
                pending -= 1;
                if let Some(handle) = handles[rank].take() {
                    // The thread has sent its last message; joining only waits for it to exit.
                    let _ = handle.join();
                }
                // Measured from the latest ending, as a collective's deadline is measured from
                // its latest arrival: a world larger than the machine's cores ends a rank at a
                // time, and is stuck only when no rank has ended for a deadline.
                grace = Some(Instant::now() + deadline);
                stuck_after = ("another rank ended", deadline);
            }
            Err(_) => break,
        }
    }

    let first_failure = shared.lock().first_failure;
    if let Some(rank) = first_failure {
        if let Some(ending) = endings[rank].take() {
            return Err(match ending {
                Ending::Failed(error) => match error.downcast::<CommError>() {
                    Ok(comm) => LaunchError::Collective(*comm),
                    Err(other) => LaunchError::RankFailed {
                        rank,
                        message: other.to_string(),
                    },
                },
                Ending::Panicked(message) => LaunchError::RankPanicked { rank, message },
                Ending::Returned(_) => unreachable!("a rank that returned is not a failure"),
            });
        }
    }
    let stuck: Vec<usize> = (0..size).filter(|&r| endings[r].is_none()).collect();
    if !stuck.is_empty() {
        // Their threads are detached: dropping the handles does not wait for them.
        return Err(LaunchError::Stuck {
            ranks: stuck,
            waited: stuck_after.1,
            after: stuck_after.0,
        });
    }
    Ok(endings
        .into_iter()
        .map(|e| match e {
            Some(Ending::Returned(value)) => value,
            _ => unreachable!("every rank returned: no failure was recorded"),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::seed::derive_stream;

    fn config(n: usize) -> LaunchConfig {
        LaunchConfig::new(n).with_deadline(Duration::from_secs(10))
    }

    fn random_tensor(rank: usize, len: usize) -> Tensor {
        let mut rng = derive_stream(9, Stream::Data, rank as u64, 0);
        Tensor::from_vec((0..len).map(|_| rng.normal_f32()).collect())
    }

    fn allreduce_all(cfg: &LaunchConfig, mode: ReductionMode, len: usize) -> Vec<Vec<u32>> {
        launch_threads(cfg, move |comm| {
            let mut t = random_tensor(comm.rank(), len);
            comm.allreduce(&mut t, ReduceOp::Sum, mode)?;
            Ok(t.values::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect())
        })
        .unwrap()
    }

    #[test]
    fn a_deadline_and_run_limit_beyond_a_week_are_cut_not_overflowed() {
        // Duration::MAX added to the clock panicked before the limits were cut to a week.
        let mut cfg = LaunchConfig::new(2).with_deadline(Duration::MAX);
        cfg.run_timeout = Duration::MAX;
        let sums = allreduce_all(&cfg, ReductionMode::Ring, 8);
        assert_eq!(sums[0], sums[1]);
    }

    #[test]
    fn reduce_scatter_gives_each_rank_its_chunk_of_the_allreduce() {
        for mode in [ReductionMode::Ring, ReductionMode::Reproducible] {
            let full = allreduce_all(&LaunchConfig::new(3), mode, 100);
            let chunks = launch_threads(&LaunchConfig::new(3), move |comm| {
                let t = random_tensor(comm.rank(), 100);
                let chunk = comm.reduce_scatter(&t, ReduceOp::Sum, mode)?;
                Ok(chunk
                    .values::<f32>()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>())
            })
            .unwrap();
            let joined: Vec<u32> = chunks.concat();
            assert_eq!(
                chunks.iter().map(Vec::len).collect::<Vec<_>>(),
                [33, 33, 34]
            );
            assert_eq!(joined, full[0], "{mode}");
        }
    }

    #[test]
    fn reproducible_allreduce_ignores_arrival_order_where_arrival_order_does_not() {
        let perturbed = |rotation| {
            LaunchConfig::new(4).with_perturbation(Perturbation {
                seed: 11,
                rotation,
                max_delay: Duration::from_micros(50),
            })
        };
        let a = allreduce_all(&perturbed(0), ReductionMode::Reproducible, 512);
        let b = allreduce_all(&perturbed(1), ReductionMode::Reproducible, 512);
        assert_eq!(a, b);
        let c = allreduce_all(&perturbed(0), ReductionMode::ArrivalOrder, 512);
        let d = allreduce_all(&perturbed(1), ReductionMode::ArrivalOrder, 512);
        assert_ne!(c, d, "the control differs, so the test could fail");
    }

    #[test]
    fn allreduce_matches_a_serial_sum_in_each_schedule() {
        let (n, len) = (4, 1001);
        let inputs: Vec<Tensor> = (0..n).map(|r| random_tensor(r, len)).collect();
        let values: Vec<&[f32]> = inputs.iter().map(|t| t.values().unwrap()).collect();
        for mode in [ReductionMode::RankOrdered, ReductionMode::Ring] {
            let results = allreduce_all(&config(n), mode, len);
            assert!(
                results.iter().all(|r| r == &results[0]),
                "{mode}: ranks disagree"
            );
            for (i, &bits) in results[0].iter().enumerate() {
                let chunk = (0..n)
                    .find(|&c| chunk_range(len, n, c).contains(&i))
                    .unwrap();
                let order = summation_order(mode, n, chunk, &[]);
                let expected = order[1..]
                    .iter()
                    .fold(values[order[0]][i], |acc, &r| acc + values[r][i]);
                assert_eq!(bits, expected.to_bits(), "{mode} element {i}");
            }
        }
    }

    #[test]
    fn deterministic_modes_ignore_perturbation_and_arrival_order_does_not() {
        let perturbed = |rotation| {
            config(3).with_perturbation(Perturbation {
                seed: 5,
                rotation,
                max_delay: Duration::from_micros(200),
            })
        };
        for mode in [ReductionMode::RankOrdered, ReductionMode::Ring] {
            assert_eq!(
                allreduce_all(&perturbed(0), mode, 512),
                allreduce_all(&perturbed(1), mode, 512)
            );
        }
        let a = allreduce_all(&perturbed(0), ReductionMode::ArrivalOrder, 512);
        let b = allreduce_all(&perturbed(1), ReductionMode::ArrivalOrder, 512);
        assert!(
            a.iter().all(|r| r == &a[0]),
            "every rank still gets the same bits"
        );
        assert_ne!(a, b, "a rotated arrival order must change the sum");
        // The same perturbation reproduces the same arrival order, so the same bits.
        assert_eq!(
            a,
            allreduce_all(&perturbed(0), ReductionMode::ArrivalOrder, 512)
        );
    }

    #[test]
    fn broadcast_allgather_barrier_and_max() {
        let results = launch_threads(&config(3), |comm| {
            comm.barrier()?;
            let mut t = Tensor::from_vec(vec![comm.rank() as i64; 2]);
            comm.broadcast(&mut t, 2)?;
            let gathered = comm.allgather(&Tensor::scalar(comm.rank() as u8))?;
            let mut m = Tensor::from_vec(vec![comm.rank() as f64, -(comm.rank() as f64)]);
            comm.allreduce(&mut m, ReduceOp::Max, ReductionMode::Ring)?;
            Ok((t, gathered, m))
        })
        .unwrap();
        for (t, gathered, m) in results {
            assert_eq!(t.values::<i64>().unwrap(), [2, 2]);
            let ranks: Vec<u8> = gathered
                .iter()
                .map(|g| g.values::<u8>().unwrap()[0])
                .collect();
            assert_eq!(ranks, [0, 1, 2]);
            assert_eq!(m.values::<f64>().unwrap(), [2.0, 0.0]);
        }
    }

    #[test]
    fn broadcast_and_allgather_move_every_dtype() {
        use half::{bf16, f16};
        let tensor_of = |rank: usize| -> Vec<Tensor> {
            let r = rank as f32;
            vec![
                Tensor::from_vec(vec![f16::from_f32(r + 0.5), f16::NAN, f16::from_bits(1)]),
                Tensor::from_vec(vec![bf16::from_f32(-r), bf16::NEG_INFINITY]),
                Tensor::from_vec(vec![rank as i32 - 7, i32::MIN]),
                Tensor::from_vec(vec![rank.is_multiple_of(2), true]),
                Tensor::from_vec(vec![rank as i8 - 3, i8::MIN]),
                Tensor::from_vec(vec![rank as i16 * 300, i16::MIN]),
                Tensor::from_vec(vec![rank as u16 + 60000, 1]),
                Tensor::new(vec![2], TensorData::F8E4M3(vec![rank as u8, 0x7f])).unwrap(),
                Tensor::new(vec![2], TensorData::F8E5M2(vec![0x7c, rank as u8 | 0x80])).unwrap(),
                Tensor::from_vec(vec![[r, -r], [f32::NAN, -0.0]]),
                Tensor::from_vec(vec![[f64::from(r) * 0.1, 1.0]]),
            ]
        };
        let bits = |t: &Tensor| {
            let mut bytes = Vec::new();
            t.for_each_canonical_chunk(|c| bytes.extend_from_slice(c));
            (t.dtype(), t.shape().to_vec(), bytes)
        };
        let results = launch_threads(&config(3), move |comm| {
            let mut out = Vec::new();
            for (i, mut t) in tensor_of(comm.rank()).into_iter().enumerate() {
                let gathered = comm.allgather(&t)?;
                comm.broadcast(&mut t, i % 3)?;
                out.push((t, gathered));
            }
            Ok(out)
        })
        .unwrap();
        for per_rank in &results {
            for (i, (t, gathered)) in per_rank.iter().enumerate() {
                assert_eq!(bits(t), bits(&tensor_of(i % 3)[i]), "broadcast {i}");
                for (r, g) in gathered.iter().enumerate() {
                    assert_eq!(bits(g), bits(&tensor_of(r)[i]), "allgather {i} from {r}");
                }
            }
        }
    }

    #[test]
    fn i32_reduces_exactly_as_i64_does() {
        for mode in ReductionMode::ALL {
            let results = launch_threads(&config(3), move |comm| {
                let r = comm.rank() as i32;
                let mut sum = Tensor::from_vec(vec![i32::MAX - r, r * 1000 - 5, -r, 7]);
                comm.allreduce(&mut sum, ReduceOp::Sum, mode)?;
                let mut max = Tensor::from_vec(vec![-r, r, i32::MIN + r, 0]);
                comm.allreduce(&mut max, ReduceOp::Max, mode)?;
                let chunk =
                    comm.reduce_scatter(&Tensor::from_vec(vec![r; 5]), ReduceOp::Sum, mode)?;
                Ok((sum, max, chunk))
            })
            .unwrap();
            let first_sum = (i32::MAX)
                .wrapping_add(i32::MAX - 1)
                .wrapping_add(i32::MAX - 2);
            for (rank, (sum, max, chunk)) in results.iter().enumerate() {
                assert_eq!(
                    sum.values::<i32>().unwrap(),
                    [first_sum, 2985, -3, 21],
                    "{mode}"
                );
                assert_eq!(
                    max.values::<i32>().unwrap(),
                    [0, 2, i32::MIN + 2, 0],
                    "{mode}"
                );
                let expected = vec![3; chunk_range(5, 3, rank).len()];
                assert_eq!(chunk.values::<i32>().unwrap(), expected, "{mode}");
            }
        }
    }

    #[test]
    fn half_precision_and_bool_reductions_are_invalid_arguments() {
        use half::{bf16, f16};
        let refused = [
            Tensor::from_vec(vec![f16::ONE; 4]),
            Tensor::from_vec(vec![bf16::ONE; 4]),
            Tensor::from_vec(vec![true; 4]),
            Tensor::from_vec(vec![1i8; 4]),
            Tensor::from_vec(vec![1i16; 4]),
            Tensor::from_vec(vec![1u16; 4]),
            Tensor::new(vec![4], TensorData::F8E4M3(vec![0x38; 4])).unwrap(),
            Tensor::new(vec![4], TensorData::F8E5M2(vec![0x3c; 4])).unwrap(),
            Tensor::from_vec(vec![[1.0f32, 0.0]; 4]),
            Tensor::from_vec(vec![[1.0f64, 0.0]; 4]),
        ];
        for t in refused {
            for reduce_scatter in [false, true] {
                let t = t.clone();
                let err = launch_threads(&config(2), move |comm| {
                    let mut t = t.clone();
                    if reduce_scatter {
                        comm.reduce_scatter(&t, ReduceOp::Max, ReductionMode::Ring)?;
                    } else {
                        comm.allreduce(&mut t, ReduceOp::Sum, ReductionMode::Reproducible)?;
                    }
                    Ok(())
                })
                .unwrap_err();
                let LaunchError::Collective(CommError::InvalidArgument {
                    collective, reason, ..
                }) = &err
                else {
                    panic!("unexpected {err}");
                };
                let kind = if reduce_scatter {
                    "reduce_scatter"
                } else {
                    "allreduce"
                };
                assert_eq!(collective.to_string(), format!("{kind} #0"));
                assert!(reason.contains(" tensors are not reduced"), "{reason}");
            }
        }
    }

    #[test]
    fn a_panicking_rank_is_named_and_releases_the_others() {
        let err = launch_threads(&config(3), |comm| {
            if comm.rank() == 1 {
                panic!("planted failure");
            }
            comm.barrier()?;
            Ok(())
        })
        .unwrap_err();
        assert!(
            matches!(err, LaunchError::RankPanicked { rank: 1, .. }),
            "{err}"
        );
        assert_eq!(err.to_string(), "rank 1 panicked: planted failure");
    }

    #[test]
    fn an_erroring_rank_is_named() {
        let err = launch_threads(&config(2), |comm| {
            if comm.rank() == 0 {
                return Err("disk full".into());
            }
            comm.barrier()?;
            Ok(())
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "rank 0 failed: disk full");
    }

    #[test]
    fn a_rank_that_never_arrives_fails_the_run_at_the_deadline() {
        let cfg = LaunchConfig::new(3).with_deadline(Duration::from_millis(300));
        let started = Instant::now();
        let err = launch_threads(&cfg, |comm| {
            if comm.rank() == 2 {
                // Never joins, and never returns within the test either.
                std::thread::sleep(Duration::from_secs(30));
                return Ok(());
            }
            let mut t = Tensor::from_vec(vec![1.0f32]);
            comm.allreduce(&mut t, ReduceOp::Sum, ReductionMode::Ring)?;
            Ok(())
        })
        .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the launcher must not wait for rank 2"
        );
        match &err {
            LaunchError::Collective(CommError::Timeout {
                collective,
                missing,
                ..
            }) => {
                assert_eq!(collective.to_string(), "allreduce #0");
                assert_eq!(missing, &[2]);
            }
            other => panic!("unexpected {other}"),
        }
        assert_eq!(err.rank(), Some(2));
    }

    /// The documented maximum world size (`scenario/spec.rs`) on a perturbed step of every
    /// collective. Before a deposit woke only the next rank, every deposit woke every waiter
    /// (O(ranks²) wakeups per collective): 512 ranks took a minute per step on two cores, and
    /// 1024 missed this deadline.
    #[test]
    fn a_thousand_and_twenty_four_ranks_finish_a_perturbed_step_of_every_collective() {
        let cfg = LaunchConfig::new(1024)
            .with_deadline(Duration::from_secs(20))
            .with_perturbation(Perturbation {
                seed: 3,
                rotation: 1,
                max_delay: Duration::from_micros(100),
            });
        let results = launch_threads(&cfg, |comm| {
            let mut t = random_tensor(comm.rank(), 1024);
            let gathered = comm.allgather(&Tensor::scalar(comm.rank() as i32))?;
            comm.allreduce(&mut t, ReduceOp::Sum, ReductionMode::Ring)?;
            let mut token = Tensor::scalar(comm.rank() as i64);
            comm.broadcast(&mut token, 1023)?;
            comm.barrier()?;
            let bits: Vec<u32> = t
                .values::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            Ok((gathered.len(), token.values::<i64>().unwrap()[0], bits))
        })
        .unwrap();
        assert_eq!(results.len(), 1024);
        for (gathered, token, bits) in &results {
            assert_eq!((*gathered, *token), (1024, 1023));
            assert_eq!(bits, &results[0].2, "every rank gets the same bits");
        }
    }

    /// A world larger than the machine's cores arrives a rank at a time: the deadline counts
    /// from the collective's last arrival, so only a rank that stops the progress for a whole
    /// deadline fails the run.
    #[test]
    fn ranks_arriving_one_by_one_over_more_than_a_deadline_are_not_timed_out() {
        let cfg = LaunchConfig::new(6).with_deadline(Duration::from_secs(1));
        launch_threads(&cfg, |comm| {
            std::thread::sleep(Duration::from_millis(300) * comm.rank() as u32);
            comm.barrier()?;
            Ok(())
        })
        .unwrap();
    }

    /// Likewise a world's ranks end one by one: stuck means no rank ended for a deadline.
    #[test]
    fn ranks_ending_one_by_one_over_more_than_a_deadline_are_not_stuck() {
        let cfg = LaunchConfig::new(4).with_deadline(Duration::from_secs(1));
        launch_threads(&cfg, |comm| {
            std::thread::sleep(Duration::from_millis(400) * comm.rank() as u32);
            Ok(())
        })
        .unwrap();
    }

    #[test]
    fn a_rank_still_running_a_deadline_after_the_others_is_reported_stuck() {
        let cfg = LaunchConfig::new(2).with_deadline(Duration::from_millis(300));
        let started = Instant::now();
        let err = launch_threads(&cfg, |comm| {
            if comm.rank() == 1 {
                std::thread::sleep(Duration::from_secs(30)); // no collective to time out in
            }
            Ok(())
        })
        .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(
            err.to_string(),
            "rank(s) [1] still running 300ms after another rank ended"
        );
        assert_eq!(err.rank(), Some(1));
    }

    #[test]
    fn a_rank_that_exits_early_releases_the_waiters_at_once() {
        let err = launch_threads(&config(2), |comm| {
            if comm.rank() == 0 {
                comm.barrier()?;
            }
            Ok(())
        })
        .unwrap_err();
        assert!(
            matches!(
                err,
                LaunchError::Collective(CommError::PeerExited { exited_rank: 1, .. })
            ),
            "{err}"
        );
    }

    /// Under a perturbation ranks wait for their turn on their own condvar: a rank that exits
    /// before its turn must still wake those queued behind it, at once, not at the deadline.
    #[test]
    fn a_rank_that_exits_before_its_turn_releases_the_ranks_queued_behind_it() {
        let perturbation = Perturbation {
            seed: 8,
            rotation: 0,
            max_delay: Duration::from_micros(10),
        };
        let first = perturbation.arrival_order(4, 0)[0];
        let cfg = config(4)
            .with_deadline(Duration::from_secs(20))
            .with_perturbation(perturbation);
        let started = Instant::now();
        let err = launch_threads(&cfg, move |comm| {
            if comm.rank() == first {
                // Exits once the others are queued for their turns behind it.
                std::thread::sleep(Duration::from_millis(300));
            } else {
                comm.barrier()?;
            }
            Ok(())
        })
        .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "released at once"
        );
        assert!(
            matches!(err, LaunchError::Collective(CommError::PeerExited { exited_rank, .. }) if exited_rank == first),
            "{err}"
        );
    }

    #[test]
    fn mismatched_collectives_are_reported() {
        let err = launch_threads(&config(2), |comm| {
            let mut t = Tensor::from_vec(vec![0.0f32; 1 + comm.rank()]);
            comm.allreduce(&mut t, ReduceOp::Sum, ReductionMode::Ring)?;
            Ok(())
        })
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("allreduce #0") && text.contains("f32[1]"),
            "{text}"
        );
        assert!(matches!(
            err,
            LaunchError::Collective(CommError::Mismatch { .. })
        ));
    }

    #[test]
    fn bad_arguments_are_errors_not_panics() {
        assert!(matches!(
            launch_threads(&config(0), |_| Ok(())),
            Err(LaunchError::EmptyWorld { .. })
        ));
        let err = launch_threads(&config(2), |comm| {
            let mut t = Tensor::scalar(1.0f32);
            comm.broadcast(&mut t, 5)?;
            Ok(())
        })
        .unwrap_err();
        assert!(err.to_string().contains("root 5 is not a rank"), "{err}");
    }
}
