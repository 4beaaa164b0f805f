//! The first differing element of a check's divergence: the two runs are run again, each
//! capturing only the divergent record's tensor (`crate::launch::capture`), and the captured
//! tensors are compared element by element.
//!
//! A check's traces hold digests and statistics, not tensors; recording every tensor of every
//! step to name one element would cost what a full dump costs. A re-run costs one run per side
//! and keeps one tensor. It is only trusted when it reproduces: each captured tensor's md5 must
//! equal the digest its side recorded in the check. When it does not, the finding says so
//! plainly (the divergence itself depends on timing) and names no element. Such a divergence
//! shows in some launches only, so up to [`RERUN_PAIRS`] pairs of re-runs are made until one
//! differs at the record with every record before it equal (`rerun_until_they_differ`); when
//! none does and the module draws at random, the finding names that draw
//! (`OperatorFinding::RandomNotReproduced`: the checked runs show the record differing after
//! equal records, the re-runs' operator trace shows the draw; nothing is named without both).
//!
//! Invariant (a diagnosis re-runs, never guesses): the element and the operator of a check's
//! divergence come from re-runs of both sides capturing that record (the same request, so the same
//! `PYTHONHASHSEED`, start order and `MASTER_PORT`); an element is the checked runs' only when both
//! re-runs reproduce their digests, otherwise it is named as between the re-runs. The operator
//! finding is a pure function of the two operator traces (`diagnose/operator.rs`).
//!
//! Determinism: a re-run is the same request as the run it repeats (same spec, perturbation and
//! plan), with a capture added; what it captures is a function of the program.

use super::operator::{find_operator, random_operator};
use crate::compare::put_together;
use crate::compare::{
    compare_traces, traced_window, Divergence, ElementFinding, NoElementDetail, OperatorFinding,
    RecordSummary, TraceView,
};
use crate::file::reader::load_trace;
use crate::launch::capture::read_capture;
use crate::launch::Capture;
use crate::record::{RankTrace, Trace};
use crate::run::RunError;
use crate::value::digest::Md5Digest;
use crate::value::tensor::Tensor;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Runs one side of a comparison again with a capture (the folder the captured tensor goes to).
pub(crate) type Rerun<'a> = Box<dyn Fn(&Capture, &Path) -> Result<Trace, RunError> + 'a>;

/// One side of a check's comparison: how to run it again, and which rank's record it is.
pub(crate) struct Side<'a> {
    /// Runs the side again.
    pub(crate) rerun: Rerun<'a>,
    /// The rank whose record this side is (the divergence's rank, or rank 0 for the left side
    /// of `replicas` and both sides of `world_sizes`).
    pub(crate) rank: u32,
    /// The side's name in reports (`run 1`, `threads`...).
    pub(crate) label: &'static str,
}

/// A folder for one capture, removed when dropped.
struct CaptureFolder(PathBuf);

impl CaptureFolder {
    fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("detcheck-capture-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        CaptureFolder(dir)
    }
}

impl Drop for CaptureFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Which record of its name in its step the divergence's left record is (the engine pairs the
/// k-th record of a name on one side with the k-th on the other).
fn occurrence(trace: &Trace, rank: u32, d: &Divergence) -> u32 {
    trace.ranks.get(rank as usize).map_or(0, |r| {
        r.records
            .iter()
            .filter(|rec| rec.step == d.step && rec.name == d.name && rec.seq < d.seq)
            .count() as u32
    })
}

/// What one side's re-run kept: the captured tensor, or why not, and its operator trace.
struct Kept {
    tensor: Result<Tensor, String>,
    /// The operator trace of a `detcheck.torch.watch` record (`None`: the program traced
    /// none), or why it cannot be read.
    operators: Result<Option<RankTrace>, String>,
    /// The re-run reproduced the digest its side recorded in the check.
    reproduced: bool,
    /// What the re-run recorded (`None`: it failed).
    trace: Option<Trace>,
}

