//! Named tensors as safetensors bytes: the one encoder and decoder that full dumps
//! (`dump/`) and checkpoints (`checkpoint.rs`) share.
//!
//! [`encode`] takes `(name, tensor)` pairs and returns the bytes of a safetensors file; [`decode`]
//! reads one tensor back by name. Only the dtypes of [`DType`] are read; any other is an error.
//!
//! Determinism: the bytes depend only on the tensors (safetensors orders its header by dtype
//! alignment and name, and no metadata map is written), so the same tensors give the same file.
//!
//! Limits: a whole file is held in memory while it is encoded or decoded.

use crate::value::tensor::{DType, Tensor, TensorData};

/// The safetensors dtype of a detcheck dtype.
fn safetensors_dtype(dtype: DType) -> safetensors::Dtype {
    match dtype {
        DType::F32 => safetensors::Dtype::F32,
        DType::F64 => safetensors::Dtype::F64,
        DType::I64 => safetensors::Dtype::I64,
        DType::U8 => safetensors::Dtype::U8,
    }
}

/// A tensor's canonical (little-endian) bytes.
pub(crate) fn canonical_bytes(tensor: &Tensor) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(tensor.len() * tensor.dtype().size_of());
    tensor.for_each_canonical_chunk(|c| bytes.extend_from_slice(c));
    bytes
}

/// The bytes of a safetensors file holding `tensors` (name, dtype, shape, canonical bytes).
///
/// # Errors
/// A description naming the tensor when its bytes do not match its shape.
pub(crate) fn encode(tensors: &[(String, DType, Vec<usize>, Vec<u8>)]) -> Result<Vec<u8>, String> {
    let mut views = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, bytes) in tensors {
        let view =
            safetensors::tensor::TensorView::new(safetensors_dtype(*dtype), shape.clone(), bytes)
                .map_err(|e| format!("tensor `{name}`: {e}"))?;
        views.push((name.as_str(), view));
    }
    safetensors::tensor::serialize(views, None).map_err(|e| e.to_string())
}

/// Tensor `name` of a parsed safetensors file; `Ok(None)` when the file has no such tensor.
///
/// # Errors
/// A description naming the tensor when its dtype is not one of ours or its size does not
/// match its shape.
pub(crate) fn decode(
    file: &safetensors::SafeTensors<'_>,
    name: &str,
) -> Result<Option<Tensor>, String> {
    let Ok(view) = file.tensor(name) else {
        return Ok(None);
    };
    let dtype = match view.dtype() {
        safetensors::Dtype::F32 => DType::F32,
        safetensors::Dtype::F64 => DType::F64,
        safetensors::Dtype::I64 => DType::I64,
        safetensors::Dtype::U8 => DType::U8,
        other => return Err(format!("tensor `{name}` has unsupported dtype {other:?}")),
    };
    tensor_from_bytes(dtype, view.shape().to_vec(), view.data())
        .map(Some)
        .ok_or_else(|| format!("tensor `{name}` has a size that does not match its shape"))
}

/// A tensor from its canonical bytes; `None` when the size does not match the shape.
fn tensor_from_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Option<Tensor> {
    fn chunks<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
        bytes
            .chunks_exact(N)
            .map(|c| f(c.try_into().expect("chunk of N")))
            .collect()
    }
    if bytes.len() % dtype.size_of() != 0 {
        return None;
    }
    let data = match dtype {
        DType::F32 => TensorData::F32(chunks(bytes, f32::from_le_bytes)),
        DType::F64 => TensorData::F64(chunks(bytes, f64::from_le_bytes)),
        DType::I64 => TensorData::I64(chunks(bytes, i64::from_le_bytes)),
        DType::U8 => TensorData::U8(bytes.to_vec()),
    };
    Tensor::new(shape, data).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_round_trip_bit_for_bit_and_bad_shapes_are_named() {
        let a = Tensor::new(vec![2, 2], TensorData::F32(vec![1.0, -0.0, f32::NAN, 3.5])).unwrap();
        let b = Tensor::from_vec(vec![7i64, -1]);
        let entries: Vec<_> = [("a", &a), ("b", &b)]
            .iter()
            .map(|(n, t)| {
                (
                    n.to_string(),
                    t.dtype(),
                    t.shape().to_vec(),
                    canonical_bytes(t),
                )
            })
            .collect();
        let bytes = encode(&entries).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let back = decode(&file, "a").unwrap().unwrap();
        assert_eq!(canonical_bytes(&back), canonical_bytes(&a));
        assert_eq!(decode(&file, "b").unwrap().unwrap(), b);
        assert_eq!(decode(&file, "missing").unwrap(), None);
        let bad = vec![("c".to_owned(), DType::F32, vec![3], vec![0u8; 8])];
        assert!(encode(&bad).unwrap_err().starts_with("tensor `c`"));
    }
}
