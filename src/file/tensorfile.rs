//! Named tensors as safetensors bytes: the one encoder and decoder that full dumps
//! (`dump/`) and checkpoints (`checkpoint.rs`) share.
//!
//! [`encode`] takes `(name, tensor)` pairs and returns the bytes of a safetensors file; [`decode`]
//! reads one tensor back by name. Only the dtypes of [`DType`] are read; any other is an error.
//! safetensors names `i8`, `i16`, `u16`, `f8e4m3fn`, `f8e5m2` and `c64` `I8`, `I16`, `U16`,
//! `F8_E4M3` (torch's `float8_e4m3fn`), `F8_E5M2` and `C64`; it has no complex128, so a `c128`
//! tensor cannot be encoded: [`encode`] returns an error naming the tensor and the dtype.
//!
//! Determinism: the bytes depend only on the tensors (safetensors orders its header by dtype
//! alignment and name, and no metadata map is written), so the same tensors give the same file.
//!
//! Limits: a whole file is held in memory while it is encoded or decoded.

use crate::value::tensor::{DType, Tensor, TensorView};

/// The safetensors dtype of a detcheck dtype (`None` for `c128`: safetensors has none).
fn safetensors_dtype(dtype: DType) -> Option<safetensors::Dtype> {
    Some(match dtype {
        DType::F32 => safetensors::Dtype::F32,
        DType::F64 => safetensors::Dtype::F64,
        DType::I64 => safetensors::Dtype::I64,
        DType::U8 => safetensors::Dtype::U8,
        DType::F16 => safetensors::Dtype::F16,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::I32 => safetensors::Dtype::I32,
        DType::Bool => safetensors::Dtype::BOOL,
        DType::I8 => safetensors::Dtype::I8,
        DType::I16 => safetensors::Dtype::I16,
        DType::U16 => safetensors::Dtype::U16,
        DType::F8E4M3 => safetensors::Dtype::F8_E4M3,
        DType::F8E5M2 => safetensors::Dtype::F8_E5M2,
        DType::C64 => safetensors::Dtype::C64,
        DType::C128 => return None,
    })
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
/// A description naming the tensor when its bytes do not match its shape, or when safetensors
/// has no dtype for its dtype (`c128`).
pub(crate) fn encode(tensors: &[(String, DType, Vec<usize>, Vec<u8>)]) -> Result<Vec<u8>, String> {
    let mut views = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, bytes) in tensors {
        let st_dtype = safetensors_dtype(*dtype).ok_or_else(|| {
            format!(
                "tensor `{name}`: dtype {dtype} has no safetensors dtype (safetensors has C64 \
                 but no 128-bit complex), so it cannot be saved in full mode; record it in md5 \
                 or stats mode, or as its real parts (torch.view_as_real: f64)"
            )
        })?;
        let view = safetensors::tensor::TensorView::new(st_dtype, shape.clone(), bytes)
            .map_err(|e| format!("tensor `{name}`: {e}"))?;
        views.push((name.as_str(), view));
    }
    safetensors::tensor::serialize(views, None).map_err(|e| e.to_string())
}

