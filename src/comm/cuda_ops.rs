//! GPU operators (feature `nccl`): scatter-add as an `atomicAdd` negative control and as its
//! deterministic twin, compiled by NVRTC from [`OPS_SOURCE`] and launched by safe methods of
//! [`Gpu`].
//!
//! [`OPS_KERNELS`] names each kernel of [`OPS_SOURCE`] with its CPU reference in
//! `value/scatter.rs`:
//! - `detcheck_scatter_atomic_f32`: one `atomicAdd` per value ([`Gpu::scatter_add_atomic`]). The
//!   adds into one bucket land in the order the GPU's threads reach memory, which changes from
//!   launch to launch, and f32 addition is not associative: the bits change too (an H100 gave 20
//!   different results in 20 launches of 4M values into 64 buckets). Nondeterministic by design:
//!   it is the negative control, equal to `segmented_sum_f32` only up to rounding.
//! - `detcheck_segmented_sum_f32`: one thread per bucket folds the bucket's values in increasing
//!   position ([`Gpu::segmented_sum`]), from a stable counting sort done on the host
//!   ([`Segments`]). Its bits are `value::scatter::segmented_sum_f32`'s: the same IEEE adds in
//!   the same order, compiled with `--fmad=false` and without fast-math (`comm/cuda.rs`,
//!   `NVRTC_OPTIONS`); the launch configuration decides which thread folds a bucket, never how.
//!
//! Safety of the safe methods: the kernels index without bounds checks of their own, so every
//! index they follow is checked on the host before it reaches the device. Indices go up through
//! [`Gpu::upload_indices`] (each below the bucket count, or a panic before any upload), and the
//! order and offsets through [`Gpu::upload_segments`], from a [`Segments`], whose only
//! constructor guarantees them; the launch methods check the values' dtype and length against
//! those handles.
//!
//! Limits: f32 values only; positions and buckets are `u32` (`value/scatter.rs`). The segmented
//! kernel runs one thread per bucket, so few buckets of many values each run nearly serially:
//! it is a reference of bits, not of speed.

// cudarc's kernel launch is `unsafe` (the arguments must match the kernel's parameters and every
// address the kernel follows must be in bounds). Every `unsafe` block says why it holds.
#![allow(unsafe_code)]

use super::cuda::CudaError;
use super::gpu::{driver, elementwise, DeviceTensor, Gpu, Program};
use crate::value::scatter::{check_indices, Segments};
use crate::value::tensor::DType;
use cudarc::driver::{CudaSlice, PushKernelArg};

/// The name NVRTC gives [`OPS_SOURCE`] in its messages.
pub const OPS_PROGRAM: &str = "detcheck_ops.cu";

/// The CUDA C of the operator kernels (see the module docs and [`OPS_KERNELS`]).
pub const OPS_SOURCE: &str = r#"// detcheck's GPU operators: scatter-add, an atomicAdd control and its deterministic twin.
// Compiled by NVRTC with --fmad=false --prec-div=true --prec-sqrt=true --ftz=false.

// The negative control: out[indices[i]] += values[i], one atomicAdd per value. The host checked
// every index against out's length. The adds into one bucket happen in the order the threads
// reach memory, which changes from launch to launch, and so do the bits of the sums.
extern "C" __global__ void detcheck_scatter_atomic_f32(
    float* out, const float* values, const unsigned int* indices, unsigned long long n) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += stride) {
        atomicAdd(&out[indices[i]], values[i]);
    }
}

// The deterministic twin, value/scatter.rs `Segments::sum_f32` (= `segmented_sum_f32`): bucket
// b's positions are order[offsets[b] .. offsets[b + 1]], increasing (a stable counting sort on
// the host). One thread folds one bucket from its first value, one IEEE add at a time, in that
// order; a bucket without values is +0.0.
extern "C" __global__ void detcheck_segmented_sum_f32(
    float* out, const float* values, const unsigned int* order, const unsigned int* offsets,
    unsigned int buckets) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long b = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         b < buckets; b += stride) {
        unsigned int start = offsets[b];
        unsigned int end = offsets[b + 1];
        float sum = 0.0f;
        if (start < end) {
            sum = values[order[start]];
            for (unsigned int k = start + 1; k < end; ++k) sum = sum + values[order[k]];
        }
        out[b] = sum;
    }
}
"#;

/// The operator kernels' program.
pub(crate) const OPS: Program = Program {
    name: OPS_PROGRAM,
    source: OPS_SOURCE,
};

