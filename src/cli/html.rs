//! The HTML page of a failed check (`detcheck check --report-dir DIR`:
//! `DIR/<scenario>.<check>.html`): the scenario, the check and its expectation, the first
//! divergence with both records, the first differing element and the environment differences
//! when the comparison has them, the differing records, the divergence map and the loss curves
//! (both as inline SVG).
//!
//! The page is self-contained (inline CSS and SVG, no script, no external resource) and
//! deterministic: no time, host or absolute path, so the same report gives the same bytes.
//! Every string that comes from a scenario or a trace (names can hold `<`) is escaped.
//!
//! Fields the library adds to `Comparison` or `Divergence` later are shown without a change
//! here: the page reads both through their serde form, and renders every field it does not
//! know as a table under its own heading.

use super::report::{expectation_name, headline, FORMAT_VERSION};
use detcheck::check::{CheckOutcome, ScenarioReport};
use detcheck::compare::align::{AlignedRecord, Alignment};
use detcheck::compare::curves::{
    compare_curves, curve_plot_svg, Curve, CurveComparison, Tolerance,
};
use detcheck::compare::{Cause, Comparison, Divergence, RecordSummary};
use detcheck::scenario::CheckKind;
use detcheck::value::{ExactF64, Stats};
use detcheck::LoadedScenario;
use serde_json::Value;
use std::fmt::Write as _;

/// `text` escaped for HTML content and attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// What each check compares (the table of docs/checks.md).
fn compares(kind: CheckKind) -> &'static str {
    match kind {
        CheckKind::Repeat => {
            "two runs of one configuration, each under a different perturbation (seeded delays, \
             rotated arrival orders), record by record"
        }
        CheckKind::Replicas => {
            "within each run, every rank's replicated records (parameters, gradients, loss) with \
             rank 0's"
        }
        CheckKind::Backends => "run 1 on MPI ranks with the same run on thread ranks",
        CheckKind::WorldSizes => {
            "rank 0's replicated records of runs at each world size with the smallest"
        }
        CheckKind::Workers => "runs with each number of data-loader workers with the first",
        CheckKind::Restart => {
            "the continuous run with a run checkpointed and resumed in a fresh launch"
        }
        CheckKind::Variants => "run 1 with a run under each of the scenario's variants",
        CheckKind::BatchSizes => {
            "each sample's records of runs at each batch size with the first size's (a record's \
             step is its sample)"
        }
        _ => "two runs of the scenario, record by record",
    }
}

const STYLE: &str = "\
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;\
margin:2em auto;max-width:1100px;padding:0 1em;color:#1a1a1a;line-height:1.45}\
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:1.8em;\
border-bottom:1px solid #ddd;padding-bottom:.2em}h3{font-size:1em;margin-top:1.2em}\
code,.mono{font-family:'DejaVu Sans Mono',Menlo,Consolas,monospace;font-size:.92em}\
.verdict{font-size:1.1em;padding:.6em .9em;border-left:5px solid #d62728;background:#fdf0f0}\
.where{font-size:1.1em;padding:.6em .9em;border-left:5px solid #1f77b4;background:#eef5fb}\
table{border-collapse:collapse;margin:.6em 0}\
.scroll{overflow-x:auto}\
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}\
th{background:#f5f5f5;font-weight:600}td.num{text-align:right}\
td.diff{background:#ffe3c4}\
table.facts th{width:14em}\
.figure{overflow-x:auto;border:1px solid #eee;padding:.5em;background:#fff}\
.figure svg{max-width:100%;height:auto}\
.muted{color:#666}footer{margin-top:3em;color:#888;font-size:.85em}";

/// A cell of the records table: its text, and its tooltip.
type Cell = (String, Option<String>);

