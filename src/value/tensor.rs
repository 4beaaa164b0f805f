//! A small dense tensor: a dtype, a shape and the values, row-major; and a borrowed view of one.
//!
//! [`Tensor`] is what ranks record and what collectives move. Its canonical byte form is the values
//! in little-endian order, row-major, with no header: the same bytes numpy's
//! `arr.astype('<f4').tobytes()` gives, so an md5 taken here can be checked anywhere. `f16` and
//! `bf16` are IEEE binary16 and bfloat16 (the [`half`] crate's types, re-exported as
//! [`crate::value::f16`] and [`crate::value::bf16`]); `bool` is one byte per element, 0 or 1, as
//! numpy's and torch's bool. The 8-bit floats `f8e4m3fn` and `f8e5m2` (torch's `float8_e4m3fn`
//! and `float8_e5m2`, the OCP FP8 formats) are held as their raw bytes ([`TensorData::F8E4M3`],
//! [`TensorData::F8E5M2`]: `Vec<u8>`), one byte an element; [`DType::f8_to_f64`] gives their values.
//! The complex dtypes `c64` and `c128` hold `[re, im]` pairs of f32 and f64 (torch's and numpy's
//! `complex64`/`complex128`): the canonical bytes of an element are the real part, then the
//! imaginary part, each little-endian, as `arr.tobytes()` gives.
//!
//! [`TensorView`] borrows the canonical bytes of a tensor that lives elsewhere (a numpy buffer, a
//! file), so it can be digested and recorded without a copy; [`TensorView::new`] checks that the
//! bytes fit the dtype and shape. [`Tensor::with_view`] views a tensor, so digests and statistics
//! have one implementation, on views.
//!
//! Determinism: a tensor is plain data; nothing here reads a clock or an address.
//! Limits: no strides or broadcasting (a view is contiguous, row-major); fifteen dtypes (f32, f64,
//! i64, u8, f16, bf16, i32, bool, i8, i16, u16, f8e4m3fn, f8e5m2, c64, c128).

use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary64.
    F64,
    /// Two's complement 64-bit integer.
    I64,
    /// Unsigned byte (masks, images).
    U8,
    /// IEEE 754 binary16 (half precision).
    F16,
    /// bfloat16: the upper 16 bits of a binary32.
    BF16,
    /// Two's complement 32-bit integer.
    I32,
    /// Boolean, one byte per element: 0 (false) or 1 (true).
    Bool,
    /// Two's complement 8-bit integer.
    I8,
    /// Two's complement 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// 8-bit float E4M3FN (torch's `float8_e4m3fn`): sign, 4 exponent bits (bias 7), 3 mantissa
    /// bits; subnormals, no infinities, `0x7f`/`0xff` NaN; largest finite value 448.
    #[serde(rename = "f8e4m3fn")]
    F8E4M3,
    /// 8-bit float E5M2 (torch's `float8_e5m2`): sign, 5 exponent bits (bias 15), 2 mantissa
    /// bits, as IEEE 754 (subnormals, infinities, NaNs); largest finite value 57344.
    F8E5M2,
    /// Complex of two f32 (real, imaginary), 8 bytes.
    C64,
    /// Complex of two f64 (real, imaginary), 16 bytes.
    C128,
}

impl DType {
    /// Every dtype, in declaration order (the order of their trace file codes).
    pub const ALL: [DType; 15] = [
        DType::F32,
        DType::F64,
        DType::I64,
        DType::U8,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::Bool,
        DType::I8,
        DType::I16,
        DType::U16,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::C64,
        DType::C128,
    ];

