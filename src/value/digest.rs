//! Digests and summary statistics of a tensor.
//!
//! [`Md5Digest`] is the md5 (RFC 1321, the `md-5` crate) of a tensor's canonical little-endian bytes
//! (see [`crate::Tensor::for_each_canonical_chunk`]): the same value `hashlib.md5(arr.tobytes())`
//! gives for a little-endian numpy array, so digests can be checked outside detcheck. Dtype and
//! shape are kept beside the digest in a record and compared with it.
//!
//! [`Stats`] are max, min, mean and L2 norm, accumulated in `f64` in eight interleaved lanes
//! combined in lane order (a fixed order, so a pure function of the values), and the counts of
//! NaN, +Inf and -Inf. [`ExactF64`] stores a float in JSON as its bit pattern, so NaN, infinities
//! and -0.0 survive a round trip (JSON has no NaN).
//!
//! Determinism: both are pure functions of the tensor's values; stats are summed in one fixed order.
//! A golden test pins the stats' bits.
//! Limits: stats are summaries for people, not proofs; equality of runs is decided by the md5.

use crate::value::tensor::{Tensor, TensorData};
use md5::{Digest as _, Md5};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// The md5 of a tensor's canonical bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Md5Digest(pub [u8; 16]);

impl Md5Digest {
    /// The md5 of `tensor`'s canonical bytes.
    #[must_use]
    pub fn of_tensor(tensor: &Tensor) -> Self {
        let mut hasher = Md5::new();
        tensor.for_each_canonical_chunk(|chunk| hasher.update(chunk));
        Md5Digest(hasher.finalize().into())
    }

    /// The md5 of raw bytes.
    #[must_use]
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Md5Digest(Md5::digest(bytes).into())
    }

    /// Parses 32 hex digits.
    #[must_use]
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 32 || !hex.is_ascii() {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Md5Digest(out))
    }
}

impl fmt::Display for Md5Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Md5Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Md5Digest({self})")
    }
}

impl Serialize for Md5Digest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Md5Digest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Md5Digest::from_hex(&text)
            .ok_or_else(|| serde::de::Error::custom("expected an md5 of 32 hex digits"))
    }
}

/// An `f64` that keeps its exact bits on disk: written as `"0x"` and 16 hex digits.
#[derive(Clone, Copy, Default)]
pub struct ExactF64(pub f64);

impl PartialEq for ExactF64 {
    /// Bitwise equality: NaN equals a NaN of the same payload, and 0.0 differs from -0.0.
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for ExactF64 {}

impl fmt::Debug for ExactF64 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl Serialize for ExactF64 {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&format_args!("0x{:016x}", self.0.to_bits()))
    }
}

impl<'de> Deserialize<'de> for ExactF64 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.strip_prefix("0x")
            .filter(|hex| hex.len() == 16)
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
            .map(|bits| ExactF64(f64::from_bits(bits)))
            .ok_or_else(|| {
                serde::de::Error::custom("expected a float's bits as 0x and 16 hex digits")
            })
    }
}

/// Summary statistics of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Stats {
    /// Largest value that is not NaN (`None` when there is none).
    pub max: Option<ExactF64>,
    /// Smallest value that is not NaN (`None` when there is none).
    pub min: Option<ExactF64>,
    /// Arithmetic mean over all elements (`None` when empty; NaN if any element is NaN).
    pub mean: Option<ExactF64>,
    /// L2 norm over all elements (`None` when empty).
    pub norm: Option<ExactF64>,
    /// Number of NaN elements.
    pub nan: u64,
    /// Number of +Inf elements.
    pub pos_inf: u64,
    /// Number of -Inf elements.
    pub neg_inf: u64,
}

/// Number of interleaved accumulators: independent chains let the compiler vectorise, and the
/// lanes are combined in lane order, so the result is still one fixed function of the values.
const LANES: usize = 8;

/// Running accumulators for [`Stats`]: element i goes to lane i mod [`LANES`].
struct StatsAccumulator {
    max: [f64; LANES],
    min: [f64; LANES],
    sum: [f64; LANES],
    sum_sq: [f64; LANES],
    nan: u64,
    pos_inf: u64,
    neg_inf: u64,
}

