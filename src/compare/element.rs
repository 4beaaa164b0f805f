//! The first differing element of two tensors: where, both values with their exact bits, how
//! far apart in units in the last place, and how many elements differ.
//!
//! [`ElementDetail::between`] is exact: elements are compared by their bits (two NaNs with the
//! same bits are equal, `-0.0` and `+0.0` differ), in row-major order, so the first element is
//! the lowest flat index. The ULP distance of two floats of one dtype is the number of
//! representable values between them (0 for equal bits, counted across zero); it is not
//! defined when either is NaN. Errors are computed in f64.
//!
//! Per dtype: an 8-bit float (`f8e4m3fn`, `f8e5m2`) shows its exact value and its byte, and its
//! ULP distance counts its 256 codes as for any float; integers (`i8` to `i64`, `u8`, `u16`,
//! `bool`) show the value, its two's complement bits and the absolute difference. A complex
//! element shows both parts (`1.5e0-2e0j`) and both parts' bits (`0xREAL,0xIMAG`, real first);
//! its ULP distance is the larger of the two parts' distances, its error `|a − b|` the modulus
//! of the complex difference.

use crate::value::tensor::{DType, Tensor, TensorData};
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
    /// The left value's bits, in hex (the element's little-endian bytes as an integer; for a
    /// complex element the real part's, a comma, and the imaginary part's).
    pub left_bits: String,
    /// The right value's bits.
    pub right_bits: String,
    /// The distance in units in the last place (floats; `None` when a value is NaN, and for
    /// integers, which have no ulps; complex: the larger of the parts').
    pub ulps: Option<u64>,
    /// |a − b| of two integer elements (`None` for floats).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int_difference: Option<u64>,
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

/// What an element is, for its ULP distance.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Float,
    Int,
    /// Two floats of half the width each, real part in the low bits.
    Complex,
}

/// One element: its value in f64 (the real part of a complex one, whose imaginary part is
/// `imag`; 0 otherwise), its bits (the little-endian bytes as an integer) and their width,
/// printed, and its kind.
struct Element {
    value: f64,
    imag: f64,
    bits: u128,
    width: u32,
    text: String,
    kind: Kind,
}

impl Element {
    fn is_nan(&self) -> bool {
        self.value.is_nan() || self.imag.is_nan()
    }

    /// The bits in hex, `width / 4` digits (complex: each part's, real first).
    fn hex(&self) -> String {
        if self.kind == Kind::Complex {
            let half = self.width / 2;
            let digits = (half / 4) as usize;
            let mask = (1u128 << half) - 1;
            format!(
                "0x{:0digits$x},0x{:0digits$x}",
                self.bits & mask,
                self.bits >> half
            )
        } else {
            let digits = (self.width / 4) as usize;
            format!("0x{:0digits$x}", self.bits)
        }
    }
}

/// A complex number printed as numpy does, in Rust's exponent form: `1.5e0-2e0j`.
fn complex_text(re: f64, im: f64, part: impl Fn(f64) -> String) -> String {
    let sign = if im.is_sign_negative() && !im.is_nan() {
        '-'
    } else {
        '+'
    };
    format!("{}{sign}{}j", part(re), part(im.abs()))
}

fn element(data: &TensorData, i: usize) -> Element {
    let float = |value: f64, bits: u64, width: u32, text: String| Element {
        value,
        imag: 0.0,
        bits: bits.into(),
        width,
        text,
        kind: Kind::Float,
    };
    let int = |value: f64, bits: u64, width: u32, text: String| Element {
        value,
        imag: 0.0,
        bits: bits.into(),
        width,
        text,
        kind: Kind::Int,
    };
    let f8 = |dtype: DType, bits: u8| {
        let value = dtype.f8_to_f64(bits).expect("an 8-bit float dtype");
        float(value, bits.into(), 8, format!("{value:e}"))
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
        TensorData::F8E4M3(v) => f8(DType::F8E4M3, v[i]),
        TensorData::F8E5M2(v) => f8(DType::F8E5M2, v[i]),
        TensorData::I64(v) => int(v[i] as f64, v[i] as u64, 64, v[i].to_string()),
        TensorData::I32(v) => int(v[i].into(), u64::from(v[i] as u32), 32, v[i].to_string()),
        TensorData::I16(v) => int(v[i].into(), u64::from(v[i] as u16), 16, v[i].to_string()),
        TensorData::I8(v) => int(v[i].into(), u64::from(v[i] as u8), 8, v[i].to_string()),
        TensorData::U16(v) => int(v[i].into(), v[i].into(), 16, v[i].to_string()),
        TensorData::U8(v) => int(v[i].into(), v[i].into(), 8, v[i].to_string()),
        TensorData::Bool(v) => int(
            f64::from(u8::from(v[i])),
            u64::from(v[i]),
            8,
            v[i].to_string(),
        ),
        TensorData::C64(v) => {
            let [re, im] = v[i];
            Element {
                value: re.into(),
                imag: im.into(),
                bits: u128::from(re.to_bits()) | u128::from(im.to_bits()) << 32,
                width: 64,
                text: complex_text(re.into(), im.into(), |x| format!("{:e}", x as f32)),
                kind: Kind::Complex,
            }
        }
        TensorData::C128(v) => {
            let [re, im] = v[i];
            Element {
                value: re,
                imag: im,
                bits: u128::from(re.to_bits()) | u128::from(im.to_bits()) << 64,
                width: 128,
                text: complex_text(re, im, |x| format!("{x:e}")),
                kind: Kind::Complex,
            }
        }
    }
}