/// The table of both records of a divergence, one column per side: layout, md5 and statistics,
/// the cells that differ between the sides highlighted.
fn records_table(outcome: &CheckOutcome, d: &Divergence) -> String {
    let (left_label, right_label) = outcome.side_labels();
    let (left_rank, right_rank) = outcome.record_ranks(d);
    let sides = [d.left.as_ref(), d.right.as_ref()];
    let mut html = format!(
        "<table class=\"records\">\n<tr><th></th><th>{} (rank {left_rank})</th>\
         <th>{} (rank {right_rank})</th></tr>\n",
        escape(left_label),
        escape(right_label)
    );
    // One row: a label and a cell per side (`None`: the side has no value for it).
    let mut row = |label: &str, cells: [Option<Cell>; 2]| {
        let differs = match (&cells[0], &cells[1]) {
            (Some(a), Some(b)) => a != b,
            _ => false,
        };
        let _ = write!(html, "<tr><th>{label}</th>");
        for cell in cells {
            let class = if differs { "mono diff" } else { "mono" };
            let _ = match cell {
                Some((text, Some(title))) => write!(
                    html,
                    "<td class=\"{class}\" title=\"{}\">{}</td>",
                    escape(&title),
                    escape(&text)
                ),
                Some((text, None)) => write!(html, "<td class=\"{class}\">{}</td>", escape(&text)),
                None => write!(html, "<td class=\"muted\">-</td>"),
            };
        }
        html.push_str("</tr>\n");
    };
    let per_side =
        |f: &dyn Fn(&RecordSummary) -> Option<Cell>| [sides[0].and_then(f), sides[1].and_then(f)];
    if sides.iter().any(Option::is_none) {
        let present = |r: Option<&RecordSummary>| {
            Some((
                if r.is_some() {
                    "yes"
                } else {
                    "no (only the other side has it)"
                }
                .to_owned(),
                None,
            ))
        };
        row("has the record", [present(sides[0]), present(sides[1])]);
    }
    row(
        "dtype[shape]",
        per_side(&|r| Some((r.layout.clone(), None))),
    );
    row(
        "md5",
        per_side(&|r| Some((r.digest.clone().unwrap_or_else(|| "-".to_owned()), None))),
    );
    let float = |x: Option<ExactF64>| {
        x.map(|v| {
            (
                format!("{:.9e}", v.0),
                Some(format!("exact bits 0x{:016x}", v.0.to_bits())),
            )
        })
    };
    let stat = |f: fn(&Stats) -> Option<ExactF64>| {
        move |r: &RecordSummary| r.stats.as_ref().and_then(|s| float(f(s)))
    };
    // A cell's title holds the exact bits, so equal text with other bits still differs.
    row("max", per_side(&stat(|s| s.max)));
    row("min", per_side(&stat(|s| s.min)));
    row("mean", per_side(&stat(|s| s.mean)));
    row("L2 norm", per_side(&stat(|s| s.norm)));
    row(
        "NaN / +Inf / &minus;Inf",
        per_side(&|r| {
            r.stats
                .as_ref()
                .map(|s| (format!("{} / {} / {}", s.nan, s.pos_inf, s.neg_inf), None))
        }),
    );
    html.push_str("</table>\n");
    html
}

/// A field name as a heading: `first_element` -> `First element`.
fn humanize(key: &str) -> String {
    let text = key.replace('_', " ");
    let mut chars = text.chars();
    match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => text,
    }
}

/// Any serde value as HTML: objects as tables of their fields, lists as lists, scalars as text.
fn value_html(value: &Value) -> String {
    match value {
        Value::Null => "<span class=\"muted\">(none)</span>".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => format!("<span class=\"mono\">{n}</span>"),
        Value::String(s) => escape(s),
        Value::Array(items) if items.is_empty() => "<span class=\"muted\">none</span>".to_owned(),
        Value::Array(items) if items.iter().all(|v| !v.is_object() && !v.is_array()) => {
            let shown: Vec<String> = items.iter().map(value_html).collect();
            shown.join(", ")
        }
        Value::Array(items) if same_fields(items).is_some() => {
            // Objects of one shape (the environment's differences): one table, a row each.
            let keys = same_fields(items).unwrap_or_default();
            let mut html = String::from("<div class=\"scroll\"><table class=\"fields\"><tr>");
            for key in &keys {
                let _ = write!(html, "<th>{}</th>", escape(key));
            }
            html.push_str("</tr>");
            for item in items {
                html.push_str("<tr>");
                for key in &keys {
                    let _ = write!(html, "<td>{}</td>", value_html(&item[key.as_str()]));
                }
                html.push_str("</tr>");
            }
            html.push_str("</table></div>");
            html
        }
        Value::Array(items) => {
            let mut html = String::from("<ol>");
            for item in items {
                let _ = write!(html, "<li>{}</li>", value_html(item));
            }
            html.push_str("</ol>");
            html
        }
        Value::Object(fields) => {
            let mut html = String::from("<table class=\"fields\">");
            for (key, v) in fields {
                let _ = write!(
                    html,
                    "<tr><th>{}</th><td>{}</td></tr>",
                    escape(key),
                    value_html(v)
                );
            }
            html.push_str("</table>");
            html
        }
    }
}

/// The field names of a list of objects that all have the same ones, in order (`None` when the
/// list holds anything else).
fn same_fields(items: &[Value]) -> Option<Vec<String>> {
    let first = items.first()?.as_object()?;
    if !items
        .iter()
        .all(|item| item.as_object().is_some_and(|o| o.keys().eq(first.keys())))
    {
        return None;
    }
    // What a row is about first, then its two sides, then the rest in order.
    let rank = |key: &str| match key {
        "key" | "name" => 0,
        "left" => 1,
        "right" => 2,
        _ => 3,
    };
    let mut keys: Vec<String> = first.keys().cloned().collect();
    keys.sort_by_key(|k| rank(k));
    Some(keys)
}

