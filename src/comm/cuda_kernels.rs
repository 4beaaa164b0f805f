//! The CPU's reduction arithmetic (`value/reduce.rs`) as CUDA kernels, compiled by NVRTC to PTX
//! for `compute_90` and to a cubin for `sm_90` (feature `nccl`).
//!
//! [`REDUCE_SOURCE`] is one CUDA C translation unit; [`REDUCE_KERNELS`] names its 20 kernels,
//! one per (operation, dtype, form), each with the CPU function that is its reference, and
//! [`compile_reduce_kernels`] compiles it ([`ReduceModules`]). Two forms:
//! - [`KernelForm::Combine`]: `out[i] = ((in[0][i] op in[1][i]) op in[2][i]) op ...` over an
//!   array of input pointers, in the array's order. The caller orders the inputs as
//!   `reduce::summation_order` orders the ranks (rank order for `rank_ordered`; `c, c+1, ...`
//!   for chunk `c` of `ring`): the reference is `reduce::reduce_chunk`, which copies the first
//!   contribution and folds the others in with `combine_into`, one after the other.
//! - [`KernelForm::Accumulate`]: `dst[i] = dst[i] op src[i]`, one step of a ring: the partial
//!   result received so far, then the next rank's chunk. The reference is `reduce::combine_into`.
//!
//! Determinism: each element is one thread's sequential fold, in the inputs' order, with the
//! CPU's operations: IEEE `+` on f32 and f64, compiled with `--fmad=false` (no contraction;
//! `comm/cuda.rs`, `NVRTC_OPTIONS`) and without fast-math, so never reassociated; wrap-around
//! integer sums (done in unsigned arithmetic, where C++ defines the wrap); `max` as
//! `Reducible::max_of`: a canonical NaN (Rust's `f32::NAN`, `f64::NAN` bits) if either side is
//! NaN, else the larger in Rust's `total_cmp` order, computed on the bits as `total_cmp` does,
//! so +0.0 wins over -0.0. The grid-stride loop only decides which thread computes an element,
//! never the order of its operations, so the bits do not depend on the launch configuration.
//!
//! Limits: dtypes are those `reduce::unreducible` accepts (f32, f64, i32, i64, u8); the
//! `reproducible` mode's integer-grid sums (`value/reprosum.rs`) have their kernels in
//! `comm/cuda_reprosum.rs`. The kernels are compiled, not yet launched: that the GPU gives the
//! CPU's bits for them is to be checked on a GPU, with the NCCL communicator (issue 26).

use crate::comm::cuda::{compile_cubin, compile_ptx, CudaError};
use crate::value::{DType, ReduceOp};

/// The name NVRTC gives [`REDUCE_SOURCE`] in its messages.
pub const REDUCE_PROGRAM: &str = "detcheck_reduce.cu";

/// The virtual architecture of the PTX: Hopper (H100, H200), which a newer GPU's driver JITs.
pub const PTX_ARCH: &str = "compute_90";

/// The real architecture of the cubin: Hopper's machine code, loaded without a JIT step.
pub const CUBIN_ARCH: &str = "sm_90";

/// The CUDA C of every reduction kernel (see the module docs and [`REDUCE_KERNELS`]).
pub const REDUCE_SOURCE: &str = r#"// detcheck's reduction kernels: value/reduce.rs's arithmetic, element by element.
// Compiled by NVRTC with --fmad=false --prec-div=true --prec-sqrt=true --ftz=false.

// value/reduce.rs `Reducible` for f32: `add` is IEEE +; `max_of` is a canonical NaN
// (f32::NAN, 0x7fc00000) if either side is NaN, else `self` when self.total_cmp(other) >= 0.
__device__ __forceinline__ float detcheck_add(float a, float b) { return a + b; }
__device__ __forceinline__ float detcheck_max_of(float a, float b) {
    if (isnan(a) || isnan(b)) return __int_as_float(0x7fc00000);
    // f32::total_cmp: flip the magnitude bits of negative values, compare as signed integers.
    int left = __float_as_int(a);
    int right = __float_as_int(b);
    left ^= (int)(((unsigned int)(left >> 31)) >> 1);
    right ^= (int)(((unsigned int)(right >> 31)) >> 1);
    return left >= right ? a : b;
}

// The same for f64: f64::NAN is 0x7ff8000000000000.
__device__ __forceinline__ double detcheck_add(double a, double b) { return a + b; }
__device__ __forceinline__ double detcheck_max_of(double a, double b) {
    if (isnan(a) || isnan(b)) return __longlong_as_double(0x7ff8000000000000LL);
    long long left = __double_as_longlong(a);
    long long right = __double_as_longlong(b);
    left ^= (long long)(((unsigned long long)(left >> 63)) >> 1);
    right ^= (long long)(((unsigned long long)(right >> 63)) >> 1);
    return left >= right ? a : b;
}

