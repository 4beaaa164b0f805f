//! The `world_sizes` check: rank 0's replicated records at each of the spec's world sizes (those
//! the runner can launch), compared with the smallest size's.
//!
//! Main type: [`WorldSizes`], its unit. Its runs are run 1 of the scenario resized to each size
//! (`series.rs`); its drill-down re-runs the first differing pair of sizes, every rank of each
//! for a global tensor's shards (`element::find_sharded`), rank 0 otherwise.
//!
//! Determinism: each size's run is run 1 of the resized scenario (its perturbation), so the
//! outcome is a function of the scenario. Limits: only the sizes the runner can launch are
//! compared (a note says `no world sizes fits` when none is), and only rank 0's records that both
//! sizes hold alike (marked replicated, or equal on every rank: a tensor-parallel layer's output
//! after its all-reduce; `held_alike_at_both`): what every world size must agree on.

use super::series::compare_series;
use super::{run_of, CheckUnit, Compared, Drill, Pair, Runs};
use crate::compare::{compare_traces, is_evidence, is_sharded, Divergence, TraceView};
use crate::diagnose::element::Side;
use crate::record::{Record, Trace};
use crate::run::{perturbation, runner_for, RunError, RunRequest};
use crate::scenario::{LoadedScenario, RunPlan};
use crate::value::{DType, Md5Digest};
use std::collections::{BTreeMap, BTreeSet};

/// The `world_sizes` check's unit.
pub(super) struct WorldSizes;

/// The scenario resized to `size` ranks.
fn resized(scenario: &LoadedScenario, size: usize) -> LoadedScenario {
    let mut resized = scenario.clone();
    resized.spec.world_size = size;
    resized
}

impl CheckUnit for WorldSizes {
    fn sides(&self) -> (&'static str, &'static str) {
        ("smallest", "larger")
    }

    /// The scenario at each of its `world_sizes` (those the runner can launch), rank 0's
    /// replicated records compared with the smallest size's.
    fn compare(&self, runs: &Runs<'_>) -> Result<Compared, RunError> {
        let (runner, scenario, options) = (runs.runner, runs.scenario, runs.options);
        let mut sizes = scenario.spec.world_sizes.clone();
        sizes.sort_unstable();
        sizes.dedup();
        sizes.retain(|&w| runner.max_world_size().is_none_or(|max| w <= max));
        let run_at = |world_size: usize| run_of(runner, &resized(scenario, world_size), options, 1);
        compare_series(
            &sizes,
            run_at,
            |a, b| {
                let (a, b, counts) = held_alike_at_both(a, b);
                let mut c = compare_traces(&a, &b, TraceView::RankZeroReplicated);
                let (small, large) = (
                    a.world_size().min(b.world_size()),
                    a.world_size().max(b.world_size()),
                );
                if counts.found > 0 {
                    c.notes.push(format!(
                        "{} record(s) that nothing marks replicated held alike by every rank at \
                         world size {large} (such as a tensor-parallel layer's output after \
                         its all-reduce), compared as replicated",
                        counts.found
                    ));
                }
                if counts.left_out > 0 {
                    c.notes.push(format!(
                        "{} record(s) replicated at world size {small} that the ranks of world \
                         size {large} do not hold alike (a tensor-parallel layer's parameter \
                         shards), not compared",
                        counts.left_out
                    ));
                }
                c
            },
            |a, b| format!("world size {a} (smallest) vs {b} (larger)"),
            |w| format!("world size {w}"),
            "world sizes",
        )
    }