/// One kernel of [`OPS_SOURCE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpsKernel {
    /// Its `extern "C"` name, as the PTX and cubin name it.
    pub name: &'static str,
    /// The CPU function in `value/scatter.rs` it computes.
    pub reference: &'static str,
    /// `true` when it must give the reference's bits; `false` for a negative control, which
    /// equals it only up to rounding.
    pub bitwise: bool,
}

/// The atomic scatter kernel's name.
const SCATTER_ATOMIC: &str = "detcheck_scatter_atomic_f32";
/// The segmented sum kernel's name.
const SEGMENTED_SUM: &str = "detcheck_segmented_sum_f32";

/// Every kernel of [`OPS_SOURCE`] with its CPU reference.
pub const OPS_KERNELS: [OpsKernel; 2] = [
    OpsKernel {
        name: SCATTER_ATOMIC,
        reference: "value::scatter::segmented_sum_f32 (up to rounding: adds in arrival order)",
        bitwise: false,
    },
    OpsKernel {
        name: SEGMENTED_SUM,
        reference: "value::scatter::segmented_sum_f32",
        bitwise: true,
    },
];

/// Bucket indices on the device, each checked below [`DeviceIndices::buckets`] on the host.
#[derive(Debug)]
pub struct DeviceIndices {
    indices: CudaSlice<u32>,
    len: usize,
    buckets: usize,
}

impl DeviceIndices {
    /// The number of indices.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` without indices.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The number of buckets every index is below.
    #[must_use]
    pub fn buckets(&self) -> usize {
        self.buckets
    }
}

/// A [`Segments`] on the device: its order and offsets, with the guarantees it was built with.
#[derive(Debug)]
pub struct DeviceSegments {
    order: CudaSlice<u32>,
    offsets: CudaSlice<u32>,
    len: usize,
    buckets: usize,
}

impl DeviceSegments {
    /// The number of positions (values to scatter).
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` without positions.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The number of buckets.
    #[must_use]
    pub fn buckets(&self) -> usize {
        self.buckets
    }
}

impl Gpu {
    /// Copies `data` to the device as `u32`s (an empty slice allocates nothing).
    fn upload_u32(&self, data: &[u32]) -> Result<CudaSlice<u32>, CudaError> {
        if data.is_empty() {
            self.stream().null::<u32>()
        } else {
            self.stream().clone_htod(data)
        }
        .map_err(driver("cuMemcpyHtoD"))
    }

    /// Copies bucket indices to the device for [`Gpu::scatter_add_atomic`].
    ///
    /// # Panics
    /// When an index is not below `buckets`, or there are more than `u32::MAX` indices or
    /// buckets (a caller's bug: check input with `value::check_indices` first).
    ///
    /// # Errors
    /// [`CudaError::Driver`] when the allocation or the copy fails.
    pub fn upload_indices(
        &self,
        indices: &[u32],
        buckets: usize,
    ) -> Result<DeviceIndices, CudaError> {
        if let Err(e) = check_indices(indices, buckets) {
            panic!("indices for a scatter on the GPU: {e}");
        }
        Ok(DeviceIndices {
            indices: self.upload_u32(indices)?,
            len: indices.len(),
            buckets,
        })
    }

    /// Copies `segments` to the device for [`Gpu::segmented_sum`].
    ///
    /// # Errors
    /// [`CudaError::Driver`] when an allocation or a copy fails.
    pub fn upload_segments(&self, segments: &Segments) -> Result<DeviceSegments, CudaError> {
        Ok(DeviceSegments {
            order: self.upload_u32(segments.order())?,
            offsets: self.upload_u32(segments.offsets())?,
            len: segments.len(),
            buckets: segments.buckets(),
        })
    }

    /// The negative control: `values` (f32) scattered into `indices.buckets()` f32 buckets with
    /// one `atomicAdd` each, from zeros. Each bucket is its values' sum, added in an order that
    /// changes from launch to launch, and so do the bits.
    ///
    /// # Panics
    /// When `values` is not f32 or its length is not `indices.len()` (a caller's bug).
    ///
    /// # Errors
    /// [`CudaError`] when the kernel cannot be compiled, loaded or launched, or an allocation
    /// fails.
    pub fn scatter_add_atomic(
        &self,
        values: &DeviceTensor,
        indices: &DeviceIndices,
    ) -> Result<DeviceTensor, CudaError> {
        assert_eq!(values.dtype(), DType::F32, "a scatter of f32 values");
        assert_eq!(values.len(), indices.len, "one index per value");
        let out = self.zeros(DType::F32, &[indices.buckets])?;
        if values.is_empty() {
            return Ok(out);
        }
        let function = self.function(OPS, SCATTER_ATOMIC)?;
        let out_address = out.address(self.stream(), 0);
        let values_address = values.address(self.stream(), 0);
        let n = values.len() as u64;
        let mut launch = self.stream().launch_builder(&function);
        launch
            .arg(&out_address)
            .arg(&values_address)
            .arg(&indices.indices)
            .arg(&n);
        // SAFETY: the kernel takes `(float* out, const float* values, const unsigned int*
        // indices, unsigned long long n)`, and gets exactly those: `out` holds `buckets` f32s,
        // `values` `n` f32s and `indices` `n` u32s (checked above), each below `buckets`
        // (`upload_indices` checked every one), so every read and every atomic write is in
        // bounds. `out`, `values` and `indices` live until the launch is enqueued, and their
        // frees are ordered after it on this one stream.
        unsafe { launch.launch(elementwise(values.len())) }.map_err(driver("cuLaunchKernel"))?;
        Ok(out)
    }