// Integers: `wrapping_add` (in unsigned arithmetic, where C++ defines the wrap) and `Ord::max`.
__device__ __forceinline__ int detcheck_add(int a, int b) {
    return (int)((unsigned int)a + (unsigned int)b);
}
__device__ __forceinline__ int detcheck_max_of(int a, int b) { return a >= b ? a : b; }
__device__ __forceinline__ long long detcheck_add(long long a, long long b) {
    return (long long)((unsigned long long)a + (unsigned long long)b);
}
__device__ __forceinline__ long long detcheck_max_of(long long a, long long b) {
    return a >= b ? a : b;
}
__device__ __forceinline__ unsigned char detcheck_add(unsigned char a, unsigned char b) {
    return (unsigned char)(a + b);
}
__device__ __forceinline__ unsigned char detcheck_max_of(unsigned char a, unsigned char b) {
    return a >= b ? a : b;
}

struct DetcheckSum {
    template <typename T> __device__ __forceinline__ static T apply(T a, T b) {
        return detcheck_add(a, b);
    }
};
struct DetcheckMax {
    template <typename T> __device__ __forceinline__ static T apply(T a, T b) {
        return detcheck_max_of(a, b);
    }
};

// reduce::reduce_chunk: out = inputs[0], then out = out op inputs[k] for k = 1, 2, ... in the
// array's order (the caller's summation_order). One thread folds one element, in that order.
template <typename T, typename Op>
__device__ __forceinline__ void detcheck_combine(
    T* out, const T* const* inputs, unsigned int count, unsigned long long len) {
    if (count == 0) return;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < len; i += stride) {
        T acc = inputs[0][i];
        for (unsigned int k = 1; k < count; ++k) acc = Op::apply(acc, inputs[k][i]);
        out[i] = acc;
    }
}

// reduce::combine_into: dst = dst op src (a ring step: the partial result, then the next rank's).
template <typename T, typename Op>
__device__ __forceinline__ void detcheck_accumulate(T* dst, const T* src, unsigned long long len) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < len; i += stride) {
        dst[i] = Op::apply(dst[i], src[i]);
    }
}

#define DETCHECK_KERNELS(T, NAME)                                                              \
    extern "C" __global__ void detcheck_sum_##NAME(                                            \
        T* out, const T* const* inputs, unsigned int count, unsigned long long len) {          \
        detcheck_combine<T, DetcheckSum>(out, inputs, count, len);                             \
    }                                                                                          \
    extern "C" __global__ void detcheck_max_##NAME(                                            \
        T* out, const T* const* inputs, unsigned int count, unsigned long long len) {          \
        detcheck_combine<T, DetcheckMax>(out, inputs, count, len);                             \
    }                                                                                          \
    extern "C" __global__ void detcheck_accumulate_sum_##NAME(                                 \
        T* dst, const T* src, unsigned long long len) {                                        \
        detcheck_accumulate<T, DetcheckSum>(dst, src, len);                                    \
    }                                                                                          \
    extern "C" __global__ void detcheck_accumulate_max_##NAME(                                 \
        T* dst, const T* src, unsigned long long len) {                                        \
        detcheck_accumulate<T, DetcheckMax>(dst, src, len);                                    \
    }

DETCHECK_KERNELS(float, f32)
DETCHECK_KERNELS(double, f64)
DETCHECK_KERNELS(int, i32)
DETCHECK_KERNELS(long long, i64)
DETCHECK_KERNELS(unsigned char, u8)
"#;

/// The shape of a reduction kernel's arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelForm {
    /// `(out, inputs, count, len)`: `out[i]` is the fold of `inputs[0..count][i]` in the array's
    /// order; `inputs` is a device array of `count` device pointers. Reference:
    /// `reduce::reduce_chunk` with `order` = the inputs' order.
    Combine,
    /// `(dst, src, len)`: `dst[i] = dst[i] op src[i]`. Reference: `reduce::combine_into`.
    Accumulate,
}

/// One kernel of [`REDUCE_SOURCE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReduceKernel {
    /// Its `extern "C"` name, as the PTX and cubin name it.
    pub name: &'static str,
    /// The operation.
    pub op: ReduceOp,
    /// The element type.
    pub dtype: DType,
    /// Its arguments.
    pub form: KernelForm,
    /// The CPU function in `value/reduce.rs` whose bits it must give.
    pub reference: &'static str,
}

const COMBINE_REFERENCE: &str = "value::reduce::reduce_chunk (ordered path)";
const ACCUMULATE_REFERENCE: &str = "value::reduce::combine_into";

