//! The CLI's dump commands: `detcheck run --dump`, `detcheck compare`, `detcheck curves`, and
//! the divergence maps, report pages and overflow lines of `detcheck check`. Printing and verdicts only; the
//! work is in the library (`detcheck::dump_scenario`, `compare_dumps`, `compare_curves`), and
//! the exit code of an error is decided in `exit.rs`.

use super::exit::{CliError, Exit};
use super::html;
use super::report::{ReportFile, FORMAT_VERSION};
use detcheck::check::launcher_size;
use detcheck::checkpoint::resumable_step;
use detcheck::compare::align::{
    align_dumps, unit_roundoff, AlignOptions, AlignedRecord, Alignment,
};
use detcheck::compare::curves::{
    compare_curves, load_curve, write_curve_plots, CurveComparison, Tolerance,
};
use detcheck::compare::{
    compare_dumps, CauseClass, CompareOptions, Comparison, Divergence, RecordSummary,
};
use detcheck::diagnose::decide_cause;
use detcheck::file::{write_atomically, DumpMode};
use detcheck::launch::capture::read_window_inputs;
use detcheck::launch::{Capture, InsideRequest};
use detcheck::run::{dump_inside, dump_scenario};
use detcheck::scenario::limits::MAX_WORKERS;
use detcheck::scenario::{Program, RunPlan};
use detcheck::value::{ExactF64, Stats};
use detcheck::{check::ScenarioReport, CheckOptions, LoadedScenario};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Standard output, collected and written when dropped, ignoring a closed pipe: `detcheck
/// compare A B | head` must not panic.
struct Out(String);

impl Drop for Out {
    fn drop(&mut self) {
        let _ = std::io::stdout().lock().write_all(self.0.as_bytes());
    }
}

/// `println!` into an [`Out`].
macro_rules! outln {
    ($o:expr) => {
        $o.0.push('\n')
    };
    ($o:expr, $($arg:tt)*) => {{
        let _ = writeln!($o.0, $($arg)*);
    }};
}

/// `detcheck run SCENARIO --dump DIR`.
pub(crate) fn run(
    scenario: LoadedScenario,
    dir: &Path,
    mode: DumpMode,
    perturb: Option<usize>,
    options: &CheckOptions,
    plan: &RunPlan,
) -> Result<Exit, CliError> {
    // Every process of the job would be one whole run into the same folder: one would claim
    // it, the others fail, and the launcher would kill the one writing. All refuse instead.
    if let Some(processes) = launcher_size().filter(|&n| n > 1) {
        return Err(CliError::Invalid(format!(
            "run: started by an MPI launcher with {processes} processes, each of which would \
             write its own run into {}: `detcheck run` runs a scenario's ranks as threads of one \
             process; start it without mpirun (or with -n 1)",
            dir.display()
        )));
    }
    let spec = &scenario.spec;
    let end = plan.stop_at.unwrap_or(spec.steps);
    if end > spec.steps {
        return Err(CliError::Invalid(format!(
            "--stop-at {end} is beyond the scenario's {} steps",
            spec.steps
        )));
    }
    let unsupported = |flag: &str, what: &str| {
        CliError::Invalid(format!("{flag}: kind `{}` does not {what}", spec.kind))
    };
    let capabilities = scenario.program.capabilities();
    if plan.loader_workers.is_some() && !capabilities.loads_data {
        return Err(unsupported("--workers", "load data with worker threads"));
    }
    if let Some(workers) = plan.loader_workers.filter(|&w| w > MAX_WORKERS) {
        return Err(CliError::Invalid(format!(
            "--workers {workers}: at most {MAX_WORKERS} loader workers per rank"
        )));
    }
    if (plan.checkpoint_to.is_some() || plan.resume_from.is_some()) && !capabilities.resumes {
        return Err(unsupported("--checkpoint/--resume", "write checkpoints"));
    }
    let mut start = 0;
    if let Some(from) = &plan.resume_from {
        start = resumable_step(&spec.checkpoint_identity(0), from)?;
        if start >= end {
            return Err(CliError::Invalid(format!(
                "--resume: the checkpoint in {} is at step {start}, but this run stops before \
                 step {end}",
                from.display()
            )));
        }
    }
    let trace = dump_scenario(&scenario, dir, mode, options, perturb, plan)?;
    let mut o = Out(String::new());
    outln!(
        o,
        "wrote {}: {} ranks, steps {start} to {}, {} records, {mode} mode",
        dir.display(),
        trace.world_size(),
        end - 1,
        trace.num_records()
    );
    if let Some(to) = &plan.checkpoint_to {
        outln!(o, "checkpoint of step {end} in {}", to.display());
    }
    Ok(Exit::Ok)
}