/// An enum variant's name as words: `NotReproduced` -> `not reproduced`.
fn variant_words(name: &str) -> String {
    let mut words = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            words.push(' ');
        }
        words.extend(c.to_lowercase());
    }
    words.replace('_', " ")
}

/// An enum value in its serde form (`{"NotCaptured": {"reason": "..."}}`, or a bare string) as
/// a phrase: `not captured (reason: ...)`.
fn variant_text(value: &Value) -> String {
    match value {
        Value::String(name) => variant_words(name),
        Value::Object(fields) if fields.len() == 1 => {
            let (name, inner) = fields.iter().next().expect("one field");
            let details = match inner {
                Value::Object(f) => f
                    .iter()
                    .map(|(k, v)| format!("{}: {}", k.replace('_', " "), value_plain(v)))
                    .collect::<Vec<_>>()
                    .join(", "),
                Value::Null => String::new(),
                other => value_plain(other),
            };
            if details.is_empty() {
                variant_words(name)
            } else {
                format!("{} ({details})", variant_words(name))
            }
        }
        other => value_plain(other),
    }
}

/// Headings of the fields the page knows by name but reads through their serde form.
fn heading(key: &str) -> String {
    match key {
        "environment" => "Environment differences".to_owned(),
        other => humanize(other),
    }
}

/// The fields of a serde object that the page does not show elsewhere, each under a heading.
fn other_fields(value: &Value, known: &[&str], level: &str) -> String {
    let mut html = String::new();
    let Some(fields) = value.as_object() else {
        return html;
    };
    for (key, v) in fields {
        if known.contains(&key.as_str()) || v.is_null() {
            continue;
        }
        if v.as_array().is_some_and(Vec::is_empty) || v.as_object().is_some_and(|o| o.is_empty()) {
            continue;
        }
        let _ = write!(
            html,
            "<{level} id=\"{}\">{}</{level}>\n<div class=\"field\">{}</div>\n",
            escape(key),
            escape(&heading(key)),
            value_html(v)
        );
    }
    html
}

/// The first differing element, when the divergence names one (`element` of its serde form):
/// a sentence when it is found, else the reason, as the library gives it.
fn element_html(divergence: &Value, labels: (&str, &str)) -> String {
    let Some(element) = divergence.get("element").filter(|e| !e.is_null()) else {
        return String::new();
    };
    let mut html = String::from("<h3 id=\"element\">First differing element</h3>\n");
    let in_reruns = element.get("found_in_reruns").and_then(Value::as_object);
    let rerun_labels;
    let labels = if in_reruns.is_some() {
        html.push_str(
            "<p class=\"muted\">Between the two re-runs: they did not reproduce the checked \
             runs' values, so this divergence changes from launch to launch.</p>\n",
        );
        rerun_labels = (
            format!("re-run of {}", labels.0),
            format!("re-run of {}", labels.1),
        );
        (rerun_labels.0.as_str(), rerun_labels.1.as_str())
    } else {
        labels
    };
    match element
        .get("found")
        .and_then(Value::as_object)
        .or(in_reruns)
    {
        Some(f) => {
            let text = |key: &str| f.get(key).map(value_plain).unwrap_or_default();
            let index = match f.get("index").and_then(Value::as_array) {
                Some(i) if i.is_empty() => "The scalar".to_owned(),
                _ => format!("Index <code>[{}]</code>", escape(&text("index"))),
            };
            let float = |key: &str| {
                f.get(key)
                    .and_then(Value::as_f64)
                    .map_or("-".to_owned(), |x| format!("{x:.3e}"))
            };
            let _ = writeln!(
                html,
                "<p class=\"element\">{index} (flat {}): <b>{}</b> <code>{}</code> (bits \
                 <code>{}</code>) vs <b>{}</b> <code>{}</code> (bits <code>{}</code>){}.</p>\n\
                 <p>{} of {} elements differ; max |a &minus; b| {}, max relative error {}.</p>",
                escape(&text("flat_index")),
                escape(labels.0),
                escape(&text("left")),
                escape(&text("left_bits")),
                escape(labels.1),
                escape(&text("right")),
                escape(&text("right_bits")),
                match (
                    f.get("ulps").and_then(Value::as_u64),
                    f.get("int_difference").and_then(Value::as_u64),
                ) {
                    (_, Some(d)) => format!(", {d} apart"),
                    (Some(1), None) => ", 1 ulp apart".to_owned(),
                    (Some(u), None) => format!(", {u} ulps apart"),
                    (None, None) => String::new(),
                },
                escape(&text("num_differing")),
                escape(&text("num_elements")),
                float("max_abs_err"),
                float("max_rel_err"),
            );
        }
        None => {
            let _ = writeln!(
                html,
                "<p>Not named: {}.</p>",
                escape(&variant_text(element.get("unavailable").unwrap_or(element)))
            );
        }
    }
    html
}

