//! The reports of `detcheck check` for machines: one JSON object per line (`--format json`) and
//! a JUnit XML file (`--junit FILE`), both built from the [`ScenarioResult`]s the check loop
//! collects. The HTML pages of failed checks are in `html.rs`.
//!
//! Both formats are versioned and deterministic: the same scenarios with the same outcomes give
//! the same bytes, except the JUnit `time` attributes (the real elapsed time of each scenario,
//! reported only). The JSON lines hold no time at all.
//!
//! JSON lines, format version [`FORMAT_VERSION`]: one `"type": "scenario"` object per scenario,
//! printed as soon as it ends, then one `"type": "summary"` object. Library types (`Comparison`,
//! `Divergence`, `Overflow`, the scenario's spec) are written with their own serde forms, so a
//! field added to them appears here without a change to this file; floats in statistics are
//! their exact bits (`"0x3ff8000000000000"`), as in every detcheck file. A comparison's
//! divergence map is left out (it is a picture: `--report-dir`).
//!
//! JUnit: the Jenkins flavour nextest writes (`testsuites` > `testsuite` > `testcase`, with
//! `failure`, `error`, `skipped`, `system-out`), one `testsuite` per scenario folder and one
//! `testcase` per scenario.
//!
//! Invariant (reports are deterministic; here and in `html.rs`): JSON lines and report pages are
//! pure functions of the scenarios and their outcomes (no time, host or absolute path); JUnit's
//! `time` attributes are the only measured values, and nothing reads them back. Every string from a
//! scenario or trace is escaped (XML, HTML).

use super::exit::Exit;
use detcheck::check::{CheckOutcome, ScenarioReport, SettingsFinding};
use detcheck::compare::Divergence;
use detcheck::record::Overflow;
use detcheck::scenario::{CheckKind, Expectation, Program, ScenarioSpec};
use detcheck::LoadedScenario;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The version of the JSON lines and of the report pages; raised when a field changes meaning
/// or goes away (a new field does not raise it).
pub(crate) const FORMAT_VERSION: u32 = 1;

/// What became of one scenario.
pub(crate) enum Outcome {
    /// Its checks ran: the report says whether they hold.
    Ran(Box<ScenarioReport>),
    /// A run failed (or could not start): the message and the exit it counts as.
    Errored { message: String, exit: Exit },
    /// `"ignored": true` and no `--include-ignored`.
    Ignored,
    /// The session cannot run it (under MPI: too many ranks, or a command).
    Skipped(&'static str),
}

/// A file `--report-dir` wrote for a check.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ReportFile {
    /// The check it shows.
    pub(crate) check: CheckKind,
    /// `map` (PNG) or `page` (HTML).
    pub(crate) kind: &'static str,
    /// Where it is.
    pub(crate) path: PathBuf,
}

/// One scenario of a `detcheck check`, as every report shows it.
pub(crate) struct ScenarioResult<'s> {
    pub(crate) scenario: &'s LoadedScenario,
    /// The reduction column: the effective mode, or a command's launcher.
    pub(crate) reduction: String,
    pub(crate) outcome: Outcome,
    /// Wall-clock time of its checks (JUnit only).
    pub(crate) elapsed: Duration,
    /// The text `detcheck check` prints about it below the table (failures, maps, overflow).
    pub(crate) detail: Option<String>,
    pub(crate) files: Vec<ReportFile>,
}

impl ScenarioResult<'_> {
    /// `passed`, `failed`, `errored`, `ignored` or `skipped`.
    pub(crate) fn status(&self) -> &'static str {
        match &self.outcome {
            Outcome::Ran(report) if report.passed() => "passed",
            Outcome::Ran(_) => "failed",
            Outcome::Errored { .. } => "errored",
            Outcome::Ignored => "ignored",
            Outcome::Skipped(_) => "skipped",
        }
    }

    /// The verdict column of the table.
    pub(crate) fn verdict(&self) -> &'static str {
        match &self.outcome {
            Outcome::Ran(report) if report.compared_nothing() => "n/a",
            Outcome::Ran(report) => match (report.passed(), self.scenario.spec.expect) {
                (true, Expectation::Identical) => "ok",
                (true, Expectation::Diverges) => "ok (caught)",
                (false, Expectation::Identical) => "FAIL",
                (false, Expectation::Diverges) => "FAIL (missed)",
            },
            Outcome::Errored { .. } => "ERROR",
            Outcome::Ignored => "ignored",
            Outcome::Skipped(_) => "skipped",
        }
    }

    /// The exit this scenario counts as.
    pub(crate) fn exit(&self) -> Exit {
        match &self.outcome {
            Outcome::Ran(report) => Exit::verdict(report.passed()),
            Outcome::Errored { exit, .. } => *exit,
            Outcome::Ignored | Outcome::Skipped(_) => Exit::Ok,
        }
    }

    /// The folder of the scenario's file as given (`scenarios`), or `detcheck` for a file named
    /// without one: the JUnit classname and suite.
    pub(crate) fn folder(&self) -> String {
        match self.scenario.origin.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.display().to_string(),
            _ => "detcheck".to_owned(),
        }
    }
}