/// The distance in ULPs of two floating-point elements of one dtype (`None` when either is
/// NaN), or the absolute difference of two integers.
fn ulps(x: &Element, y: &Element) -> Option<u64> {
    let float_ulps = |a: u128, b: u128, width: u32| {
        let (a, b) = (a as u64, b as u64);
        (ordered(a, width) - ordered(b, width)).unsigned_abs() as u64
    };
    match x.kind {
        Kind::Int => Some((x.value - y.value).abs() as u64),
        _ if x.is_nan() || y.is_nan() => None,
        Kind::Float => Some(float_ulps(x.bits, y.bits, x.width)),
        Kind::Complex => {
            let half = x.width / 2;
            let mask = (1u128 << half) - 1;
            let re = float_ulps(x.bits & mask, y.bits & mask, half);
            let im = float_ulps(x.bits >> half, y.bits >> half, half);
            Some(re.max(im))
        }
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
            if x.is_nan() && y.is_nan() {
                continue;
            }
            // The modulus (imaginary parts are 0 but for complex elements).
            let modulus = |re: f64, im: f64| {
                if x.kind == Kind::Complex {
                    re.hypot(im)
                } else {
                    re.abs()
                }
            };
            let abs = modulus(x.value - y.value, x.imag - y.imag);
            let abs = if abs.is_nan() { f64::INFINITY } else { abs };
            let rel = if y.value == 0.0 && y.imag == 0.0 {
                if x.value == 0.0 && x.imag == 0.0 {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                abs / modulus(y.value, y.imag)
            };
            max_abs = max_abs.max(abs);
            max_rel = max_rel.max(rel);
        }
        let Some(i) = first else {
            return Ok(None);
        };
        let (x, y) = (element(a, i), element(b, i));
        Ok(Some(ElementDetail {
            flat_index: i as u64,
            index: multi_index(i, left.shape()),
            left_bits: x.hex(),
            right_bits: y.hex(),
            ulps: (x.kind != Kind::Int).then(|| ulps(&x, &y)).flatten(),
            int_difference: (x.kind == Kind::Int).then(|| ulps(&x, &y)).flatten(),
            left: x.text,
            right: y.text,
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
        let ulps = match (self.ulps, self.int_difference) {
            (_, Some(d)) => format!(", {d} apart"),
            (Some(1), None) => ", 1 ulp apart".to_owned(),
            (Some(u), None) => format!(", {u} ulps apart"),
            (None, None) => ", NaN (no ulp distance)".to_owned(),
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
        // Integers (token ids, sample indices) have no ulps: their difference.
        assert_eq!(
            (ints.flat_index, ints.ulps, ints.int_difference),
            (1, None, Some(9))
        );
        assert!(ints.describe("a", "b").contains(", 9 apart;"), "{ints:?}");
        assert_eq!(
            ElementDetail::between(
                &Tensor::from_vec(vec![1.0f32]),
                &Tensor::from_vec(vec![1.0f64])
            ),
            Err(NoElementDetail::Layout)
        );
    }

    #[test]
    fn eight_bit_floats_show_their_value_and_byte() {
        let f8 = |dtype: DType, codes: Vec<u8>| {
            let data = match dtype {
                DType::F8E4M3 => TensorData::F8E4M3(codes),
                _ => TensorData::F8E5M2(codes),
            };
            Tensor::new(vec![data.len()], data).unwrap()
        };
        // e4m3fn: 1.0 (0x38) vs 1.125 (0x39), one code apart; 448 vs 416; 2^-9 vs -2^-9.
        let a = f8(DType::F8E4M3, vec![0x38, 0x7e, 0x01]);
        let b = f8(DType::F8E4M3, vec![0x39, 0x7d, 0x81]);
        let d = ElementDetail::between(&a, &b).unwrap().unwrap();
        assert_eq!((d.left.as_str(), d.right.as_str()), ("1e0", "1.125e0"));
        assert_eq!(
            (d.left_bits.as_str(), d.right_bits.as_str()),
            ("0x38", "0x39")
        );
        assert_eq!((d.ulps, d.num_differing, d.max_abs_err), (Some(1), 3, 32.0));
        let nan = ElementDetail::between(
            &f8(DType::F8E4M3, vec![0x7e]),
            &f8(DType::F8E4M3, vec![0x7f]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (nan.left.as_str(), nan.right.as_str(), nan.ulps),
            ("4.48e2", "NaN", None)
        );
        // The smallest subnormals across zero: 2^-9, +0, -0, -2^-9.
        let across = ElementDetail::between(
            &f8(DType::F8E4M3, vec![0x01]),
            &f8(DType::F8E4M3, vec![0x81]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(across.ulps, Some(3));
        // e5m2: 57344 and +Inf are neighbours.
        let d = ElementDetail::between(
            &f8(DType::F8E5M2, vec![0x7b]),
            &f8(DType::F8E5M2, vec![0x7c]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (d.left.as_str(), d.right.as_str(), d.ulps),
            ("5.7344e4", "inf", Some(1))
        );
        assert_eq!(d.right_bits, "0x7c");
    }

    #[test]
    fn narrow_integers_show_their_twos_complement_bits() {
        let d = ElementDetail::between(
            &Tensor::from_vec(vec![-1i8, 5]),
            &Tensor::from_vec(vec![3i8, 5]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (
                d.left.as_str(),
                d.left_bits.as_str(),
                d.right_bits.as_str(),
                d.int_difference
            ),
            ("-1", "0xff", "0x03", Some(4))
        );
        let d = ElementDetail::between(
            &Tensor::from_vec(vec![i16::MIN]),
            &Tensor::from_vec(vec![i16::MAX]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (d.left_bits.as_str(), d.int_difference),
            ("0x8000", Some(65535))
        );
        let d = ElementDetail::between(
            &Tensor::from_vec(vec![65535u16]),
            &Tensor::from_vec(vec![1u16]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (d.left.as_str(), d.left_bits.as_str(), d.int_difference),
            ("65535", "0xffff", Some(65534))
        );
    }

    #[test]
    fn complex_elements_show_both_parts() {
        let a = Tensor::from_vec(vec![[1.0f32, 2.0], [1.5, -2.0]]);
        let b = Tensor::from_vec(vec![
            [1.0f32, 2.0],
            [1.5, f32::from_bits((-2.0f32).to_bits() + 2)],
        ]);
        let d = ElementDetail::between(&a, &b).unwrap().unwrap();
        assert_eq!(d.flat_index, 1);
        assert_eq!(
            (d.left.as_str(), d.right.as_str()),
            ("1.5e0-2e0j", "1.5e0-2.0000005e0j")
        );
        assert_eq!(
            (d.left_bits.as_str(), d.right_bits.as_str()),
            ("0x3fc00000,0xc0000000", "0x3fc00000,0xc0000002")
        );
        // The larger part's distance; the error is the modulus of the difference.
        assert_eq!(d.ulps, Some(2));
        assert!(d
            .describe("A", "B")
            .contains("A 1.5e0-2e0j (0x3fc00000,0xc0000000) vs B"));
        let c = ElementDetail::between(
            &Tensor::from_vec(vec![[3.0f64, 0.0]]),
            &Tensor::from_vec(vec![[0.0f64, 4.0]]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (c.left.as_str(), c.right.as_str()),
            ("3e0+0e0j", "0e0+4e0j")
        );
        assert_eq!(c.left_bits, "0x4008000000000000,0x0000000000000000");
        assert_eq!((c.max_abs_err, c.max_rel_err), (5.0, 1.25));
        let nan = ElementDetail::between(
            &Tensor::from_vec(vec![[1.0f64, f64::NAN]]),
            &Tensor::from_vec(vec![[1.0f64, 0.0]]),
        )
        .unwrap()
        .unwrap();
        assert_eq!((nan.left.as_str(), nan.ulps), ("1e0+NaNj", None));
    }
}
