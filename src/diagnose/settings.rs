//! Which of `--deterministic`'s settings makes a program's runs identical: the answer a user
//! needs ("add `random.seed(0)` at the top of the script"), not only that all of them together
//! do.
//!
//! When `repeat` holds with every setting, the program is run twice without them. Identical:
//! none is needed. Otherwise the cause of that divergence (`diagnose::decide_cause`) names the
//! settings that should fix it (a seed for an unseeded or differently seeded generator,
//! deterministic algorithms for an operator), and the seeds of the generators whose states
//! differ at any step; the hash seed where no evidence names a cause and the launches' hash
//! seeds differed (first when no generator differs either); for an operator, deterministic
//! algorithms alone before the operator settings together; the smallest candidates first.
//! Runs with only those settings confirm it; the set that does (or every setting, when the
//! cause names none or they do not suffice) is halved while a half still makes the runs
//! identical. A subset is confirmed by one run that equals the check's run 1 with
//! every setting bit for bit (it reproduced a result that repeats), else by a second run with
//! the subset: the usual finding costs three runs. When `repeat` does not hold with every
//! setting, no run is made: none of them fixes it, and the report's cause says why.
//!
//! Main type: [`SettingsFinding`]. Determinism: every run is one of the check's (perturbations
//! 1 and 2), so the finding is a function of the program. Limits: at most 2 + 4 * 2 + 4 * 2 * 2
//! runs (without, four candidates, the halving of every setting); a program whose runs need two
//! settings from different halves is answered with the smallest set tried that works; a
//! nondeterminism so rare that one run with a subset matched the check's run would be missed.

use super::decide_cause;
use crate::compare::{compare_traces, Cause, CauseClass, Comparison, TraceView, FRAMEWORK_KEY};
use crate::launch::{all_settings, setting_names, settings_mask};
use crate::record::hints;
use crate::record::Trace;
use crate::run::RunError;
use serde::Serialize;

/// What `--deterministic` learned (module doc).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SettingsFinding {
    /// The settings that make the runs identical, by the hint table's names; empty when the
    /// runs are identical without any, or when none makes them so (`fixes`).
    pub fixed_by: Vec<String>,
    /// Whether the settings make the runs identical at all.
    pub fixes: bool,
    /// What to write in the program, one statement per setting (`random.seed(0)`,
    /// `PYTHONHASHSEED=0`).
    pub statements: Vec<String>,
    /// The cause of the divergence without the settings, when the runs diverged.
    pub cause_without: Option<CauseClass>,
    /// The finding in one sentence.
    pub summary: String,
    /// How many runs the finding took, besides the check's own (issue 54: at most 3 when the
    /// setting the cause names fixes the program).
    pub runs: u32,
}

/// The settings a cause names (by the hint table's names), for a program of `framework`
/// (`torch`, or `mindspore`: the fact `site:framework` a MindSpore rank records).
fn named_by(class: CauseClass, generator: Option<&str>, framework: &str) -> Vec<&'static str> {
    if framework == "mindspore" {
        return match class {
            CauseClass::SeededDifferently | CauseClass::UnseededGenerator => match generator {
                Some("python") => vec!["random.seed"],
                Some("numpy") => vec!["numpy.random.seed"],
                _ => vec!["mindspore.set_seed"],
            },
            CauseClass::InitialParameters | CauseClass::DataOrder => vec!["mindspore.set_seed"],
            CauseClass::DataValues => {
                vec!["random.seed", "numpy.random.seed", "mindspore.set_seed"]
            }
            CauseClass::HashOrder => vec!["PYTHONHASHSEED"],
            CauseClass::NondeterministicOperator => {
                vec!["mindspore.set_deterministic", "HCCL_DETERMINISTIC"]
            }
            _ => vec![],
        };
    }
    match class {
        CauseClass::SeededDifferently | CauseClass::UnseededGenerator => match generator {
            Some("python") => vec!["random.seed"],
            Some("numpy") => vec!["numpy.random.seed"],
            Some("torch" | "cuda") => vec!["torch.manual_seed"],
            Some("mindspore") => vec!["mindspore.set_seed"],
            _ => vec![],
        },
        CauseClass::InitialParameters | CauseClass::DataOrder => vec!["torch.manual_seed"],
        CauseClass::DataValues => vec!["random.seed", "numpy.random.seed", "torch.manual_seed"],
        CauseClass::HashOrder => vec!["PYTHONHASHSEED"],
        CauseClass::NondeterministicOperator => vec![
            "torch.use_deterministic_algorithms",
            "CUBLAS_WORKSPACE_CONFIG",
            "torch.backends.cudnn.deterministic",
            "torch.backends.cudnn.benchmark",
            "torch._inductor.config.deterministic",
        ],
        _ => vec![],
    }
}