/// The settings a `params.deterministic` launch applied (`hints::deterministic()`), one per
/// line under a heading, with what each changes: the report says what was tried.
pub(crate) fn deterministic_settings(seed: u64, frameworks: &[String]) -> String {
    let mut text = String::from(
        "  launched with the deterministic settings (--deterministic, params.deterministic):\n",
    );
    for hint in detcheck::record::hints::deterministic_for(frameworks) {
        let applied = hint.statement(Some(seed));
        text.push_str(&format!("    {applied}: {}\n", hint.why));
    }
    text
}

/// One line of a check that does not hold: what it expected and what it found.
pub(crate) fn headline(outcome: &CheckOutcome) -> String {
    let c = &outcome.comparison;
    if c.first.is_none() && outcome.expectation == Expectation::Diverges {
        format!(
            "{}: negative control not caught: expected a divergence, but all {} compared \
             records are identical",
            outcome.kind, c.num_compared
        )
    } else {
        format!(
            "{}: expected {}, but {} of {} compared records differ{}",
            outcome.kind,
            expectation_name(outcome.expectation),
            c.num_differing,
            c.num_compared,
            outcome
                .note
                .as_ref()
                .map_or(String::new(), |n| format!(" ({n})"))
        )
    }
}

/// `identical` or `diverges`, as scenario files spell it.
pub(crate) fn expectation_name(e: Expectation) -> &'static str {
    match e {
        Expectation::Identical => "identical",
        Expectation::Diverges => "diverges",
    }
}

// ---- JSON lines ----

#[derive(Serialize)]
struct ScenarioLine<'a> {
    format_version: u32,
    #[serde(rename = "type")]
    line_type: &'static str,
    scenario: ScenarioJson<'a>,
    status: &'static str,
    verdict: &'static str,
    exit_code: u8,
    skip_reason: Option<&'a str>,
    error: Option<&'a str>,
    counts: Counts,
    first_divergence: Option<FirstDivergence<'a>>,
    overflow: Option<&'a Overflow>,
    checks: Vec<CheckJson<'a>>,
    files: &'a [ReportFile],
    /// The text `detcheck check` prints about the scenario below its table (what failed or was
    /// caught, with element and operator), as a person reads it.
    detail: Option<&'a str>,
    /// With `--deterministic`: which of the settings make the runs identical.
    #[serde(skip_serializing_if = "Option::is_none")]
    deterministic: Option<&'a SettingsFinding>,
}

#[derive(Serialize)]
struct ScenarioJson<'a> {
    name: &'a str,
    file: &'a Path,
    folder: String,
    reduction: &'a str,
    checks: &'a [CheckKind],
    spec: &'a ScenarioSpec,
}

#[derive(Serialize, Default)]
struct Counts {
    checks: usize,
    checks_failed: usize,
    checks_skipped: usize,
    records_compared: u64,
    records_differing: u64,
}

#[derive(Serialize)]
struct FirstDivergence<'a> {
    check: CheckKind,
    /// The one-line form: `step 0 rank 0 seq 4 `x`: md5 differs`.
    text: String,
    #[serde(flatten)]
    divergence: &'a Divergence,
}

#[derive(Serialize)]
struct CheckJson<'a> {
    check: CheckKind,
    expectation: Expectation,
    status: &'static str,
    holds: bool,
    /// What the comparison found (`None` when skipped).
    found: Option<Expectation>,
    skip_reason: Option<&'a str>,
    note: Option<&'a str>,
    /// What the comparison's left and right sides are.
    sides: [&'static str; 2],
    /// `Comparison` as serde writes it, without its map.
    comparison: serde_json::Value,
}