/// The first differing operator of the divergent record's module, when the check traced one
/// (`crate::compare::OperatorFinding`, a program recorded by `detcheck.torch.watch`).
fn operator_html(divergence: &Divergence) -> String {
    let Some(finding) = &divergence.operator else {
        return String::new();
    };
    format!(
        "<h3 id=\"operator\">First differing operator</h3>\n<p class=\"operator\">{}</p>\n",
        escape(&finding.to_string())
    )
}

/// The cause of the first divergence (`crate::compare::Cause`), first on the page: its class
/// and summary, the program's line, the fix and the evidence.
fn cause_html(cause: &Cause) -> String {
    let mut html = format!(
        "<h2 id=\"cause\">Cause</h2>\n<p class=\"cause\"><b>{}</b>: {}</p>\n<ul>\n",
        escape(&cause.kind.to_string()),
        escape(&cause.summary)
    );
    if let Some(site) = &cause.site {
        let _ = writeln!(html, "<li>at <code>{}</code></li>", escape(site));
    }
    if let Some(fix) = &cause.fix {
        let _ = writeln!(html, "<li>fix: {}</li>", escape(fix));
    }
    for line in &cause.evidence {
        let _ = writeln!(html, "<li>evidence: {}</li>", escape(line));
    }
    html.push_str("</ul>\n");
    html
}

/// A scalar or list as plain text (for sentences).
fn value_plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().map(value_plain).collect::<Vec<_>>().join(", "),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

/// The known fields of `Comparison` and `Divergence` (shown by their own sections).
const COMPARISON_FIELDS: [&str; 11] = [
    "evidence",
    "left",
    "right",
    "world_sizes",
    "num_compared",
    "num_differing",
    "first",
    "rows",
    "notes",
    "overflow",
    "map",
];
const DIVERGENCE_FIELDS: [&str; 11] = [
    "cause",
    "step",
    "rank",
    "seq",
    "name",
    "difference",
    "left",
    "right",
    "metrics",
    "element",
    "operator",
];

/// The page of one check that does not hold.
pub(crate) fn page(
    scenario: &LoadedScenario,
    report: &ScenarioReport,
    outcome: &CheckOutcome,
) -> String {
    let c = &outcome.comparison;
    let labels = outcome.side_labels();
    let title = format!("{}: {} check failed", scenario.name, outcome.kind);
    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"generator\" content=\"detcheck {}\">\n\
         <title>detcheck: {}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        env!("CARGO_PKG_VERSION"),
        escape(&title)
    );
    let _ = writeln!(
        html,
        "<h1>detcheck: <code>{}</code> &mdash; <code>{}</code> check failed</h1>",
        escape(&scenario.name),
        outcome.kind
    );
    let _ = writeln!(
        html,
        "<p class=\"verdict\" id=\"verdict\">{}</p>",
        escape(&headline(outcome))
    );

    html.push_str(&facts_html(scenario, report, outcome));

    if let Some(cause) = c.first.as_ref().and_then(|d| d.cause.as_ref()) {
        html.push_str(&cause_html(cause));
    }
    let comparison_json = serde_json::to_value(c).unwrap_or(Value::Null);
    // Fields of the comparison this page does not know by their type (the environment's
    // differences, ...): before the divergence, which they may explain.
    html.push_str(&other_fields(&comparison_json, &COMPARISON_FIELDS, "h2"));
    html.push_str("<h2 id=\"first-divergence\">First divergence</h2>\n");
    match &c.first {
        Some(d) => html.push_str(&divergence_html(outcome, d, &comparison_json, labels)),
        None => html.push_str(
            "<p class=\"where\" id=\"where\">none: every compared record is identical, and the \
             check expected a divergence.</p>\n",
        ),
    }

    if c.rows.len() > 1 {
        html.push_str(&differing_records_html(c));
    }
    if !c.notes.is_empty() {
        html.push_str("<h2 id=\"notes\">Notes</h2>\n<ul>\n");
        for note in &c.notes {
            let _ = writeln!(html, "<li>{}</li>", escape(note));
        }
        html.push_str("</ul>\n");
    }

    if let Some(map) = &c.map {
        let map_title = format!(
            "{}: {} check, first divergent tensor",
            report.name, outcome.kind
        );
        let _ = writeln!(
            html,
            "<h2 id=\"map\">Divergence map</h2>\n<p class=\"muted\">Ranks (rows) &times; steps \
             (columns); each cell is coloured by the first tensor that differs there (light \
             grey: identical; grey: only one side has that rank and step).</p>\n\
             <div class=\"figure\">\n{}</div>",
            map.to_svg(&map_title)
        );
    }
    if let Some((a, b)) = &outcome.curves {
        let cmp = compare_curves(a, b, Tolerance::default());
        let _ = writeln!(
            html,
            "<h2 id=\"curves\">Loss curves</h2>\n<p class=\"muted\">Rank 0's <code>{}</code> per \
             step in both runs, and their difference within numpy's allclose tolerance (atol \
             1e-3, rtol 1e-3); bitwise differences below it are still divergences.</p>\n\
             <div class=\"figure\">\n{}</div>",
            escape(&a.name),
            curve_plot_svg(a, b, &cmp)
        );
    }
    if let Some(o) = &report.overflow {
        let _ = writeln!(
            html,
            "<h2 id=\"overflow\">Overflow</h2>\n<p>first overflow in run 1: {}</p>",
            escape(&o.to_string())
        );
    }
    let _ = writeln!(
        html,
        "<footer>detcheck {} &middot; report format {FORMAT_VERSION}</footer>\n</body>\n</html>",
        env!("CARGO_PKG_VERSION")
    );
    html
}