    /// Size of one element in bytes.
    #[must_use]
    pub fn size_of(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 | DType::C64 => 8,
            DType::U8 | DType::Bool | DType::I8 | DType::F8E4M3 | DType::F8E5M2 => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::C128 => 16,
        }
    }

    /// The lowercase name used in files and reports (`f32`, `f64`, `i64`, `u8`, `f16`, `bf16`,
    /// `i32`, `bool`, `i8`, `i16`, `u16`, `f8e4m3fn`, `f8e5m2`, `c64`, `c128`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::Bool => "bool",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::U16 => "u16",
            DType::F8E4M3 => "f8e4m3fn",
            DType::F8E5M2 => "f8e5m2",
            DType::C64 => "c64",
            DType::C128 => "c128",
        }
    }

    /// The dtype a dump names as `name`: detcheck's names (`f32`), torch's (`torch.bfloat16`,
    /// `float`, `long`), MindSpore's and msprobe's (`Float16`, `Int64`); case and a module
    /// prefix are ignored. `None` for a name detcheck does not know.
    #[must_use]
    pub fn from_dump_name(name: &str) -> Option<DType> {
        let lower = name.to_ascii_lowercase();
        let d = lower.rsplit('.').next().unwrap_or(&lower);
        Some(match d {
            "f64" | "float64" | "double" => DType::F64,
            "f32" | "float32" | "float" => DType::F32,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "f8e4m3fn" | "float8_e4m3fn" | "float8_e4m3fnuz" => DType::F8E4M3,
            "f8e5m2" | "float8_e5m2" | "float8_e5m2fnuz" => DType::F8E5M2,
            "c64" | "complex64" => DType::C64,
            "c128" | "complex128" => DType::C128,
            "bool" => DType::Bool,
            "u8" | "uint8" => DType::U8,
            "i8" | "int8" => DType::I8,
            "i16" | "int16" => DType::I16,
            "u16" | "uint16" => DType::U16,
            "i32" | "int32" | "int" => DType::I32,
            "i64" | "int64" | "long" => DType::I64,
            _ => return None,
        })
    }

    /// The largest finite magnitude of a floating-point dtype (a complex dtype: of its parts),
    /// or `None` for an integer or boolean dtype, whose values never overflow to NaN or Inf.
    #[must_use]
    pub fn finite_max(self) -> Option<f64> {
        match self {
            DType::F16 => Some(65504.0),
            DType::BF16 => Some(f64::from(f32::from_bits(0x7f7f_0000))),
            DType::F32 | DType::C64 => Some(f64::from(f32::MAX)),
            DType::F64 | DType::C128 => Some(f64::MAX),
            DType::F8E4M3 => Some(448.0),
            DType::F8E5M2 => Some(57344.0),
            DType::I64
            | DType::U8
            | DType::I32
            | DType::Bool
            | DType::I8
            | DType::I16
            | DType::U16 => None,
        }
    }

    /// `true` for `c64` and `c128`.
    #[must_use]
    pub fn is_complex(self) -> bool {
        matches!(self, DType::C64 | DType::C128)
    }

    /// The exact value of the 8-bit float `bits` of `f8e4m3fn` or `f8e5m2` (as torch converts
    /// it); `None` for any other dtype.
    #[must_use]
    pub fn f8_to_f64(self, bits: u8) -> Option<f64> {
        match self {
            DType::F8E4M3 => Some(F8E4M3FN_VALUES[usize::from(bits)]),
            DType::F8E5M2 => Some(F8E5M2_VALUES[usize::from(bits)]),
            _ => None,
        }
    }
}

/// The value of the 8-bit float `bits` with `mantissa` mantissa bits and exponent bias `bias`:
/// normal numbers are (1 + m / 2^M) · 2^(e − bias), subnormals (e = 0) m / 2^M · 2^(1 − bias),
/// both exact in f64. The caller decides which codes are NaN or infinite.
const fn f8_finite(bits: u8, mantissa: u32, bias: i32) -> f64 {
    let e = ((bits & 0x7f) >> mantissa) as i32;
    let m = (bits & ((1 << mantissa) - 1)) as i32;
    // value = significand · 2^(exponent − bias − M), the significand an integer below 2^(M+1).
    let (significand, exponent) = if e == 0 {
        (m, 1)
    } else {
        (m + (1 << mantissa), e)
    };
    let scale = f64::from_bits(((exponent - bias - mantissa as i32 + 1023) as u64) << 52);
    let magnitude = significand as f64 * scale;
    if bits & 0x80 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// `f8e4m3fn` (bias 7, 3 mantissa bits): no infinities; `0x7f` and `0xff` are NaN.
const fn f8e4m3fn_value(bits: u8) -> f64 {
    if bits & 0x7f == 0x7f {
        f64::NAN
    } else {
        f8_finite(bits, 3, 7)
    }
}

/// `f8e5m2` (bias 15, 2 mantissa bits): exponent 31 is infinity (mantissa 0) or NaN.
const fn f8e5m2_value(bits: u8) -> f64 {
    match bits & 0x7f {
        0x7c if bits & 0x80 != 0 => f64::NEG_INFINITY,
        0x7c => f64::INFINITY,
        0x7d..=0x7f => f64::NAN,
        _ => f8_finite(bits, 2, 15),
    }
}

/// The value of every byte: of `f8e4m3fn` when `e4m3fn`, of `f8e5m2` otherwise.
const fn f8_table(e4m3fn: bool) -> [f64; 256] {
    let mut table = [0.0; 256];
    let mut i = 0;
    while i < 256 {
        table[i] = if e4m3fn {
            f8e4m3fn_value(i as u8)
        } else {
            f8e5m2_value(i as u8)
        };
        i += 1;
    }
    table
}

/// The value of every `f8e4m3fn` byte.
pub(crate) static F8E4M3FN_VALUES: [f64; 256] = f8_table(true);
/// The value of every `f8e5m2` byte.
pub(crate) static F8E5M2_VALUES: [f64; 256] = f8_table(false);

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The values of a tensor, one vector per dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// `f32` values.
    F32(Vec<f32>),
    /// `f64` values.
    F64(Vec<f64>),
    /// `i64` values.
    I64(Vec<i64>),
    /// `u8` values.
    U8(Vec<u8>),
    /// `f16` values.
    F16(Vec<f16>),
    /// `bf16` values.
    BF16(Vec<bf16>),
    /// `i32` values.
    I32(Vec<i32>),
    /// `bool` values (in memory one byte each, 0 or 1: the canonical bytes).
    Bool(Vec<bool>),
    /// `i8` values.
    I8(Vec<i8>),
    /// `i16` values.
    I16(Vec<i16>),
    /// `u16` values.
    U16(Vec<u16>),
    /// `f8e4m3fn` values as their raw bytes (Rust has no 8-bit float type; decode one with
    /// [`DType::f8_to_f64`]).
    F8E4M3(Vec<u8>),
    /// `f8e5m2` values as their raw bytes.
    F8E5M2(Vec<u8>),
    /// `c64` values: `[real, imaginary]` pairs of f32.
    C64(Vec<[f32; 2]>),
    /// `c128` values: `[real, imaginary]` pairs of f64.
    C128(Vec<[f64; 2]>),
}

