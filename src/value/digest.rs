//! Digests and summary statistics of a tensor.
//!
//! [`Md5Digest`] is 16 bytes of md5 (RFC 1321, the `md-5` crate): of raw bytes
//! ([`Md5Digest::of_bytes`]: files, run ids), or a tensor's digest, the tree digest of its
//! canonical little-endian bytes (`Md5Digest::of_view`, in `value/md5tree.rs`), which is
//! `hashlib.md5(arr.tobytes())` for a tensor of at most 4 KiB. Dtype and shape are kept beside the
//! digest in a record and compared with it.
//!
//! [`Stats`] are max, min, mean and L2 norm, accumulated in `f64` in eight interleaved lanes
//! combined in lane order (a fixed order, so a pure function of the values), and the counts of
//! NaN, +Inf and -Inf. Every dtype is read as `f64`: exactly for f32, f16, bf16, f8e4m3fn and
//! f8e5m2 (decoded from their bytes), i32, i16, i8, u16, u8 and bool (0 or 1); i64 rounds to the
//! nearest `f64`. A complex tensor of n elements is read as its 2n real parts (real, imaginary,
//! real, ... in element order, part i to lane i mod 8): its norm is the square root of the sum of
//! the squares of every part, which is the L2 norm of the complex tensor, and NaN and infinities
//! are counted per part; max, min and mean are `None` (complex numbers have no order, and a mean
//! of parts would mean nothing). [`ExactF64`] stores a float in JSON as its bit pattern, so NaN,
//! infinities and -0.0 survive a round trip (JSON has no NaN).
//!
//! Both are computed on a [`TensorView`] (`of_view`), the canonical bytes read in place; a
//! [`Tensor`] goes through its view (`of_tensor`), so there is one implementation.
//!
//! Invariant (a digest depends only on dtype, shape and the canonical bytes, which
//! `value/tensor.rs` defines): every md5, in a lane of `value/md5x.rs` or alone, is RFC 1321's of
//! those bytes (tested against `md-5`); the recorder digests a copy taken when the tensor is
//! recorded (or, for a module's fresh output on the CPU, and for a gradient or parameter whose
//! memory no one but the tensors the recorder sees holds, a torch copy-on-write snapshot that holds
//! the same bytes: `python/src/buffer.rs`'s `Lent`, `_torch.tensors.lendable`), in batches, and
//! keeps the records in call order.
//!
//! Invariant (exact values stay exact on disk): stats serialize as `0x` + 16 hex digits of their
//! bits in JSON (`ExactF64`), and as raw f64 bits in trace files (`file/format.rs`).
//!
//! Determinism: both are pure functions of the tensor's values; stats are summed in one fixed
//! order. Golden tests pin the stats' bits and the md5 of each dtype.
//! Limits: stats are summaries for people, not proofs; equality of runs is decided by the md5.

use crate::value::tensor::{DType, Tensor, TensorView, F8E4M3FN_VALUES, F8E5M2_VALUES};
use half::{bf16, f16};
use md5::{Digest as _, Md5};
use multiversion::multiversion;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// The md5 of a tensor's canonical bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Md5Digest(pub [u8; 16]);