/// `detcheck run --dump DIR --inside RECORD [--replay REF] -- PROGRAM`.
pub(crate) fn run_inside(
    scenario: LoadedScenario,
    dir: &Path,
    capture: &Capture,
    inside: &InsideRequest,
    perturb: Option<usize>,
    options: &CheckOptions,
    plan: &RunPlan,
) -> Result<Exit, CliError> {
    let refuse = |flag: &str| {
        CliError::Invalid(format!(
            "{flag}: not with --inside (it traces one module of one plain run)"
        ))
    };
    if !matches!(scenario.program, Program::Command(_)) {
        return Err(CliError::Invalid(
            "--inside: traces the operators of a Python program recorded by detcheck's start-up \
             hook or `detcheck.torch.watch`; give it after `--`"
                .to_owned(),
        ));
    }
    if perturb.is_some() {
        return Err(refuse("--perturb"));
    }
    if plan.checkpoint_to.is_some() || plan.resume_from.is_some() {
        return Err(refuse("--checkpoint/--resume"));
    }
    if !capture.name.starts_with("fwd/") {
        return Err(CliError::Invalid(format!(
            "--inside {}: give a forward record of a module, `fwd/<module>` (the operators of \
             a backward or an optimizer step are traced by `check`'s drill-down)",
            capture.name
        )));
    }
    if let Some(from) = &inside.replay_from {
        // Read now, so that a wrong folder is said before the program runs.
        read_window_inputs(from, capture.step)
            .map_err(|e| CliError::Invalid(format!("--replay {}: {e}", from.display())))?;
    }
    let trace = dump_inside(&scenario, dir, capture, inside, options, plan)?;
    let records = trace.ranks.first().map_or(&[][..], |r| &r.records[..]);
    let calls: BTreeSet<&str> = records
        .iter()
        .filter_map(|r| r.name.strip_prefix("op/")?.split('/').next())
        .collect();
    let mut o = Out(String::new());
    outln!(
        o,
        "wrote {}: the operators inside `{}` (step {}, rank {}, call {} of it): {} operator \
         calls, {} records, full mode{}",
        dir.display(),
        capture.name,
        capture.step,
        capture.rank,
        capture.occurrence,
        calls.len(),
        records.len(),
        inside
            .replay_from
            .as_ref()
            .map_or_else(String::new, |from| format!(
                "; the module ran on the inputs of {}",
                from.display()
            ))
    );
    Ok(Exit::Ok)
}

fn show(x: Option<ExactF64>) -> String {
    x.map_or("-".to_owned(), |v| format!("{:.6e}", v.0))
}

fn delta(a: Option<ExactF64>, b: Option<ExactF64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if a == b => "0".into(),
        (Some(a), Some(b)) => format!("{:+.3e}", b.0 - a.0),
        _ => "-".into(),
    }
}

fn clip(name: &str, width: usize) -> String {
    if name.chars().count() <= width {
        name.to_owned()
    } else {
        let tail: String = name
            .chars()
            .rev()
            .take(width - 3)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!("...{tail}")
    }
}

/// Prints a comparison: header, environment differences, first divergence, notes, the table,
/// overflows.
fn print_comparison(o: &mut Out, a: &Path, b: &Path, cmp: &Comparison) {
    outln!(
        o,
        "A: {} ({}, {} ranks)",
        a.display(),
        cmp.left,
        cmp.world_sizes.0
    );
    outln!(
        o,
        "B: {} ({}, {} ranks)",
        b.display(),
        cmp.right,
        cmp.world_sizes.1
    );
    // First: a changed variable, library or kernel often explains what follows.
    if !cmp.environment.is_empty() {
        outln!(o, "environment differs (A -> B):");
        for d in &cmp.environment {
            o.0.push_str(&d.describe("  "));
        }
    }
    outln!(
        o,
        "compared {} records: {} differ",
        cmp.num_compared,
        cmp.num_differing
    );
    match &cmp.first {
        Some(first) => {
            if let Some(cause) = &first.cause {
                o.0.push_str(&cause.describe(""));
            }
            outln!(o, "first divergence: {first}");
        }
        None => outln!(o, "identical"),
    }
    for note in &cmp.notes {
        outln!(o, "note: {note}");
    }
    if !cmp.rows.is_empty() {
        print_differing_records(o, cmp);
    }
    outln!(o);
    for (label, overflow) in ["A", "B"].iter().zip(&cmp.overflow) {
        match overflow {
            Some(first) => outln!(o, "overflow in {label}: {first}"),
            None => outln!(o, "overflow in {label}: none (no NaN, Inf or |x| >= 65504)"),
        }
    }
}