    fn drill_down<'a>(
        &self,
        runs: &Runs<'a>,
        d: &Divergence,
        pair: Option<&'a Pair>,
    ) -> Option<Drill<'a>> {
        let (left_label, right_label) = self.sides();
        let (a, b, base) = pair?;
        let scenario = runs.scenario;
        if is_sharded(base, d) {
            // A global tensor: every rank of each side is run again for its shard.
            let sides = |size: usize, label| -> Vec<Side<'a>> {
                (0..size as u32)
                    .map(|r| {
                        runs.owned_side(resized(scenario, size), 1, RunPlan::default(), r, label)
                    })
                    .collect()
            };
            return Some(Drill::Sharded {
                left: sides(*a, left_label),
                right: sides(*b, right_label),
                base,
            });
        }
        Some(Drill::Pair {
            left: runs.owned_side(resized(scenario, *a), 1, RunPlan::default(), 0, left_label),
            right: runs.owned_side(resized(scenario, *b), 1, RunPlan::default(), 0, right_label),
            left_trace: base,
        })
    }
}

/// The two traces with `replicated` set on rank 0's records that both sizes hold alike, and what
/// that changed ([`Counts`]).
///
/// A record is held alike in a trace when its recorder marked it replicated (a data-parallel
/// wrapper's gradients and parameters, a replicated DTensor), when every rank of a world of more
/// than one holds it with equal bits (a tensor-parallel layer's output after its all-reduce:
/// nothing marks it, every rank holds it), or, in a world of one, always (one rank holds
/// everything alike, trivially). Only what both worlds hold alike is compared: a hand-written
/// tensor-parallel layer's parameter shards are not compared against the whole parameters of
/// the world of one, where they would be records "only in" one run, not differences of values.
/// Held alike is decided per (step, name, occurrence of the name in the step), with equal
/// digests, dtypes and shapes on every rank; shards (a global tensor's) are compared as they
/// are, never by this rule, and records of evidence (generator and loader states:
/// [`is_evidence`]), whose values follow the world size on purpose, are never held alike by it.
fn held_alike_at_both(a: &Trace, b: &Trace) -> (Trace, Trace, Counts) {
    let (alike_a, alike_b) = (held_alike(a), held_alike(b));
    let mut counts = Counts::default();
    let mut mark = |t: &Trace| {
        let mut out = t.clone();
        let larger = t.world_size() == a.world_size().max(b.world_size());
        if let Some(rank0) = out.ranks.first_mut() {
            for (key, record) in keyed(&mut rank0.records) {
                if record.shard.is_some() {
                    continue;
                }
                let both = alike_a.contains(&key) && alike_b.contains(&key);
                if larger && both && !record.replicated {
                    counts.found += 1;
                }
                if !larger && record.replicated && !both {
                    counts.left_out += 1;
                }
                record.replicated = both;
            }
        }
        out
    };
    let (a, b) = (mark(a), mark(b));
    (a, b, counts)
}

/// What [`held_alike_at_both`] changed: records of the larger world that nothing marked
/// replicated, compared because every rank held them alike; records of the smaller world marked
/// replicated that the larger does not hold alike, not compared.
#[derive(Default)]
struct Counts {
    found: usize,
    left_out: usize,
}

/// Each record's value (digest, dtype, shape) by its [`Key`].
fn values(records: &[Record]) -> BTreeMap<Key, (&Md5Digest, DType, &[usize])> {
    let mut seen = BTreeMap::new();
    records
        .iter()
        .map(|r| (key_of(&mut seen, r), (&r.md5, r.dtype, r.shape.as_slice())))
        .collect()
}

/// A record's place: (step, name, how many records of that name came before it in the step).
type Key = (u64, String, usize);

/// `r`'s [`Key`], `seen` counting the names met so far.
fn key_of(seen: &mut BTreeMap<(u64, String), usize>, r: &Record) -> Key {
    let n = seen.entry((r.step, r.name.clone())).or_insert(0);
    *n += 1;
    (r.step, r.name.clone(), *n - 1)
}

/// Each of `records` with its [`Key`].
fn keyed(records: &mut [Record]) -> impl Iterator<Item = (Key, &mut Record)> {
    let mut seen = BTreeMap::new();
    records.iter_mut().map(move |r| (key_of(&mut seen, r), r))
}

