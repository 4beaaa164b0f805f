//! Loss curves: one scalar per step from two runs, compared within a tolerance and plotted.
//!
//! [`load_curve`] reads a [`Curve`] from a detcheck dump (the scalar record of a name, `loss` by
//! default, on rank 0: its value is the record's mean, exact for a one-element tensor) or from a
//! Hugging Face `trainer_state.json` (`log_history` entries that have the key and a `step`).
//! [`compare_curves`] applies numpy's `allclose` rule, |a − b| ≤ atol + rtol·|b| (B is the
//! reference), to the first two common steps (MindSpore's check that randomness is fixed) and to the
//! whole run, and finds the first step beyond tolerance. `plot` draws both curves and their
//! difference with the tolerance band, as PNG and SVG.
//!
//! Determinism: pure functions of the two inputs; the plot's bytes depend only on the curves.
//! Limits: one scalar per step (the first occurrence when a step records the name twice); a NaN is
//! never close to anything (numpy's default).

use crate::file::source::TensorReads;
use crate::file::{open_dump, Batch, DumpError};
use crate::picture::{axis_label, Anchor, Figure, BLACK, GREY, LIGHT_GREY, PALETTE};
use crate::record::Trace;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One scalar per step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    /// Where it came from, for legends.
    pub label: String,
    /// The scalar's name (`loss`).
    pub name: String,
    /// (step, value), ascending steps, one point per step.
    pub points: Vec<(u64, f64)>,
}

/// Why a curve could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CurveError {
    /// The dump could not be read.
    #[error(transparent)]
    Dump(#[from] DumpError),
    /// A JSON file could not be read or parsed.
    #[error("{}: {detail}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// What is wrong (names the field).
        detail: String,
    },
    /// Nothing of that name was found.
    #[error("{}: no scalar named `{name}` was found{hint}", path.display())]
    NotFound {
        /// The file or folder.
        path: PathBuf,
        /// The name looked for.
        name: String,
        /// What names there are.
        hint: String,
    },
    /// The record of that name is not a scalar, or has no statistics to read it from.
    #[error("{}: `{name}` at step {step}: {detail}", path.display())]
    NotScalar {
        /// The folder.
        path: PathBuf,
        /// The name.
        name: String,
        /// The step.
        step: u64,
        /// Why its value cannot be read.
        detail: String,
    },
}

/// Reads the curve of `name` from a dump folder or a `trainer_state.json` file.
///
/// # Errors
/// [`CurveError`] naming the file when it cannot be read, the name is absent, or the record is
/// not a scalar with statistics.
pub fn load_curve(path: &Path, name: &str) -> Result<Curve, CurveError> {
    let points = if path.is_dir() {
        from_dump(path, name)?
    } else {
        from_trainer_state(path, name)?
    };
    if points.is_empty() {
        return Err(CurveError::NotFound {
            path: path.to_owned(),
            name: name.to_owned(),
            hint: String::new(),
        });
    }
    Ok(Curve {
        label: path.display().to_string(),
        name: name.to_owned(),
        points,
    })
}

/// The curve of `name` in an in-memory run (a check's): rank 0's one-element records of that
/// name, one point per step (the first when a step has two), the value from the record's mean.
/// `None` when rank 0 has no such record with statistics (md5-level records have none).
#[must_use]
pub fn curve_of_trace(trace: &Trace, name: &str, label: &str) -> Option<Curve> {
    let rank0 = trace.ranks.first()?;
    let mut points: Vec<(u64, f64)> = Vec::new();
    for r in rank0.records.iter().filter(|r| r.name == name) {
        // A scalar: every dimension 1 (a shape from a file may overflow a product).
        if r.shape.iter().any(|&d| d != 1) || points.last().is_some_and(|p| p.0 == r.step) {
            continue;
        }
        if let Some(value) = r.stats.mean {
            points.push((r.step, value.0));
        }
    }
    (!points.is_empty()).then(|| Curve {
        label: label.to_owned(),
        name: name.to_owned(),
        points,
    })
}