/// Runs `side` again capturing `capture` (and, for a record of `detcheck.torch.watch`, the
/// operators of its module) and reads what it kept.
fn rerun(side: &Side<'_>, capture: &Capture, recorded: &str) -> Kept {
    let folder = CaptureFolder::new();
    let ran = (side.rerun)(capture, &folder.0)
        .map_err(|e| format!("the re-run of {} failed: {e}", side.label));
    let tensor = ran
        .clone()
        .and_then(|_| match read_capture(&folder.0, side.rank) {
            Ok(Some(t)) => Ok(t),
            Ok(None) => Err(format!(
                "the re-run of {} wrote no capture of the record (it did not record it \
                 again, or its writer predates captures)",
                side.label
            )),
            Err(e) => Err(e.to_string()),
        });
    let operators = ran
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|_| read_operators(&folder.0, side.label));
    let reproduced = tensor
        .as_ref()
        .is_ok_and(|t| Md5Digest::of_tensor(t).to_string() == recorded);
    Kept {
        tensor,
        operators,
        reproduced,
        trace: ran.ok(),
    }
}

/// The `torch.compile`d part of a run's model, as its recorder noted it (`site:compiled`, on
/// any rank).
fn compiled_part(trace: &Trace) -> Option<String> {
    trace.ranks.iter().find_map(|r| {
        r.environment
            .as_ref()?
            .get("site:compiled")
            .map(str::to_owned)
    })
}

/// The operator trace a re-run's tracer wrote into its capture folder (a world of one rank in
/// `ops/`: see `crate::diagnose::find_operator`); `None` when it wrote none (a program that
/// does not use `detcheck.torch.watch`).
fn read_operators(dir: &Path, label: &str) -> Result<Option<RankTrace>, String> {
    let ops = dir.join("ops");
    if !ops.exists() {
        return Ok(None);
    }
    let mut trace = load_trace(&ops, 1)
        .map_err(|e| format!("the operator trace of the re-run of {label}: {e}"))?;
    Ok(Some(trace.ranks.remove(0)))
}

/// Runs both sides again capturing the divergent record, and compares what they captured: the
/// first differing element, and for a record of `detcheck.torch.watch` the first operator whose
/// output differs. `left_trace` is the left side's trace from the check (it numbers the
/// occurrence).
pub(crate) fn find(
    d: &Divergence,
    left_trace: &Trace,
    left: &Side<'_>,
    right: &Side<'_>,
) -> (ElementFinding, Option<OperatorFinding>) {
    let unavailable =
        |reason: String| ElementFinding::Unavailable(NoElementDetail::NotCaptured { reason });
    let k = occurrence(left_trace, left.rank, d);
    let window = traced_window(&d.name);
    let recorded = |side: &Side<'_>, record: &Option<RecordSummary>| {
        record
            .as_ref()
            .and_then(|r| r.digest.clone())
            .ok_or_else(|| format!("{} has no record there", side.label))
    };
    let (left_digest, right_digest) = match (recorded(left, &d.left), recorded(right, &d.right)) {
        (Ok(l), Ok(r)) => (l, r),
        (Err(reason), _) | (_, Err(reason)) => return (unavailable(reason), None),
    };
    let capture = |side: &Side<'_>| Capture {
        rank: side.rank,
        step: d.step,
        name: d.name.clone(),
        occurrence: k,
    };
    let (a, b) = rerun_until_they_differ(d, k, left.rank == right.rank, || {
        (
            rerun(left, &capture(left), &left_digest),
            rerun(right, &capture(right), &right_digest),
        )
    });
    let diverged = shows_the_divergence(d, k, left.rank == right.rank, &a, &b);
    let operator = window.and_then(|window| match (&a.operators, &b.operators) {
        // Re-runs that captured equal tensors, or parted at an earlier record, show no divergence
        // of it: "no operator differs" would read as "the value changed outside the operators".
        // A random operator among its calls is the module's one draw on more than its inputs.
        (Ok(Some(left_ops)), Ok(Some(_))) if !diverged => Some(
            random_operator(left_ops, window, RERUN_PAIRS).unwrap_or_else(|| {
                OperatorFinding::Unavailable {
                    reason: format!(
                        "the re-runs did not diverge at this record ({RERUN_PAIRS} pairs of \
                         re-runs gave equal values there): the divergence depends on timing or \
                         on something that changes every run, and no re-run showed it"
                    ),
                }
            }),
        ),
        (Ok(Some(left_ops)), Ok(Some(right_ops))) => {
            let mut finding = find_operator(left_ops, right_ops, window);
            // A re-run's operator trace holds no `site:compiled` of its own: the check's run
            // says whether the model is compiled, so the finding never contradicts the cause.
            if let OperatorFinding::NoOperatorDiffers { compiled, .. } = &mut finding {
                if compiled.is_none() {
                    *compiled = compiled_part(left_trace);
                }
            }
            Some(finding)
        }
        (Ok(None), Ok(None)) => None,
        (Err(reason), _) | (_, Err(reason)) => Some(OperatorFinding::Unavailable {
            reason: reason.clone(),
        }),
        (Ok(None), _) | (_, Ok(None)) => Some(OperatorFinding::Unavailable {
            reason: "only one re-run traced the module's operators (the module did not run \
                     there at that step)"
                .to_owned(),
        }),
    });
    let element = match (&a.tensor, &b.tensor) {
        (Err(reason), _) | (_, Err(reason)) => unavailable(reason.clone()),
        (Ok(ta), Ok(tb)) => judge(ta, tb, (a.reproduced, b.reproduced), (left, right)),
    };
    (element, operator)
}