/// The page's "Scenario and check" section: the scenario, its run, the check and what it
/// compared.
fn facts_html(
    scenario: &LoadedScenario,
    report: &ScenarioReport,
    outcome: &CheckOutcome,
) -> String {
    let spec = &scenario.spec;
    let c = &outcome.comparison;
    let labels = outcome.side_labels();
    let mut html = String::new();
    html.push_str("<h2 id=\"scenario\">Scenario and check</h2>\n<table class=\"facts\">\n");
    let mut fact = |key: &str, value: String| {
        let _ = writeln!(html, "<tr><th>{key}</th><td>{value}</td></tr>");
    };
    fact(
        "scenario",
        format!("<code>{}</code>", escape(&scenario.name)),
    );
    fact(
        "file",
        format!(
            "<code>{}</code>",
            escape(&scenario.origin.display().to_string())
        ),
    );
    if !spec.description.is_empty() {
        fact("description", escape(&spec.description));
    }
    fact(
        "run",
        escape(&format!(
            "kind {}, {}, {}, seed {}, reduction {}",
            spec.kind,
            super::report::counted(spec.world_size as u64, "rank"),
            super::report::counted(spec.steps, "step"),
            spec.seed,
            super::report::reduction_label(scenario, Some(report))
        )),
    );
    fact("check", format!("<code>{}</code>", outcome.kind));
    fact("compares", escape(compares(outcome.kind)));
    fact(
        "expectation",
        format!(
            "<code>{}</code>{}",
            expectation_name(outcome.expectation),
            if outcome.expectation == detcheck::scenario::Expectation::Diverges {
                " (a negative control: the check holds only when it finds a divergence)"
            } else {
                ""
            }
        ),
    );
    if let Some(note) = &outcome.note {
        fact("compared", escape(note));
    }
    fact(
        "sides",
        format!("left: {}, right: {}", escape(labels.0), escape(labels.1)),
    );
    fact(
        "records",
        format!("{} compared, {} differ", c.num_compared, c.num_differing),
    );
    html.push_str("</table>\n");
    html
}

/// The first divergence `d` of the page's check (`comparison_json`: its comparison as JSON):
/// where, its records, metrics, element, operator and other fields.
fn divergence_html(
    outcome: &CheckOutcome,
    d: &Divergence,
    comparison_json: &Value,
    labels: (&str, &str),
) -> String {
    let mut html = String::new();
    let _ = writeln!(
        html,
        "<p class=\"where\" id=\"where\">step <b>{}</b> &middot; rank <b>{}</b> &middot; \
         seq <b>{}</b> &middot; <code>{}</code>: {}</p>",
        d.step,
        d.rank,
        d.seq,
        escape(&d.name),
        escape(&d.difference.to_string())
    );
    html.push_str(
        "<p class=\"muted\">The earliest step, then record (seq), then rank where the \
         two sides differ.</p>\n",
    );
    html.push_str(&records_table(outcome, d));
    if let Some(m) = &d.metrics {
        let _ = writeln!(
            html,
            "<p>max |a &minus; b| {:.4e}, max relative error {:.4e}, cosine {:.6}, \
             within 1e-3: {:.1}%, within 5e-3: {:.1}%</p>",
            m.max_abs_err,
            m.max_rel_err,
            m.cosine,
            100.0 * m.within_1e3,
            100.0 * m.within_5e3
        );
    }
    let first_json = comparison_json.get("first").cloned().unwrap_or(Value::Null);
    html.push_str(&element_html(&first_json, labels));
    html.push_str(&operator_html(d));
    html.push_str(&other_fields(&first_json, &DIVERGENCE_FIELDS, "h3"));
    html
}