fn from_dump(path: &Path, name: &str) -> Result<Vec<(u64, f64)>, CurveError> {
    let dump = open_dump(path)?;
    let mut rank0 = dump.open_rank(0)?;
    rank0.will_read(TensorReads::None); // the values are the trace's statistics
    let mut batch = Batch::default();
    let mut points = Vec::new();
    while let Some(step) = rank0.next_step(&mut batch)? {
        let names = rank0.names();
        let Some(i) = batch
            .entries
            .iter()
            .position(|e| names[e.name as usize] == name)
        else {
            continue;
        };
        let e = &batch.entries[i];
        let layout = &rank0.layouts()[e.layout as usize];
        let not_scalar = |detail: String| CurveError::NotScalar {
            path: path.to_owned(),
            name: name.to_owned(),
            step,
            detail,
        };
        if layout.num_elements() != 1 {
            return Err(not_scalar(format!(
                "is {}, not a scalar",
                layout.describe()
            )));
        }
        let value = batch
            .stats(i)
            .and_then(|s| s.mean.or(s.max))
            .ok_or_else(|| {
                not_scalar(
                    "the dump holds no statistics to read its value from (dump with --mode stats or full)"
                        .into(),
                )
            })?;
        points.push((step, value.0));
    }
    Ok(points)
}

fn from_trainer_state(path: &Path, name: &str) -> Result<Vec<(u64, f64)>, CurveError> {
    let json_err = |detail: String| CurveError::Json {
        path: path.to_owned(),
        detail,
    };
    let text = crate::file::read_input(path)
        .map_err(|e| CurveError::Dump(DumpError::io("read", path, e)))?;
    let doc: Value =
        serde_json::from_slice(&text).map_err(|e| json_err(format!("invalid JSON: {e}")))?;
    if !doc.is_object() {
        return Err(json_err(
            "the top level: expected an object (a trainer_state.json)".into(),
        ));
    }
    let history = doc
        .get("log_history")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            json_err("field `log_history`: expected an array (a trainer_state.json)".into())
        })?;
    let mut points = BTreeMap::new();
    for (i, entry) in history.iter().enumerate() {
        // An entry is an object of named values, never read (or skipped) as an array.
        if !entry.is_object() {
            return Err(json_err(format!(
                "field `log_history[{i}]`: expected an object, got {}",
                kind_of(entry)
            )));
        }
        let Some(value) = entry.get(name) else {
            continue;
        };
        let value = value.as_f64().ok_or_else(|| {
            json_err(format!(
                "field `log_history[{i}].{name}`: expected a number, got {value}"
            ))
        })?;
        let step = entry.get("step").and_then(Value::as_u64).ok_or_else(|| {
            json_err(format!(
                "field `log_history[{i}].step`: expected a non-negative integer"
            ))
        })?;
        points.entry(step).or_insert(value);
    }
    if points.is_empty() {
        let mut keys: Vec<&str> = history
            .iter()
            .filter_map(Value::as_object)
            .flat_map(|o| o.keys().map(String::as_str))
            .filter(|k| *k != "step")
            .collect();
        keys.sort_unstable();
        keys.dedup();
        return Err(CurveError::NotFound {
            path: path.to_owned(),
            name: name.to_owned(),
            hint: format!(" in `log_history` (keys there: {})", keys.join(", ")),
        });
    }
    Ok(points.into_iter().collect())
}

/// What a JSON value is, in an error: `an array`, `a number`, ...
fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The `allclose` tolerance: |a − b| ≤ atol + rtol·|b|.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance (relative to B).
    pub rtol: f64,
}

impl Default for Tolerance {
    /// MindSpore's check: atol = rtol = 1e-3.
    fn default() -> Self {
        Tolerance {
            atol: 1e-3,
            rtol: 1e-3,
        }
    }
}

impl Tolerance {
    /// `true` when `a` is within tolerance of `b` (NaN is never close).
    #[must_use]
    pub fn is_close(&self, a: f64, b: f64) -> bool {
        (a == b && a.is_finite()) || (a - b).abs() <= self.atol + self.rtol * b.abs()
    }
}

/// The verdict on two curves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[must_use]
pub struct CurveComparison {
    /// The tolerance applied.
    pub tolerance: Tolerance,
    /// Steps both curves have.
    pub num_common: usize,
    /// Steps only A has.
    pub only_left: Vec<u64>,
    /// Steps only B has.
    pub only_right: Vec<u64>,
    /// `allclose` over the first two common steps (`None` with fewer than two).
    pub first_two_close: Option<bool>,
    /// `allclose` over every common step, and no step missing on either side.
    pub all_close: bool,
    /// The first step beyond tolerance: (step, a, b).
    pub first_beyond: Option<(u64, f64, f64)>,
    /// The largest |a − b| and its step.
    pub max_abs_diff: Option<(u64, f64)>,
}