/// At most this many pairs of re-runs look for a divergence that does not reproduce.
const RERUN_PAIRS: u32 = 4;

/// Runs a pair of re-runs (`pair`) again while they did not reproduce their sides' digests and
/// do not show the divergence at the record, at most [`RERUN_PAIRS`] times: a divergence that
/// depends on timing (a race in a random operator) shows in some launches only, and one pair
/// that happened to agree there, or parted at an earlier record than the checked runs did,
/// would name no operator, or a wrong one ("its input came from outside"). A pair that
/// reproduced, failed, or parts at the record is kept at once, so a reproducible divergence
/// costs one pair as before. `same_rank`: both sides are one rank of two runs (`repeat` and
/// its kin), whose re-runs are compared by the engine to find where they parted.
fn rerun_until_they_differ(
    d: &Divergence,
    occurrence: u32,
    same_rank: bool,
    mut pair: impl FnMut() -> (Kept, Kept),
) -> (Kept, Kept) {
    let mut kept = pair();
    for _ in 1..RERUN_PAIRS {
        if shows_the_divergence(d, occurrence, same_rank, &kept.0, &kept.1) {
            break;
        }
        kept = pair();
    }
    kept
}

/// Whether a pair of re-runs is evidence about the record `d`: both reproduced their sides, or
/// what they captured differs (or could not be compared) while their records before `d` are
/// equal (the engine's first divergence between the two re-runs is `d`'s record or later;
/// `occurrence`: which record of its name in its step `d` is).
fn shows_the_divergence(
    d: &Divergence,
    occurrence: u32,
    same_rank: bool,
    a: &Kept,
    b: &Kept,
) -> bool {
    if a.reproduced && b.reproduced {
        return true;
    }
    let differ = match (&a.tensor, &b.tensor) {
        (Ok(ta), Ok(tb)) => ElementFinding::between(ta, tb).is_some(),
        _ => return true,
    };
    let parted_before = match (&a.trace, &b.trace) {
        (Some(ta), Some(tb)) if same_rank => {
            // The record's place in the re-run (a re-run may number its records otherwise
            // than the checked run: it records what it captures too).
            let here = ta.ranks.get(d.rank as usize).and_then(|r| {
                r.records
                    .iter()
                    .filter(|rec| rec.step == d.step && rec.name == d.name)
                    .nth(occurrence as usize)
                    .map(|rec| rec.seq)
            });
            compare_traces(ta, tb, TraceView::All)
                .first
                .is_some_and(|f| {
                    f.step < d.step
                        || (f.step == d.step
                            && f.rank == d.rank
                            && here.is_some_and(|seq| f.seq < seq))
                })
        }
        _ => false,
    };
    differ && !parted_before
}