macro_rules! reduce_kernels {
    ($($dtype:ident $suffix:literal),* $(,)?) => {
        [$(
            ReduceKernel {
                name: concat!("detcheck_sum_", $suffix),
                op: ReduceOp::Sum,
                dtype: DType::$dtype,
                form: KernelForm::Combine,
                reference: COMBINE_REFERENCE,
            },
            ReduceKernel {
                name: concat!("detcheck_max_", $suffix),
                op: ReduceOp::Max,
                dtype: DType::$dtype,
                form: KernelForm::Combine,
                reference: COMBINE_REFERENCE,
            },
            ReduceKernel {
                name: concat!("detcheck_accumulate_sum_", $suffix),
                op: ReduceOp::Sum,
                dtype: DType::$dtype,
                form: KernelForm::Accumulate,
                reference: ACCUMULATE_REFERENCE,
            },
            ReduceKernel {
                name: concat!("detcheck_accumulate_max_", $suffix),
                op: ReduceOp::Max,
                dtype: DType::$dtype,
                form: KernelForm::Accumulate,
                reference: ACCUMULATE_REFERENCE,
            },
        )*]
    };
}

/// Every kernel of [`REDUCE_SOURCE`]: sum and max, combine and accumulate, for each dtype the
/// CPU reduces.
pub const REDUCE_KERNELS: [ReduceKernel; 20] =
    reduce_kernels!(F32 "f32", F64 "f64", I32 "i32", I64 "i64", U8 "u8");

/// The kernel for `op` on `dtype` in `form`; `None` for a dtype the CPU does not reduce.
#[must_use]
pub fn reduce_kernel(
    op: ReduceOp,
    dtype: DType,
    form: KernelForm,
) -> Option<&'static ReduceKernel> {
    REDUCE_KERNELS
        .iter()
        .find(|k| k.op == op && k.dtype == dtype && k.form == form)
}

/// A kernel source compiled ([`REDUCE_SOURCE`] by [`compile_reduce_kernels`],
/// [`REPROSUM_SOURCE`](crate::comm::REPROSUM_SOURCE) by
/// [`compile_reprosum_kernels`](crate::comm::compile_reprosum_kernels)): PTX for [`PTX_ARCH`] and
/// a cubin for [`CUBIN_ARCH`].
#[derive(Debug, Clone)]
pub struct ReduceModules {
    /// The PTX text (any Hopper or later GPU; its driver JITs it).
    pub ptx: String,
    /// The cubin (an ELF image of sm_90 machine code).
    pub cubin: Vec<u8>,
}

/// Compiles [`REDUCE_SOURCE`] with NVRTC, to PTX and to a cubin.
///
/// # Errors
/// [`CudaError::LibraryMissing`] when NVRTC cannot be loaded (see its hint);
/// [`CudaError::Compile`] if NVRTC refuses the source.
pub fn compile_reduce_kernels() -> Result<ReduceModules, CudaError> {
    Ok(ReduceModules {
        ptx: compile_ptx(REDUCE_PROGRAM, REDUCE_SOURCE, PTX_ARCH)?,
        cubin: compile_cubin(REDUCE_PROGRAM, REDUCE_SOURCE, CUBIN_ARCH)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::cuda::assert_compiles_with_nvrtc;
    use crate::value::reduce::unreducible;
    use std::collections::BTreeSet;

    #[test]
    fn there_is_a_kernel_for_every_reduction_the_cpu_does() {
        for dtype in DType::ALL {
            for op in [ReduceOp::Sum, ReduceOp::Max] {
                for form in [KernelForm::Combine, KernelForm::Accumulate] {
                    let kernel = reduce_kernel(op, dtype, form);
                    assert_eq!(
                        kernel.is_some(),
                        unreducible(dtype).is_none(),
                        "{op} {dtype} {form:?}"
                    );
                    if let Some(kernel) = kernel {
                        assert!(kernel.name.ends_with(dtype.name()), "{}", kernel.name);
                        let reference = kernel.reference.rsplit("::").next().unwrap();
                        let reference = reference.split(' ').next().unwrap();
                        let cpu = include_str!("../value/reduce.rs");
                        assert!(cpu.contains(&format!("fn {reference}")), "{reference}");
                    }
                }
            }
        }
        let names: BTreeSet<_> = REDUCE_KERNELS.iter().map(|k| k.name).collect();
        assert_eq!(names.len(), REDUCE_KERNELS.len());
    }

    #[test]
    fn the_kernels_nans_are_rusts() {
        // The canonical NaN `Reducible::max_of` returns, as the CUDA source writes it.
        assert!(REDUCE_SOURCE.contains(&format!("{:#x}", f32::NAN.to_bits())));
        assert!(REDUCE_SOURCE.contains(&format!("{:#x}LL", f64::NAN.to_bits())));
    }

    /// Every kernel compiles with NVRTC to PTX (compute_90) and to a cubin (sm_90). Without NVRTC
    /// this says what it would check and passes, unless `DETCHECK_REQUIRE_NVRTC=1` (CI).
    #[test]
    fn every_reduction_kernel_compiles_with_nvrtc() {
        let names: Vec<&str> = REDUCE_KERNELS.iter().map(|k| k.name).collect();
        assert_compiles_with_nvrtc(
            (REDUCE_PROGRAM, REDUCE_SOURCE),
            (PTX_ARCH, CUBIN_ARCH),
            &names,
            &["f32", "f64"],
        );
    }
}