/// Tensor `name` of a parsed safetensors file; `Ok(None)` when the file has no such tensor.
///
/// # Errors
/// A description naming the tensor when its dtype is not one of ours, its size does not
/// match its shape or a bool is neither 0 nor 1.
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
        safetensors::Dtype::F16 => DType::F16,
        safetensors::Dtype::BF16 => DType::BF16,
        safetensors::Dtype::I32 => DType::I32,
        safetensors::Dtype::BOOL => DType::Bool,
        safetensors::Dtype::I8 => DType::I8,
        safetensors::Dtype::I16 => DType::I16,
        safetensors::Dtype::U16 => DType::U16,
        safetensors::Dtype::F8_E4M3 => DType::F8E4M3,
        safetensors::Dtype::F8_E5M2 => DType::F8E5M2,
        safetensors::Dtype::C64 => DType::C64,
        other => return Err(format!("tensor `{name}` has unsupported dtype {other:?}")),
    };
    TensorView::new(dtype, view.shape(), view.data())
        .map(|v| Some(v.to_tensor()))
        .map_err(|e| format!("tensor `{name}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::tensor::TensorData;

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

    /// Writes `tensors` as `t0`, `t1` ... into one safetensors file, reads each back (its bytes
    /// and dtype must be the same) and returns the safetensors dtypes they were stored as.
    fn round_trip(tensors: &[Tensor]) -> Vec<safetensors::Dtype> {
        let entries: Vec<_> = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let key = format!("t{i}");
                (key, t.dtype(), t.shape().to_vec(), canonical_bytes(t))
            })
            .collect();
        let bytes = encode(&entries).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (i, t) in tensors.iter().enumerate() {
            let back = decode(&file, &format!("t{i}")).unwrap().unwrap();
            assert_eq!(canonical_bytes(&back), canonical_bytes(t), "t{i}");
            assert_eq!(back.dtype(), t.dtype());
        }
        (0..tensors.len())
            .map(|i| file.tensor(&format!("t{i}")).unwrap().dtype())
            .collect()
    }

    #[test]
    fn new_dtypes_round_trip_as_safetensors_dtypes() {
        use half::{bf16, f16};
        let tensors = [
            Tensor::from_vec(vec![
                f16::from_f32(1.5),
                f16::NEG_INFINITY,
                f16::from_bits(1),
            ]),
            Tensor::from_vec(vec![bf16::from_f32(-2.0), bf16::NAN]),
            Tensor::from_vec(vec![i32::MIN, 7]),
            Tensor::from_vec(vec![true, false]),
        ];
        let dtypes = round_trip(&tensors);
        assert_eq!(
            dtypes,
            [
                safetensors::Dtype::F16,
                safetensors::Dtype::BF16,
                safetensors::Dtype::I32,
                safetensors::Dtype::BOOL
            ]
        );
        // A bool byte other than 0 or 1 is refused, with the tensor named.
        let bad = vec![("m".to_owned(), DType::Bool, vec![2], vec![1u8, 2])];
        let bytes = encode(&bad).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let err = decode(&file, "m").unwrap_err();
        assert_eq!(err, "tensor `m`: bool element 1 is the byte 2, not 0 or 1");
    }

    #[test]
    fn gpu_training_dtypes_round_trip_and_c128_is_refused_by_name() {
        let tensors = [
            Tensor::from_vec(vec![i8::MIN, -1, 7]),
            Tensor::from_vec(vec![i16::MIN, 300]),
            Tensor::from_vec(vec![u16::MAX, 1]),
            Tensor::new(vec![3], TensorData::F8E4M3(vec![0x7e, 0x7f, 0x80])).unwrap(),
            Tensor::new(vec![3], TensorData::F8E5M2(vec![0x7c, 0x7d, 0x01])).unwrap(),
            Tensor::from_vec(vec![[1.5f32, -2.0], [f32::NAN, -0.0]]),
        ];
        let dtypes = round_trip(&tensors);
        assert_eq!(
            dtypes,
            [
                safetensors::Dtype::I8,
                safetensors::Dtype::I16,
                safetensors::Dtype::U16,
                safetensors::Dtype::F8_E4M3,
                safetensors::Dtype::F8_E5M2,
                safetensors::Dtype::C64,
            ]
        );
        // safetensors has no complex128: an error naming the tensor and the dtype, no panic.
        let c = Tensor::from_vec(vec![[1.0f64, 2.0]]);
        let entries = vec![(
            "z".to_owned(),
            c.dtype(),
            c.shape().to_vec(),
            canonical_bytes(&c),
        )];
        let err = encode(&entries).unwrap_err();
        assert!(
            err.starts_with("tensor `z`: dtype c128 has no safetensors dtype"),
            "{err}"
        );
    }
}
