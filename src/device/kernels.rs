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
//! Invariant (GPU kernels are the CPU's arithmetic): each names its reference in `value/reduce.rs`,
//! folds an element in the CPU's order, and is compiled with `--fmad=false` (`device/cuda.rs`'s
//! `NVRTC_OPTIONS`), so no multiply-add is fused where the CPU rounds twice. The reproducible sums'
//! kernels (`device/reprosum.rs`) round each term to the CPU's grid with the same f64 addition and
//! combine only by wrap-around integer adds and maxima, so their bits depend on no launch
//! configuration or scheduling. The operators of `device/ops.rs` name theirs in `value/scatter.rs`
//! the same way; the one kernel that cannot give its reference's bits, the `atomicAdd` scatter,
//! says so (`OpsKernel::bitwise`) and exists only as a negative control. Without a GPU (CI), a host
//! emulation (`device/host_emulation.rs`, g++) runs every kernel source on the CPU and checks its
//! bits against its reference (`reduce_chunk`, `value/reprosum.rs`, `segmented_sum_f32`; the atomic
//! scatter: a fold in some order, within rounding); a GPU's bits are checked by
//! `scripts/gpu-selftest.sh`.
//!
//! Determinism: each element is one thread's sequential fold, in the inputs' order, with the
//! CPU's operations: IEEE `+` on f32 and f64, compiled with `--fmad=false` (no contraction;
//! `device/cuda.rs`, `NVRTC_OPTIONS`) and without fast-math, so never reassociated; wrap-around
//! integer sums (done in unsigned arithmetic, where C++ defines the wrap); `max` as
//! `Reducible::max_of`: a canonical NaN (Rust's `f32::NAN`, `f64::NAN` bits) if either side is
//! NaN, else the larger in Rust's `total_cmp` order, computed on the bits as `total_cmp` does,
//! so +0.0 wins over -0.0. The grid-stride loop only decides which thread computes an element,
//! never the order of its operations, so the bits do not depend on the launch configuration.
//!
//! Testing: without a GPU (CI has none) the tests run every kernel on the CPU, through the host
//! emulation (`device/host_emulation.rs`: g++ compiles the very text of [`REDUCE_SOURCE`] with
//! `host_shim.h`, and `host_driver.cpp` launches it with its blocks in a shuffled
//! order, a block's threads as `std::thread`s). Their bits are compared with `reduce_chunk`'s,
//! given the inputs' order as its `order` (combine) or two contributions (accumulate: one
//! `combine_into`), for every dtype and operation, 1 to 8 inputs, NaNs with payloads, of both
//! signs and signalling, signed zeros, infinities, subnormals, overflow and integer wrap-around,
//! at several launch configurations, bit for bit: a NaN sum, like a NaN maximum, is Rust's
//! canonical NaN on both sides (IEEE 754 leaves a NaN sum's payload to the hardware and the
//! compiler's order of operands, so both make it canonical). That a GPU gives the same bits is checked by `device/gpu.rs`'s tests, run on a
//! GPU by `scripts/gpu-selftest.sh`.
//!
//! Limits: dtypes are those `reduce::unreducible` accepts (f32, f64, i32, i64, u8); the
//! `reproducible` mode's integer-grid sums (`value/reprosum.rs`) have their kernels in
//! `device/reprosum.rs`.

use crate::device::cuda::{compile_cubin, compile_ptx, CudaError};
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

// value/reduce.rs `Reducible` for f32: `add` is IEEE + with a NaN result made the canonical NaN
// (f32::NAN, 0x7fc00000: a GPU's own NaN is 0x7fffffff, x86's the first operand's); `max_of` is
// the canonical NaN if either side is NaN, else `self` when self.total_cmp(other) >= 0.
__device__ __forceinline__ float detcheck_add(float a, float b) {
    float sum = a + b;
    return isnan(sum) ? __int_as_float(0x7fc00000) : sum;
}
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
__device__ __forceinline__ double detcheck_add(double a, double b) {
    double sum = a + b;
    return isnan(sum) ? __longlong_as_double(0x7ff8000000000000LL) : sum;
}
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
/// [`REPROSUM_SOURCE`](crate::device::REPROSUM_SOURCE) by
/// [`compile_reprosum_kernels`](crate::device::compile_reprosum_kernels)): PTX for [`PTX_ARCH`] and
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
pub(crate) mod tests {
    use super::*;
    use crate::device::cuda::assert_compiles_with_nvrtc;
    use crate::device::host_emulation::{host_kernels, run, Cases, HostSource};
    use crate::value::reduce::{reduce_chunk, unreducible};
    use crate::value::seed::{derive_stream, RankRng, Stream};
    use crate::value::tensor::TensorData;
    use crate::value::ReductionMode;
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