#[derive(Serialize)]
struct SummaryLine<'a> {
    format_version: u32,
    #[serde(rename = "type")]
    line_type: &'static str,
    session: &'a str,
    scenarios: usize,
    passed: usize,
    failed: usize,
    errored: usize,
    ignored: usize,
    skipped: usize,
    exit_code: u8,
}

fn check_json(outcome: &CheckOutcome) -> CheckJson<'_> {
    let mut comparison =
        serde_json::to_value(&outcome.comparison).unwrap_or(serde_json::Value::Null);
    if let Some(fields) = comparison.as_object_mut() {
        fields.remove("map");
    }
    let (left, right) = outcome.side_labels();
    let status = if outcome.skipped.is_some() {
        "skipped"
    } else if outcome.holds() {
        "passed"
    } else {
        "failed"
    };
    CheckJson {
        check: outcome.kind,
        expectation: outcome.expectation,
        status,
        holds: outcome.holds(),
        found: outcome.skipped.is_none().then(|| {
            if outcome.comparison.is_identical() {
                Expectation::Identical
            } else {
                Expectation::Diverges
            }
        }),
        skip_reason: outcome.skipped.as_deref(),
        note: outcome.note.as_deref(),
        sides: [left, right],
        comparison,
    }
}

/// The JSON line of one scenario (no newline).
pub(crate) fn scenario_line(result: &ScenarioResult<'_>) -> String {
    let scenario = result.scenario;
    let mut counts = Counts::default();
    let (mut checks, mut first_divergence, mut overflow) = (Vec::new(), None, None);
    if let Outcome::Ran(report) = &result.outcome {
        for o in &report.outcomes {
            counts.checks += 1;
            counts.checks_failed += usize::from(!o.holds());
            counts.checks_skipped += usize::from(o.skipped.is_some());
            counts.records_compared += o.comparison.num_compared;
            counts.records_differing += o.comparison.num_differing;
            checks.push(check_json(o));
        }
        first_divergence = report
            .first_divergence()
            .map(|(check, divergence)| FirstDivergence {
                check,
                text: divergence.to_string(),
                divergence,
            });
        overflow = report.overflow.as_ref();
    }
    let line = ScenarioLine {
        format_version: FORMAT_VERSION,
        line_type: "scenario",
        scenario: ScenarioJson {
            name: &scenario.name,
            file: &scenario.origin,
            folder: result.folder(),
            reduction: &result.reduction,
            checks: &scenario.checks,
            spec: &scenario.spec,
        },
        status: result.status(),
        verdict: result.verdict(),
        exit_code: result.exit().code(),
        skip_reason: match &result.outcome {
            Outcome::Skipped(reason) => Some(reason),
            Outcome::Ignored => Some(IGNORED_REASON),
            _ => None,
        },
        error: match &result.outcome {
            Outcome::Errored { message, .. } => Some(message),
            _ => None,
        },
        counts,
        first_divergence,
        overflow,
        checks,
        files: &result.files,
        detail: result.detail.as_deref(),
        deterministic: match &result.outcome {
            Outcome::Ran(report) => report.deterministic.as_ref(),
            _ => None,
        },
    };
    // Every value here is a string, number, bool, null, or a library type with a derived
    // `Serialize` and no maps with non-string keys: serialization cannot fail.
    serde_json::to_string(&line).expect("a scenario's JSON line")
}

/// Why an ignored scenario did not run.
pub(crate) const IGNORED_REASON: &str =
    "marked \"ignored\": true in its file (run it with --include-ignored)";

/// The closing JSON line (no newline).
pub(crate) fn summary_line(results: &[ScenarioResult<'_>], session: &str, exit: Exit) -> String {
    let count = |status: &str| results.iter().filter(|r| r.status() == status).count();
    let line = SummaryLine {
        format_version: FORMAT_VERSION,
        line_type: "summary",
        session,
        scenarios: results.len(),
        passed: count("passed"),
        failed: count("failed"),
        errored: count("errored"),
        ignored: count("ignored"),
        skipped: count("skipped"),
        exit_code: exit.code(),
    };
    serde_json::to_string(&line).expect("the summary JSON line")
}

// ---- JUnit XML ----

/// `text` without the characters XML 1.0 cannot hold (control characters other than tab,
/// newline and carriage return), as nextest strips them.
fn xml_chars(text: &str) -> impl Iterator<Item = char> + '_ {
    text.chars().filter(|&c| {
        matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && !matches!(c, '\u{fffe}' | '\u{ffff}'))
    })
}