/// Prints the table of a comparison's differing records (at least one), how many more differ,
/// and each side of the first divergence.
fn print_differing_records(o: &mut Out, cmp: &Comparison) {
    let width = cmp
        .rows
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, 48);
    let full = cmp.rows.iter().any(|r| r.metrics.is_some());
    outln!(o);
    if full {
        outln!(
            o,
            "{:>6} {:>5} {:>5}  {:<width$}  {:<18} {:>11} {:>11} {:>10} {:>7} {:>7}",
            "step",
            "rank",
            "seq",
            "tensor",
            "difference",
            "max_abs",
            "max_rel",
            "cosine",
            "<1e-3",
            "<5e-3"
        );
    } else {
        outln!(
            o,
            "{:>6} {:>5} {:>5}  {:<width$}  {:<18} {:<12} {:<12} {:>10} {:>10} {:>10} {:>10}",
            "step",
            "rank",
            "seq",
            "tensor",
            "difference",
            "md5 A",
            "md5 B",
            "dmax",
            "dmin",
            "dmean",
            "dnorm"
        );
    }
    for r in &cmp.rows {
        print_differing_record(o, r, width, full);
    }
    if cmp.num_differing > cmp.rows.len() as u64 {
        outln!(
            o,
            "... and {} more differing records (--max-rows N to show more, 0 for all)",
            cmp.num_differing - cmp.rows.len() as u64
        );
    }
    if let Some(first) = &cmp.first {
        print_first_sides(o, first);
    }
}

/// Prints one row of the table of differing records: its metrics in a `full` table, else its
/// digests and the differences of its statistics.
fn print_differing_record(o: &mut Out, r: &Divergence, width: usize, full: bool) {
    let name = clip(&r.name, width);
    let head = format!(
        "{:>6} {:>5} {:>5}  {name:<width$}  {:<18}",
        r.step,
        r.rank,
        r.seq,
        r.difference.to_string()
    );
    if let Some(m) = &r.metrics {
        outln!(
            o,
            "{head} {:>11.4e} {:>11.4e} {:>10.6} {:>6.1}% {:>6.1}%",
            m.max_abs_err,
            m.max_rel_err,
            m.cosine,
            100.0 * m.within_1e3,
            100.0 * m.within_5e3
        );
    } else if full {
        outln!(o, "{head}");
    } else {
        let digest = |s: &Option<RecordSummary>| {
            s.as_ref()
                .and_then(|s| s.digest.clone())
                .map_or("-".to_owned(), |d| d.chars().take(12).collect())
        };
        let (sa, sb) = (
            r.left.as_ref().and_then(|s| s.stats),
            r.right.as_ref().and_then(|s| s.stats),
        );
        let d = |f: fn(&Stats) -> Option<ExactF64>| {
            delta(sa.as_ref().and_then(f), sb.as_ref().and_then(f))
        };
        outln!(
            o,
            "{head} {:<12} {:<12} {:>10} {:>10} {:>10} {:>10}",
            digest(&r.left),
            digest(&r.right),
            d(|s| s.max),
            d(|s| s.min),
            d(|s| s.mean),
            d(|s| s.norm)
        );
    }
}

/// Prints each side of the first divergence: its layout, digest and statistics.
fn print_first_sides(o: &mut Out, first: &Divergence) {
    for (label, side) in [("A", &first.left), ("B", &first.right)] {
        if let Some(s) = side {
            let stats = s.stats.map_or(String::new(), |st| {
                format!(
                    " max {} min {} mean {} norm {}",
                    show(st.max),
                    show(st.min),
                    show(st.mean),
                    show(st.norm)
                )
            });
            outln!(
                o,
                "first divergence in {label}: {} digest {}{stats}",
                s.layout,
                s.digest.as_deref().unwrap_or("-")
            );
        }
    }
}

