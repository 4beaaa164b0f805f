//! The first differing element of two tensors: where, both values with their exact bits, how
//! far apart in units in the last place, and how many elements differ.
//!
//! [`ElementDetail::between`] is exact: elements are compared by their bits (two NaNs with the
//! same bits are equal, `-0.0` and `+0.0` differ), in row-major order, so the first element is
//! the lowest flat index. The ULP distance of two floats of one dtype is the number of
//! representable values between them (0 for equal bits, counted across zero); it is not
//! defined when either is NaN. Errors are computed in f64.

use crate::value::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Why two tensors have no element detail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NoElementDetail {
    /// The tensors have different dtypes or shapes.
    Layout,
    /// A re-run that captured the record did not reproduce one side's digest: the divergence
    /// depends on timing, or on something that changes every run (OS entropy, hash seeds).
    NotReproduced {
        /// Which side (`A`/`B`, or the check's label of it) the re-run did not reproduce.
        side: String,
    },
    /// The record's tensor could not be captured (the run did not record it again, or failed).
    NotCaptured {
        /// Why.
        reason: String,
    },
}

impl fmt::Display for NoElementDetail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoElementDetail::Layout => f.write_str("the tensors have different dtypes or shapes"),
            NoElementDetail::NotReproduced { side } => write!(
                f,
                "a re-run did not reproduce {side}'s record: the divergence is itself not \
                 reproducible (it depends on timing, or on something that changes every run: \
                 OS entropy, hash seeds), so no element is named"
            ),
            NoElementDetail::NotCaptured { reason } => {
                write!(f, "the tensors could not be captured: {reason}")
            }
        }
    }
}

/// The first differing element of two tensors of one dtype and shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElementDetail {
    /// Its row-major index.
    pub flat_index: u64,
    /// Its index per dimension.
    pub index: Vec<u64>,
    /// The left value, printed exactly (shortest round-trip form).
    pub left: String,
    /// The right value.
    pub right: String,
    /// The left value's bits, in hex (the element's little-endian bytes as an integer).
    pub left_bits: String,
    /// The right value's bits.
    pub right_bits: String,
    /// The distance in units in the last place (floats; `None` when a value is NaN), or the
    /// absolute difference (integers).
    pub ulps: Option<u64>,
    /// How many elements differ.
    pub num_differing: u64,
    /// How many elements there are.
    pub num_elements: u64,
    /// max |a − b| over the elements (NaN pairs aside; infinity when one side is not finite).
    pub max_abs_err: f64,
    /// max |a − b| / |b| (0 where both are 0, infinity where only b is).
    pub max_rel_err: f64,
}

/// A float's bits as an integer ordered like the floats (negative values below positive ones,
/// −0 just below +0), so that the difference of two is their distance in ULPs.
fn ordered(bits: u64, width: u32) -> i128 {
    let sign = 1u64 << (width - 1);
    let magnitude = i128::from(bits & (sign - 1));
    if bits & sign != 0 {
        -magnitude - 1
    } else {
        magnitude
    }
}

/// One element as (value in f64, bits, bit width, printed, is NaN).
struct Element {
    value: f64,
    bits: u64,
    width: u32,
    text: String,
    is_float: bool,
}

fn element(data: &TensorData, i: usize) -> Element {
    let float = |value: f64, bits: u64, width: u32, text: String| Element {
        value,
        bits,
        width,
        text,
        is_float: true,
    };
    let int = |value: f64, bits: u64, width: u32, text: String| Element {
        value,
        bits,
        width,
        text,
        is_float: false,
    };
    match data {
        TensorData::F32(v) => float(
            v[i].into(),
            v[i].to_bits().into(),
            32,
            format!("{:e}", v[i]),
        ),
        TensorData::F64(v) => float(v[i], v[i].to_bits(), 64, format!("{:e}", v[i])),
        TensorData::F16(v) => float(
            v[i].to_f64(),
            v[i].to_bits().into(),
            16,
            format!("{:e}", v[i].to_f32()),
        ),
        TensorData::BF16(v) => float(
            v[i].to_f64(),
            v[i].to_bits().into(),
            16,
            format!("{:e}", v[i].to_f32()),
        ),
        TensorData::I64(v) => int(v[i] as f64, v[i] as u64, 64, v[i].to_string()),
        TensorData::I32(v) => int(v[i].into(), u64::from(v[i] as u32), 32, v[i].to_string()),
        TensorData::U8(v) => int(v[i].into(), v[i].into(), 8, v[i].to_string()),
        TensorData::Bool(v) => int(
            f64::from(u8::from(v[i])),
            u64::from(v[i]),
            8,
            v[i].to_string(),
        ),
    }
}