/// The page's table of the differing records `c` lists, with how many more differ.
fn differing_records_html(c: &Comparison) -> String {
    let mut html = String::new();
    html.push_str(
        "<h2 id=\"records\">Differing records</h2>\n<div class=\"scroll\"><table class=\"rows\">\n<tr><th>step</th>\
         <th>rank</th><th>seq</th><th>tensor</th><th>difference</th><th>md5 left</th>\
         <th>md5 right</th></tr>\n",
    );
    for r in &c.rows {
        let digest = |s: &Option<RecordSummary>| {
            s.as_ref()
                .and_then(|s| s.digest.clone())
                .unwrap_or_else(|| "-".to_owned())
        };
        let _ = writeln!(
            html,
            "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"mono\">{}</td><td>{}</td><td class=\"mono\">{}</td>\
             <td class=\"mono\">{}</td></tr>",
            r.step,
            r.rank,
            r.seq,
            escape(&r.name),
            escape(&r.difference.to_string()),
            escape(&digest(&r.left)),
            escape(&digest(&r.right))
        );
    }
    html.push_str("</table></div>\n");
    if c.num_differing > c.rows.len() as u64 {
        let _ = writeln!(
            html,
            "<p class=\"muted\">... and {} more differing records.</p>",
            c.num_differing - c.rows.len() as u64
        );
    }
    html
}

/// Step lines of the alignment picture: a palette that stays apart in print.
const STEP_COLOURS: [&str; 6] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf",
];

/// The excess a record's point is drawn at: log10, clamped to [-3, 4] (an exact match at the
/// bottom, a non-finite error at the top).
fn excess_y(excess: f32) -> f64 {
    if excess <= 0.0 {
        -3.0
    } else if !excess.is_finite() {
        4.0
    } else {
        f64::from(excess).log10().clamp(-3.0, 4.0)
    }
}

/// The picture of an alignment: each record's excess (log scale) along the program order, one
/// line per step and rank, the allowance (1x) and the error threshold marked, the first culprit
/// circled. Inline SVG.
fn alignment_svg(al: &Alignment) -> String {
    let (w, h, left, right, top, bottom) = (960.0, 320.0, 72.0, 16.0, 16.0, 40.0);
    let longest = al
        .series
        .iter()
        .map(|s| s.excess.len())
        .max()
        .unwrap_or(1)
        .max(2);
    let x = |i: usize| left + (w - left - right) * i as f64 / (longest - 1) as f64;
    let y = |v: f64| top + (h - top - bottom) * (4.0 - v) / 7.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" \
         height=\"{h}\" role=\"img\" aria-label=\"excess of each record along the program order\">\n\
         <rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"#fff\"/>\n"
    );
    for decade in -3..=4 {
        let yy = y(f64::from(decade));
        let _ = writeln!(
            svg,
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#eee\"/>\
             <text x=\"{}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">{}</text>",
            w - right,
            left - 6.0,
            yy + 4.0,
            match decade {
                -3 => "exact".to_owned(),
                4 => "non-finite".to_owned(),
                d => format!("1e{d}"),
            }
        );
    }
    for (level, colour, label) in [
        (1.0, "#2ca02c", "allowance"),
        (al.options.error_excess, "#d62728", "error"),
    ] {
        let yy = y(level.log10());
        let _ = writeln!(
            svg,
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"{colour}\" \
             stroke-dasharray=\"5,4\"/><text x=\"{}\" y=\"{:.1}\" font-size=\"11\" \
             fill=\"{colour}\" text-anchor=\"end\">{label}</text>",
            w - right,
            w - right,
            yy - 4.0
        );
    }
    let mut steps: Vec<u64> = al.series.iter().map(|s| s.step).collect();
    steps.dedup();
    for (i, step) in steps.iter().take(STEP_COLOURS.len()).enumerate() {
        let colour = STEP_COLOURS[(*step as usize) % STEP_COLOURS.len()];
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" fill=\"{colour}\">step {step}</text>",
            left + 8.0 + 56.0 * i as f64,
            top + 12.0
        );
    }
    for (k, series) in al.series.iter().enumerate() {
        let colour = STEP_COLOURS[(series.step as usize) % STEP_COLOURS.len()];
        let points: Vec<String> = series
            .excess
            .iter()
            .enumerate()
            .map(|(i, &e)| format!("{:.1},{:.1}", x(i), y(excess_y(e))))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\">\
             <title>step {} rank {}</title></polyline>",
            points.join(" "),
            series.step,
            series.rank
        );
        if let Some(c) = al
            .culprit
            .as_ref()
            .filter(|c| (c.step, c.rank) == (series.step, series.rank))
        {
            let index = al.culprit_index.filter(|&(s, _)| s == k).map(|(_, i)| i);
            if let Some(i) = index {
                let _ = writeln!(
                    svg,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"6\" fill=\"none\" stroke=\"#d62728\" \
                     stroke-width=\"2\"><title>first culprit: {}</title></circle>",
                    x(i),
                    y(excess_y(series.excess[i])),
                    escape(&c.name)
                );
            }
        }
    }
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">records of a step, \
         in program order (forward, backward, parameters); excess = error / allowance</text>\n</svg>",
        (left + w - right) / 2.0,
        h - 10.0
    );
    svg
}