/// `detcheck compare A B`.
pub(crate) fn compare(
    a: &Path,
    b: &Path,
    max_rows: usize,
    map: Option<&Path>,
    json: bool,
) -> Result<Exit, CliError> {
    let options = CompareOptions {
        max_rows: if max_rows == 0 { usize::MAX } else { max_rows },
        map: map.is_some(),
    };
    let mut cmp = compare_dumps(a, b, &options)?;
    // The cause, where the evidence names one (two dumps made by hand have no hash-seed probe).
    let cause = decide_cause(&cmp, None).filter(|c| c.kind != CauseClass::Unknown);
    if let Some(first) = cmp.first.as_mut() {
        first.cause = cause;
    }
    let mut text = Out(String::new());
    print_comparison(&mut text, a, b, &cmp);
    if let (Some(path), Some(m)) = (map, &cmp.map) {
        let title = format!("divergence map: {} vs {}", a.display(), b.display());
        m.write_png(path, &title)?;
        outln!(text, "divergence map: {}", path.display());
    }
    let exit = Exit::verdict(cmp.is_identical());
    if json {
        // One object: what the text says, as data (the map is a picture: `--map`).
        let mut comparison = serde_json::to_value(&cmp).unwrap_or(serde_json::Value::Null);
        if let Some(fields) = comparison.as_object_mut() {
            fields.remove("map");
        }
        let line = serde_json::json!({
            "format_version": FORMAT_VERSION,
            "type": "comparison",
            "identical": cmp.is_identical(),
            "exit_code": exit.code(),
            "comparison": comparison,
            "text": std::mem::take(&mut text.0),
        });
        text.0 = line.to_string() + "\n";
    }
    Ok(exit)
}

/// `detcheck curves A B`.
pub(crate) fn curves(
    a: &Path,
    b: &Path,
    name: &str,
    tolerance: Tolerance,
    plot: Option<&Path>,
) -> Result<Exit, CliError> {
    if !(tolerance.atol >= 0.0 && tolerance.rtol >= 0.0) {
        return Err(CliError::Invalid(
            "--atol and --rtol must be non-negative numbers".to_owned(),
        ));
    }
    let (ca, cb) = (load_curve(a, name)?, load_curve(b, name)?);
    let cmp = compare_curves(&ca, &cb, tolerance);
    let mut o = Out(String::new());
    outln!(
        o,
        "{name}: A {} ({} steps), B {} ({} steps), {} steps in common",
        a.display(),
        ca.points.len(),
        b.display(),
        cb.points.len(),
        cmp.num_common
    );
    print_curve_summary(&mut o, &cmp);
    for (label, only) in [("A", &cmp.only_left), ("B", &cmp.only_right)] {
        if !only.is_empty() {
            let shown: Vec<String> = only.iter().take(8).map(ToString::to_string).collect();
            let more = if only.len() > 8 { ", ..." } else { "" };
            outln!(o, "steps only in {label}: {}{more}", shown.join(", "));
        }
    }
    if let Some(stem) = plot {
        let (png, svg) = write_curve_plots(&ca, &cb, &cmp, stem)?;
        outln!(o, "plots: {} {}", png.display(), svg.display());
    }
    Ok(Exit::verdict(cmp.all_close))
}

/// What `--report-dir` wrote for a scenario: the lines `check` prints, and the files.
pub(crate) struct Written {
    pub(crate) lines: Vec<String>,
    pub(crate) files: Vec<ReportFile>,
}