    // ---- The host emulation (`device/host_emulation.rs`) ---------------------------------------

    /// [`REDUCE_SOURCE`] for the host emulation's driver.
    pub(crate) const HOST: HostSource = HostSource {
        program: REDUCE_PROGRAM,
        source: REDUCE_SOURCE,
    };

    /// A dtype as the driver names it (its code in case kinds 5 and 6) and its element width.
    #[derive(Debug, Clone, Copy)]
    struct HostDType {
        dtype: DType,
        code: u64,
        width: usize,
    }

    const HOST_DTYPES: [HostDType; 5] = [
        HostDType {
            dtype: DType::F32,
            code: 0,
            width: 4,
        },
        HostDType {
            dtype: DType::F64,
            code: 1,
            width: 8,
        },
        HostDType {
            dtype: DType::I32,
            code: 2,
            width: 4,
        },
        HostDType {
            dtype: DType::I64,
            code: 3,
            width: 8,
        },
        HostDType {
            dtype: DType::U8,
            code: 4,
            width: 1,
        },
    ];

    const OPS: [(ReduceOp, u64); 2] = [(ReduceOp::Sum, 0), (ReduceOp::Max, 1)];

    /// NaNs as `(f32 bits, f64 bits)`: quiet with payloads of both signs, signalling, Rust's.
    const NANS: [(u32, u64); 5] = [
        (0x7fc0_1234, 0x7ff8_0000_0123_4000),
        (0xffc0_0001, 0xfff8_0000_0000_0001),
        (0x7f80_0001, 0x7ff0_0000_0000_0001),
        (0xff80_4321, 0xfff0_0000_0000_4321),
        (0x7fc0_0000, 0x7ff8_0000_0000_0000),
    ];

    /// A float element to plant: a value, or one of [`NANS`].
    #[derive(Debug, Clone, Copy)]
    enum Float {
        Value(f64),
        Nan(usize),
        /// The smallest subnormal times the `u32`, with this sign.
        Subnormal(bool, u32),
    }

    fn float_bits(dtype: DType, x: Float) -> u64 {
        match (dtype, x) {
            (DType::F32, Float::Value(v)) => u64::from((v as f32).to_bits()),
            (DType::F32, Float::Nan(k)) => u64::from(NANS[k].0),
            (DType::F32, Float::Subnormal(negative, m)) => {
                u64::from(m & 0x007f_ffff | u32::from(negative) << 31)
            }
            (_, Float::Value(v)) => v.to_bits(),
            (_, Float::Nan(k)) => NANS[k].1,
            (_, Float::Subnormal(negative, m)) => u64::from(m) | u64::from(negative) << 63,
        }
    }

    fn int_bits(dtype: DType, x: i128) -> u64 {
        match dtype {
            DType::I32 => u64::from(x as i32 as u32),
            DType::I64 => x as i64 as u64,
            _ => u64::from(x as u8),
        }
    }

    /// Element `e` of contribution `k` of `count` where it is planted (the first 16 elements),
    /// as bits: signed zeros alone and mixed (max's +0.0 must beat -0.0 wherever it is), NaNs
    /// with payloads, signalling and of both signs, infinities of one and both signs,
    /// subnormals, overflow, sums whose bits depend on the order, integer wrap-around.
    fn planted(dtype: DType, e: usize, k: usize, count: usize) -> Option<u64> {
        let last = count - 1;
        let float = |x: Float| Some(float_bits(dtype, x));
        let value = |v: f64| float(Float::Value(v));
        if matches!(dtype, DType::F32 | DType::F64) {
            match e {
                0 => value(if k == last { 0.0 } else { -0.0 }),
                1 => value(if k == 0 { 0.0 } else { -0.0 }),
                2 => value(-0.0),
                3 if k == count / 2 => float(Float::Nan(0)),
                4 if k == 0 => float(Float::Nan(1)),
                5 if k == last => float(Float::Nan(2)),
                6 => float(Float::Nan((k + 1) % NANS.len())),
                7 if k == 0 => value(f64::INFINITY),
                7 if k == last => value(f64::NEG_INFINITY),
                8 => value(f64::NEG_INFINITY),
                9 => float(Float::Subnormal(k % 2 == 1, 1 + 77 * k as u32)),
                10 => value(f64::from(f32::MAX) * if dtype == DType::F64 { 1e270 } else { 1.0 }),
                11 => {
                    value(if k.is_multiple_of(2) { 1.0e30 } else { -1.0e30 } * (k / 2 + 1) as f64)
                }
                12 => value(if k == 0 {
                    1.0
                } else {
                    2f64.powi(-30) * k as f64
                }),
                13 => match k % 3 {
                    0 => value(-0.0),
                    1 => float(Float::Subnormal(true, 3)),
                    _ => value(-f64::from(f32::MIN_POSITIVE)),
                },
                14 => value(if k == last {
                    1.0
                } else {
                    2f64.powi(100 - 7 * k as i32)
                }),
                15 if k == count / 2 => value(f64::INFINITY),
                _ => None,
            }
        } else {
            let (min, max) = match dtype {
                DType::I32 => (i128::from(i32::MIN), i128::from(i32::MAX)),
                DType::I64 => (i128::from(i64::MIN), i128::from(i64::MAX)),
                _ => (0, 255),
            };
            let int = |x: i128| Some(int_bits(dtype, x));
            match e {
                0 => int(max),
                1 => int(min),
                2 => int(if k == 0 { max } else { 1 }),
                3 => int(if k.is_multiple_of(2) { -1 } else { min }),
                4 => int(max - k as i128),
                5 => int(if k == last { max } else { min + k as i128 }),
                _ => None,
            }
        }
    }