/// `text` escaped for an XML attribute value: newlines and tabs as character references, which
/// attribute-value normalisation would otherwise turn into spaces.
pub(crate) fn xml_attr(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in xml_chars(text) {
        match c {
            '\n' => out.push_str("&#10;"),
            '\t' => out.push_str("&#9;"),
            c => push_escaped(&mut out, c),
        }
    }
    out
}

/// `text` escaped for element content (newlines kept as they are).
pub(crate) fn xml_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in xml_chars(text) {
        push_escaped(&mut out, c);
    }
    out
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '&' => out.push_str("&amp;"),
        '<' => out.push_str("&lt;"),
        '>' => out.push_str("&gt;"),
        '"' => out.push_str("&quot;"),
        '\'' => out.push_str("&apos;"),
        // A raw CR would be read back as a newline.
        '\r' => out.push_str("&#13;"),
        c => out.push(c),
    }
}

/// The reduction column of the table (also the JUnit and HTML facts): a built-in scenario's
/// effective mode; for a program, its own collectives as its recorder saw them
/// (`site:collective`: `gloo`, `nccl`, `mpi`), else `own`, or `none` at one rank. Never the
/// spec's `reduction`, which a program does not use.
pub(super) fn reduction_label(
    scenario: &LoadedScenario,
    report: Option<&ScenarioReport>,
) -> String {
    match &scenario.program {
        Program::Ranks(_) => scenario.spec.effective_mode().to_string(),
        Program::Command(_) => {
            let recorded = report.and_then(|r| {
                r.outcomes
                    .iter()
                    .find_map(|o| o.comparison.fact("site:collective"))
            });
            match recorded {
                Some(backend) => backend.to_owned(),
                None if scenario.spec.world_size < 2 => "none".to_owned(),
                None => "own".to_owned(),
            }
        }
    }
}