/// Writes, for each of a scenario's failed checks, its divergence map (`DIR/<scenario>.<check>.png`,
/// when it found a divergence) and its HTML page (`DIR/<scenario>.<check>.html`) into `dir`;
/// returns the lines to print (the first overflow, then each file) and the files written.
pub(crate) fn write_reports(
    scenario: &LoadedScenario,
    report: &ScenarioReport,
    dir: Option<&Path>,
) -> Written {
    let mut lines = Vec::new();
    let mut files = Vec::new();
    if let Some(o) = &report.overflow {
        lines.push(format!("  first overflow: {o}"));
    }
    let Some(dir) = dir else {
        return Written { lines, files };
    };
    let created = std::fs::create_dir_all(dir).map_err(|e| e.to_string());
    let maps: Vec<_> = report.maps().collect();
    for outcome in report.outcomes.iter().filter(|o| !o.holds()) {
        let kind = outcome.kind;
        if let Some((_, map)) = maps.iter().find(|(k, _)| *k == kind) {
            let path: PathBuf = dir.join(format!("{}.{kind}.png", report.name));
            let title = format!("{}: {kind} check, first divergent tensor", report.name);
            let written = created
                .clone()
                .and_then(|()| map.write_png(&path, &title).map_err(|e| e.to_string()));
            match written {
                Ok(()) => {
                    lines.push(format!("  {kind}: divergence map {}", path.display()));
                    files.push(ReportFile {
                        check: kind,
                        kind: "map",
                        path,
                    });
                }
                Err(e) => lines.push(format!("  {kind}: cannot write the divergence map: {e}")),
            }
        }
        let path: PathBuf = dir.join(format!("{}.{kind}.html", report.name));
        let page = html::page(scenario, report, outcome);
        let written = created
            .clone()
            .and_then(|()| write_atomically(&path, page.as_bytes()).map_err(|e| e.to_string()));
        match written {
            Ok(()) => {
                lines.push(format!("  {kind}: report page {}", path.display()));
                files.push(ReportFile {
                    check: kind,
                    kind: "page",
                    path,
                });
            }
            Err(e) => lines.push(format!("  {kind}: cannot write the report page: {e}")),
        }
    }
    Written { lines, files }
}

/// `detcheck compare --align A B`: precision alignment (docs/align.md).
pub(crate) fn align(
    a: &Path,
    b: &Path,
    options: &AlignOptions,
    html_page: Option<&Path>,
    curve_files: &[PathBuf],
    json: bool,
) -> Result<Exit, CliError> {
    for (flag, value) in [
        ("--rounding-units", options.rounding_units),
        ("--growth", options.growth),
        ("--error-excess", options.error_excess),
    ] {
        if !(value.is_finite() && value > 0.0) {
            return Err(CliError::Invalid(format!(
                "{flag} must be a positive number, not {value}"
            )));
        }
    }
    if let Some(dtype) = options.precision.as_deref() {
        if unit_roundoff(dtype).is_none_or(|u| u == 0.0) {
            return Err(CliError::Invalid(format!(
                "--precision: `{dtype}` is not a floating dtype (f64, f32, tf32, f16, bf16, \
                 f8e4m3fn, f8e5m2)"
            )));
        }
    }
    if options.error_excess < 1.0 {
        return Err(CliError::Invalid(format!(
            "--error-excess must be at least 1 (a record is a warning up to that many times its \
             allowance), not {}",
            options.error_excess
        )));
    }
    let alignment = align_dumps(a, b, options)?;
    let mut text = Out(String::new());
    print_alignment(&mut text, a, b, &alignment);
    // The loss curves beside the records: from the files given, else the dumps' own `loss`.
    let curves = match curve_files {
        [ca, cb] => Some((load_curve(ca, "loss")?, load_curve(cb, "loss")?)),
        _ => load_curve(a, "loss").ok().zip(load_curve(b, "loss").ok()),
    };
    let curves = curves.map(|(ca, cb)| {
        let cmp = compare_curves(&ca, &cb, Tolerance::default());
        (ca, cb, cmp)
    });
    match &curves {
        Some((ca, _, cmp)) => {
            outln!(
                text,
                "{} curve ({} steps in common):",
                ca.name,
                cmp.num_common
            );
            print_curve_summary(&mut text, cmp);
        }
        None => outln!(
            text,
            "note: no loss curve (the dumps hold no `loss` record on both sides; --curves A B \
             reads trainer_state.json files)"
        ),
    }
    if let Some(path) = html_page {
        let page = html::alignment_page(
            &a.display().to_string(),
            &b.display().to_string(),
            &alignment,
            curves.as_ref(),
            &text.0,
        );
        write_atomically(path, page.as_bytes())?;
        outln!(text, "page: {}", path.display());
    }
    let exit = Exit::verdict(alignment.is_aligned());
    if json {
        let line = serde_json::json!({
            "format_version": FORMAT_VERSION,
            "type": "alignment",
            "aligned": alignment.is_aligned(),
            "exit_code": exit.code(),
            "alignment": alignment,
            "text": std::mem::take(&mut text.0),
        });
        text.0 = line.to_string() + "\n";
    }
    Ok(exit)
}

