//! A series of runs compared with its first: what `world_sizes`, `workers`, `buckets` and
//! `batch_sizes` check (one run per value of the series), and the first differing pair that
//! `variants` keeps too.
//!
//! Main function: [`compare_series`], which runs the scenario once per value and compares each
//! run with the first's, and returns a [`Compared`]: the totals over the series, the first
//! differing pair's comparison kept whole (its first divergence and map) with the two runs'
//! curves, and a note naming that pair (or the whole series when none differs).
//!
//! Determinism: every run of a series is run 1 (its perturbation) of the scenario at that value,
//! so the outcome is a function of the scenario; the runs are made in the order of the series.
//! Limits: the runs are made one after the other, and the first value's trace is held while the
//! others run.

use super::{curves_of, Compared};
use crate::compare::curves::Curve;
use crate::compare::Comparison;
use crate::record::Trace;
use crate::run::RunError;

/// The first pair of a series that differs: its comparison, which value of the series (or
/// variant) it was, and the two runs' curves.
pub(super) type FirstDiffering = (Comparison, usize, Option<(Curve, Curve)>);

/// Runs the scenario once per value of a series (world sizes, worker counts, batch sizes) under
/// run 1's perturbation and compares each run with the first: the total, and a note naming the
/// first pair that differs (`describe(first, other)`), or the whole series when none does, and
/// every pair's notes (each once, in the order of the series). The
/// first differing pair's comparison is kept whole (its first divergence and map), with the two
/// runs' curves (labelled `label(value)`).
pub(super) fn compare_series(
    values: &[usize],
    run_at: impl Fn(usize) -> Result<Trace, RunError>,
    compare: impl Fn(&Trace, &Trace) -> Comparison,
    describe: impl Fn(usize, usize) -> String,
    label: impl Fn(usize) -> String,
    series: &str,
) -> Result<Compared, RunError> {
    let Some((&first, others)) = values.split_first() else {
        return Ok(Compared {
            note: Some(format!("no {series} fits")),
            ..Compared::nothing()
        });
    };
    let base = run_at(first)?;
    let mut found: Option<FirstDiffering> = None;
    let (mut num_compared, mut num_differing) = (0, 0);
    let mut notes: Vec<String> = Vec::new();
    for &value in others {
        let other = run_at(value)?;
        let c = compare(&base, &other);
        num_compared += c.num_compared;
        num_differing += c.num_differing;
        for note in &c.notes {
            if !notes.contains(note) {
                notes.push(note.clone());
            }
        }
        if found.is_none() && !c.is_identical() {
            let curves = curves_of(&base, &other, (&label(first), &label(value)));
            found = Some((c, value, curves));
        }
    }
    let differing = found
        .as_ref()
        .map(|(_, value, _)| (first, *value, base.clone()));
    let (mut comparison, note, curves) = match found {
        Some((c, value, curves)) => (c, describe(first, value), curves),
        None => (Comparison::empty(), format!("{series} {values:?}"), None),
    };
    comparison.num_compared = num_compared;
    comparison.num_differing = num_differing;
    comparison.notes = notes;
    Ok(Compared {
        comparison,
        skipped: None,
        note: Some(note),
        curves,
        differing,
    })
}