    /// A random element: a special float one time in eight, else a normal spread over 2^±20;
    /// any integer half the time, else a small one.
    fn random_bits(dtype: DType, rng: &mut RankRng) -> u64 {
        if matches!(dtype, DType::F32 | DType::F64) {
            let x = match rng.below(16) {
                0 => Float::Nan(rng.below(NANS.len() as u64) as usize),
                1 => Float::Value(if rng.below(2) == 0 { 0.0 } else { -0.0 }),
                2 => Float::Value(f64::INFINITY),
                3 => Float::Subnormal(rng.below(2) == 0, 1 + rng.below(1000) as u32),
                _ => Float::Value(rng.normal_f64() * 2f64.powi(rng.below(41) as i32 - 20)),
            };
            float_bits(dtype, x)
        } else if rng.below(2) == 0 {
            int_bits(dtype, i128::from(rng.next_u64()))
        } else {
            int_bits(dtype, i128::from(rng.below(21)) - 10)
        }
    }

    /// Contribution `k` of `count`, `len` elements as bits.
    fn contribution(dtype: DType, len: usize, k: usize, count: usize, seed: u64) -> Vec<u64> {
        let mut rng = derive_stream(seed, Stream::User(50), k as u64, 0);
        (0..len)
            .map(|e| planted(dtype, e, k, count).unwrap_or_else(|| random_bits(dtype, &mut rng)))
            .collect()
    }

    fn tensor_data(dtype: DType, bits: &[u64]) -> TensorData {
        match dtype {
            DType::F32 => TensorData::F32(bits.iter().map(|&b| f32::from_bits(b as u32)).collect()),
            DType::F64 => TensorData::F64(bits.iter().map(|&b| f64::from_bits(b)).collect()),
            DType::I32 => TensorData::I32(bits.iter().map(|&b| b as u32 as i32).collect()),
            DType::I64 => TensorData::I64(bits.iter().map(|&b| b as i64).collect()),
            DType::U8 => TensorData::U8(bits.iter().map(|&b| b as u8).collect()),
            other => panic!("no {other} reduction"),
        }
    }