/// `1 rank`, `2 ranks`: a count with its noun.
pub(super) fn counted(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Seconds with three decimals, as nextest writes `time`.
fn seconds(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

/// What `system-out` holds for a scenario that ran or failed to: its facts, each check's
/// finding, its first overflow and the files `--report-dir` wrote.
fn system_out(result: &ScenarioResult<'_>) -> String {
    let scenario = result.scenario;
    let spec = &scenario.spec;
    let mut text = format!(
        "scenario: {} ({})\nkind: {}, {}, {}, seed {}, reduction {}\nexpect: {}\n",
        scenario.name,
        scenario.origin.display(),
        spec.kind,
        counted(spec.world_size as u64, "rank"),
        counted(spec.steps, "step"),
        spec.seed,
        result.reduction,
        expectation_name(spec.expect),
    );
    match &result.outcome {
        Outcome::Ran(report) => {
            for o in &report.outcomes {
                let c = &o.comparison;
                let found = match &o.skipped {
                    Some(why) => format!("n/a: {why}"),
                    None => format!(
                        "{} ({} of {} compared records differ)",
                        if o.holds() { "holds" } else { "does NOT hold" },
                        c.num_differing,
                        c.num_compared
                    ),
                };
                let _ = writeln!(text, "check {}: {found}", o.kind);
            }
            if let Some(o) = &report.overflow {
                let _ = writeln!(text, "first overflow: {o}");
            }
        }
        Outcome::Errored { message, .. } => {
            let _ = writeln!(text, "error: {message}");
        }
        Outcome::Ignored | Outcome::Skipped(_) => {}
    }
    for file in &result.files {
        let what = if file.kind == "map" {
            "divergence map"
        } else {
            "report page"
        };
        let _ = writeln!(text, "{}: {what} {}", file.check, file.path.display());
    }
    text
}

/// The JUnit XML of a whole check: one `testsuite` per scenario folder (in order of first
/// appearance), one `testcase` per scenario.
pub(crate) fn junit_xml(results: &[ScenarioResult<'_>]) -> String {
    let mut folders: Vec<String> = Vec::new();
    for r in results {
        let folder = r.folder();
        if !folders.contains(&folder) {
            folders.push(folder);
        }
    }
    let count = |rs: &[&ScenarioResult<'_>], statuses: &[&str]| {
        rs.iter().filter(|r| statuses.contains(&r.status())).count()
    };
    let all: Vec<&ScenarioResult<'_>> = results.iter().collect();
    let total: Duration = results.iter().map(|r| r.elapsed).sum();
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        xml,
        "<testsuites name=\"detcheck\" tests=\"{}\" skipped=\"{}\" failures=\"{}\" errors=\"{}\" \
         time=\"{}\">",
        all.len(),
        count(&all, &["ignored", "skipped"]),
        count(&all, &["failed"]),
        count(&all, &["errored"]),
        seconds(total)
    );
    for folder in &folders {
        let cases: Vec<&ScenarioResult<'_>> =
            results.iter().filter(|r| &r.folder() == folder).collect();
        let time: Duration = cases.iter().map(|r| r.elapsed).sum();
        let _ = writeln!(
            xml,
            "    <testsuite name=\"{}\" tests=\"{}\" skipped=\"{}\" errors=\"{}\" failures=\"{}\" \
             time=\"{}\">",
            xml_attr(folder),
            cases.len(),
            count(&cases, &["ignored", "skipped"]),
            count(&cases, &["errored"]),
            count(&cases, &["failed"]),
            seconds(time)
        );
        for r in cases {
            let _ = write!(
                xml,
                "        <testcase name=\"{}\" classname=\"{}\" time=\"{}\">",
                xml_attr(&r.scenario.name),
                xml_attr(folder),
                seconds(r.elapsed)
            );
            let inner = "            ";
            xml.push('\n');
            match &r.outcome {
                Outcome::Ran(report) if !report.passed() => {
                    let failing: Vec<&CheckOutcome> =
                        report.outcomes.iter().filter(|o| !o.holds()).collect();
                    let mut message = failing.first().map(|o| headline(o)).unwrap_or_default();
                    if failing.len() > 1 {
                        let _ = write!(message, " (and {} more checks)", failing.len() - 1);
                    }
                    let _ = writeln!(
                        xml,
                        "{inner}<failure message=\"{}\" type=\"{}\">{}</failure>",
                        xml_attr(&message),
                        match r.scenario.spec.expect {
                            Expectation::Identical => "divergence",
                            Expectation::Diverges => "negative control not caught",
                        },
                        xml_text(&report.explain_failures())
                    );
                }
                Outcome::Ran(_) => {}
                Outcome::Errored { message, exit } => {
                    let kind = match exit {
                        Exit::BadInput => "bad input",
                        Exit::NoDevice => "no gpu",
                        _ => "run failed",
                    };
                    let first_line = message.lines().next().unwrap_or_default();
                    let _ = writeln!(
                        xml,
                        "{inner}<error message=\"{}\" type=\"{kind}\">{}</error>",
                        xml_attr(first_line),
                        xml_text(message)
                    );
                }
                Outcome::Ignored => {
                    let _ = writeln!(
                        xml,
                        "{inner}<skipped message=\"{}\"/>",
                        xml_attr(&format!("ignored: {IGNORED_REASON}"))
                    );
                }
                Outcome::Skipped(reason) => {
                    let _ = writeln!(
                        xml,
                        "{inner}<skipped message=\"{}\"/>",
                        xml_attr(&format!("skipped: {reason}"))
                    );
                }
            }
            if matches!(r.outcome, Outcome::Ran(_) | Outcome::Errored { .. }) {
                let _ = writeln!(
                    xml,
                    "{inner}<system-out>{}</system-out>",
                    xml_text(&system_out(r))
                );
            }
            xml.push_str("        </testcase>\n");
        }
        xml.push_str("    </testsuite>\n");
    }
    xml.push_str("</testsuites>\n");
    xml
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escaping_keeps_text_and_drops_what_xml_cannot_hold() {
        let text = "a<b>&\"c'\u{1}\u{1b}\u{fffe}d\n\r\té";
        assert_eq!(
            xml_attr(text),
            "a&lt;b&gt;&amp;&quot;c&apos;d&#10;&#13;&#9;é"
        );
        assert_eq!(xml_text(text), "a&lt;b&gt;&amp;&quot;c&apos;d\n&#13;\té");
    }

    #[test]
    fn seconds_have_three_decimals() {
        assert_eq!(seconds(Duration::from_millis(1234)), "1.234");
        assert_eq!(seconds(Duration::ZERO), "0.000");
    }
}
