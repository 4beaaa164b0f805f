//! The `batch_sizes` check: a `command` program run at each of the spec's batch sizes, every
//! sample's records compared with the first size's (batch invariance of an unmodified program).
//!
//! Main type: [`BatchSizes`], its unit. Its runs are run 1 with each batch size
//! (`RunPlan::batch_size`, `series.rs`): the size is `{batch}` in the program's arguments and in
//! `params.env`, and the launch asks its recorder for each sample's rows (`DETCHECK_RECORD=rows`,
//! `launch/mod.rs`): every module output's row of a sample is that sample's record, at step = the
//! sample's place in the stream of samples the program feeds its model. So a record's step is a
//! sample, not an optimizer step, and every size's run is compared with the first size's, record
//! by record, by the one comparison engine (`compare_traces`, every record).
//!
//! Determinism: each size's run is run 1 (its perturbation) at that size, so the outcome is a
//! function of the scenario and of the program's arithmetic at each batch size. The first size
//! is the base; the runs are made in the order of `batch_sizes`.
//!
//! The operator: when the first divergence is a module output (`fwd/*`), both sizes run once
//! more, each recording the sample's rows of every operator that reads the batch inside that
//! call of the module (`RunPlan::rows_inside`, `DETCHECK_ROWS_INSIDE`), and the first operator
//! whose rows differ is the divergence's operator finding (`OperatorFinding::BatchVariant`, with
//! both sizes' input shapes and the program's line): every operator before it gave equal rows.
//! The sizes' operators are paired by name in order ([`pair_calls`]: one a size runs alone is
//! skipped and listed), and the finding says where the sample sat in each batch (`SampleRows`).
//!
//! Limits: there is no drill-down to the first differing element (a re-run's capture takes a
//! record's whole tensor, not a sample's row): a divergence names its sample, record and
//! operator, and says that its runs are not re-run for the element. What a sample is,
//! and which outputs have one row per sample, is the recorder's (the Python package's); a program
//! that writes its own traces records whatever it writes.

use super::series::compare_series;
use super::{run_planned, CheckUnit, Compared, Drill, Pair, Runs};
use crate::compare::{compare_traces, operator_call, window_input_index, Difference, Divergence};
use crate::compare::{InputSource, OperatorCall, OperatorFinding, SampleRows, TraceView};
use crate::record::{RankTrace, Trace};
use crate::run::RunError;
use crate::scenario::RunPlan;
use crate::value::digest::Md5Digest;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

/// The `batch_sizes` check's unit.
pub(super) struct BatchSizes;

/// Why the check is n/a when a size's run wrote no samples.
const NO_SAMPLES: &str = "the program's recorder wrote no samples (no `detcheck.rows` in its \
     traces: MindSpore's recorder has no rows yet, and a program that records itself records \
     what it writes): nothing to compare sample by sample";

/// Whether a run's traces hold samples: a rank's recorder said so (`launch::ROWS_KEY`).
fn holds_samples(trace: &Trace) -> bool {
    trace.ranks.iter().any(|r| {
        r.environment
            .as_ref()
            .and_then(|e| e.get(crate::launch::ROWS_KEY))
            .is_some()
    })
}

/// The plan of a run at batch size `batch`, recording each sample's rows.
pub(super) fn batch_plan(batch: usize) -> RunPlan {
    RunPlan {
        batch_size: Some(batch),
        ..RunPlan::default()
    }
}

impl CheckUnit for BatchSizes {
    fn sides(&self) -> (&'static str, &'static str) {
        ("first", "other")
    }