/// The HTML page of `detcheck compare --align --html FILE`: the verdict, the first culprit and
/// its chain, the picture of every record's excess along the program order (one line per step,
/// so the jump is seen), and the table of records that are not aligned. `text` is the text
/// report, kept at the end. Self-contained and deterministic, as the check pages.
pub(crate) fn alignment_page(
    a: &str,
    b: &str,
    al: &Alignment,
    curves: Option<&(Curve, Curve, CurveComparison)>,
    text: &str,
) -> String {
    let verdict = if al.is_aligned() {
        format!(
            "aligned: all {} records are within their allowance",
            al.num_records
        )
    } else {
        let [aligned, warnings, errors] = al.counts;
        format!(
            "not aligned: {aligned} of {} records aligned, {warnings} warnings, {errors} errors",
            al.num_records
        )
    };
    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"generator\" content=\"detcheck {}\">\n\
         <title>detcheck: precision alignment</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>detcheck: precision alignment</h1>\n<p class=\"verdict\" id=\"verdict\">{}</p>\n",
        env!("CARGO_PKG_VERSION"),
        escape(&verdict)
    );
    html.push_str("<table class=\"facts\">\n");
    for (key, value) in [
        (
            "A",
            format!("<code>{}</code> ({})", escape(a), escape(&al.left)),
        ),
        (
            "B (reference)",
            format!("<code>{}</code> ({})", escape(b), escape(&al.right)),
        ),
        ("ranks", al.world_size.to_string()),
        (
            "rule",
            format!(
                "{} units of roundoff at a record's magnitude, or {}x the relative error of the \
                 aligned records before it; an error beyond {}x",
                al.options.rounding_units, al.options.growth, al.options.error_excess
            ),
        ),
    ] {
        let _ = writeln!(html, "<tr><th>{key}</th><td>{value}</td></tr>");
    }
    html.push_str("</table>\n");
    if let Some(c) = &al.culprit {
        html.push_str(&culprit_html(al, c));
    }
    let _ = writeln!(
        html,
        "<h2 id=\"picture\">Each record's error along the program order</h2>\n\
         <div class=\"figure\">{}</div>",
        alignment_svg(al)
    );
    if let Some((ca, cb, cmp)) = curves {
        let _ = writeln!(
            html,
            "<h2 id=\"curves\">The {} curves</h2>\n<p>whole run within |A &minus; B| &le; {:e} + \
             {:e}&middot;|B|: {}</p>\n<div class=\"figure\">{}</div>",
            escape(&ca.name),
            cmp.tolerance.atol,
            cmp.tolerance.rtol,
            if cmp.all_close { "yes" } else { "no" },
            curve_plot_svg(ca, cb, cmp)
        );
    }
    if !al.rows.is_empty() {
        html.push_str(&unaligned_records_html(al));
    }
    let _ = writeln!(
        html,
        "<h2 id=\"text\">The text report</h2>\n<pre>{}</pre>\n<footer>detcheck {} \
         (docs/align.md)</footer>\n</body>\n</html>",
        escape(text),
        env!("CARGO_PKG_VERSION")
    );
    html
}

/// The alignment page's "First culprit" section: the culprit `c` of `al` and the records that
/// inherited its error.
fn culprit_html(al: &Alignment, c: &AlignedRecord) -> String {
    let mut html = String::new();
    let _ = writeln!(
        html,
        "<h2 id=\"culprit\">First culprit</h2>\n<p class=\"where\">step {} rank {} \
         <code>{}</code> ({} vs {}): {}</p>",
        c.step,
        c.rank,
        escape(&c.name),
        escape(&c.left),
        escape(&c.right),
        escape(&c.note.clone().unwrap_or_else(|| format!(
            "max |a-b| {:.3e} is {:.1}x its allowance {:.3e}: {}",
            c.error,
            c.excess,
            c.allowance,
            c.blame.reason()
        )))
    );
    if al.chain_len > 0 {
        let _ = writeln!(
            html,
            "<p>Inherited by {} records after it: {}{}</p>",
            al.chain_len,
            al.chain
                .iter()
                .map(|n| escape(n))
                .collect::<Vec<_>>()
                .join(", "),
            if al.chain_len > al.chain.len() as u64 {
                ", ..."
            } else {
                ""
            }
        );
    }
    html
}