impl StatsAccumulator {
    fn new() -> Self {
        StatsAccumulator {
            max: [f64::NEG_INFINITY; LANES],
            min: [f64::INFINITY; LANES],
            sum: [0.0; LANES],
            sum_sq: [0.0; LANES],
            nan: 0,
            pos_inf: 0,
            neg_inf: 0,
        }
    }

    #[inline]
    fn push_finite(&mut self, lane: usize, x: f64) {
        self.max[lane] = if x > self.max[lane] {
            x
        } else {
            self.max[lane]
        };
        self.min[lane] = if x < self.min[lane] {
            x
        } else {
            self.min[lane]
        };
        self.sum[lane] += x;
        self.sum_sq[lane] += x * x;
    }

    #[inline]
    fn push_lane(&mut self, lane: usize, x: f64) {
        if x.is_finite() {
            self.push_finite(lane, x);
        } else if x.is_nan() {
            self.nan += 1;
        } else if x > 0.0 {
            self.pos_inf += 1;
        } else {
            self.neg_inf += 1;
        }
    }

    /// Feeds `values` in index order.
    fn feed<T: Copy>(&mut self, values: &[T], to_f64: impl Fn(T) -> f64) {
        let mut blocks = values.chunks_exact(LANES);
        for block in &mut blocks {
            let xs: [f64; LANES] = std::array::from_fn(|i| to_f64(block[i]));
            if xs.iter().all(|x| x.is_finite()) {
                // The common case, without branches per element.
                for (lane, &x) in xs.iter().enumerate() {
                    self.push_finite(lane, x);
                }
            } else {
                for (lane, &x) in xs.iter().enumerate() {
                    self.push_lane(lane, x);
                }
            }
        }
        for (lane, &x) in blocks.remainder().iter().enumerate() {
            self.push_lane(lane, to_f64(x));
        }
    }

    fn finish(self, len: usize) -> Stats {
        let fold = |lanes: [f64; LANES], f: fn(f64, f64) -> f64| lanes.into_iter().reduce(f);
        let max = fold(self.max, |a, b| if b > a { b } else { a }).unwrap_or(f64::NEG_INFINITY);
        let min = fold(self.min, |a, b| if b < a { b } else { a }).unwrap_or(f64::INFINITY);
        let sum = fold(self.sum, |a, b| a + b).unwrap_or(0.0);
        let sum_sq = fold(self.sum_sq, |a, b| a + b).unwrap_or(0.0);

        let any_number = len as u64 > self.nan;
        let (max, min) = if any_number {
            (
                Some(if self.pos_inf > 0 { f64::INFINITY } else { max }),
                Some(if self.neg_inf > 0 {
                    f64::NEG_INFINITY
                } else {
                    min
                }),
            )
        } else {
            (None, None)
        };
        let (mean, norm) = if len == 0 {
            (None, None)
        } else if self.nan > 0 || (self.pos_inf > 0 && self.neg_inf > 0) {
            (
                Some(f64::NAN),
                Some(if self.nan > 0 {
                    f64::NAN
                } else {
                    f64::INFINITY
                }),
            )
        } else if self.pos_inf > 0 || self.neg_inf > 0 {
            let inf = if self.pos_inf > 0 {
                f64::INFINITY
            } else {
                f64::NEG_INFINITY
            };
            (Some(inf), Some(f64::INFINITY))
        } else {
            (Some(sum / len as f64), Some(sum_sq.sqrt()))
        };
        Stats {
            max: max.map(ExactF64),
            min: min.map(ExactF64),
            mean: mean.map(ExactF64),
            norm: norm.map(ExactF64),
            nan: self.nan,
            pos_inf: self.pos_inf,
            neg_inf: self.neg_inf,
        }
    }
}