impl TensorData {
    /// The dtype of these values.
    #[must_use]
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F32(_) => DType::F32,
            TensorData::F64(_) => DType::F64,
            TensorData::I64(_) => DType::I64,
            TensorData::U8(_) => DType::U8,
            TensorData::F16(_) => DType::F16,
            TensorData::BF16(_) => DType::BF16,
            TensorData::I32(_) => DType::I32,
            TensorData::Bool(_) => DType::Bool,
            TensorData::I8(_) => DType::I8,
            TensorData::I16(_) => DType::I16,
            TensorData::U16(_) => DType::U16,
            TensorData::F8E4M3(_) => DType::F8E4M3,
            TensorData::F8E5M2(_) => DType::F8E5M2,
            TensorData::C64(_) => DType::C64,
            TensorData::C128(_) => DType::C128,
        }
    }

    /// Number of elements.
    #[must_use]
    pub fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::F64(v) => v.len(),
            TensorData::I64(v) => v.len(),
            TensorData::U8(v) => v.len(),
            TensorData::F16(v) => v.len(),
            TensorData::BF16(v) => v.len(),
            TensorData::I32(v) => v.len(),
            TensorData::Bool(v) => v.len(),
            TensorData::I8(v) => v.len(),
            TensorData::I16(v) => v.len(),
            TensorData::U16(v) => v.len(),
            TensorData::F8E4M3(v) | TensorData::F8E5M2(v) => v.len(),
            TensorData::C64(v) => v.len(),
            TensorData::C128(v) => v.len(),
        }
    }

    /// `true` when there are no elements.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values' bytes in this machine's order (the canonical bytes on a little-endian one).
    fn native_bytes(&self) -> &[u8] {
        match self {
            TensorData::F32(v) => bytemuck::cast_slice(v),
            TensorData::F64(v) => bytemuck::cast_slice(v),
            TensorData::I64(v) => bytemuck::cast_slice(v),
            TensorData::U8(v) => v,
            TensorData::F16(v) => bytemuck::cast_slice(v),
            TensorData::BF16(v) => bytemuck::cast_slice(v),
            TensorData::I32(v) => bytemuck::cast_slice(v),
            TensorData::Bool(v) => bytemuck::cast_slice(v),
            TensorData::I8(v) => bytemuck::cast_slice(v),
            TensorData::I16(v) => bytemuck::cast_slice(v),
            TensorData::U16(v) => bytemuck::cast_slice(v),
            TensorData::F8E4M3(v) | TensorData::F8E5M2(v) => v,
            TensorData::C64(v) => bytemuck::cast_slice(v),
            TensorData::C128(v) => bytemuck::cast_slice(v),
        }
    }
}

/// A dense row-major tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: TensorData,
}

/// Why a tensor could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("shape {shape:?} holds {expected} elements but {actual} values were given")]
pub struct ShapeError {
    shape: Vec<usize>,
    expected: usize,
    actual: usize,
}

impl Tensor {
    /// Builds a tensor, checking that `shape` matches the number of values.
    ///
    /// # Errors
    /// [`ShapeError`] when the product of `shape` differs from the number of values.
    pub fn new(shape: Vec<usize>, data: TensorData) -> Result<Self, ShapeError> {
        // A shape from a file may overflow a product: no tensor holds usize::MAX values.
        let expected = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .unwrap_or(usize::MAX);
        if expected != data.len() {
            return Err(ShapeError {
                shape,
                expected,
                actual: data.len(),
            });
        }
        Ok(Tensor { shape, data })
    }

    /// A one-dimensional tensor holding `values`.
    pub fn from_vec<T: Element>(values: Vec<T>) -> Self {
        Tensor {
            shape: vec![values.len()],
            data: T::wrap(values),
        }
    }

    /// A zero-dimensional tensor holding one value.
    pub fn scalar<T: Element>(value: T) -> Self {
        Tensor {
            shape: Vec::new(),
            data: T::wrap(vec![value]),
        }
    }

    /// The dtype.
    #[must_use]
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// The shape (empty for a scalar).
    #[must_use]
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    #[must_use]
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// `true` when the tensor has no elements.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The values.
    #[must_use]
    pub fn data(&self) -> &TensorData {
        &self.data
    }

    /// The values, mutably (the shape cannot change this way).
    pub fn data_mut(&mut self) -> &mut TensorData {
        &mut self.data
    }

    /// Takes the values out, leaving the tensor.
    #[must_use]
    pub fn into_data(self) -> TensorData {
        self.data
    }

    /// The values as a typed slice, or `None` if `T` is not the tensor's dtype.
    #[must_use]
    pub fn values<T: Element>(&self) -> Option<&[T]> {
        T::view(&self.data)
    }