/// The one setting tried before a class's whole set: deterministic algorithms for an operator
/// (the one setting that reaches the CPU's kernels and Inductor's lowering; the others are
/// cuBLAS's, cuDNN's and Inductor's autotuning's).
fn first_of(class: CauseClass) -> Option<&'static str> {
    (class == CauseClass::NondeterministicOperator).then_some("torch.use_deterministic_algorithms")
}

fn statements(names: &[String], seed: u64) -> Vec<String> {
    hints::deterministic()
        .filter(|h| names.iter().any(|n| n == h.name))
        .map(|h| h.statement(Some(seed)))
        .collect()
}

/// The sets of settings to try first, smallest first, for a divergence without the settings
/// (`without`) and its cause: what the cause names; first the hash seed where no evidence named
/// anything else and the launches' hash seeds differed (what the check's own hash-seed run would
/// try). Empty sets are left out.
fn candidates(
    cause: Option<&Cause>,
    without: &Comparison,
    framework: &str,
) -> Vec<Vec<&'static str>> {
    let mut candidates: Vec<Vec<&'static str>> = Vec::new();
    if let Some(cause) = cause {
        // The seeds of the generators whose states differ at any step, also after the first
        // divergence (not evidence of its cause, but where a seed is likely missing).
        let mut seeds: Vec<&str> = Vec::new();
        for e in &without.evidence {
            let generator = e.name.strip_prefix("rng/").or(e.name.strip_prefix("seed/"));
            for setting in generator.map_or_else(Vec::new, |g| {
                named_by(CauseClass::UnseededGenerator, Some(g), framework)
            }) {
                if !seeds.contains(&setting) {
                    seeds.push(setting);
                }
            }
        }
        let hash_seeds_differ = without
            .environment
            .iter()
            .any(|e| e.key == "PYTHONHASHSEED");
        // The hash seed where no evidence names a cause and the launches' hash seeds differed:
        // first when no generator differs either, else last.
        let hash = cause.kind.needs_hash_probe() && hash_seeds_differ;
        if hash && seeds.is_empty() {
            candidates.push(vec!["PYTHONHASHSEED"]);
        }
        candidates.extend(first_of(cause.kind).map(|name| vec![name]));
        candidates.push(named_by(cause.kind, cause.generator.as_deref(), framework));
        if !seeds.is_empty() {
            candidates.push(seeds);
            if hash {
                candidates.push(vec!["PYTHONHASHSEED"]);
            }
        }
    }
    // The smallest first (stable: in the order above among equals), so that the answer is
    // the one seed the evidence names rather than a class's set of seeds.
    candidates.sort_by_key(Vec::len);
    candidates.dedup();
    candidates.retain(|c| !c.is_empty());
    candidates
}

/// Runs a program once, with perturbation `k` (1 or 2) and the deterministic settings `only` (by
/// name; `None`: none at all).
pub(crate) type RunOnce<'r> = dyn Fn(Option<&[String]>, usize) -> Result<Trace, RunError> + 'r;