/// The element of two captured tensors, trusted as the checked runs' when both re-runs
/// reproduced their sides' digests (`reproduced`).
fn judge(
    ta: &Tensor,
    tb: &Tensor,
    (a, b): (bool, bool),
    (left, right): (&Side<'_>, &Side<'_>),
) -> ElementFinding {
    match ElementFinding::between(ta, tb) {
        // Both re-runs reproduced their sides: the element of the checked runs.
        Some(ElementFinding::Found(e)) if a && b => ElementFinding::Found(e),
        // They did not, but still differ from each other: the divergence changes from
        // launch to launch, and the re-runs show one instance of it.
        Some(ElementFinding::Found(e)) => ElementFinding::FoundInReruns(e),
        Some(other) => other,
        None => ElementFinding::Unavailable(NoElementDetail::NotReproduced {
            side: if a {
                right.label.to_owned()
            } else {
                left.label.to_owned()
            },
        }),
    }
}

/// The first differing element of a sharded record's global tensors (`world_sizes`): each
/// side is run again once per rank (`sides`, one per rank of its world), capturing that rank's
/// shard, and the shards are put together by the placements the re-runs recorded
/// (`compare::shards`). Trusted when each side's captured shards add up to the position digest
/// the check recorded.
pub(crate) fn find_sharded(
    d: &Divergence,
    left_trace: &Trace,
    left: &[Side<'_>],
    right: &[Side<'_>],
) -> ElementFinding {
    let k = occurrence(left_trace, d.rank, d);
    let global = |sides: &[Side<'_>]| -> Result<(Tensor, String), String> {
        let mut parts = Vec::with_capacity(sides.len());
        for side in sides {
            let folder = CaptureFolder::new();
            let capture = Capture {
                rank: side.rank,
                step: d.step,
                name: d.name.clone(),
                occurrence: k,
            };
            let trace = (side.rerun)(&capture, &folder.0)
                .map_err(|e| format!("the re-run of {} failed: {e}", side.label))?;
            let tensor = read_capture(&folder.0, side.rank)
                .map_err(|e| e.to_string())?
                .ok_or_else(|| {
                    format!(
                        "the re-run of {} wrote no capture of rank {}'s shard",
                        side.label, side.rank
                    )
                })?;
            let shard = trace
                .ranks
                .get(side.rank as usize)
                .and_then(|r| {
                    r.records
                        .iter()
                        .filter(|x| x.step == d.step && x.name == d.name)
                        .nth(k as usize)
                })
                .and_then(|x| x.shard.clone())
                .ok_or_else(|| {
                    format!(
                        "the re-run of {} recorded no shard of rank {}",
                        side.label, side.rank
                    )
                })?;
            parts.push((tensor, shard));
        }
        put_together(&parts)
    };
    let (Some(l), Some(r)) = (left.first(), right.first()) else {
        return ElementFinding::Unavailable(NoElementDetail::NotCaptured {
            reason: "no rank to re-run".into(),
        });
    };
    let recorded =
        |summary: &Option<RecordSummary>| summary.as_ref().and_then(|s| s.digest.clone());
    match (global(left), global(right)) {
        (Err(reason), _) | (_, Err(reason)) => {
            ElementFinding::Unavailable(NoElementDetail::NotCaptured { reason })
        }
        (Ok((ta, da)), Ok((tb, db))) => judge(
            &ta,
            &tb,
            (
                recorded(&d.left) == Some(da),
                recorded(&d.right) == Some(db),
            ),
            (l, r),
        ),
    }
}