/// The alignment page's table of the records that are not aligned, with their metrics.
fn unaligned_records_html(al: &Alignment) -> String {
    let mut html = String::new();
    html.push_str(
        "<h2 id=\"records\">Records not aligned</h2>\n<div class=\"scroll\"><table>\n<tr>\
         <th>step</th><th>rank</th><th>tensor</th><th>A</th><th>B</th><th>verdict</th>\
         <th>blame</th><th>excess</th><th>MaxAbsErr</th><th>MaxRelativeErr</th>\
         <th>EucDist</th><th>Cosine</th><th>&lt;1e-3</th><th>&lt;5e-3</th></tr>\n",
    );
    let num = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |v| format!("{v:.3e}"));
    for r in &al.rows {
        let blame = r.blame;
        let m = &r.metrics;
        let _ = writeln!(
            html,
            "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td><code>{}</code></td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{blame}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            r.step,
            r.rank,
            escape(&r.name),
            escape(&r.left),
            escape(&r.right),
            r.verdict,
            if r.excess.is_finite() {
                format!("{:.1}x", r.excess)
            } else {
                "inf".into()
            },
            num(m.max_abs_err.or(Some(r.error))),
            num(m.max_rel_err),
            num(m.euc_dist),
            m.cosine
                .map_or_else(|| "-".to_owned(), |c| format!("{c:.6}")),
            m.one_thousandth
                .map_or_else(|| "-".to_owned(), |v| format!("{:.1}%", 100.0 * v)),
            m.five_thousandths
                .map_or_else(|| "-".to_owned(), |v| format!("{:.1}%", 100.0 * v)),
        );
    }
    html.push_str("</table></div>\n");
    html
}

#[cfg(test)]
mod tests {
    use super::*;
    use detcheck::{run_checks, CheckOptions, KindRegistry};

    #[test]
    fn escape_covers_markup_and_quotes() {
        assert_eq!(
            escape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn a_page_escapes_every_name_and_is_deterministic() {
        let text = r#"{"kind": "collective", "world_size": 3, "steps": 2, "seed": 1,
            "reduction": "arrival_order", "deterministic_comm": true, "expect": "identical",
            "description": "sums <b>& more</b>"}"#;
        let mut scenario = KindRegistry::builtin()
            .build(
                serde_json::from_str(text).unwrap(),
                std::path::Path::new("dir/<x>.json"),
            )
            .unwrap();
        scenario.name = "<script>alert(1)</script>".to_owned();
        let mut report = run_checks(&scenario, &CheckOptions::default()).unwrap();
        assert!(!report.passed());
        let outcome = &mut report.outcomes[0];
        let first = outcome.comparison.first.as_mut().unwrap();
        first.name = "grad/<w>&\"q\"".to_owned();
        outcome.comparison.notes.push("a <note>".to_owned());
        let outcome = report.outcomes[0].clone();
        let html = page(&scenario, &report, &outcome);
        assert!(!html.contains("<script>"), "{html}");
        assert!(!html.contains("<b>& more"), "{html}");
        assert!(!html.contains("<w>") && !html.contains("<note>"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("grad/&lt;w&gt;&amp;&quot;q&quot;"));
        assert!(html.contains("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(
            !html.contains(" src=") && !html.contains(" href="),
            "no external resource"
        );
        assert_eq!(html, page(&scenario, &report, &outcome));
    }

    #[test]
    fn enum_values_read_as_phrases() {
        let v = serde_json::json!({"NotReproduced": {"side": "run 2"}});
        assert_eq!(variant_text(&v), "not reproduced (side: run 2)");
        assert_eq!(variant_text(&serde_json::json!("Layout")), "layout");
        let element =
            serde_json::json!({"element": {"unavailable": {"NotCaptured": {"reason": "<x>"}}}});
        let html = element_html(&element, ("run 1", "run 2"));
        assert!(
            html.contains("Not named: not captured (reason: &lt;x&gt;)."),
            "{html}"
        );
    }

    #[test]
    fn unknown_fields_get_their_own_section() {
        let value: Value = serde_json::json!({
            "left": "x",
            "environment": [
                {"key": "OMP_NUM_THREADS", "left": "1", "right": "<4>", "ranks": [0, 1]},
                {"key": "NCCL_ALGO", "left": null, "right": "Tree", "ranks": [2]}
            ],
            "later": {"a": [1, 2]},
            "empty": []
        });
        let html = other_fields(&value, &COMPARISON_FIELDS, "h2");
        assert!(
            html.contains("<h2 id=\"environment\">Environment differences</h2>"),
            "{html}"
        );
        assert_eq!(
            html.matches("<table").count(),
            2,
            "one table of the differences: {html}"
        );
        assert!(
            html.contains("<tr><th>key</th><th>left</th><th>right</th><th>ranks</th></tr>"),
            "{html}"
        );
        assert!(
            html.contains("<th>key</th>") && html.contains("<td>NCCL_ALGO</td>"),
            "{html}"
        );
        assert!(
            html.contains("&lt;4&gt;") && html.contains("(none)"),
            "{html}"
        );
        assert!(html.contains("<h2 id=\"later\">Later</h2>"), "{html}");
        assert!(
            !html.contains("empty") && !html.contains(">Left<"),
            "{html}"
        );
    }
}