/// `run(only, k)`: the program's run `k` (perturbation 1 or 2) with the settings `only` (by
/// name; `None`: none at all). `with_all`: the check's `repeat` comparison with every setting,
/// and `with_all_first` its run 1.
///
/// A subset of the settings is confirmed by one run when that run equals the check's run 1
/// with every setting, bit for bit (the subset reproduced a result that repeats); otherwise by
/// a second run with the subset: the usual finding costs three runs (two without, one with).
pub(crate) fn which_settings_fix(
    with_all: &Comparison,
    seed: u64,
    with_all_first: &Trace,
    run: &RunOnce<'_>,
) -> Result<SettingsFinding, RunError> {
    let runs = std::cell::Cell::new(0_u32);
    let run = |only: Option<&[String]>, k: usize| {
        runs.set(runs.get() + 1);
        run(only, k)
    };
    let identical = |only: Option<&[String]>| -> Result<(bool, Comparison), RunError> {
        let a = run(only, 1)?;
        if only.is_some() && compare_traces(with_all_first, &a, TraceView::All).is_identical() {
            return Ok((true, Comparison::empty()));
        }
        let b = run(only, 2)?;
        let c = compare_traces(&a, &b, TraceView::All);
        Ok((c.is_identical(), c))
    };
    if !with_all.is_identical() {
        return Ok(SettingsFinding {
            fixed_by: Vec::new(),
            fixes: false,
            statements: Vec::new(),
            cause_without: None,
            summary: "none of the deterministic settings makes the runs identical: the cause \
                      above is not one a setting fixes"
                .to_owned(),
            runs: 0,
        });
    }
    let (same, without) = identical(None)?;
    if same {
        return Ok(SettingsFinding {
            fixed_by: Vec::new(),
            fixes: true,
            statements: Vec::new(),
            cause_without: None,
            summary: "the runs are identical without the settings too: none of them is needed"
                .to_owned(),
            runs: runs.get(),
        });
    }
    let cause = decide_cause(&without, None);
    let cause_without = cause.as_ref().map(|c| c.kind);
    let framework = without.fact(FRAMEWORK_KEY).unwrap_or("torch");
    let all: Vec<String> = setting_names(all_settings())
        .into_iter()
        .map(str::to_owned)
        .collect();
    let mut fixed_by = all.clone();
    for candidate in candidates(cause.as_ref(), &without, framework) {
        let names: Vec<String> = candidate.into_iter().map(str::to_owned).collect();
        if settings_mask(names.iter().map(String::as_str)).is_some() && identical(Some(&names))?.0 {
            fixed_by = names;
            break;
        }
    }
    // Halve while a half still makes the runs identical (every setting, or a cause's set that
    // did: the answer is the smallest part that still does).
    while fixed_by.len() > 1 {
        let (first, second) = fixed_by.split_at(fixed_by.len() / 2);
        let (first, second) = (first.to_vec(), second.to_vec());
        if identical(Some(&first))?.0 {
            fixed_by = first;
        } else if identical(Some(&second))?.0 {
            fixed_by = second;
        } else {
            break;
        }
    }
    let statements = statements(&fixed_by, seed);
    // The hash seed alone fixing it is itself the evidence of hash order.
    let cause_without = if fixed_by == ["PYTHONHASHSEED"] {
        Some(CauseClass::HashOrder)
    } else {
        cause_without
    };
    let class = cause_without.map_or_else(|| "unknown".to_owned(), |k| k.to_string());
    let quoted = |items: &[String]| {
        items
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (variables, calls): (Vec<String>, Vec<String>) =
        statements.iter().cloned().partition(|s| !s.contains('('));
    let mut todo = Vec::new();
    if !calls.is_empty() {
        todo.push(format!("add {} at the top of the script", quoted(&calls)));
    }
    if !variables.is_empty() {
        todo.push(format!("set {} in its environment", quoted(&variables)));
    }
    let summary = format!(
        "{} alone make{} the runs identical ({} runs more); without the settings the cause is \
         {class}. To fix the program: {}",
        quoted(&fixed_by),
        if fixed_by.len() == 1 { "s" } else { "" },
        runs.get(),
        todo.join(", and ")
    );
    Ok(SettingsFinding {
        fixed_by,
        fixes: true,
        statements,
        cause_without,
        summary,
        runs: runs.get(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{RecordLevel, Recorder};
    use crate::value::tensor::Tensor;
    use std::cell::RefCell;

    /// A one-rank trace: `rng/python` (evidence) then the model's input, with these values.
    fn trace(rng: f32, input: f32) -> Trace {
        let mut r = Recorder::new(0, RecordLevel::Stats);
        r.record(0, "rng/python", &Tensor::from_vec(vec![rng]));
        r.record(0, "in/(model).0", &Tensor::from_vec(vec![input]));
        Trace {
            ranks: vec![r.finish()],
        }
    }

    /// A program whose runs are identical, and equal to the check's run with every setting
    /// (`trace(1.0, 1.0)`), when `needs` are among the settings applied (always, when it needs
    /// none); otherwise each run `k` differs from every other run. `evidence`: whether its
    /// divergence leaves `rng/python` evidence. Counts the runs.
    fn program<'r>(
        needs: &'static [&'static str],
        evidence: bool,
        runs: &'r RefCell<Vec<Option<Vec<String>>>>,
    ) -> impl Fn(Option<&[String]>, usize) -> Result<Trace, RunError> + 'r {
        move |only, k| {
            runs.borrow_mut().push(only.map(<[String]>::to_vec));
            let fixed = needs.is_empty()
                || only.is_some_and(|o| needs.iter().all(|n| o.iter().any(|x| x == n)));
            let input = if fixed { 1.0 } else { 1.0 + k as f32 };
            let rng = if evidence { input } else { 1.0 };
            Ok(trace(rng, input))
        }
    }

    fn all_first() -> Trace {
        trace(1.0, 1.0)
    }

    fn with_all(identical: bool) -> Comparison {
        let b = if identical { 1.0 } else { 2.0 };
        compare_traces(&trace(1.0, 1.0), &trace(1.0, b), TraceView::All)
    }

    #[test]
    fn the_cause_names_the_setting_and_two_runs_confirm_it() {
        let runs = RefCell::new(Vec::new());
        let program = program(&["random.seed"], true, &runs);
        let f = which_settings_fix(&with_all(true), 7, &all_first(), &program).unwrap();
        assert_eq!(f.fixed_by, ["random.seed"]);
        assert_eq!(f.statements, ["random.seed(7)"]);
        assert_eq!(f.cause_without, Some(CauseClass::UnseededGenerator));
        assert!(
            f.summary.contains("add `random.seed(7)` at the top"),
            "{}",
            f.summary
        );
        // Two runs without the settings, then one with the setting the cause names, which
        // equals the check's run with every setting.
        assert_eq!(runs.borrow().len(), 3, "{:?}", runs.borrow());
        assert_eq!(f.runs, 3);
        assert!(f.summary.contains("(3 runs more)"), "{}", f.summary);
    }

    #[test]
    fn a_generator_that_differs_after_the_divergence_is_tried_before_halving() {
        // The model's input differs at step 0; numpy's state only at step 1 (it was drawn from
        // inside step 0): no evidence of the cause, but its seed is the likely fix.
        let trace = |value: f32| {
            let mut r = Recorder::new(0, RecordLevel::Stats);
            r.record(0, "in/(model).0", &Tensor::from_vec(vec![value]));
            r.record(1, "rng/numpy", &Tensor::from_vec(vec![value]));
            Trace {
                ranks: vec![r.finish()],
            }
        };
        let runs = RefCell::new(Vec::new());
        let program = |only: Option<&[String]>, k: usize| -> Result<Trace, RunError> {
            runs.borrow_mut().push(only.map(<[String]>::to_vec));
            let fixed = only.is_some_and(|o| o.iter().any(|n| n == "numpy.random.seed"));
            Ok(trace(if fixed { 1.0 } else { 1.0 + k as f32 }))
        };
        let with_all = compare_traces(&trace(1.0), &trace(1.0), TraceView::All);
        let f = which_settings_fix(&with_all, 0, &trace(1.0), &program).unwrap();
        assert_eq!(f.fixed_by, ["numpy.random.seed"], "{f:?}");
        // Two without, then numpy's seed alone (before the data-values class's three seeds),
        // confirmed by one run.
        assert_eq!(runs.borrow().len(), 3, "{:?}", runs.borrow());
    }

    #[test]
    fn a_compiled_models_kernels_try_deterministic_algorithms_alone_first() {
        // A compiled model's gradient differs, nothing traced does: an operator cause, which
        // deterministic algorithms alone fix (Inductor's atomic adds on the CPU).
        let trace = |value: f32| {
            let mut r = Recorder::new(0, RecordLevel::Stats);
            r.record(0, "grad/wte.weight", &Tensor::from_vec(vec![value]));
            let mut rank = r.finish();
            let mut environment = crate::record::Environment::new();
            environment.set("site:compiled", "GPT");
            rank.environment = Some(environment);
            Trace { ranks: vec![rank] }
        };
        let runs = RefCell::new(Vec::new());
        let program = |only: Option<&[String]>, k: usize| -> Result<Trace, RunError> {
            runs.borrow_mut().push(only.map(<[String]>::to_vec));
            let fixed =
                only.is_some_and(|o| o.iter().any(|n| n == "torch.use_deterministic_algorithms"));
            Ok(trace(if fixed { 1.0 } else { 1.0 + k as f32 }))
        };
        let with_all = compare_traces(&trace(1.0), &trace(1.0), TraceView::All);
        let f = which_settings_fix(&with_all, 0, &trace(1.0), &program).unwrap();
        assert_eq!(f.fixed_by, ["torch.use_deterministic_algorithms"], "{f:?}");
        assert_eq!(f.cause_without, Some(CauseClass::NondeterministicOperator));
        assert_eq!(runs.borrow().len(), 3, "{:?}", runs.borrow());
        // A set that fixes it is halved to the part that does: cuDNN's setting of the five.
        let runs = RefCell::new(Vec::new());
        let program = |only: Option<&[String]>, k: usize| -> Result<Trace, RunError> {
            runs.borrow_mut().push(only.map(<[String]>::to_vec));
            let fixed =
                only.is_some_and(|o| o.iter().any(|n| n == "torch.backends.cudnn.benchmark"));
            Ok(trace(if fixed { 1.0 } else { 1.0 + k as f32 }))
        };
        let f = which_settings_fix(&with_all, 0, &trace(1.0), &program).unwrap();
        assert_eq!(f.fixed_by, ["torch.backends.cudnn.benchmark"], "{f:?}");
    }

    #[test]
    fn without_evidence_the_settings_are_halved() {
        let runs = RefCell::new(Vec::new());
        let program = program(&["PYTHONHASHSEED"], false, &runs);
        let f = which_settings_fix(&with_all(true), 0, &all_first(), &program).unwrap();
        assert_eq!(f.fixed_by, ["PYTHONHASHSEED"]);
        assert_eq!(f.cause_without, Some(CauseClass::HashOrder));
        assert!(f
            .summary
            .contains("set `PYTHONHASHSEED=0` in its environment"));
        // As many runs as pairs before: a confirmed half costs one run, a refused one two.
        assert!(
            runs.borrow().len() <= 2 * (1 + 2 * 3),
            "{:?}",
            runs.borrow()
        );
    }

    #[test]
    fn identical_without_settings_and_not_fixed_by_them_are_said() {
        let runs = RefCell::new(Vec::new());
        let f = which_settings_fix(
            &with_all(true),
            0,
            &all_first(),
            &program(&[], false, &runs),
        )
        .unwrap();
        assert!(f.fixes && f.fixed_by.is_empty(), "{f:?}");
        assert!(f.summary.contains("none of them is needed"));
        let runs = RefCell::new(Vec::new());
        let program = program(&["x"], false, &runs);
        let f = which_settings_fix(&with_all(false), 0, &all_first(), &program).unwrap();
        assert!(!f.fixes && f.summary.starts_with("none of the deterministic settings"));
        assert!(
            runs.borrow().is_empty(),
            "no run is made when the settings do not fix it"
        );
    }
}
