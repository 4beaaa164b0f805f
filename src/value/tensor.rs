//! A small dense tensor: a dtype, a shape and the values, row-major; and a borrowed view of one.
//!
//! [`Tensor`] is what ranks record and what collectives move. Its canonical byte form is the values
//! in little-endian order, row-major, with no header: the same bytes numpy's
//! `arr.astype('<f4').tobytes()` gives, so an md5 taken here can be checked anywhere. `f16` and
//! `bf16` are IEEE binary16 and bfloat16 (the [`half`] crate's types, re-exported as
//! [`crate::value::f16`] and [`crate::value::bf16`]); `bool` is one byte per element, 0 or 1, as
//! numpy's and torch's bool.
//!
//! [`TensorView`] borrows the canonical bytes of a tensor that lives elsewhere (a numpy buffer, a
//! file), so it can be digested and recorded without a copy; [`TensorView::new`] checks that the
//! bytes fit the dtype and shape. [`Tensor::with_view`] views a tensor, so digests and statistics
//! have one implementation, on views.
//!
//! Determinism: a tensor is plain data; nothing here reads a clock or an address.
//! Limits: no strides or broadcasting (a view is contiguous, row-major); eight dtypes (f32, f64,
//! i64, u8, f16, bf16, i32, bool).

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
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F64,
        DType::I64,
        DType::U8,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::Bool,
    ];

    /// Size of one element in bytes.
    #[must_use]
    pub fn size_of(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::U8 | DType::Bool => 1,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// The lowercase name used in files and reports (`f32`, `f64`, `i64`, `u8`, `f16`, `bf16`,
    /// `i32`, `bool`).
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
        }
    }
}

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
            TensorData::U8(_) | TensorData::Bool(_) => sink(self.data.native_bytes()),
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
        };
        Tensor {
            shape: self.shape.to_vec(),
            data,
        }
    }
}

/// An element type a [`Tensor`] can hold.
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
            r#""f32" "f64" "i64" "u8" "f16" "bf16" "i32" "bool""#
        );
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
