//! A small dense tensor: a dtype, a shape and the values, row-major.
//!
//! [`Tensor`] is what ranks record and what collectives move. Its canonical byte form is the values
//! in little-endian order, row-major, with no header: the same bytes numpy's
//! `arr.astype('<f4').tobytes()` gives, so an md5 taken here can be checked anywhere.
//!
//! Determinism: a tensor is plain data; nothing here reads a clock or an address.
//! Limits: no strides, views or broadcasting; four dtypes (f32, f64, i64, u8).

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
}

impl DType {
    /// Size of one element in bytes.
    #[must_use]
    pub fn size_of(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::U8 => 1,
        }
    }

    /// The lowercase name used in files and reports (`f32`, `f64`, `i64`, `u8`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I64 => "i64",
            DType::U8 => "u8",
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
        }
    }

    /// `true` when there are no elements.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        let expected = shape.iter().product::<usize>();
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
            if cfg!(target_endian = "little") {
                sink(bytemuck::cast_slice(values));
            } else {
                let mut buffer: Vec<T> = Vec::with_capacity(4096);
                for block in values.chunks(4096) {
                    buffer.clear();
                    buffer.extend(block.iter().map(&to_le));
                    sink(bytemuck::cast_slice(&buffer));
                }
            }
        }
        match &self.data {
            TensorData::F32(v) => {
                swap_through(v, |x| f32::from_bits(x.to_bits().to_le()), &mut sink)
            }
            TensorData::F64(v) => {
                swap_through(v, |x| f64::from_bits(x.to_bits().to_le()), &mut sink)
            }
            TensorData::I64(v) => swap_through(v, |x| x.to_le(), &mut sink),
            TensorData::U8(v) => sink(v),
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
    fn typed_views_check_the_dtype() {
        let t = Tensor::scalar(3.5f64);
        assert_eq!(t.values::<f64>(), Some(&[3.5][..]));
        assert_eq!(t.values::<f32>(), None);
        assert!(t.shape().is_empty());
        assert_eq!(t.len(), 1);
    }
}