    /// The deterministic twin: `values` (f32) summed per bucket of `segments`, each bucket
    /// folded from its first value in increasing position: `value::segmented_sum_f32`'s bits.
    ///
    /// # Panics
    /// When `values` is not f32 or its length is not `segments.len()` (a caller's bug).
    ///
    /// # Errors
    /// [`CudaError`] when the kernel cannot be compiled, loaded or launched, or an allocation
    /// fails.
    pub fn segmented_sum(
        &self,
        values: &DeviceTensor,
        segments: &DeviceSegments,
    ) -> Result<DeviceTensor, CudaError> {
        assert_eq!(values.dtype(), DType::F32, "a segmented sum of f32 values");
        assert_eq!(values.len(), segments.len, "one position per value");
        let out = self.zeros(DType::F32, &[segments.buckets])?;
        if segments.buckets == 0 {
            return Ok(out);
        }
        let function = self.function(OPS, SEGMENTED_SUM)?;
        let out_address = out.address(self.stream(), 0);
        let values_address = values.address(self.stream(), 0);
        // `Segments` counts its buckets in a u32 (`check_indices`).
        let buckets = segments.buckets as u32;
        let mut launch = self.stream().launch_builder(&function);
        launch
            .arg(&out_address)
            .arg(&values_address)
            .arg(&segments.order)
            .arg(&segments.offsets)
            .arg(&buckets);
        // SAFETY: the kernel takes `(float* out, const float* values, const unsigned int*
        // order, const unsigned int* offsets, unsigned int buckets)`, and gets exactly those.
        // `out` holds `buckets` f32s; `offsets` `buckets + 1` u32s, from 0 up to `len`, never
        // decreasing; `order` `len` u32s, each below `len` (what `Segments` guarantees, copied
        // unchanged by `upload_segments`), and `values` `len` f32s (checked above): every read
        // and write is in bounds. The buffers live until the launch is enqueued, and their
        // frees are ordered after it on this one stream.
        unsafe { launch.launch(elementwise(segments.buckets)) }
            .map_err(driver("cuLaunchKernel"))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::cuda::assert_compiles_with_nvrtc;
    use crate::comm::cuda_kernels::{CUBIN_ARCH, PTX_ARCH};
    use crate::comm::gpu::gpu_for_test;
    use crate::value::scatter::{segmented_sum_f32, segments};
    use crate::value::seed::{derive_stream, Stream};
    use crate::value::tensor::Tensor;
    use std::collections::BTreeSet;

    /// `len` normals spread over 17 binades (`2^-8` to `2^8`, so the order of adds matters) and
    /// indices below `buckets`, seeded.
    fn scatter_input(len: usize, buckets: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
        let mut rng = derive_stream(seed, Stream::User(21), 0, 0);
        let values = (0..len)
            .map(|_| rng.normal_f32() * 2f32.powi(rng.below(17) as i32 - 8))
            .collect();
        let indices = (0..len).map(|_| rng.below(buckets as u64) as u32).collect();
        (values, indices)
    }

    fn floats(tensor: &Tensor) -> Vec<f32> {
        tensor.values::<f32>().expect("an f32 tensor").to_vec()
    }

    #[test]
    fn every_kernel_names_a_reference_that_exists() {
        let cpu = include_str!("../value/scatter.rs");
        for kernel in &OPS_KERNELS {
            assert!(
                OPS_SOURCE.contains(&format!("void {}(", kernel.name)),
                "{}",
                kernel.name
            );
            let path = kernel.reference.split(' ').next().unwrap();
            let function = path.rsplit("::").next().unwrap();
            assert!(cpu.contains(&format!("pub fn {function}(")), "{function}");
        }
        let names: BTreeSet<_> = OPS_KERNELS.iter().map(|k| k.name).collect();
        assert_eq!(names.len(), OPS_KERNELS.len());
    }

    /// Both kernels compile with NVRTC to PTX (compute_90) and to a cubin (sm_90). Without NVRTC
    /// this says what it would check and passes, unless `DETCHECK_REQUIRE_NVRTC=1` (CI).
    #[test]
    fn every_operator_kernel_compiles_with_nvrtc() {
        let names: Vec<&str> = OPS_KERNELS.iter().map(|k| k.name).collect();
        let Some(instructions) = assert_compiles_with_nvrtc(
            (OPS_PROGRAM, OPS_SOURCE),
            (PTX_ARCH, CUBIN_ARCH),
            &names,
            &["f32"],
        ) else {
            return;
        };
        // The control's adds are atomic (`atom`/`red` add), the twin's pinned (checked above).
        assert!(
            instructions.iter().any(
                |i| (i.starts_with("atom.") || i.starts_with("red.")) && i.contains(".add.f32")
            ),
            "no atomic f32 add in the PTX: {instructions:?}"
        );
    }

    #[test]
    fn the_segmented_sum_gives_the_cpus_bits() {
        let Some(gpu) = gpu_for_test(
            "detcheck_segmented_sum_f32 gives segmented_sum_f32's bits (0 to 1<<20 values, 1 to \
             5000 buckets, empty buckets included)",
        ) else {
            return;
        };
        let mut checked = 0;
        for (len, buckets) in [
            (0usize, 3usize),
            (1, 1),
            (255, 7),
            (256, 256),
            (257, 5000),
            (10_000, 64),
            (1 << 20, 64),
            (1 << 20, 4099),
        ] {
            let (values, indices) = scatter_input(len, buckets, (len * 31 + buckets) as u64);
            let want = segmented_sum_f32(&values, &indices, buckets).unwrap();
            let device_values = gpu.upload(&Tensor::from_vec(values)).unwrap();
            let device_segments = gpu
                .upload_segments(&segments(&indices, buckets).unwrap())
                .unwrap();
            let out = gpu.segmented_sum(&device_values, &device_segments).unwrap();
            let got = floats(&gpu.download(&out).unwrap());
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{len} values, {buckets} buckets");
            checked += 1;
        }
        println!(
            "{checked} segmented sums on {} equal the CPU's bits",
            gpu.name()
        );
    }

    #[test]
    fn the_atomic_scatter_changes_its_bits_between_launches() {
        let Some(gpu) = gpu_for_test(
            "20 launches of detcheck_scatter_atomic_f32 (1<<20 values into 64 buckets) give more \
             than one distinct result, each close to segmented_sum_f32's",
        ) else {
            return;
        };
        let (len, buckets) = (1usize << 20, 64usize);
        let (values, indices) = scatter_input(len, buckets, 20);
        let reference = segmented_sum_f32(&values, &indices, buckets).unwrap();
        let mut magnitude = vec![0.0f64; buckets];
        for (&v, &b) in values.iter().zip(&indices) {
            magnitude[b as usize] += f64::from(v.abs());
        }
        let device_values = gpu.upload(&Tensor::from_vec(values)).unwrap();
        let device_indices = gpu.upload_indices(&indices, buckets).unwrap();
        let mut distinct = BTreeSet::new();
        for _ in 0..20 {
            let out = gpu
                .scatter_add_atomic(&device_values, &device_indices)
                .unwrap();
            let got = floats(&gpu.download(&out).unwrap());
            // The same sums up to rounding: each add errs by half an ulp of its partial sum.
            for b in 0..buckets {
                let error = f64::from((got[b] - reference[b]).abs());
                assert!(
                    error <= magnitude[b] * 1e-3,
                    "bucket {b}: {} against {}",
                    got[b],
                    reference[b]
                );
            }
            distinct.insert(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        }
        println!(
            "{} distinct results in 20 atomic scatters of {len} values into {buckets} buckets on {}",
            distinct.len(),
            gpu.name()
        );
        assert!(
            distinct.len() > 1,
            "the atomic scatter repeated its bits 20 times"
        );
    }
}