    /// Calls `sink` with the canonical little-endian bytes, in one or more pieces.
    ///
    /// On little-endian machines this is the memory itself, without a copy; on big-endian machines
    /// the values are byte-swapped through a small buffer.
    pub fn for_each_canonical_chunk(&self, mut sink: impl FnMut(&[u8])) {
        fn swap_through<T: bytemuck::Pod>(
            values: &[T],
            to_le: impl Fn(&T) -> T,
            sink: &mut impl FnMut(&[u8]),
        ) {
            let mut buffer: Vec<T> = Vec::with_capacity(4096);
            for block in values.chunks(4096) {
                buffer.clear();
                buffer.extend(block.iter().map(&to_le));
                sink(bytemuck::cast_slice(&buffer));
            }
        }
        if cfg!(target_endian = "little") {
            sink(self.data.native_bytes());
            return;
        }
        match &self.data {
            TensorData::F32(v) => {
                swap_through(v, |x| f32::from_bits(x.to_bits().to_le()), &mut sink)
            }
            TensorData::F64(v) => {
                swap_through(v, |x| f64::from_bits(x.to_bits().to_le()), &mut sink)
            }
            TensorData::I64(v) => swap_through(v, |x| x.to_le(), &mut sink),
            TensorData::F16(v) => {
                swap_through(v, |x| f16::from_bits(x.to_bits().to_le()), &mut sink)
            }
            TensorData::BF16(v) => {
                swap_through(v, |x| bf16::from_bits(x.to_bits().to_le()), &mut sink)
            }
            TensorData::I32(v) => swap_through(v, |x| x.to_le(), &mut sink),
            TensorData::I16(v) => swap_through(v, |x| x.to_le(), &mut sink),
            TensorData::U16(v) => swap_through(v, |x| x.to_le(), &mut sink),
            // Each part of a complex number on its own: real, then imaginary.
            TensorData::C64(v) => swap_through(
                v,
                |x| x.map(|p| f32::from_bits(p.to_bits().to_le())),
                &mut sink,
            ),
            TensorData::C128(v) => swap_through(
                v,
                |x| x.map(|p| f64::from_bits(p.to_bits().to_le())),
                &mut sink,
            ),
            TensorData::U8(_)
            | TensorData::Bool(_)
            | TensorData::I8(_)
            | TensorData::F8E4M3(_)
            | TensorData::F8E5M2(_) => sink(self.data.native_bytes()),
        }
    }

    /// A view of the canonical bytes in place: `Some` on a little-endian machine, where they are
    /// the tensor's memory; `None` on a big-endian one (use [`Tensor::with_view`]).
    #[must_use]
    pub(crate) fn view_in_place(&self) -> Option<TensorView<'_>> {
        cfg!(target_endian = "little").then(|| TensorView {
            dtype: self.dtype(),
            shape: &self.shape,
            bytes: self.data.native_bytes(),
        })
    }

    /// Calls `f` with a view of the canonical bytes, and returns what it returns.
    ///
    /// On little-endian machines the view is the tensor's memory, without a copy; on big-endian
    /// machines it views a little-endian copy.
    pub fn with_view<R>(&self, f: impl FnOnce(TensorView<'_>) -> R) -> R {
        let dtype = self.dtype();
        if cfg!(target_endian = "little") {
            f(TensorView {
                dtype,
                shape: &self.shape,
                bytes: self.data.native_bytes(),
            })
        } else {
            let mut bytes = Vec::with_capacity(self.len() * dtype.size_of());
            self.for_each_canonical_chunk(|c| bytes.extend_from_slice(c));
            f(TensorView {
                dtype,
                shape: &self.shape,
                bytes: &bytes,
            })
        }
    }
}

/// A borrowed tensor: a dtype, a shape and the canonical (little-endian, row-major) bytes of its
/// values, e.g. a numpy array's buffer. Digests, statistics, records and trace files take a view
/// as they take a [`Tensor`], without copying the values.
///
/// ```
/// use detcheck::value::{DType, Md5Digest, TensorView};
/// let bytes = [0, 0, 128, 63, 0, 0, 0, 192]; // np.array([1, -2], dtype='<f4').tobytes()
/// let view = TensorView::new(DType::F32, &[2], &bytes).unwrap();
/// assert_eq!(view.len(), 2);
/// assert_eq!(Md5Digest::of_view(view), Md5Digest::of_bytes(&bytes));
/// assert!(TensorView::new(DType::F32, &[3], &bytes).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorView<'a> {
    dtype: DType,
    shape: &'a [usize],
    bytes: &'a [u8],
}

/// Why bytes cannot be viewed as a tensor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ViewError {
    /// The bytes are not `product(shape) × size_of(dtype)` long.
    #[error(
        "a tensor of {dtype} and shape {shape:?} holds {expected} bytes but {actual} were given"
    )]
    Length {
        /// The dtype.
        dtype: DType,
        /// The shape.
        shape: Vec<usize>,
        /// `product(shape) × size_of(dtype)`.
        expected: usize,
        /// The number of bytes given.
        actual: usize,
    },
    /// `product(shape) × size_of(dtype)` does not fit in a `usize`.
    #[error(
        "a tensor of {dtype} and shape {shape:?} holds more than {} bytes but {actual} were given",
        usize::MAX
    )]
    TooLarge {
        /// The dtype.
        dtype: DType,
        /// The shape.
        shape: Vec<usize>,
        /// The number of bytes given.
        actual: usize,
    },
    /// A `bool` element is a byte other than 0 or 1.
    #[error("bool element {index} is the byte {byte}, not 0 or 1")]
    NotBool {
        /// The element's index (row-major).
        index: usize,
        /// Its byte.
        byte: u8,
    },
}