    /// The program at each of its `batch_sizes`, every sample's records compared with the first
    /// size's.
    fn compare(&self, runs: &Runs<'_>) -> Result<Compared, RunError> {
        let (runner, scenario, options) = (runs.runner, runs.scenario, runs.options);
        // Run 1 is the first size's run when this is the only check (`first_plan`).
        let without_samples = Cell::new(false);
        let run_at = |batch: usize| {
            let plan = batch_plan(batch);
            let trace = if plan == runs.first_plan {
                runs.first.clone()
            } else {
                run_planned(runner, scenario, options, 1, &plan)?
            };
            if !holds_samples(&trace) {
                without_samples.set(true);
            }
            Ok(trace)
        };
        // The first differing pair's records as compared (each sample's records both sizes
        // hold), where the first divergence's call of its module is counted.
        let compared_left: RefCell<Option<Trace>> = RefCell::new(None);
        let mut found = compare_series(
            &scenario.spec.batch_sizes,
            run_at,
            |a, b| {
                let (a, b, one_sided) = common_records(a, b);
                let mut c = compare_traces(&a, &b, TraceView::All);
                if one_sided > 0 {
                    c.notes.push(format!(
                        "{one_sided} record(s) of one size only, not compared (a tensor \
                         shared by the batch whose first dimension equals one size's rows)"
                    ));
                }
                if !c.is_identical() && compared_left.borrow().is_none() {
                    *compared_left.borrow_mut() = Some(a);
                }
                c
            },
            |a, b| format!("batch {a} (first) vs batch {b}; a record's step is its sample"),
            |b| format!("batch {b}"),
            "batch sizes",
        )?;
        if without_samples.get() {
            return Ok(Compared {
                skipped: Some(NO_SAMPLES),
                ..Compared::nothing()
            });
        }
        let left = compared_left.into_inner();
        if let (Some((first, other, _)), Some(left), true) =
            (&found.differing, left, options.element_detail)
        {
            let sizes = (*first, *other);
            if let Some(d) = found.comparison.first.as_mut() {
                d.operator = name_operator(runs, d, &left, sizes)?;
            }
        }
        Ok(found)
    }

    /// None: a capture takes a record's whole tensor, not a sample's row (module doc, limits).
    fn drill_down<'a>(
        &self,
        _runs: &Runs<'a>,
        _d: &Divergence,
        _pair: Option<&'a Pair>,
    ) -> Option<Drill<'a>> {
        None
    }
}

/// The records `a` and `b` both hold, and how many one of them holds alone: at each step (a
/// sample) of each rank that both runs hold, a record is kept when the other run's same step
/// holds its name as often as its occurrence (a sample one run lacks stays whole, for the engine
/// to report). The recorder splits a tensor into samples where its first dimension is the
/// batch's rows, so a tensor the batch shares (a `[1, T, D]` table, a position vector) is a
/// sample's record at the one size whose rows equal its first dimension, and at no other: not a
/// difference of the sample's values. Records keep their order; `seq` is renumbered.
fn common_records(a: &Trace, b: &Trace) -> (Trace, Trace, usize) {
    let mut one_sided = 0;
    let mut keep = |mine: &RankTrace, theirs: &RankTrace| -> RankTrace {
        let mut held: BTreeMap<(u64, &str), usize> = BTreeMap::new();
        for r in &theirs.records {
            *held.entry((r.step, r.name.as_str())).or_default() += 1;
        }
        let steps: std::collections::BTreeSet<u64> =
            theirs.records.iter().map(|r| r.step).collect();
        let mut seen: BTreeMap<(u64, &str), usize> = BTreeMap::new();
        let mut seq: BTreeMap<u64, u32> = BTreeMap::new();
        let mut out = RankTrace {
            rank: mine.rank,
            records: Vec::with_capacity(mine.records.len()),
            environment: mine.environment.clone(),
            digest: mine.digest,
        };
        for r in &mine.records {
            let k = seen.entry((r.step, r.name.as_str())).or_default();
            *k += 1;
            let shared = steps.contains(&r.step);
            if shared && held.get(&(r.step, r.name.as_str())).copied().unwrap_or(0) < *k {
                one_sided += 1;
                continue;
            }
            let next = seq.entry(r.step).or_default();
            let mut kept = r.clone();
            kept.seq = *next;
            *next += 1;
            out.records.push(kept);
        }
        out
    };
    let mut left = Trace { ranks: Vec::new() };
    let mut right = Trace { ranks: Vec::new() };
    for (x, y) in a.ranks.iter().zip(&b.ranks) {
        left.ranks.push(keep(x, y));
        right.ranks.push(keep(y, x));
    }
    // A rank one run has and the other lacks stays, for the engine to report.
    left.ranks
        .extend(a.ranks.iter().skip(b.ranks.len()).cloned());
    right
        .ranks
        .extend(b.ranks.iter().skip(a.ranks.len()).cloned());
    (left, right, one_sided)
}