/// The commands that look inside a culprit module (`run --inside`, `--replay`): which of its
/// operators makes the error, with the module run on the reference's own inputs; each side's
/// program as its dump recorded it (`-- <A's program>` where it did not).
fn print_inside_commands(o: &mut Out, c: &AlignedRecord, programs: &[Option<String>; 2]) {
    let mut at = format!("--inside {} --inside-step {}", c.name, c.step);
    if c.rank > 0 {
        let _ = write!(at, " --inside-rank {}", c.rank);
    }
    if c.occurrence > 0 {
        let _ = write!(at, " --inside-occurrence {}", c.occurrence);
    }
    outln!(
        o,
        "  inside it: which operator, with the module run on B's own inputs (docs/align.md, \
         \"Inside the culprit\"):"
    );
    let [a, b] = [("A", &programs[0]), ("B", &programs[1])].map(|(side, p)| {
        p.clone()
            .unwrap_or_else(|| format!("-- <{side}'s program>"))
    });
    outln!(o, "    detcheck run --dump B-IN {at} {b}");
    outln!(o, "    detcheck run --dump A-IN {at} --replay B-IN {a}");
    outln!(o, "    detcheck compare --align A-IN B-IN");
}

/// A number of a metric column: `-` when it does not apply.
fn metric(x: Option<f64>, precision: usize) -> String {
    x.map_or_else(|| "-".to_owned(), |v| format!("{v:.precision$e}"))
}

/// Prints an alignment: the two sides, the verdict, the first culprit and its chain, the notes,
/// the table of records that are not aligned.
fn print_alignment(o: &mut Out, a: &Path, b: &Path, al: &Alignment) {
    outln!(
        o,
        "A: {} ({}, {} ranks)",
        a.display(),
        al.left,
        al.world_size
    );
    outln!(o, "B: {} ({}, the reference)", b.display(), al.right);
    let [aligned, warnings, errors] = al.counts;
    let floor = match al.options.precision.as_deref() {
        Some(dtype) => format!(" (at least {dtype}'s, {:.3e})", al.precision),
        None => String::new(),
    };
    outln!(
        o,
        "rule: an error is allowed {} units of its dtype's roundoff{floor} at its own magnitude, \
         or {}x the relative error of the aligned records before it (docs/align.md)",
        al.options.rounding_units,
        al.options.growth
    );
    if al.is_aligned() {
        outln!(
            o,
            "aligned: all {} records are within their allowance",
            al.num_records
        );
        if let Some(c) = &al.closest {
            outln!(
                o,
                "closest to its allowance: step {} rank {} `{}`: max |a-b| {:.3e}, {:.2}x its \
                 allowance {:.3e}",
                c.step,
                c.rank,
                c.name,
                c.error,
                c.excess,
                c.allowance
            );
        }
    } else {
        outln!(
            o,
            "not aligned: {aligned} of {} records aligned, {warnings} warnings, {errors} errors",
            al.num_records
        );
    }
    if let Some(c) = &al.culprit {
        print_culprit(o, al, c);
    }
    if let Some(part) = &al.operators_part {
        outln!(o, "operators: {part}");
    }
    for note in &al.notes {
        outln!(o, "note: {note}");
    }
    if al.rows.is_empty() {
        return;
    }
    print_unaligned_records(o, al);
}