impl<'a> TensorView<'a> {
    /// Views `bytes` as a tensor of `dtype` and `shape`.
    ///
    /// # Errors
    /// [`ViewError::Length`] when `bytes` is not `product(shape) × dtype.size_of()` long (both
    /// named), [`ViewError::TooLarge`] when that product overflows a `usize`, and
    /// [`ViewError::NotBool`] when a `bool` byte is neither 0 nor 1.
    pub fn new(dtype: DType, shape: &'a [usize], bytes: &'a [u8]) -> Result<Self, ViewError> {
        // A zero dimension holds nothing, however large the others are.
        let expected = if shape.contains(&0) {
            Some(0)
        } else {
            shape
                .iter()
                .try_fold(dtype.size_of(), |acc, &d| acc.checked_mul(d))
        };
        match expected {
            None => {
                return Err(ViewError::TooLarge {
                    dtype,
                    shape: shape.to_vec(),
                    actual: bytes.len(),
                })
            }
            Some(expected) if expected != bytes.len() => {
                return Err(ViewError::Length {
                    dtype,
                    shape: shape.to_vec(),
                    expected,
                    actual: bytes.len(),
                })
            }
            Some(_) => {}
        }
        if dtype == DType::Bool {
            if let Some(index) = bytes.iter().position(|&b| b > 1) {
                return Err(ViewError::NotBool {
                    index,
                    byte: bytes[index],
                });
            }
        }
        Ok(TensorView {
            dtype,
            shape,
            bytes,
        })
    }

    /// The dtype.
    #[must_use]
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape (empty for a scalar).
    #[must_use]
    pub fn shape(&self) -> &'a [usize] {
        self.shape
    }

    /// The canonical little-endian bytes.
    #[must_use]
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Number of elements.
    #[must_use]
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size_of()
    }

    /// `true` when the view has no elements.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// An owned tensor holding a copy of the values.
    #[must_use]
    pub fn to_tensor(&self) -> Tensor {
        fn decode<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
            bytes
                .chunks_exact(N)
                .map(|c| f(c.try_into().expect("chunks of N bytes")))
                .collect()
        }
        let b = self.bytes;
        let data = match self.dtype {
            DType::F32 => TensorData::F32(decode(b, f32::from_le_bytes)),
            DType::F64 => TensorData::F64(decode(b, f64::from_le_bytes)),
            DType::I64 => TensorData::I64(decode(b, i64::from_le_bytes)),
            DType::U8 => TensorData::U8(b.to_vec()),
            DType::F16 => TensorData::F16(decode(b, f16::from_le_bytes)),
            DType::BF16 => TensorData::BF16(decode(b, bf16::from_le_bytes)),
            DType::I32 => TensorData::I32(decode(b, i32::from_le_bytes)),
            DType::Bool => TensorData::Bool(b.iter().map(|&x| x != 0).collect()),
            DType::I8 => TensorData::I8(decode(b, i8::from_le_bytes)),
            DType::I16 => TensorData::I16(decode(b, i16::from_le_bytes)),
            DType::U16 => TensorData::U16(decode(b, u16::from_le_bytes)),
            DType::F8E4M3 => TensorData::F8E4M3(b.to_vec()),
            DType::F8E5M2 => TensorData::F8E5M2(b.to_vec()),
            DType::C64 => TensorData::C64(decode(b, |x: [u8; 8]| {
                let part = |i: usize| f32::from_le_bytes(x[i..i + 4].try_into().expect("4 bytes"));
                [part(0), part(4)]
            })),
            DType::C128 => TensorData::C128(decode(b, |x: [u8; 16]| {
                let part = |i: usize| f64::from_le_bytes(x[i..i + 8].try_into().expect("8 bytes"));
                [part(0), part(8)]
            })),
        };
        Tensor {
            shape: self.shape.to_vec(),
            data,
        }
    }
}

/// An element type a [`Tensor`] can hold: one per dtype, except the 8-bit floats, which are
/// held as raw bytes (`u8` is [`DType::U8`]'s element): build them with [`Tensor::new`] and
/// [`TensorData::F8E4M3`] or [`TensorData::F8E5M2`]. A complex element is `[re, im]`.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The dtype of this element type.
    const DTYPE: DType;
    /// Wraps a vector of this type.
    fn wrap(values: Vec<Self>) -> TensorData;
    /// Views values of this type, if they are of it.
    fn view(data: &TensorData) -> Option<&[Self]>;
    /// Views values of this type mutably, if they are of it.
    fn view_mut(data: &mut TensorData) -> Option<&mut Vec<Self>>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for i64 {}
    impl Sealed for u8 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for i32 {}
    impl Sealed for bool {}
    impl Sealed for i8 {}
    impl Sealed for i16 {}
    impl Sealed for u16 {}
    impl Sealed for [f32; 2] {}
    impl Sealed for [f64; 2] {}
}