/// One operator call of a sample in a drill-down re-run (`name_operator`).
struct Traced {
    operator: String,
    module: String,
    /// The digest of the sample's rows of its outputs.
    md5: Md5Digest,
    /// Its inputs' shapes (`detcheck.rows.op:N`).
    inputs: Vec<String>,
    /// The program's line (`site:rows:N`).
    site: Option<String>,
}

impl Traced {
    /// This operator as call `index` of the window (output 0: the rows of its outputs).
    fn call(&self, index: u32) -> OperatorCall {
        OperatorCall {
            index,
            operator: self.operator.clone(),
            module: self.module.clone(),
            inputs: self.inputs.clone(),
            output: 0,
            site: self.site.clone(),
        }
    }
}

/// The operator that breaks the sample's invariance, where the first divergence `d` is a module
/// output (`fwd/*`) of the compared records `left` at `sizes` (first, other): both sizes run
/// again, each recording the sample's rows of every operator that reads the batch inside that
/// call of the module (`RunPlan::rows_inside`, `detcheck._torch.rows`), and the first whose rows
/// differ is named ([`OperatorFinding::BatchVariant`]): every operator before it gave equal rows,
/// so its input rows were equal. Where the sample's rows of the module's inputs already differ
/// (made outside any recorded module), the call of the module that encloses it is traced next,
/// up to the model, until one names the operator; where none does, the innermost module's input
/// is the finding ([`OperatorFinding::InputFromOutside`] from the window's input). `None` where
/// `d` is no module output of a digest (an input of the model: the sizes fed other samples).
fn name_operator(
    runs: &Runs<'_>,
    d: &Divergence,
    left: &Trace,
    sizes: (usize, usize),
) -> Result<Option<OperatorFinding>, RunError> {
    if d.difference != Difference::Digest || !d.name.starts_with("fwd/") {
        return Ok(None);
    }
    // The call of a module that was running when the divergent record was made: how many of
    // its calls the sample completed before it (a call's record is its output, `fwd/<module>`,
    // or its first tensor's, `fwd/<module>.0`).
    let call_of = |module: &str| {
        let (whole, first) = (format!("fwd/{module}"), format!("fwd/{module}.0"));
        left.ranks
            .iter()
            .filter(|r| r.rank == d.rank)
            .flat_map(|r| &r.records)
            .filter(|r| r.step == d.step && r.seq < d.seq && (r.name == whole || r.name == first))
            .count()
    };
    let mut module = d.name["fwd/".len()..].to_owned();
    let mut call = call_of(&module);
    // The innermost module's finding stands unless an enclosing module's call names the
    // operator.
    let mut innermost: Option<OperatorFinding> = None;
    loop {
        let finding = operator_inside(runs, d, &format!("fwd/{module}"), call, sizes)?;
        // An input of the module already differed: the operator that made it ran in a module
        // that encloses this one (outside any recorded module: an attention's product), whose
        // call is traced next, up to the model, until one names the operator.
        let from_outside = matches!(
            &finding,
            OperatorFinding::InputFromOutside {
                source: InputSource::WindowInput { .. },
                ..
            }
        );
        let named = matches!(&finding, OperatorFinding::BatchVariant { .. });
        let finding = match innermost.take() {
            Some(inner) if !named => inner,
            _ => finding,
        };
        match enclosing(&module) {
            Some(outer) if from_outside => {
                innermost = Some(finding);
                call = call_of(&outer);
                module = outer;
            }
            _ => return Ok(Some(finding)),
        }
    }
}