/// The keys of rank 0's records that `t` holds alike ([`held_alike_at_both`]).
fn held_alike(t: &Trace) -> BTreeSet<Key> {
    let Some((rank0, others)) = t.ranks.split_first() else {
        return BTreeSet::new();
    };
    let others: Vec<_> = others.iter().map(|r| values(&r.records)).collect();
    let mut seen = BTreeMap::new();
    rank0
        .records
        .iter()
        .map(|r| (key_of(&mut seen, r), r))
        .filter(|(key, r)| {
            let value = (&r.md5, r.dtype, r.shape.as_slice());
            r.replicated
                || (r.shard.is_none()
                    && !is_evidence(&r.name)
                    && others.iter().all(|o| o.get(key) == Some(&value)))
        })
        .map(|(key, _)| key)
        .collect()
}

impl<'a> Runs<'a> {
    /// As [`Runs::side`], for a scenario of its own (a resized one): the side owns it.
    fn owned_side(
        &self,
        scenario: LoadedScenario,
        run: usize,
        plan: RunPlan,
        rank: u32,
        label: &'static str,
    ) -> Side<'a> {
        let (runner, options) = (self.runner, self.options);
        let p = Some(perturbation(scenario.spec.seed, run, options));
        Side {
            rerun: Box::new(move |capture, dir| {
                let request =
                    RunRequest::new(&scenario, options, p, run, &plan).with_capture(capture, dir);
                runner_for(&scenario, runner)?.run(&scenario, &request)
            }),
            rank,
            label,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{RecordLevel, Recorder};
    use crate::value::Tensor;

    /// A trace of `world` ranks, each recording what `records(rank)` gives:
    /// (name, values, replicated).
    fn trace(world: u32, records: impl Fn(u32) -> Vec<(&'static str, Vec<f32>, bool)>) -> Trace {
        Trace {
            ranks: (0..world)
                .map(|rank| {
                    let mut r = Recorder::new(rank, RecordLevel::Digest);
                    for (name, values, replicated) in records(rank) {
                        let t = Tensor::from_vec(values);
                        if replicated {
                            r.record_replicated(0, name, &t);
                        } else {
                            r.record(0, name, &t);
                        }
                    }
                    r.finish()
                })
                .collect(),
        }
    }

    #[test]
    fn what_every_rank_holds_alike_is_compared_and_shards_and_evidence_are_not() {
        // One rank: a world of one holds its parameter replicated.
        let one = trace(1, |_| {
            vec![
                ("param/w", vec![1.0, 2.0], true),
                ("fwd/out", vec![3.0], false),
                ("rng/torch", vec![4.0], false),
            ]
        });
        // Two ranks: the parameter is a shard (each rank's own), the output after the
        // all-reduce is held alike, the generator's state too (evidence: never by this rule).
        let two = trace(2, |rank| {
            vec![
                ("param/w", vec![1.0 + rank as f32], false),
                ("fwd/out", vec![3.0], false),
                ("rng/torch", vec![4.0], false),
            ]
        });
        let (a, b, counts) = held_alike_at_both(&one, &two);
        let replicated = |t: &Trace| -> Vec<(String, bool)> {
            t.ranks[0]
                .records
                .iter()
                .map(|r| (r.name.clone(), r.replicated))
                .collect()
        };
        let expected = vec![
            ("param/w".to_owned(), false),
            ("fwd/out".to_owned(), true),
            ("rng/torch".to_owned(), false),
        ];
        assert_eq!(replicated(&a), expected);
        assert_eq!(replicated(&b), expected);
        assert_eq!((counts.found, counts.left_out), (1, 1));
        // Ranks that hold the output differently: nothing is compared.
        let apart = trace(2, |rank| vec![("fwd/out", vec![rank as f32], false)]);
        let (_, b, counts) = held_alike_at_both(&one, &apart);
        assert!(!b.ranks[0].records[0].replicated);
        assert_eq!(counts.found, 0);
    }
}