/// Compares two curves step by step.
pub fn compare_curves(a: &Curve, b: &Curve, tolerance: Tolerance) -> CurveComparison {
    let right: BTreeMap<u64, f64> = b.points.iter().copied().collect();
    let left: BTreeMap<u64, f64> = a.points.iter().copied().collect();
    let common: Vec<(u64, f64, f64)> = a
        .points
        .iter()
        .filter_map(|&(s, x)| right.get(&s).map(|&y| (s, x, y)))
        .collect();
    let only_left = a
        .points
        .iter()
        .map(|p| p.0)
        .filter(|s| !right.contains_key(s))
        .collect::<Vec<_>>();
    let only_right = b
        .points
        .iter()
        .map(|p| p.0)
        .filter(|s| !left.contains_key(s))
        .collect::<Vec<_>>();
    let first_beyond = common
        .iter()
        .find(|&&(_, x, y)| !tolerance.is_close(x, y))
        .copied();
    let first_two_close = (common.len() >= 2).then(|| {
        common[..2]
            .iter()
            .all(|&(_, x, y)| tolerance.is_close(x, y))
    });
    // A NaN difference counts as the largest; ties keep the earliest step.
    let rank = |d: f64| if d.is_nan() { f64::INFINITY } else { d };
    let mut max_abs_diff: Option<(u64, f64)> = None;
    for &(s, x, y) in &common {
        let d = (x - y).abs();
        if max_abs_diff.is_none_or(|(_, best)| rank(d) > rank(best)) {
            max_abs_diff = Some((s, d));
        }
    }
    CurveComparison {
        tolerance,
        num_common: common.len(),
        all_close: first_beyond.is_none()
            && only_left.is_empty()
            && only_right.is_empty()
            && !common.is_empty(),
        only_left,
        only_right,
        first_two_close,
        first_beyond,
        max_abs_diff,
    }
}

/// Writes `STEM.png` and `STEM.svg`: both curves above, their difference and the tolerance band
/// below. Returns the two paths.
///
/// # Errors
/// [`DumpError::Io`] when a file cannot be written.
pub fn write_curve_plots(
    a: &Curve,
    b: &Curve,
    cmp: &CurveComparison,
    stem: &Path,
) -> Result<(PathBuf, PathBuf), DumpError> {
    let figure = plot(a, b, cmp);
    let mut png = stem.as_os_str().to_owned();
    png.push(".png");
    let mut svg = stem.as_os_str().to_owned();
    svg.push(".svg");
    let (png, svg) = (PathBuf::from(png), PathBuf::from(svg));
    figure.write_png(&png)?;
    figure.write_svg(&svg)?;
    Ok((png, svg))
}

/// The plot of [`write_curve_plots`] as SVG text (to embed in a page): both curves above, their
/// difference and the tolerance band below. Its bytes depend only on the curves.
#[must_use]
pub fn curve_plot_svg(a: &Curve, b: &Curve, cmp: &CurveComparison) -> String {
    plot(a, b, cmp).to_svg()
}

/// A panel: pixel box and data ranges.
struct Panel {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
    x_range: (f64, f64),
    y_range: (f64, f64),
}

impl Panel {
    fn px(&self, sx: f64, sy: f64) -> (f64, f64) {
        let (x0, x1) = self.x_range;
        let (y0, y1) = self.y_range;
        (
            self.x + (sx - x0) / (x1 - x0) * self.w,
            self.y + self.h - (sy - y0) / (y1 - y0) * self.h,
        )
    }

    fn axes(&self, f: &mut Figure, y_label: &str) {
        f.frame(self.x, self.y, self.w, self.h, BLACK);
        for i in 0..=4 {
            let t = f64::from(i) / 4.0;
            let sx = self.x_range.0 + t * (self.x_range.1 - self.x_range.0);
            let sy = self.y_range.0 + t * (self.y_range.1 - self.y_range.0);
            let (px, _) = self.px(sx, self.y_range.0);
            let (_, py) = self.px(self.x_range.0, sy);
            f.line(
                vec![(px, self.y + self.h), (px, self.y + self.h + 4.0)],
                BLACK,
                1.0,
            );
            f.text(
                px,
                self.y + self.h + 16.0,
                &axis_label(sx.round()),
                BLACK,
                Anchor::Middle,
            );
            f.line(vec![(self.x - 4.0, py), (self.x, py)], BLACK, 1.0);
            f.line(vec![(self.x, py), (self.x + self.w, py)], LIGHT_GREY, 1.0);
            f.text(self.x - 6.0, py + 4.0, &axis_label(sy), BLACK, Anchor::End);
        }
        f.text(self.x, self.y - 6.0, y_label, BLACK, Anchor::Start);
    }
}

fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if hi - lo < 1e-12 {
        let pad = lo.abs().max(1e-6) * 0.05;
        return (lo - pad, hi + pad);
    }
    let pad = (hi - lo) * 0.05;
    (lo - pad, hi + pad)
}