impl Md5Digest {
    /// The md5 of raw bytes.
    #[must_use]
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Md5Digest(Md5::digest(bytes).into())
    }

    /// The md5 of everything `reader` gives, and how many bytes that was, read in 256 KiB chunks
    /// (memory stays flat however large the file).
    ///
    /// # Errors
    /// The reader's error.
    pub(crate) fn of_reader(mut reader: impl std::io::Read) -> std::io::Result<(Self, u64)> {
        let mut hasher = Md5::new();
        let mut buffer = vec![0u8; 256 << 10];
        let mut len = 0u64;
        loop {
            match reader.read(&mut buffer) {
                Ok(0) => return Ok((Md5Digest(hasher.finalize().into()), len)),
                Ok(n) => {
                    hasher.update(&buffer[..n]);
                    len += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
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

    #[inline(always)]
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

    #[inline(always)]
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

    /// Feeds little-endian elements of `N` bytes each, in index order (inlined into
    /// `feed_view`'s versions, so it is vectorised for each). A block of [`LANES`] elements is
    /// one vector per accumulator. The inner loop runs over finite blocks with the lanes in
    /// locals and nothing else written, which lets the compiler keep each accumulator in one
    /// vector register (with `self` written in the loop, it kept 32 scalars: 5x slower); a
    /// block's finiteness is tested without a branch per element. A block with a NaN or an
    /// infinity goes element by element through [`StatsAccumulator::push_lane`], which gives
    /// each lane the same operations in the same order, so the bits do not depend on the path.
    #[inline(always)]
    fn feed<const N: usize>(&mut self, bytes: &[u8], to_f64: impl Fn([u8; N]) -> f64) {
        let block_of = |block: &[u8]| -> [f64; LANES] {
            let (elements, _) = block.as_chunks::<N>();
            std::array::from_fn(|i| to_f64(elements[i]))
        };
        let whole = bytes.len() / (N * LANES) * (N * LANES);
        let mut at = 0;
        while at < whole {
            // The finite blocks from `at` on, in registers; stops before a block with a NaN or
            // an infinity.
            let (mut max, mut min, mut sum, mut sum_sq) =
                (self.max, self.min, self.sum, self.sum_sq);
            while at < whole {
                let xs = block_of(&bytes[at..at + N * LANES]);
                if !xs.iter().fold(true, |all, x| all & x.is_finite()) {
                    break;
                }
                max = std::array::from_fn(|l| if xs[l] > max[l] { xs[l] } else { max[l] });
                min = std::array::from_fn(|l| if xs[l] < min[l] { xs[l] } else { min[l] });
                sum = std::array::from_fn(|l| sum[l] + xs[l]);
                sum_sq = std::array::from_fn(|l| sum_sq[l] + xs[l] * xs[l]);
                at += N * LANES;
            }
            (self.max, self.min, self.sum, self.sum_sq) = (max, min, sum, sum_sq);
            if at < whole {
                for (lane, x) in block_of(&bytes[at..at + N * LANES]).into_iter().enumerate() {
                    self.push_lane(lane, x);
                }
                at += N * LANES;
            }
        }
        for (lane, x) in bytes[whole..].chunks_exact(N).enumerate() {
            let x: [u8; N] = x.try_into().expect("N bytes");
            self.push_lane(lane, to_f64(x));
        }
    }

    fn finish(self, len: usize) -> Stats {
        let fold = |lanes: [f64; LANES], f: fn(f64, f64) -> f64| lanes.into_iter().reduce(f);
        let max = fold(self.max, |a, b| if b > a { b } else { a }).unwrap_or(f64::NEG_INFINITY);
        let min = fold(self.min, |a, b| if b < a { b } else { a }).unwrap_or(f64::INFINITY);
        let sum = fold(self.sum, |a, b| a + b).unwrap_or(0.0);
        let sum_sq = fold(self.sum_sq, |a, b| a + b).unwrap_or(0.0);
        Stats::from_totals(
            len as u64,
            Totals {
                max,
                min,
                sum,
                sum_sq,
                nan: self.nan,
                pos_inf: self.pos_inf,
                neg_inf: self.neg_inf,
            },
        )
    }
}

/// What statistics are made of, summed however a device sums: the largest and smallest finite
/// values (-inf and +inf when there is none), the sum and the sum of squares of the finite
/// values, and the counts of NaN, +Inf and -Inf. A GPU kernel (the Python package's) computes
/// these; [`Stats::from_totals`] turns them into [`Stats`] by the rules the CPU's stats follow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Totals {
    /// Largest finite value (-inf when there is none).
    pub max: f64,
    /// Smallest finite value (+inf when there is none).
    pub min: f64,
    /// Sum of the finite values.
    pub sum: f64,
    /// Sum of their squares.
    pub sum_sq: f64,
    /// NaN elements.
    pub nan: u64,
    /// +Inf elements.
    pub pos_inf: u64,
    /// -Inf elements.
    pub neg_inf: u64,
}

impl Stats {
    /// The statistics of `len` elements from their [`Totals`]: max and min count infinities
    /// and skip NaN; mean and norm are NaN with a NaN (or both infinities), infinite with an
    /// infinity, `None` when empty.
    #[must_use]
    pub fn from_totals(len: u64, totals: Totals) -> Stats {
        let Totals {
            max,
            min,
            sum,
            sum_sq,
            nan,
            pos_inf,
            neg_inf,
        } = totals;
        let any_number = len > nan;
        let (max, min) = if any_number {
            (
                Some(if pos_inf > 0 { f64::INFINITY } else { max }),
                Some(if neg_inf > 0 { f64::NEG_INFINITY } else { min }),
            )
        } else {
            (None, None)
        };
        let (mean, norm) = if len == 0 {
            (None, None)
        } else if nan > 0 || (pos_inf > 0 && neg_inf > 0) {
            (
                Some(f64::NAN),
                Some(if nan > 0 { f64::NAN } else { f64::INFINITY }),
            )
        } else if pos_inf > 0 || neg_inf > 0 {
            let inf = if pos_inf > 0 {
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
            nan,
            pos_inf,
            neg_inf,
        }
    }
}

impl Stats {
    /// Computes the statistics of `tensor` in one pass.
    #[must_use]
    pub fn of_tensor(tensor: &Tensor) -> Self {
        tensor.with_view(Stats::of_view)
    }

    /// Computes the statistics of a view in one pass, reading its bytes in place.
    #[must_use]
    pub fn of_view(view: TensorView<'_>) -> Self {
        let mut acc = StatsAccumulator::new();
        feed_view(&mut acc, view.dtype(), view.bytes());
        if view.dtype().is_complex() {
            Stats::of_complex_parts(acc.finish(2 * view.len()))
        } else {
            acc.finish(view.len())
        }
    }

    /// The statistics of a complex tensor from those of its 2n real parts (each element's real,
    /// then imaginary part): the norm and the NaN and infinity counts are kept, max, min and
    /// mean are `None`. For totals computed elsewhere:
    /// `Stats::of_complex_parts(Stats::from_totals(2 * n, totals))`.
    #[must_use]
    pub fn of_complex_parts(parts: Stats) -> Stats {
        Stats {
            max: None,
            min: None,
            mean: None,
            ..parts
        }
    }
}

/// Feeds every element of `bytes` (little-endian `dtype`s) to `acc`, compiled for the reduction
/// kernels' targets (`value/reduce.rs`) and picked at run time: the same operations per lane in
/// the same order on each (no FMA), only the vector width differs, so the same bits. A complex
/// element is fed as its two parts, so part i (not element i) goes to lane i mod 8.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx512dq", "x86_64+avx2"))]
fn feed_view(acc: &mut StatsAccumulator, dtype: DType, bytes: &[u8]) {
    {
        match dtype {
            DType::F32 => acc.feed(bytes, |b| f64::from(f32::from_le_bytes(b))),
            DType::F64 => acc.feed(bytes, f64::from_le_bytes),
            DType::I64 => acc.feed(bytes, |b| i64::from_le_bytes(b) as f64),
            DType::U8 | DType::Bool => acc.feed(bytes, |[b]: [u8; 1]| f64::from(b)),
            // Through f32, which holds every f16 and bf16 value exactly (faster than `to_f64`).
            DType::F16 => acc.feed(bytes, |b| f64::from(f16::from_le_bytes(b).to_f32())),
            DType::BF16 => acc.feed(bytes, |b| f64::from(bf16::from_le_bytes(b).to_f32())),
            DType::I32 => acc.feed(bytes, |b| f64::from(i32::from_le_bytes(b))),
            DType::I16 => acc.feed(bytes, |b| f64::from(i16::from_le_bytes(b))),
            DType::U16 => acc.feed(bytes, |b| f64::from(u16::from_le_bytes(b))),
            DType::I8 => acc.feed(bytes, |[b]: [u8; 1]| f64::from(b as i8)),
            // Every 8-bit float value is exact in f64: a table of the 256.
            DType::F8E4M3 => acc.feed(bytes, |[b]: [u8; 1]| F8E4M3FN_VALUES[usize::from(b)]),
            DType::F8E5M2 => acc.feed(bytes, |[b]: [u8; 1]| F8E5M2_VALUES[usize::from(b)]),
            // The real parts, in order: the bytes are pairs of f32 (f64) parts.
            DType::C64 => acc.feed(bytes, |b| f64::from(f32::from_le_bytes(b))),
            DType::C128 => acc.feed(bytes, f64::from_le_bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::tensor::TensorData;

    /// The streaming md5 (a full dump's tensor files, checked in chunks) is the one-shot md5,
    /// across chunk boundaries, counting every byte.
    #[test]
    fn md5_of_a_reader_is_the_md5_of_its_bytes() {
        for len in [0, 1, 255 << 10, 256 << 10, (256 << 10) + 1, 600_000] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let (digest, read) = Md5Digest::of_reader(&bytes[..]).unwrap();
            assert_eq!((digest, read), (Md5Digest::of_bytes(&bytes), len as u64));
        }
    }

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

    /// The vector path (finite blocks in registers, a block with a NaN or an infinity element
    /// by element) gives the bits of the plain definition: element i pushed to lane i mod 8, in
    /// index order, for every position of a non-finite value and for signed zeros.
    #[test]
    fn stats_are_the_lane_by_lane_definition_wherever_non_finite_values_fall() {
        let base: Vec<f64> = (0..203)
            .map(|i| f64::from((i * 7919) % 1000) / 7.0 - 60.0)
            .collect();
        let mut cases: Vec<Vec<f64>> = vec![base.clone(), vec![0.0, -0.0, -0.0, 0.0]];
        cases.push(
            (0..40)
                .map(|i| if i % 3 == 0 { 0.0 } else { -0.0 })
                .collect(),
        );
        for at in [0, 5, 7, 8, 63, 64, 100, 199, 202] {
            for special in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
                let mut values = base.clone();
                values[at] = special;
                cases.push(values);
            }
        }
        for values in cases {
            let mut want = StatsAccumulator::new();
            for (i, &x) in values.iter().enumerate() {
                want.push_lane(i % LANES, x);
            }
            let want = want.finish(values.len());
            let f32s: Vec<f32> = values.iter().map(|&x| x as f32).collect();
            let mut want32 = StatsAccumulator::new();
            for (i, &x) in f32s.iter().enumerate() {
                want32.push_lane(i % LANES, f64::from(x));
            }
            let want32 = want32.finish(f32s.len());
            assert_eq!(Stats::of_tensor(&Tensor::from_vec(values)), want);
            assert_eq!(Stats::of_tensor(&Tensor::from_vec(f32s)), want32);
        }
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

    /// The md5 and the stats' bits as one line: `md5 max min mean norm nan N +inf N -inf N`.
    fn md5_and_stats(t: &Tensor) -> String {
        let s = Stats::of_tensor(t);
        let bits = [s.max, s.min, s.mean, s.norm]
            .map(|x| x.map_or("none".to_owned(), |x| format!("{:016x}", x.0.to_bits())));
        format!(
            "{} {} nan {} +inf {} -inf {}",
            Md5Digest::of_tensor(t),
            bits.join(" "),
            s.nan,
            s.pos_inf,
            s.neg_inf
        )
    }

    // The golden lines of the new dtypes were computed independently of this crate, with numpy
    // and hashlib: `hashlib.md5(a.tobytes())` of the array (`<f2`, the bf16 bits as `<u2`,
    // `<i4`, `bool`), and the stats in Python floats from `a.astype(np.float64)` (bf16: its bits
    // << 16 viewed as `<f4`), summed in the same eight lanes.

    /// f16 bits: 1.5, -2.25, 0.1, 65504, -0.0, the smallest and largest subnormals, minus the
    /// smallest; NaN, +Inf, -Inf, 3, -65504, 0, 0.001, 7; -1, 2, 0.5.
    const F16_BITS: [u16; 19] = [
        0x3e00, 0xc080, 0x2e66, 0x7bff, 0x8000, 0x0001, 0x03ff, 0x8001, 0x7e00, 0x7c00, 0xfc00,
        0x4200, 0xfbff, 0x0000, 0x1419, 0x4700, 0xbc00, 0x4000, 0x3800,
    ];

    /// bf16 bits (f32 bits >> 16): 1.5, -3, 0.1, 1e10, -0.0, the smallest and largest
    /// subnormals, minus the smallest; NaN, +Inf, -Inf, 1e-3, -2.5e-30, 0, 65504, 7; -1, 2, 0.5.
    const BF16_BITS: [u16; 19] = [
        0x3fc0, 0xc040, 0x3dcc, 0x5015, 0x8000, 0x0001, 0x007f, 0x8001, 0x7fc0, 0x7f80, 0xff80,
        0x3a83, 0x8e4a, 0x0000, 0x477f, 0x40e0, 0xbf80, 0x4000, 0x3f00,
    ];

    #[test]
    fn f16_md5_and_stats_bits_do_not_change() {
        let all: Vec<f16> = F16_BITS.iter().map(|&b| f16::from_bits(b)).collect();
        let finite: Vec<f16> = all.iter().copied().filter(|x| x.is_finite()).collect();
        assert_eq!(
            md5_and_stats(&Tensor::from_vec(all)),
            "6b45198b01be0203aa2a0b1543a652ff 7ff0000000000000 fff0000000000000 \
             7ff8000000000000 7ff8000000000000 nan 1 +inf 1 -inf 1"
        );
        assert_eq!(
            md5_and_stats(&Tensor::from_vec(finite)),
            "90930a53898e15258372b8a0d6e6fc90 40effc0000000000 c0effc0000000000 \
             3fe5b3bb1e000000 40f69dca5441d5b6 nan 0 +inf 0 -inf 0"
        );
    }

    #[test]
    fn bf16_md5_and_stats_bits_do_not_change() {
        let all: Vec<bf16> = BF16_BITS.iter().map(|&b| bf16::from_bits(b)).collect();
        let finite: Vec<bf16> = all.iter().copied().filter(|x| x.is_finite()).collect();
        assert_eq!(
            md5_and_stats(&Tensor::from_vec(all)),
            "781cc844d7635b4f7baf409a109bf9eb 7ff0000000000000 fff0000000000000 \
             7ff8000000000000 7ff8000000000000 nan 1 +inf 1 -inf 1"
        );
        assert_eq!(
            md5_and_stats(&Tensor::from_vec(finite)),
            "8dcbeda21ff988ccfbda60ceb093ca79 4202a00000000000 c008000000000000 \
             41c2a007f838ce0c 4202a0000001b469 nan 0 +inf 0 -inf 0"
        );
    }

    #[test]
    fn i32_md5_and_stats_bits_do_not_change() {
        let values = vec![
            0,
            1,
            -1,
            i32::MAX,
            i32::MIN,
            123_456_789,
            -987_654_321,
            42,
            7,
            -7,
            (1 << 24) + 1,
            -(1 << 24) - 1,
            1000,
            -1000,
            5,
            6,
            99,
            -99,
            3,
        ];
        assert_eq!(
            md5_and_stats(&Tensor::from_vec(values)),
            "fff959d850159da8ade0c64d6c7d53f4 41dfffffffc00000 c1e0000000000000 \
             c185b0416de50d79 41e7cff3cde4729e nan 0 +inf 0 -inf 0"
        );
    }

    #[test]
    fn bool_md5_and_stats_bits_do_not_change() {
        let bytes = [1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1];
        let values: Vec<bool> = bytes.iter().map(|&b| b == 1).collect();
        let t = Tensor::from_vec(values);
        assert_eq!(Md5Digest::of_tensor(&t), Md5Digest::of_bytes(&bytes));
        assert_eq!(
            md5_and_stats(&t),
            "307fcb458a884c00842350eef5b824b0 3ff0000000000000 0000000000000000 \
             3fe286bca1af286c 400a887293fd6f34 nan 0 +inf 0 -inf 0"
        );
    }

    // The golden lines of the dtypes GPU training uses were computed independently of this
    // crate, in Python: the md5 with hashlib of numpy's `tobytes()` (`<i1`, `<i2`, `<u2`, `<c8`,
    // `<c16`; the 8-bit floats' bytes as they are), the values with numpy and torch (8-bit
    // floats: `t.view(torch.float8_e4m3fn).double()`; complex: `a.view('<f4')`, the parts), and
    // the stats in Python floats summed in the same eight lanes.

    #[test]
    fn narrow_integer_md5_and_stats_bits_do_not_change() {
        let i8s = vec![
            0i8, 1, -1, 127, -128, 42, -7, 100, -100, 5, 6, 7, -8, 9, 10, 11, -12, 13, 3,
        ];
        assert_eq!(
            md5_and_stats(&Tensor::from_vec(i8s)),
            "89c8904250cb8fa5ce9d50d3e97e5220 405fc00000000000 c060000000000000 \
             40106bca1af286bd 406d5941ad5243a7 nan 0 +inf 0 -inf 0"
        );
        let i16s = vec![
            0i16, 1, -1, 32767, -32768, 1234, -4321, 300, -300, 5, 6, 7, -8, 9, 10, 11, -12, 13, 3,
        ];
        assert_eq!(
            md5_and_stats(&Tensor::from_vec(i16s)),
            "44831e026f0b6577c072c236fec7ad75 40dfffc000000000 c0e0000000000000 \
             c06406bca1af286c 40e6bbf1f2c9835f nan 0 +inf 0 -inf 0"
        );
        let u16s = vec![
            0u16, 1, 65535, 40000, 300, 1234, 4321, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 65534,
        ];
        assert_eq!(
            md5_and_stats(&Tensor::from_vec(u16s)),
            "60c8b8a3902f03bdad72bd1025523c43 40efffe000000000 0000000000000000 \
             40c233650d79435e 40f8ab3b01cfe25f nan 0 +inf 0 -inf 0"
        );
    }

    /// f8e4m3fn codes: 0, the smallest subnormals, the smallest normal, 1, 448, -448, -0, NaN,
    /// -NaN, then ordinary values.
    const F8E4M3FN_CODES: [u8; 19] = [
        0x00, 0x01, 0x07, 0x08, 0x38, 0x7e, 0xfe, 0x80, 0x7f, 0xff, 0x40, 0x3c, 0x81, 0x55, 0x22,
        0x6a, 0xb0, 0x30, 0x44,
    ];

    /// f8e5m2 codes: 0, subnormals, the smallest normal, 1, 57344, -57344, -0, +Inf, -Inf, NaNs,
    /// then ordinary values.
    const F8E5M2_CODES: [u8; 19] = [
        0x00, 0x01, 0x03, 0x04, 0x3c, 0x7b, 0xfb, 0x80, 0x7c, 0xfc, 0x7d, 0x7f, 0xff, 0x40, 0x38,
        0x42, 0x81, 0x55, 0x22,
    ];

    #[test]
    fn f8_md5_and_stats_bits_do_not_change() {
        let e4 =
            |codes: Vec<u8>| Tensor::new(vec![codes.len()], TensorData::F8E4M3(codes)).unwrap();
        let e5 =
            |codes: Vec<u8>| Tensor::new(vec![codes.len()], TensorData::F8E5M2(codes)).unwrap();
        let all = F8E4M3FN_CODES.to_vec();
        let finite: Vec<u8> = all.iter().copied().filter(|c| c & 0x7f != 0x7f).collect();
        assert_eq!(
            md5_and_stats(&e4(all)),
            "00ba8bca4130ad4e829d29e84e642712 407c000000000000 c07c000000000000 \
             7ff8000000000000 7ff8000000000000 nan 2 +inf 0 -inf 0"
        );
        assert_eq!(
            md5_and_stats(&e4(finite)),
            "9fd6264abdff5938fc7cfbbddce2f967 407c000000000000 c07c000000000000 \
             4017b0d2d2d2d2d3 4083f5f383ec107b nan 0 +inf 0 -inf 0"
        );
        let all = F8E5M2_CODES.to_vec();
        let finite: Vec<u8> = all.iter().copied().filter(|c| c & 0x7f < 0x7c).collect();
        assert_eq!(
            md5_and_stats(&e5(all)),
            "c992ff52c5450deb9b010f66c5368fcf 7ff0000000000000 fff0000000000000 \
             7ff8000000000000 7ff8000000000000 nan 3 +inf 1 -inf 1"
        );
        assert_eq!(
            md5_and_stats(&e5(finite)),
            "f2a45331dfe5045eff8dbd2de07bff24 40ec000000000000 c0ec000000000000 \
             4018b7b8db6db6db 40f3cc8b3bab4b58 nan 0 +inf 0 -inf 0"
        );
        // The md5 is of the bytes as they are.
        assert_eq!(
            Md5Digest::of_tensor(&e4(F8E4M3FN_CODES.to_vec())),
            Md5Digest::of_bytes(&F8E4M3FN_CODES)
        );
    }

    /// Complex (real, imaginary) pairs: 10 elements, 20 parts (two blocks of eight lanes and a
    /// remainder of four).
    const COMPLEX: [[f64; 2]; 10] = [
        [1.5, -2.0],
        [0.25, 3.0],
        [-1.0, 0.0],
        [0.1, -0.0],
        [1e3, -1e-3],
        [7.0, 8.0],
        [-3.5, 2.25],
        [0.5, 0.5],
        [9.0, -9.0],
        [2.0, 1.0],
    ];

    #[test]
    fn complex_md5_and_stats_bits_do_not_change() {
        let c64: Vec<[f32; 2]> = COMPLEX.iter().map(|p| p.map(|x| x as f32)).collect();
        // Only the norm (of all 20 parts: the complex L2 norm, 1000.157...) and the counts.
        assert_eq!(
            md5_and_stats(&Tensor::from_vec(c64)),
            "2ab68d4d65bad300395f7a139a893c0d none none none 408f4141a623bb0e nan 0 +inf 0 -inf 0"
        );
        assert_eq!(
            md5_and_stats(&Tensor::from_vec(COMPLEX.to_vec())),
            "e23d9eac5b5db76fabb30798e5c5a14b none none none 408f4141a623bb0d nan 0 +inf 0 -inf 0"
        );
        let norm = Stats::of_tensor(&Tensor::from_vec(COMPLEX.to_vec()))
            .norm
            .unwrap()
            .0;
        let modulus_sq: f64 = COMPLEX.iter().map(|[re, im]| re * re + im * im).sum();
        assert!((norm - modulus_sq.sqrt()).abs() < 1e-12, "{norm}");
        // NaN and infinities are counted per part: NaN+1j, inf-infj.
        let mut parts = COMPLEX.to_vec();
        parts.push([f64::NAN, 1.0]);
        parts.push([f64::INFINITY, f64::NEG_INFINITY]);
        assert_eq!(
            md5_and_stats(&Tensor::from_vec(parts)),
            "d93273cfb5eb8cfabd2d724695381a24 none none none 7ff8000000000000 nan 1 +inf 1 -inf 1"
        );
        // Empty: no norm either.
        let empty = Tensor::from_vec(Vec::<[f32; 2]>::new());
        assert_eq!(Stats::of_tensor(&empty), Stats::default());
    }

    /// The parts of a complex tensor go to the lanes as the elements of a real tensor of twice
    /// the length would: its norm and counts are those of `view_as_real`.
    #[test]
    fn complex_stats_are_those_of_the_real_parts() {
        let pairs: Vec<[f32; 2]> = (0..37)
            .map(|i| {
                [
                    i as f32 * 0.37 - 5.0,
                    if i == 20 {
                        f32::NAN
                    } else {
                        1.0 / (i as f32 + 1.0)
                    },
                ]
            })
            .collect();
        let parts: Vec<f32> = pairs.iter().flatten().copied().collect();
        for take in [0, 1, 3, 4, 5, 9, 19, 37] {
            let c = Stats::of_tensor(&Tensor::from_vec(pairs[..take].to_vec()));
            let r = Stats::of_tensor(&Tensor::from_vec(parts[..2 * take].to_vec()));
            assert_eq!(c, Stats::of_complex_parts(r), "{take}");
        }
    }

    #[test]
    fn a_view_digests_as_its_tensor_in_place() {
        // Unaligned bytes (offset 1) are read in place too.
        let t = Tensor::from_vec(vec![3.0f32, -4.0, f32::NAN, 1.0, 0.5, 2.0, -0.0, 8.0, 9.0]);
        let mut buffer = vec![0u8];
        t.for_each_canonical_chunk(|c| buffer.extend_from_slice(c));
        let view = TensorView::new(DType::F32, t.shape(), &buffer[1..]).unwrap();
        assert_eq!(Md5Digest::of_view(view), Md5Digest::of_tensor(&t));
        assert_eq!(Stats::of_view(view), Stats::of_tensor(&t));
        let empty = TensorView::new(DType::BF16, &[0, 3], &[]).unwrap();
        assert_eq!(Stats::of_view(empty), Stats::default());
        assert_eq!(Md5Digest::of_view(empty), Md5Digest::of_bytes(b""));
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