/// The module that encloses `module` (`transformer.h.1.attn` of `transformer.h.1.attn.c_proj`,
/// the model `(model)` of a top-level one); `None` for the model.
fn enclosing(module: &str) -> Option<String> {
    match module.rsplit_once('.') {
        _ if module == "(model)" => None,
        Some((outer, _)) => Some(outer.to_owned()),
        None => Some("(model)".to_owned()),
    }
}

/// The first operator of call `call` of the module of record `record` (`fwd/<module>`) whose
/// sample's rows differ between the sizes, from two re-runs (`name_operator`).
fn operator_inside(
    runs: &Runs<'_>,
    d: &Divergence,
    record: &str,
    call: usize,
    (first, other): (usize, usize),
) -> Result<OperatorFinding, RunError> {
    let inside = format!("{}:{call}:{record}", d.step);
    let (runner, scenario, options) = (runs.runner, runs.scenario, runs.options);
    let run_inside = |batch: usize| {
        let plan = RunPlan {
            rows_inside: Some(inside.clone()),
            ..batch_plan(batch)
        };
        run_planned(runner, scenario, options, 1, &plan)
    };
    let (a, b) = (run_inside(first)?, run_inside(other)?);
    // Each side's operator calls for the sample, in order, read by the operator trace's own
    // grammar (`operator_call`), with their input shapes and lines from the environment.
    let operators = |t: &Trace| -> Vec<Traced> {
        let Some(rank) = t.ranks.iter().find(|r| r.rank == d.rank) else {
            return Vec::new();
        };
        let env = |key: String| {
            rank.environment
                .as_ref()
                .and_then(|e| e.get(&key))
                .map(str::to_owned)
        };
        rank.records
            .iter()
            .filter(|r| r.step == d.step)
            .filter_map(|r| operator_call(&r.name).map(|call| (r, call)))
            .enumerate()
            .map(|(i, (r, call))| Traced {
                operator: call.operator.to_owned(),
                module: call.module.to_owned(),
                md5: r.md5,
                inputs: env(format!("detcheck.rows.op:{i}"))
                    .map(|s| s.split(", ").map(str::to_owned).collect())
                    .unwrap_or_default(),
                site: env(format!("site:rows:{i}")),
            })
            .collect()
    };
    let (mine, theirs) = (operators(&a), operators(&b));
    let window = "forward".to_owned();
    // The sample's rows of the module's inputs (`window/inN`): where one already differs, the
    // difference came from before the module (an operator of the module that called it, outside
    // any recorded module: an attention's product), not from the operators inside it.
    // Inputs are told apart by position among the call's tensors: where the sizes pass other
    // tensors (a mask at one size only), positions are compared only where both sides' counts
    // agree, and only inputs of the same shape at both.
    let inputs = |t: &Trace| -> Vec<(u32, Md5Digest, Vec<usize>)> {
        t.ranks
            .iter()
            .filter(|r| r.rank == d.rank)
            .flat_map(|r| &r.records)
            .filter(|r| r.step == d.step)
            .filter_map(|r| Some((window_input_index(&r.name)?, r.md5, r.shape.clone())))
            .collect()
    };
    let (inputs_a, inputs_b) = (inputs(&a), inputs(&b));
    let differing_input = inputs_a
        .iter()
        .zip(&inputs_b)
        .filter(|_| inputs_a.len() == inputs_b.len())
        .find(|((ja, ma, sa), (jb, mb, sb))| ja == jb && sa == sb && ma != mb)
        .map(|((index, ..), _)| *index);
    if let (Some(index), Some(l)) = (differing_input, mine.first()) {
        return Ok(OperatorFinding::InputFromOutside {
            window,
            call: l.call(0),
            input: index,
            source: InputSource::WindowInput {
                kind: "in".to_owned(),
                index,
            },
        });
    }
    if mine.is_empty() || theirs.is_empty() {
        return Ok(OperatorFinding::Unavailable {
            reason: format!(
                "the re-runs at batch {first} and {other} recorded no operator of `{}` call {call} \
                 for sample {} (a program that records itself, or a module the recorder cannot \
                 find by the record's name)",
                record, d.step
            ),
        });
    }
    let names_a: Vec<&str> = mine.iter().map(|c| c.operator.as_str()).collect();
    let names_b: Vec<&str> = theirs.iter().map(|c| c.operator.as_str()).collect();
    let mut one_sided = Vec::new();
    let mut paired = 0;
    for step in pair_calls(&names_a, &names_b) {
        let (i, j) = match step {
            Paired::Both(i, j) => (i, j),
            Paired::First(i) => {
                one_sided.push(format!("`{}` at batch {first}", mine[i].operator));
                continue;
            }
            Paired::Other(j) => {
                one_sided.push(format!("`{}` at batch {other}", theirs[j].operator));
                continue;
            }
            Paired::Apart(i, j) => {
                return Ok(OperatorFinding::DifferentOperators {
                    window,
                    index: u32::try_from(i).unwrap_or(u32::MAX),
                    left: mine[i].operator.clone(),
                    right: theirs[j].operator.clone(),
                })
            }
        };
        paired += 1;
        let (l, r) = (&mine[i], &theirs[j]);
        if l.md5 != r.md5 {
            return Ok(OperatorFinding::BatchVariant {
                window,
                call: l.call(u32::try_from(i).unwrap_or(u32::MAX)),
                sizes: (first, other),
                other_inputs: r.inputs.clone(),
                one_sided,
                rows: sample_rows(&a, &b, d.rank),
            });
        }
    }
    Ok(OperatorFinding::NoOperatorDiffers {
        window,
        calls: paired,
        compiled: None,
    })
}