/// Polylines through the finite points (a NaN or Inf breaks the line).
fn draw_series(f: &mut Figure, panel: &Panel, points: &[(u64, f64)], color: crate::picture::Rgb) {
    let mut run = Vec::new();
    for &(s, v) in points {
        if v.is_finite() {
            run.push(panel.px(s as f64, v));
        } else {
            f.line(std::mem::take(&mut run), color, 2.0);
        }
    }
    if run.len() == 1 {
        let (x, y) = run[0];
        f.rect(x - 2.0, y - 2.0, 4.0, 4.0, color);
    }
    f.line(run, color, 2.0);
}

fn plot(a: &Curve, b: &Curve, cmp: &CurveComparison) -> Figure {
    let (width, height) = (860u32, 600u32);
    let mut f = Figure::new(width, height);
    let tol = cmp.tolerance;
    let steps = a.points.iter().chain(&b.points).map(|p| p.0 as f64);
    let (mut x0, mut x1) = steps
        .clone()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), s| {
            (lo.min(s), hi.max(s))
        });
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 - x0 < 1.0 {
        x1 = x0 + 1.0;
    }
    let verdict = if cmp.all_close {
        "allclose: yes"
    } else {
        "allclose: NO"
    };
    f.text(
        80.0,
        20.0,
        &format!(
            "{} of two runs  ({verdict}, atol {} rtol {})",
            a.name,
            axis_label(tol.atol),
            axis_label(tol.rtol)
        ),
        BLACK,
        Anchor::Start,
    );
    let top = Panel {
        x: 80.0,
        y: 72.0,
        w: 740.0,
        h: 264.0,
        x_range: (x0, x1),
        y_range: range(a.points.iter().chain(&b.points).map(|p| p.1)),
    };
    top.axes(&mut f, &a.name);
    draw_series(&mut f, &top, &b.points, PALETTE[1]);
    draw_series(&mut f, &top, &a.points, PALETTE[0]);
    // Legend.
    for (i, (curve, color)) in [(a, PALETTE[0]), (b, PALETTE[1])].iter().enumerate() {
        let y = 40.0;
        let x = 80.0 + 380.0 * i as f64;
        f.line(vec![(x, y - 4.0), (x + 20.0, y - 4.0)], *color, 2.0);
        let mut label = format!("{}: {}", ["A", "B"][i], curve.label);
        if label.len() > 50 {
            label = format!(
                "{}: ...{}",
                ["A", "B"][i],
                &curve.label[curve.label.len() - 42..]
            );
        }
        f.text(x + 26.0, y, &label, BLACK, Anchor::Start);
    }
    // The difference, with the tolerance band.
    let right: BTreeMap<u64, f64> = b.points.iter().copied().collect();
    let diff: Vec<(u64, f64)> = a
        .points
        .iter()
        .filter_map(|&(s, x)| right.get(&s).map(|&y| (s, x - y)))
        .collect();
    let band: Vec<(u64, f64)> = b
        .points
        .iter()
        .map(|&(s, y)| (s, tol.atol + tol.rtol * y.abs()))
        .collect();
    let bottom = Panel {
        x: 80.0,
        y: 396.0,
        w: 740.0,
        h: 160.0,
        x_range: (x0, x1),
        y_range: range(
            diff.iter()
                .map(|p| p.1)
                .chain(band.iter().flat_map(|p| [p.1, -p.1])),
        ),
    };
    bottom.axes(&mut f, "A - B, and the tolerance band +-(atol + rtol*|B|)");
    let upper: Vec<(u64, f64)> = band.clone();
    let lower: Vec<(u64, f64)> = band.iter().map(|&(s, t)| (s, -t)).collect();
    draw_series(&mut f, &bottom, &upper, GREY);
    draw_series(&mut f, &bottom, &lower, GREY);
    draw_series(&mut f, &bottom, &diff, PALETTE[2]);
    if let Some((step, _, _)) = cmp.first_beyond {
        for panel in [&top, &bottom] {
            let (x, _) = panel.px(step as f64, panel.y_range.0);
            f.line(vec![(x, panel.y), (x, panel.y + panel.h)], PALETTE[2], 1.0);
        }
        f.text(
            80.0,
            f64::from(height) - 14.0,
            &format!("first step beyond tolerance: {step}"),
            PALETTE[2],
            Anchor::Start,
        );
    } else {
        f.text(
            80.0,
            f64::from(height) - 14.0,
            "every common step is within tolerance",
            GREY,
            Anchor::Start,
        );
    }
    f.text(820.0, f64::from(height) - 14.0, "step", GREY, Anchor::End);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(points: &[(u64, f64)]) -> Curve {
        Curve {
            label: "x".into(),
            name: "loss".into(),
            points: points.to_vec(),
        }
    }

    #[test]
    fn allclose_uses_numpys_rule_and_finds_the_first_step_beyond() {
        let a = curve(&[(0, 1.0), (1, 0.9), (2, 0.8), (3, 0.7)]);
        let b = curve(&[(0, 1.0005), (1, 0.9), (2, 0.81), (3, 0.75)]);
        let cmp = compare_curves(&a, &b, Tolerance::default());
        assert_eq!(cmp.first_two_close, Some(true));
        assert!(!cmp.all_close);
        assert_eq!(cmp.first_beyond.map(|p| p.0), Some(2));
        assert_eq!(cmp.max_abs_diff.map(|p| p.0), Some(3));
        let same = compare_curves(&a, &a, Tolerance::default());
        assert!(same.all_close);
        let nan = curve(&[(0, f64::NAN), (1, 0.9)]);
        assert_eq!(
            compare_curves(&nan, &nan, Tolerance::default())
                .first_beyond
                .map(|p| p.0),
            Some(0)
        );
    }

    /// A record's shape read from a file may overflow its product: only all-ones is a scalar.
    #[test]
    fn a_shape_whose_product_overflows_is_not_a_scalar() {
        use crate::record::{RankTrace, Record, Trace};
        use crate::value::digest::{ExactF64, Md5Digest, Stats};
        let record = |step: u64, shape: Vec<usize>| Record {
            rank: 0,
            step,
            seq: 0,
            name: "loss".into(),
            replicated: true,
            dtype: crate::value::tensor::DType::F32,
            shape,
            md5: Md5Digest([0; 16]),
            stats: Stats {
                mean: Some(ExactF64(0.5)),
                ..Stats::default()
            },
            shard: None,
        };
        let trace = Trace {
            ranks: vec![RankTrace {
                rank: 0,
                records: vec![
                    record(0, vec![1, 1]),
                    record(1, vec![3, 6_148_914_691_236_517_206]),
                    record(2, vec![]),
                ],
                environment: None,
                digest: crate::value::DigestKind::CURRENT,
            }],
        };
        let curve = curve_of_trace(&trace, "loss", "x").unwrap();
        assert_eq!(curve.points, [(0, 0.5), (2, 0.5)]);
    }

    #[test]
    fn missing_steps_fail_the_whole_run() {
        let a = curve(&[(0, 1.0), (1, 0.9), (2, 0.8)]);
        let b = curve(&[(0, 1.0), (1, 0.9)]);
        let cmp = compare_curves(&a, &b, Tolerance::default());
        assert_eq!(cmp.only_left, [2]);
        assert!(!cmp.all_close);
        assert_eq!(cmp.first_beyond, None);
    }

    #[test]
    fn trainer_state_log_history_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trainer_state.json");
        std::fs::write(
            &path,
            r#"{"log_history": [{"step": 10, "loss": 2.5, "learning_rate": 0.1},
                                {"step": 10, "eval_loss": 3.0}, {"step": 20, "loss": 2.25}]}"#,
        )
        .unwrap();
        let c = load_curve(&path, "loss").unwrap();
        assert_eq!(c.points, [(10, 2.5), (20, 2.25)]);
        let err = load_curve(&path, "accuracy").unwrap_err().to_string();
        assert!(err.contains("no scalar named `accuracy`"), "{err}");
        assert!(err.contains("eval_loss, learning_rate, loss"), "{err}");
        std::fs::write(&path, r#"{"log_history": [{"step": 1, "loss": "x"}]}"#).unwrap();
        let err = load_curve(&path, "loss").unwrap_err().to_string();
        assert!(err.contains("field `log_history[0].loss`"), "{err}");
    }

    /// Issue 16: an entry of `log_history` given as an array is refused naming it (it was
    /// skipped), and so is a file that is not an object.
    #[test]
    fn trainer_state_entries_and_the_file_are_objects_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trainer_state.json");
        std::fs::write(
            &path,
            r#"{"log_history": [{"step": 10, "loss": 2.5}, [20, 2.25]]}"#,
        )
        .unwrap();
        let err = load_curve(&path, "loss").unwrap_err().to_string();
        assert!(
            err.contains("field `log_history[1]`: expected an object, got an array"),
            "{err}"
        );
        std::fs::write(&path, r#"[{"log_history": []}]"#).unwrap();
        let err = load_curve(&path, "loss").unwrap_err().to_string();
        assert!(err.contains("the top level: expected an object"), "{err}");
    }
}