macro_rules! impl_element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn wrap(values: Vec<Self>) -> TensorData {
                TensorData::$variant(values)
            }
            fn view(data: &TensorData) -> Option<&[Self]> {
                match data {
                    TensorData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn view_mut(data: &mut TensorData) -> Option<&mut Vec<Self>> {
                match data {
                    TensorData::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
impl_element!(f32, F32);
impl_element!(f64, F64);
impl_element!(i64, I64);
impl_element!(u8, U8);
impl_element!(f16, F16);
impl_element!(bf16, BF16);
impl_element!(i32, I32);
impl_element!(bool, Bool);
impl_element!(i8, I8);
impl_element!(i16, I16);
impl_element!(u16, U16);
impl_element!([f32; 2], C64);
impl_element!([f64; 2], C128);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_must_match_values() {
        let err = Tensor::new(vec![2, 3], TensorData::F32(vec![0.0; 5])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "shape [2, 3] holds 6 elements but 5 values were given"
        );
        assert!(Tensor::new(vec![2, 3], TensorData::F32(vec![0.0; 6])).is_ok());
        // A shape whose product overflows is an error, not a panic.
        let huge = vec![1 << 40, 1 << 40, 3];
        assert!(Tensor::new(huge, TensorData::F32(vec![0.0; 6])).is_err());
    }

    #[test]
    fn canonical_bytes_are_little_endian() {
        let t = Tensor::from_vec(vec![1.0f32, -2.0]);
        let mut bytes = Vec::new();
        t.for_each_canonical_chunk(|c| bytes.extend_from_slice(c));
        assert_eq!(bytes, [0, 0, 128, 63, 0, 0, 0, 192]);
        let t = Tensor::from_vec(vec![258i64]);
        let mut bytes = Vec::new();
        t.for_each_canonical_chunk(|c| bytes.extend_from_slice(c));
        assert_eq!(bytes, [2, 1, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn new_dtypes_have_names_sizes_and_little_endian_bytes() {
        let names: Vec<String> = DType::ALL
            .iter()
            .map(|d| serde_json::to_string(d).unwrap())
            .collect();
        assert_eq!(
            names.join(" "),
            r#""f32" "f64" "i64" "u8" "f16" "bf16" "i32" "bool" "i8" "i16" "u16" "f8e4m3fn" "f8e5m2" "c64" "c128""#
        );
        let sizes: Vec<usize> = DType::ALL.iter().map(|d| d.size_of()).collect();
        assert_eq!(sizes, [4, 8, 8, 1, 2, 2, 4, 1, 1, 2, 2, 1, 1, 8, 16]);
        for dtype in DType::ALL {
            assert_eq!(
                format!("\"{dtype}\""),
                serde_json::to_string(&dtype).unwrap()
            );
            let back: DType = serde_json::from_str(&format!("\"{}\"", dtype.name())).unwrap();
            assert_eq!(back, dtype);
        }
        let bytes_of = |t: &Tensor| {
            let mut bytes = Vec::new();
            t.for_each_canonical_chunk(|c| bytes.extend_from_slice(c));
            assert_eq!(bytes.len(), t.len() * t.dtype().size_of());
            bytes
        };
        // np.array([1, -2], '<f2').tobytes(); bf16 is the upper half of the f32 bits.
        let h = Tensor::from_vec(vec![f16::from_f32(1.0), f16::from_f32(-2.0)]);
        assert_eq!(bytes_of(&h), [0x00, 0x3c, 0x00, 0xc0]);
        let b = Tensor::from_vec(vec![bf16::from_f32(1.0), bf16::from_f32(-2.0)]);
        assert_eq!(bytes_of(&b), [0x80, 0x3f, 0x00, 0xc0]);
        let i = Tensor::from_vec(vec![258i32, -1]);
        assert_eq!(bytes_of(&i), [2, 1, 0, 0, 255, 255, 255, 255]);
        let m = Tensor::from_vec(vec![true, false, true]);
        assert_eq!(bytes_of(&m), [1, 0, 1]);
        for t in [&h, &b, &i, &m] {
            let bytes = bytes_of(t);
            t.with_view(|v| {
                assert_eq!(v.bytes(), &bytes[..]);
                assert_eq!(
                    (v.dtype(), v.shape(), v.len()),
                    (t.dtype(), t.shape(), t.len())
                );
            });
        }
    }

    /// The canonical bytes of the seven newer dtypes are numpy's `tobytes()` (`<i1`, `<i2`,
    /// `<u2`, `<c8`, `<c16`; an 8-bit float is its byte, as torch's `.view(torch.uint8)`), and a
    /// view of them decodes to the same values.
    #[test]
    fn gpu_training_dtypes_have_little_endian_bytes() {
        let bytes_of = |t: &Tensor| {
            let mut bytes = Vec::new();
            t.for_each_canonical_chunk(|c| bytes.extend_from_slice(c));
            assert_eq!(bytes.len(), t.len() * t.dtype().size_of());
            bytes
        };
        let cases = [
            (Tensor::from_vec(vec![-2i8, 127]), vec![0xfe, 0x7f]),
            (Tensor::from_vec(vec![-2i16, 258]), vec![0xfe, 0xff, 2, 1]),
            (
                Tensor::from_vec(vec![65535u16, 258]),
                vec![0xff, 0xff, 2, 1],
            ),
            (
                Tensor::new(vec![2], TensorData::F8E4M3(vec![0x38, 0xfe])).unwrap(),
                vec![0x38, 0xfe],
            ),
            (
                Tensor::new(vec![2], TensorData::F8E5M2(vec![0x3c, 0x7c])).unwrap(),
                vec![0x3c, 0x7c],
            ),
            // np.array([1-2j], '<c8').tobytes(): the real part, then the imaginary part.
            (
                Tensor::from_vec(vec![[1.0f32, -2.0]]),
                vec![0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0],
            ),
            (
                Tensor::from_vec(vec![[1.0f64, -2.0]]),
                vec![0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0, 0, 0, 0, 0, 0, 0, 0xc0],
            ),
        ];
        for (t, want) in &cases {
            assert_eq!(&bytes_of(t), want, "{}", t.dtype());
            let view = TensorView::new(t.dtype(), t.shape(), want).unwrap();
            assert_eq!(&view.to_tensor(), t, "{}", t.dtype());
        }
        assert_eq!(cases[5].0.values::<[f32; 2]>(), Some(&[[1.0, -2.0]][..]));
        assert!(DType::C64.is_complex() && DType::C128.is_complex());
        assert!(!DType::F32.is_complex() && !DType::F8E4M3.is_complex());
    }

    // torch's value of every 8-bit float code from 0 to 127, hard-coded:
    // `torch.arange(128, dtype=torch.uint8).view(torch.float8_e4m3fn).double().tolist()` (and
    // `float8_e5m2`); code 128 + c is code c with the sign bit, its value the negation.
    #[rustfmt::skip]
    const TORCH_F8E4M3FN: [f64; 128] = [
        0.0, 0.001953125, 0.00390625, 0.005859375, 0.0078125, 0.009765625, 0.01171875, 0.013671875,
        0.015625, 0.017578125, 0.01953125, 0.021484375, 0.0234375, 0.025390625, 0.02734375,
        0.029296875, 0.03125, 0.03515625, 0.0390625, 0.04296875, 0.046875, 0.05078125, 0.0546875,
        0.05859375, 0.0625, 0.0703125, 0.078125, 0.0859375, 0.09375, 0.1015625, 0.109375, 0.1171875,
        0.125, 0.140625, 0.15625, 0.171875, 0.1875, 0.203125, 0.21875, 0.234375, 0.25, 0.28125,
        0.3125, 0.34375, 0.375, 0.40625, 0.4375, 0.46875, 0.5, 0.5625, 0.625, 0.6875, 0.75, 0.8125,
        0.875, 0.9375, 1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875, 2.0, 2.25, 2.5, 2.75, 3.0,
        3.25, 3.5, 3.75, 4.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0, 7.5, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0,
        14.0, 15.0, 16.0, 18.0, 20.0, 22.0, 24.0, 26.0, 28.0, 30.0, 32.0, 36.0, 40.0, 44.0, 48.0,
        52.0, 56.0, 60.0, 64.0, 72.0, 80.0, 88.0, 96.0, 104.0, 112.0, 120.0, 128.0, 144.0, 160.0,
        176.0, 192.0, 208.0, 224.0, 240.0, 256.0, 288.0, 320.0, 352.0, 384.0, 416.0, 448.0,
        f64::NAN,
    ];
    #[rustfmt::skip]
    const TORCH_F8E5M2: [f64; 128] = [
        0.0, 1.52587890625e-05, 3.0517578125e-05, 4.57763671875e-05, 6.103515625e-05,
        7.62939453125e-05, 9.1552734375e-05, 0.0001068115234375, 0.0001220703125, 0.000152587890625,
        0.00018310546875, 0.000213623046875, 0.000244140625, 0.00030517578125, 0.0003662109375,
        0.00042724609375, 0.00048828125, 0.0006103515625, 0.000732421875, 0.0008544921875,
        0.0009765625, 0.001220703125, 0.00146484375, 0.001708984375, 0.001953125, 0.00244140625,
        0.0029296875, 0.00341796875, 0.00390625, 0.0048828125, 0.005859375, 0.0068359375, 0.0078125,
        0.009765625, 0.01171875, 0.013671875, 0.015625, 0.01953125, 0.0234375, 0.02734375, 0.03125,
        0.0390625, 0.046875, 0.0546875, 0.0625, 0.078125, 0.09375, 0.109375, 0.125, 0.15625, 0.1875,
        0.21875, 0.25, 0.3125, 0.375, 0.4375, 0.5, 0.625, 0.75, 0.875, 1.0, 1.25, 1.5, 1.75, 2.0,
        2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 28.0, 32.0,
        40.0, 48.0, 56.0, 64.0, 80.0, 96.0, 112.0, 128.0, 160.0, 192.0, 224.0, 256.0, 320.0, 384.0,
        448.0, 512.0, 640.0, 768.0, 896.0, 1024.0, 1280.0, 1536.0, 1792.0, 2048.0, 2560.0, 3072.0,
        3584.0, 4096.0, 5120.0, 6144.0, 7168.0, 8192.0, 10240.0, 12288.0, 14336.0, 16384.0, 20480.0,
        24576.0, 28672.0, 32768.0, 40960.0, 49152.0, 57344.0, f64::INFINITY, f64::NAN, f64::NAN,
        f64::NAN,
    ];

    #[test]
    fn f8_values_are_torchs_for_all_256_codes() {
        for (dtype, table) in [
            (DType::F8E4M3, TORCH_F8E4M3FN),
            (DType::F8E5M2, TORCH_F8E5M2),
        ] {
            for code in 0..=255u8 {
                let want = if code < 128 {
                    table[usize::from(code)]
                } else {
                    -table[usize::from(code - 128)]
                };
                let got = dtype.f8_to_f64(code).unwrap();
                if want.is_nan() {
                    assert!(got.is_nan(), "{dtype} {code:#04x}: {got}");
                } else {
                    assert_eq!(got.to_bits(), want.to_bits(), "{dtype} {code:#04x}: {got}");
                }
            }
        }
        let e4 = |code| DType::F8E4M3.f8_to_f64(code).unwrap();
        let e5 = |code| DType::F8E5M2.f8_to_f64(code).unwrap();
        // e4m3fn: largest 448 (0x7e), smallest subnormal 2^-9, smallest normal 2^-6, one 0x38;
        // no infinities, NaN only at 0x7f and 0xff; 0x80 is -0.0.
        assert_eq!((e4(0x7e), e4(0xfe)), (448.0, -448.0));
        assert_eq!(
            (e4(0x01), e4(0x08), e4(0x38)),
            (2f64.powi(-9), 2f64.powi(-6), 1.0)
        );
        assert_eq!(e4(0x80).to_bits(), (-0.0f64).to_bits());
        let nans: Vec<u8> = (0..=255).filter(|&c| e4(c).is_nan()).collect();
        assert_eq!(nans, [0x7f, 0xff]);
        assert!((0..=255).all(|c| !e4(c).is_infinite()));
        // e5m2: largest 57344 (0x7b), smallest subnormal 2^-16, 0x3c is one, 0x7c/0xfc are
        // +-infinity, 0x7d-0x7f and 0xfd-0xff NaN.
        assert_eq!((e5(0x7b), e5(0xfb)), (57344.0, -57344.0));
        assert_eq!(
            (e5(0x01), e5(0x04), e5(0x3c)),
            (2f64.powi(-16), 2f64.powi(-14), 1.0)
        );
        assert_eq!((e5(0x7c), e5(0xfc)), (f64::INFINITY, f64::NEG_INFINITY));
        let nans: Vec<u8> = (0..=255).filter(|&c| e5(c).is_nan()).collect();
        assert_eq!(nans, [0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff]);
        assert_eq!(DType::F16.f8_to_f64(0x3c), None);
    }

    #[test]
    fn views_check_their_length_and_decode_to_tensors() {
        let bytes = [0u8, 0x3c, 0x00, 0xc0, 0x01, 0x00];
        let v = TensorView::new(DType::F16, &[3], &bytes).unwrap();
        assert_eq!(v.len(), 3);
        let t = v.to_tensor();
        assert_eq!(
            t.values::<f16>().unwrap(),
            [f16::ONE, f16::from_f32(-2.0), f16::from_bits(1)]
        );
        assert_eq!(
            TensorView::new(DType::I32, &[2, 1], &bytes)
                .unwrap_err()
                .to_string(),
            "a tensor of i32 and shape [2, 1] holds 8 bytes but 6 were given"
        );
        // A shape whose byte count overflows is an error, not a panic or a wrapped product.
        let huge = [usize::MAX / 2, 3];
        let err = TensorView::new(DType::U8, &huge, &bytes).unwrap_err();
        assert!(
            matches!(err, ViewError::TooLarge { actual: 6, .. }),
            "{err}"
        );
        let err = TensorView::new(DType::F64, &[1 << 61], &bytes).unwrap_err();
        assert!(matches!(err, ViewError::TooLarge { .. }), "{err}");
        // A zero dimension holds nothing, whatever the others.
        assert!(TensorView::new(DType::F64, &[usize::MAX, 0], &[]).is_ok());
        // Bool bytes are 0 or 1, as numpy's and torch's.
        let m = TensorView::new(DType::Bool, &[3], &[1, 0, 1]).unwrap();
        assert_eq!(m.to_tensor().values::<bool>().unwrap(), [true, false, true]);
        assert_eq!(
            TensorView::new(DType::Bool, &[3], &[1, 0, 255]).unwrap_err(),
            ViewError::NotBool {
                index: 2,
                byte: 255
            }
        );
        // Every dtype decodes back to the same canonical bytes.
        for dtype in DType::ALL {
            let shape = [2, 2];
            let bytes: Vec<u8> = (0..4 * dtype.size_of()).map(|i| (i % 2) as u8).collect();
            let view = TensorView::new(dtype, &shape, &bytes).unwrap();
            let tensor = view.to_tensor();
            assert_eq!(tensor.dtype(), dtype);
            assert_eq!(tensor.shape(), shape);
            tensor.with_view(|back| assert_eq!(back, view, "{dtype}"));
        }
    }

    #[test]
    fn typed_views_check_the_dtype() {
        let t = Tensor::scalar(3.5f64);
        assert_eq!(t.values::<f64>(), Some(&[3.5][..]));
        assert_eq!(t.values::<f32>(), None);
        assert!(t.shape().is_empty());
        assert_eq!(t.len(), 1);
    }
}