/// Where the sample sat in each size's batch, as the drill-down re-runs' recorders said
/// (`detcheck.rows.{row,of,before,threads}` of rank `rank`, python `detcheck/_torch/rows.py`):
/// `first`'s run, then `other`'s.
fn sample_rows(first: &Trace, other: &Trace, rank: u32) -> Option<SampleRows> {
    let said = |t: &Trace, key: &str| -> Option<usize> {
        t.ranks
            .iter()
            .find(|x| x.rank == rank)?
            .environment
            .as_ref()?
            .get(&format!("detcheck.rows.{key}"))?
            .parse()
            .ok()
    };
    Some(SampleRows {
        row: (said(first, "row")?, said(other, "row")?),
        of: said(other, "of")?,
        before: said(other, "before").unwrap_or(0),
        threads: said(other, "threads").and_then(|n| u32::try_from(n).ok()),
    })
}

/// One step of [`pair_calls`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Paired {
    /// The first size's call `.0` and the other size's call `.1`: the same operator.
    Both(usize, usize),
    /// A call only the first size ran.
    First(usize),
    /// A call only the other size ran.
    Other(usize),
    /// The sides part here for good: no skip of at most [`RESYNC`] calls pairs them again.
    Apart(usize, usize),
}

/// How many calls of one side [`pair_calls`] skips, at most, to pair the sides again.
const RESYNC: usize = 8;