impl Stats {
    /// Computes the statistics of `tensor` in one pass.
    #[must_use]
    pub fn of_tensor(tensor: &Tensor) -> Self {
        let mut acc = StatsAccumulator::new();
        match tensor.data() {
            TensorData::F32(v) => acc.feed(v, f64::from),
            TensorData::F64(v) => acc.feed(v, |x| x),
            TensorData::I64(v) => acc.feed(v, |x| x as f64),
            TensorData::U8(v) => acc.feed(v, f64::from),
        }
        acc.finish(tensor.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_matches_rfc1321_vectors() {
        assert_eq!(
            Md5Digest::of_bytes(b"").to_string(),
            "d41d8cd98f00b204e9800998ecf8427e"
        );
        assert_eq!(
            Md5Digest::of_bytes(b"abc").to_string(),
            "900150983cd24fb0d6963f7d28e17f72"
        );
    }

    #[test]
    fn tensor_md5_is_md5_of_little_endian_bytes() {
        // numpy: hashlib.md5(np.array([1, -2], dtype='<f4').tobytes()).hexdigest()
        let t = Tensor::from_vec(vec![1.0f32, -2.0]);
        assert_eq!(
            Md5Digest::of_tensor(&t),
            Md5Digest::of_bytes(&[0, 0, 128, 63, 0, 0, 0, 192])
        );
        let hex = Md5Digest::of_tensor(&t).to_string();
        assert_eq!(Md5Digest::from_hex(&hex), Some(Md5Digest::of_tensor(&t)));
        assert_eq!(Md5Digest::from_hex("zz"), None);
    }

    #[test]
    fn stats_of_finite_values() {
        let s = Stats::of_tensor(&Tensor::from_vec(vec![3.0f32, -4.0, 1.0]));
        assert_eq!(s.max, Some(ExactF64(3.0)));
        assert_eq!(s.min, Some(ExactF64(-4.0)));
        assert_eq!(s.mean, Some(ExactF64(0.0)));
        assert_eq!(s.norm, Some(ExactF64(26f64.sqrt())));
        assert_eq!((s.nan, s.pos_inf, s.neg_inf), (0, 0, 0));
    }

    #[test]
    fn stats_bits_do_not_change() {
        // 1003 values: 125 full blocks of eight lanes and a remainder of three.
        let values: Vec<f32> = (0..1003)
            .map(|i| ((i * 7919) % 1000) as f32 / 7.0 - 60.0)
            .collect();
        let s = Stats::of_tensor(&Tensor::from_vec(values));
        let bits: Vec<String> = [s.max, s.min, s.mean, s.norm]
            .iter()
            .map(|x| format!("{:016x}", x.unwrap().0.to_bits()))
            .collect();
        assert_eq!(
            bits.join(" "),
            "4054adb6c0000000 c04e000000000000 4026c9b540d45add 409534ae31fd62d6"
        );
    }

    #[test]
    fn stats_count_non_finite_values() {
        let s = Stats::of_tensor(&Tensor::from_vec(vec![
            f64::NAN,
            f64::INFINITY,
            1.0,
            f64::NEG_INFINITY,
            f64::INFINITY,
        ]));
        assert_eq!((s.nan, s.pos_inf, s.neg_inf), (1, 2, 1));
        assert_eq!(s.max, Some(ExactF64(f64::INFINITY)));
        assert_eq!(s.min, Some(ExactF64(f64::NEG_INFINITY)));
        assert!(s.mean.unwrap().0.is_nan());
        let all_nan = Stats::of_tensor(&Tensor::from_vec(vec![f32::NAN]));
        assert_eq!((all_nan.max, all_nan.min), (None, None));
        let empty = Stats::of_tensor(&Tensor::from_vec(Vec::<u8>::new()));
        assert_eq!(empty, Stats::default());
    }

    #[test]
    fn exact_floats_round_trip_through_json() {
        for x in [
            f64::NAN,
            -f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            f64::MIN_POSITIVE / 3.0,
            f64::MAX,
            0.1,
        ] {
            let json = serde_json::to_string(&ExactF64(x)).unwrap();
            let back: ExactF64 = serde_json::from_str(&json).unwrap();
            assert_eq!(back.0.to_bits(), x.to_bits(), "{json}");
        }
        assert!(serde_json::from_str::<ExactF64>("\"1.5\"").is_err());
    }
}
