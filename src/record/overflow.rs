//! Overflow reports: the first place a NaN, an infinity or saturation appears.
//!
//! [`first_overflow`] scans a trace's statistics in the order of a divergence (earliest step, then
//! record, then rank) and returns the first floating-point record whose tensor holds a NaN, a
//! ±Inf, or a value at its dtype's largest finite magnitude ([`DType::finite_max`]: 65504 for
//! fp16, which a device in saturation mode writes instead of Inf, as msprobe's overflow check
//! looks for). Integer and boolean records (sample indices, token ids, masks) never overflow
//! and are never reported. It needs statistics: a record without them (md5 mode) is never
//! reported.
//!
//! Determinism: a pure function of the statistics and dtypes.
//! Limits: saturation is judged on each record's own dtype: an f32 tensor that holds values
//! beyond 65504 is not reported, though it would overflow if cast to fp16.

use crate::record::Trace;
use crate::value::digest::{ExactF64, Stats};
use crate::value::tensor::DType;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The largest finite fp16 value; a saturating device writes it instead of ±Inf.
pub const FP16_MAX: f64 = 65504.0;

/// What overflowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverflowKind {
    /// NaN elements (`count` 0 when the source holds no counts, e.g. msprobe).
    Nan {
        /// How many.
        count: u64,
    },
    /// ±Inf elements (`count` 0 when the source holds no counts).
    Inf {
        /// How many.
        count: u64,
    },
    /// A finite value at the dtype's largest finite magnitude (saturation: 65504 for fp16).
    Saturated {
        /// The dtype's limit.
        limit: ExactF64,
        /// The largest magnitude (exact bits, so reports compare with `Eq`).
        max_abs: ExactF64,
    },
}

impl fmt::Display for OverflowKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counted = |f: &mut fmt::Formatter<'_>, what: &str, count: u64| {
            if count > 0 {
                let s = if count == 1 { "" } else { "s" };
                write!(f, "{what} in {count} element{s}")
            } else {
                f.write_str(what)
            }
        };
        match *self {
            OverflowKind::Nan { count } => counted(f, "NaN", count),
            OverflowKind::Inf { count } => counted(f, "Inf", count),
            OverflowKind::Saturated { max_abs, limit } => write!(
                f,
                "max |x| = {:e} reaches its dtype's largest finite value {:e}",
                max_abs.0, limit.0
            ),
        }
    }
}

/// The first overflowing record of a trace or dump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overflow {
    /// Its step.
    pub step: u64,
    /// Its rank.
    pub rank: u32,
    /// Its position in the step.
    pub seq: u32,
    /// The tensor's name.
    pub name: String,
    /// What overflowed.
    pub kind: OverflowKind,
}

impl fmt::Display for Overflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "step {} rank {} seq {} `{}`: {}",
            self.step, self.rank, self.seq, self.name, self.kind
        )
    }
}

/// What overflowed in a tensor of `dtype` with these statistics, if anything (NaN first, then
/// Inf, then saturation at the dtype's limit); never for an integer or boolean dtype.
pub(crate) fn classify(s: &Stats, dtype: DType) -> Option<OverflowKind> {
    let limit = dtype.finite_max()?;
    let value = |x: Option<ExactF64>| x.map(|v| v.0);
    let all = [value(s.max), value(s.min), value(s.mean), value(s.norm)];
    if s.nan > 0 || all.iter().flatten().any(|x| x.is_nan()) {
        return Some(OverflowKind::Nan { count: s.nan });
    }
    let (max, min) = (value(s.max), value(s.min));
    if s.pos_inf + s.neg_inf > 0 || [max, min].iter().flatten().any(|x| x.is_infinite()) {
        return Some(OverflowKind::Inf {
            count: s.pos_inf + s.neg_inf,
        });
    }
    let max_abs = [max, min]
        .iter()
        .flatten()
        .map(|x| x.abs())
        .fold(0.0, f64::max);
    (max_abs >= limit).then_some(OverflowKind::Saturated {
        max_abs: ExactF64(max_abs),
        limit: ExactF64(limit),
    })
}

/// The first overflow of a trace, ordered by (step, seq, rank).
#[must_use]
pub fn first_overflow(trace: &Trace) -> Option<Overflow> {
    let mut best: Option<Overflow> = None;
    for rank in &trace.ranks {
        for r in &rank.records {
            if best
                .as_ref()
                .is_some_and(|b| (r.step, r.seq, r.rank) >= (b.step, b.seq, b.rank))
            {
                break;
            }
            if let Some(kind) = classify(&r.stats, r.dtype) {
                best = Some(Overflow {
                    step: r.step,
                    rank: r.rank,
                    seq: r.seq,
                    name: r.name.clone(),
                    kind,
                });
                break;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{RecordLevel, Recorder};
    use crate::value::tensor::Tensor;

    #[test]
    fn nan_inf_and_saturation_are_classified() {
        let of = |v: Vec<f32>| classify(&Stats::of_tensor(&Tensor::from_vec(v)), DType::F16);
        assert_eq!(of(vec![1.0, 2.0]), None);
        assert_eq!(
            of(vec![1.0, f32::NAN]),
            Some(OverflowKind::Nan { count: 1 })
        );
        assert_eq!(
            of(vec![f32::NEG_INFINITY, 1.0]),
            Some(OverflowKind::Inf { count: 1 })
        );
        assert_eq!(
            of(vec![-65504.0, 1.0]),
            Some(OverflowKind::Saturated {
                max_abs: ExactF64(65504.0),
                limit: ExactF64(FP16_MAX),
            })
        );
        assert_eq!(of(vec![65503.0]), None);
        assert_eq!(
            classify(&Stats::default(), DType::F16),
            None,
            "md5-only records"
        );
    }

    /// Issue 53: imagenet's integer sample indices were reported to reach "the fp16 limit".
    /// Integers never overflow; a float is judged at its own dtype's limit.
    #[test]
    fn integers_never_overflow_and_each_float_has_its_own_limit() {
        let stats = |v: Vec<f64>| Stats::of_tensor(&Tensor::from_vec(v));
        let big = stats(vec![1_281_166.0, 3.0]);
        assert_eq!(classify(&big, DType::I64), None);
        assert_eq!(classify(&big, DType::F32), None);
        assert!(matches!(
            classify(&big, DType::F16),
            Some(OverflowKind::Saturated { .. })
        ));
        let max32 = stats(vec![f64::from(f32::MAX)]);
        assert!(classify(&max32, DType::F32).is_some());
        assert_eq!(classify(&stats(vec![f64::NAN]), DType::I32), None);
    }

    #[test]
    fn the_first_overflow_is_earliest_step_then_seq_then_rank() {
        let mut recs: Vec<_> = (0..3)
            .map(|r| Recorder::new(r, RecordLevel::Stats))
            .collect();
        let ok = Tensor::from_vec(vec![1.0f32]);
        let bad = Tensor::from_vec(vec![f32::INFINITY]);
        recs[0].record(0, "a", &ok);
        recs[0].record(1, "a", &bad);
        recs[1].record(0, "a", &ok);
        recs[1].record(0, "b", &bad);
        recs[2].record(0, "a", &ok);
        recs[2].record(0, "b", &bad);
        let trace = Trace {
            ranks: recs.into_iter().map(Recorder::finish).collect(),
        };
        let o = first_overflow(&trace).unwrap();
        assert_eq!((o.step, o.seq, o.rank, o.name.as_str()), (0, 1, 1, "b"));
        assert_eq!(o.to_string(), "step 0 rank 1 seq 1 `b`: Inf in 1 element");
    }
}