/// Prints an alignment's first culprit `c`: its error, operator and chain, the commands that
/// look inside it, and the other records whose error is their own.
fn print_culprit(o: &mut Out, al: &Alignment, c: &AlignedRecord) {
    match &c.note {
        Some(note) => outln!(
            o,
            "first culprit: step {} rank {} `{}` ({} vs {}): {note}",
            c.step,
            c.rank,
            c.name,
            c.left,
            c.right
        ),
        None => outln!(
            o,
            "first culprit: step {} rank {} `{}` ({} vs {}): max |a-b| {:.3e} is {:.1}x its \
             allowance {:.3e}; {}",
            c.step,
            c.rank,
            c.name,
            c.left,
            c.right,
            c.error,
            c.excess,
            c.allowance,
            c.blame.reason()
        ),
    }
    if let Some(call) = &al.culprit_call {
        outln!(o, "  operator: {call}");
    }
    if al.chain_len > 0 {
        let shown = al.chain.len().min(6);
        let more = al.chain_len - shown as u64;
        let tail = if more > 0 {
            format!(", and {more} more")
        } else {
            String::new()
        };
        outln!(
            o,
            "  inherited by {} records after it: {}{tail}",
            al.chain_len,
            al.chain[..shown].join(", ")
        );
    }
    if c.name.starts_with("fwd/") && al.left.starts_with("detcheck") {
        print_inside_commands(o, c, &al.programs);
    }
    let others: Vec<&AlignedRecord> = al.culprits.iter().filter(|r| *r != c).collect();
    if !others.is_empty() {
        outln!(
            o,
            "other records whose error is their own (or unconfirmed):"
        );
        for r in others.iter().take(5) {
            outln!(o, "  {r}");
        }
    }
}

/// Prints the table of an alignment's records that are not aligned (at least one), and how many
/// more there are.
fn print_unaligned_records(o: &mut Out, al: &Alignment) {
    let [_, warnings, errors] = al.counts;
    let width = al
        .rows
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(6)
        .clamp(6, 40);
    outln!(o);
    outln!(
        o,
        "{:>5} {:>4}  {:<width$}  {:<7} {:<9} {:>8} {:>10} {:>10} {:>10} {:>9} {:>7} {:>7}",
        "step",
        "rank",
        "tensor",
        "verdict",
        "blame",
        "excess",
        "max_abs",
        "max_rel",
        "euc_dist",
        "cosine",
        "<1e-3",
        "<5e-3"
    );
    for r in &al.rows {
        let blame = r.blame;
        let m = &r.metrics;
        let share =
            |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |v| format!("{:.1}%", 100.0 * v));
        outln!(
            o,
            "{:>5} {:>4}  {:<width$}  {:<7} {:<9} {:>8} {:>10} {:>10} {:>10} {:>9} {:>7} {:>7}",
            r.step,
            r.rank,
            clip(&r.name, width),
            r.verdict.to_string(),
            blame.to_string(),
            if r.excess.is_finite() {
                format!("{:.1}x", r.excess)
            } else {
                "inf".to_owned()
            },
            metric(m.max_abs_err.or(Some(r.error)), 3),
            metric(m.max_rel_err, 3),
            metric(m.euc_dist, 3),
            m.cosine
                .map_or_else(|| "-".to_owned(), |c| format!("{c:.6}")),
            share(m.one_thousandth),
            share(m.five_thousandths),
        );
    }
    let shown = al.rows.len() as u64;
    if warnings + errors > shown {
        outln!(
            o,
            "... and {} more records not aligned (--max-rows N to show more, 0 for all)",
            warnings + errors - shown
        );
    }
}

/// The verdict lines of two curves (`curves`, and the curves of `compare --align`).
fn print_curve_summary(o: &mut Out, cmp: &CurveComparison) {
    let yes = |ok: bool| if ok { "yes" } else { "NO" };
    outln!(
        o,
        "tolerance: |A - B| <= atol + rtol*|B|, atol {:e}, rtol {:e}",
        cmp.tolerance.atol,
        cmp.tolerance.rtol
    );
    match cmp.first_two_close {
        Some(ok) => outln!(o, "first two steps allclose: {}", yes(ok)),
        None => outln!(
            o,
            "first two steps allclose: - (fewer than two common steps)"
        ),
    }
    outln!(o, "whole run allclose: {}", yes(cmp.all_close));
    if let Some((step, x, y)) = cmp.first_beyond {
        outln!(
            o,
            "first step beyond tolerance: {step} (A {x:.9e}, B {y:.9e}, |A - B| {:.3e} > {:.3e})",
            (x - y).abs(),
            cmp.tolerance.atol + cmp.tolerance.rtol * y.abs()
        );
    }
    if let Some((step, d)) = cmp.max_abs_diff {
        outln!(o, "max |A - B|: {d:.3e} at step {step}");
    }
}