impl ElementDetail {
    /// The first differing element of `left` and `right` (`Ok(None)`: every bit is equal).
    ///
    /// # Errors
    /// [`NoElementDetail::Layout`] when their dtypes or shapes differ.
    pub fn between(left: &Tensor, right: &Tensor) -> Result<Option<Self>, NoElementDetail> {
        if left.dtype() != right.dtype() || left.shape() != right.shape() {
            return Err(NoElementDetail::Layout);
        }
        let (a, b) = (left.data(), right.data());
        let n = a.len();
        let mut first: Option<usize> = None;
        let (mut differing, mut max_abs, mut max_rel) = (0u64, 0.0f64, 0.0f64);
        for i in 0..n {
            let (x, y) = (element(a, i), element(b, i));
            if x.bits == y.bits {
                continue;
            }
            differing += 1;
            first.get_or_insert(i);
            if x.value.is_nan() && y.value.is_nan() {
                continue;
            }
            let abs = (x.value - y.value).abs();
            let abs = if abs.is_nan() { f64::INFINITY } else { abs };
            let rel = if y.value == 0.0 {
                if x.value == 0.0 {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                abs / y.value.abs()
            };
            max_abs = max_abs.max(abs);
            max_rel = max_rel.max(rel);
        }
        let Some(i) = first else {
            return Ok(None);
        };
        let (x, y) = (element(a, i), element(b, i));
        let ulps = if x.is_float {
            (!x.value.is_nan() && !y.value.is_nan()).then(|| {
                (ordered(x.bits, x.width) - ordered(y.bits, y.width)).unsigned_abs() as u64
            })
        } else {
            Some((x.value - y.value).abs() as u64)
        };
        let hex_digits = (x.width / 4) as usize;
        Ok(Some(ElementDetail {
            flat_index: i as u64,
            index: multi_index(i, left.shape()),
            left: x.text,
            right: y.text,
            left_bits: format!("0x{:0hex_digits$x}", x.bits),
            right_bits: format!("0x{:0hex_digits$x}", y.bits),
            ulps,
            num_differing: differing,
            num_elements: n as u64,
            max_abs_err: max_abs,
            max_rel_err: max_rel,
        }))
    }

    /// One line for reports, with `left`/`right` labels: `[1, 2] (flat 6) of 12: run 1
    /// 1.5e0 (0x3fc00000) vs run 2 1.5000001e0 (0x3fc00001), 1 ulp apart; 3 of 12 elements
    /// differ, max |a - b| 1.2e-7, max rel 8e-8`.
    #[must_use]
    pub fn describe(&self, left: &str, right: &str) -> String {
        let ulps = match self.ulps {
            Some(1) => ", 1 ulp apart".to_owned(),
            Some(u) => format!(", {u} ulps apart"),
            None => ", NaN (no ulp distance)".to_owned(),
        };
        let index: Vec<String> = self.index.iter().map(ToString::to_string).collect();
        format!(
            "[{}] (flat {}) of {}: {left} {} ({}) vs {right} {} ({}){ulps}; {} of {} elements \
             differ, max |a - b| {:.3e}, max rel {:.3e}",
            index.join(", "),
            self.flat_index,
            self.num_elements,
            self.left,
            self.left_bits,
            self.right,
            self.right_bits,
            self.num_differing,
            self.num_elements,
            self.max_abs_err,
            self.max_rel_err
        )
    }
}

/// The per-dimension index of row-major index `flat` in `shape`.
fn multi_index(flat: usize, shape: &[usize]) -> Vec<u64> {
    let mut index = vec![0u64; shape.len()];
    let mut rest = flat;
    for (d, &extent) in shape.iter().enumerate().rev() {
        if extent == 0 {
            continue;
        }
        index[d] = (rest % extent) as u64;
        rest /= extent;
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_element_its_bits_and_ulps() {
        let a = Tensor::new(
            vec![2, 3],
            TensorData::F32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        )
        .unwrap();
        let next = f32::from_bits(6.0f32.to_bits() + 3);
        let b = Tensor::new(
            vec![2, 3],
            TensorData::F32(vec![
                1.0,
                2.0,
                3.0,
                4.0,
                f32::from_bits(5.0f32.to_bits() + 1),
                next,
            ]),
        )
        .unwrap();
        let d = ElementDetail::between(&a, &b).unwrap().unwrap();
        assert_eq!((d.flat_index, d.index.clone()), (4, vec![1, 1]));
        assert_eq!(
            (d.left_bits.as_str(), d.right_bits.as_str()),
            ("0x40a00000", "0x40a00001")
        );
        assert_eq!(d.ulps, Some(1));
        assert_eq!((d.num_differing, d.num_elements), (2, 6));
        assert!(d.describe("run 1", "run 2").starts_with(
            "[1, 1] (flat 4) of 6: run 1 5e0 (0x40a00000) vs run 2 5.0000005e0 (0x40a00001), \
             1 ulp apart; 2 of 6 elements differ"
        ));
        assert_eq!(ElementDetail::between(&a, &a).unwrap(), None);
    }

    #[test]
    fn ulps_count_across_zero_and_nan_has_none() {
        let a = Tensor::from_vec(vec![-0.0f64, f64::NAN, 1.0]);
        let b = Tensor::from_vec(vec![0.0f64, 1.0, 1.0]);
        let d = ElementDetail::between(&a, &b).unwrap().unwrap();
        assert_eq!(
            (d.flat_index, d.ulps),
            (0, Some(1)),
            "-0 and +0 are neighbours"
        );
        let smallest = Tensor::from_vec(vec![-f32::from_bits(1)]);
        let d = ElementDetail::between(&smallest, &Tensor::from_vec(vec![f32::from_bits(1)]))
            .unwrap()
            .unwrap();
        assert_eq!(d.ulps, Some(3), "-min, -0, +0, +min");
        let d = ElementDetail::between(
            &Tensor::from_vec(vec![f64::NAN]),
            &Tensor::from_vec(vec![1.0f64]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(d.ulps, None);
        let ints = ElementDetail::between(
            &Tensor::from_vec(vec![5i64, 7]),
            &Tensor::from_vec(vec![5i64, -2]),
        )
        .unwrap()
        .unwrap();
        assert_eq!((ints.flat_index, ints.ulps), (1, Some(9)));
        assert_eq!(
            ElementDetail::between(
                &Tensor::from_vec(vec![1.0f32]),
                &Tensor::from_vec(vec![1.0f64])
            ),
            Err(NoElementDetail::Layout)
        );
    }
}