    fn data_bits(data: &TensorData) -> Vec<u64> {
        match data {
            TensorData::F32(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
            TensorData::F64(v) => v.iter().map(|x| x.to_bits()).collect(),
            TensorData::I32(v) => v.iter().map(|&x| u64::from(x as u32)).collect(),
            TensorData::I64(v) => v.iter().map(|&x| x as u64).collect(),
            TensorData::U8(v) => v.iter().map(|&x| u64::from(x)).collect(),
            other => panic!("no {} reduction", other.dtype()),
        }
    }

    /// Elements as the driver reads them: `width` little-endian bytes each.
    fn element_bytes(width: usize, bits: &[u64]) -> Vec<u8> {
        bits.iter()
            .flat_map(|b| b.to_le_bytes()[..width].to_vec())
            .collect()
    }

    /// A seeded permutation of `0..count`.
    fn shuffled(count: usize, seed: u64) -> Vec<usize> {
        let mut rng = derive_stream(seed, Stream::User(51), 0, 0);
        let mut order: Vec<usize> = (0..count).collect();
        for i in (1..count).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        order
    }

    const LENGTHS: [usize; 3] = [0, 1, 300];
    /// Launch configurations (grid, block, block-order seed): one thread for everything, whole
    /// blocks, and fewer threads than elements (a grid-stride loop of many rounds).
    const LAUNCHES: [(u64, u64, u64); 3] = [(1, 1, 1), (3, 32, 2), (7, 5, 3)];
    const CHECKS: &str = "run the reduction kernels on the CPU and compare their bits with \
                          value/reduce.rs's reduce_chunk";

    /// What a reduction case expects: its description and the reference's bits.
    struct Expected {
        what: String,
        host: HostDType,
        bits: Vec<u64>,
        inputs: Vec<Vec<u64>>,
    }

    fn check(cases: &Cases, expected: &[Expected]) {
        let Some(kernels) = host_kernels(HOST, &[], CHECKS) else {
            return;
        };
        let mut results = run(&kernels, cases);
        let mut elements = 0;
        for case in expected {
            let got = results.elements(case.bits.len(), case.host.width);
            for (i, (g, e)) in got.iter().zip(&case.bits).enumerate() {
                let inputs: Vec<String> =
                    case.inputs.iter().map(|c| format!("{:#x}", c[i])).collect();
                assert_eq!(
                    g,
                    e,
                    "{}: element {i}: {g:#x}, cpu {e:#x} (inputs {})",
                    case.what,
                    inputs.join(", ")
                );
            }
            elements += got.len();
        }
        results.assert_done();
        println!(
            "{} launches, {elements} elements: the CPU's bits",
            expected.len()
        );
    }

    /// The combine kernels (every dtype, sum and max) against `reduce_chunk` with the inputs'
    /// order as its `order`, bit for bit: 1 to 8 inputs in a shuffled order, lengths 0, 1 and
    /// 300 with every special element, at three launch configurations and block orders.
    #[test]
    fn combine_kernels_give_the_cpus_bits_on_the_host() {
        let mut cases = Cases::default();
        let mut expected = Vec::new();
        for host in HOST_DTYPES {
            for (op, op_code) in OPS {
                for count in 1..=8 {
                    for len in LENGTHS {
                        let seed = 1000 * host.code + 100 * op_code + 10 * count as u64;
                        let ranks: Vec<Vec<u64>> = (0..count)
                            .map(|k| contribution(host.dtype, len, k, count, seed + len as u64))
                            .collect();
                        let data: Vec<TensorData> =
                            ranks.iter().map(|r| tensor_data(host.dtype, r)).collect();
                        let refs: Vec<&TensorData> = data.iter().collect();
                        let order = shuffled(count, seed);
                        let want =
                            reduce_chunk(&refs, 0..len, &order, op, ReductionMode::RankOrdered);
                        let inputs: Vec<Vec<u64>> =
                            order.iter().map(|&r| ranks[r].clone()).collect();
                        for (grid, block, block_seed) in LAUNCHES {
                            cases.words(&[5, op_code, host.code, count as u64, len as u64]);
                            cases.words(&[grid, block, block_seed]);
                            inputs
                                .iter()
                                .for_each(|i| cases.bytes(&element_bytes(host.width, i)));
                            expected.push(Expected {
                                what: format!(
                                    "{op} {} of {count} inputs in rank order {order:?}, {len} \
                                     elements, {grid}×{block}",
                                    host.dtype
                                ),
                                host,
                                bits: data_bits(&want),
                                inputs: inputs.clone(),
                            });
                        }
                    }
                }
            }
        }
        check(&cases, &expected);
    }

    /// The accumulate kernels (every dtype, sum and max) against `reduce_chunk` of two
    /// contributions (`combine_into` once: `dst op src`), bit for bit, both ways round.
    #[test]
    fn accumulate_kernels_give_the_cpus_bits_on_the_host() {
        let mut cases = Cases::default();
        let mut expected = Vec::new();
        for host in HOST_DTYPES {
            for (op, op_code) in OPS {
                for len in LENGTHS {
                    for (count, swap) in [(2, false), (2, true), (3, false)] {
                        // Two of `count` planted contributions: dst and src.
                        let seed = 7000 + 1000 * host.code + 100 * op_code + len as u64;
                        let mut pair: Vec<Vec<u64>> = (0..2)
                            .map(|k| contribution(host.dtype, len, k + count - 2, count, seed))
                            .collect();
                        if swap {
                            pair.reverse();
                        }
                        let data: Vec<TensorData> =
                            pair.iter().map(|r| tensor_data(host.dtype, r)).collect();
                        let refs: Vec<&TensorData> = data.iter().collect();
                        let want =
                            reduce_chunk(&refs, 0..len, &[0, 1], op, ReductionMode::RankOrdered);
                        for (grid, block, block_seed) in LAUNCHES {
                            cases.words(&[6, op_code, host.code, len as u64, grid, block]);
                            cases.words(&[block_seed]);
                            pair.iter()
                                .for_each(|i| cases.bytes(&element_bytes(host.width, i)));
                            expected.push(Expected {
                                what: format!(
                                    "accumulate {op} {}, {len} elements, {grid}×{block}",
                                    host.dtype
                                ),
                                host,
                                bits: data_bits(&want),
                                inputs: pair.clone(),
                            });
                        }
                    }
                }
            }
        }
        check(&cases, &expected);
    }
}