/// Pairs two sizes' operator calls in order, by operator: equal names pair; where they part,
/// the fewest calls of one side (at most [`RESYNC`], the first size's side first at each
/// count) whose skip makes the names equal again are one-sided (an operator one size runs
/// alone: a mask's fix-up where its batch holds padding rows); where no such skip exists the
/// sides are [`Paired::Apart`] and the pairing ends. A pure function of the names.
fn pair_calls(a: &[&str], b: &[&str]) -> Vec<Paired> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        if a[i] == b[j] {
            out.push(Paired::Both(i, j));
            (i, j) = (i + 1, j + 1);
            continue;
        }
        let skip = (1..=RESYNC).find_map(|s| {
            if a.get(i + s) == Some(&b[j]) {
                Some((s, 0))
            } else if b.get(j + s) == Some(&a[i]) {
                Some((0, s))
            } else {
                None
            }
        });
        let Some((sa, sb)) = skip else {
            out.push(Paired::Apart(i, j));
            return out;
        };
        out.extend((i..i + sa).map(Paired::First));
        out.extend((j..j + sb).map(Paired::Other));
        (i, j) = (i + sa, j + sb);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Record;
    use crate::value::digest::{Md5Digest, Stats};

    fn trace(records: &[(u64, &str, u8)]) -> Trace {
        let records = records
            .iter()
            .map(|&(step, name, bits)| Record {
                rank: 0,
                step,
                seq: 0,
                name: name.into(),
                replicated: false,
                dtype: crate::value::tensor::DType::F32,
                shape: vec![1, 4],
                md5: Md5Digest([bits; 16]),
                stats: Stats::default(),
                shard: None,
            })
            .collect();
        Trace {
            ranks: vec![RankTrace {
                rank: 0,
                records,
                environment: None,
                digest: crate::value::DigestKind::CURRENT,
            }],
        }
    }

    #[test]
    fn the_enclosing_module_is_the_name_without_its_last_part_up_to_the_model() {
        let chain: Vec<Option<String>> = ["transformer.h.1.attn.c_proj", "transformer", "(model)"]
            .iter()
            .map(|m| enclosing(m))
            .collect();
        assert_eq!(
            chain,
            [
                Some("transformer.h.1.attn".to_owned()),
                Some("(model)".to_owned()),
                None
            ]
        );
    }

    /// GPT-2's attention at batch 1 padded to 8 rows (a mask fixed up by `where` for the
    /// padding rows) against 8 real rows (no mask): the one-sided `where` is skipped and the
    /// attention pairs with the attention; calls that never pair again part the sides.
    #[test]
    fn an_operator_one_size_runs_alone_is_skipped_and_the_rest_pair_in_order() {
        use Paired::{Apart, Both, First, Other};
        let padded = ["cat", "where", "sdpa", "view", "addmm"];
        let full = ["cat", "sdpa", "view", "addmm"];
        assert_eq!(
            pair_calls(&padded, &full),
            [Both(0, 0), First(1), Both(2, 1), Both(3, 2), Both(4, 3)]
        );
        assert_eq!(
            pair_calls(&full, &padded),
            [Both(0, 0), Other(1), Both(1, 2), Both(2, 3), Both(3, 4)]
        );
        // the fewest skipped wins; at equal counts the first size's side is skipped
        assert_eq!(
            pair_calls(&["a", "x", "y", "b"], &["a", "y", "x", "b"]),
            [Both(0, 0), First(1), Both(2, 1), Other(2), Both(3, 3)]
        );
        let far: Vec<&str> = std::iter::once("a")
            .chain(std::iter::repeat_n("m", RESYNC + 1))
            .chain(["b"])
            .collect();
        assert_eq!(pair_calls(&far, &["a", "b"]), [Both(0, 0), Apart(1, 1)]);
    }

    /// A tensor the batch shares is a sample's record at one size only: left out, counted; a
    /// record both sizes hold is compared however it differs, in its order.
    #[test]
    fn records_of_one_size_only_are_left_out_and_counted() {
        let one = trace(&[
            (0, "in", 1),
            (0, "pos", 9),
            (0, "fwd/a", 2),
            (0, "fwd/a", 3),
        ]);
        let eight = trace(&[(0, "in", 1), (0, "fwd/a", 2), (0, "fwd/a", 4), (1, "in", 5)]);
        let (left, right, one_sided) = common_records(&one, &eight);
        assert_eq!(one_sided, 1, "`pos` at batch 1");
        let names = |t: &Trace| -> Vec<(u64, u32, String)> {
            t.ranks[0]
                .records
                .iter()
                .map(|r| (r.step, r.seq, r.name.clone()))
                .collect()
        };
        let kept = vec![
            (0, 0, "in".into()),
            (0, 1, "fwd/a".into()),
            (0, 2, "fwd/a".into()),
        ];
        assert_eq!(names(&left), kept);
        // A sample one size lacks stays: the engine reports it.
        assert_eq!(names(&right)[..3], kept[..]);
        assert_eq!(names(&right)[3], (1, 0, "in".into()));
        let c = compare_traces(&left, &right, TraceView::All);
        assert_eq!(c.first.map(|d| (d.step, d.seq)), Some((0, 2)));
    }
}
