//! Overflow reports: the first place a NaN, an infinity or fp16 saturation appears.
//!
//! [`first_overflow`] scans a trace's statistics in the order of a divergence (earliest step, then
//! record, then rank) and returns the first record whose tensor holds a NaN, a ±Inf, or a value of
//! magnitude 65504 or more: the largest fp16 value, which a device in saturation mode writes
//! instead of Inf (msprobe's overflow check looks for the same thing). It needs statistics: a
//! record without them (md5 mode) is never reported.
//!
//! Determinism: a pure function of the statistics.
//! Limits: saturation is judged on max/min of any float dtype, so an f32 tensor that legitimately
//! holds values beyond 65504 is reported too (it would overflow in fp16).

use crate::record::Trace;
use crate::value::digest::{ExactF64, Stats};
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
    /// A finite value of magnitude ≥ 65504 (fp16 saturation).
    Saturated {
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
            OverflowKind::Saturated { max_abs } => {
                write!(f, "max |x| = {:e} reaches the fp16 limit 65504", max_abs.0)
            }
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

/// What overflowed in a tensor with these statistics, if anything (NaN first, then Inf).
pub(crate) fn classify(s: &Stats) -> Option<OverflowKind> {
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
    (max_abs >= FP16_MAX).then_some(OverflowKind::Saturated {
        max_abs: ExactF64(max_abs),
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
            if let Some(kind) = classify(&r.stats) {
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
        let of = |v: Vec<f32>| classify(&Stats::of_tensor(&Tensor::from_vec(v)));
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
                max_abs: ExactF64(65504.0)
            })
        );
        assert_eq!(of(vec![65503.0]), None);
        assert_eq!(classify(&Stats::default()), None, "md5-only records");
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
