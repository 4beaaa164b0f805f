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
//!   the same order, compiled with `--fmad=false` and without fast-math (`device/cuda.rs`,
//!   `NVRTC_OPTIONS`); the launch configuration decides which thread folds a bucket, never how.
//!
//! Safety of the safe methods: the kernels index without bounds checks of their own, so every
//! index they follow is checked on the host before it reaches the device. Indices go up through
//! [`Gpu::upload_indices`] (each below the bucket count, or a panic before any upload), and the
//! order and offsets through [`Gpu::upload_segments`], from a [`Segments`], whose only
//! constructor guarantees them; the launch methods check the values' dtype and length against
//! those handles.
//!
//! Testing: without a GPU (CI has none) the tests run both kernels on the CPU through the host
//! emulation (`device/host_emulation.rs`: g++, `host_shim.h`'s atomics as `std::atomic_ref`, blocks
//! in a shuffled order, a block's threads as `std::thread`s). The segmented sum is compared with
//! `segmented_sum_f32` bit for bit (empty buckets, one bucket, many, a lone `-0.0`); the atomic
//! scatter, launched with one thread per block, gives the fold of its blocks' order bit for bit,
//! and with many threads a fold within the rounding of some order (that its bits change from
//! launch to launch is a GPU's to show). On a GPU, `scripts/gpu-selftest.sh` runs the tests that
//! compare the GPU's bits with the CPU's.
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
    use crate::device::cuda::assert_compiles_with_nvrtc;
    use crate::device::gpu::gpu_for_test;
    use crate::device::host_emulation::{
        compile_together, host_kernels, run, try_run, Cases, HostSource,
    };
    use crate::device::kernels::{CUBIN_ARCH, PTX_ARCH};
    use crate::device::{kernels, reprosum};
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

    // ---- The host emulation (`device/host_emulation.rs`) ---------------------------------------

    /// [`OPS_SOURCE`] for the host emulation's driver.
    const HOST: HostSource = HostSource {
        program: OPS_PROGRAM,
        source: OPS_SOURCE,
    };

    /// The three kernel sources compile into one translation unit (no name clashes); a driver
    /// compiled with one refuses the case kinds of the others.
    #[test]
    fn the_kernel_sources_compile_together_on_the_host() {
        let checks = "check that the kernel sources compile together for the host emulation";
        if !compile_together(&[reprosum::tests::HOST, kernels::tests::HOST, HOST], checks) {
            return;
        }
        let Some(kernels) = host_kernels(HOST, &[], checks) else {
            return;
        };
        let mut cases = Cases::default();
        // A reproducible column sum of nothing, kind 1.
        cases.words(&[1, 0, 0, 1, 1, 0]);
        let output = try_run(&kernels, &cases);
        assert_eq!(output.status.code(), Some(2), "{output:?}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("not compiled in"),
            "{output:?}"
        );
    }

    /// Launch configurations (grid, block, block-order seed): one thread for everything, whole
    /// blocks, and fewer threads than buckets or values.
    const LAUNCHES: [(u64, u64, u64); 3] = [(1, 1, 1), (3, 32, 2), (5, 7, 3)];

    /// Scatters for the host: (name, values, indices, buckets). Random ones of 0 to 1000
    /// values into 0 to 5000 buckets (most of them empty in the last), and planted buckets:
    /// `-0.0` alone (the fold starts from the first value, not from `+0.0`), `-0.0` twice,
    /// `-0.0` then `+0.0`, a NaN with a payload, infinities of both signs, an order-dependent sum.
    fn host_scatters() -> Vec<(String, Vec<f32>, Vec<u32>, usize)> {
        let mut scatters = Vec::new();
        for (len, buckets) in [
            (0usize, 0usize),
            (0, 3),
            (1, 1),
            (5, 1),
            (300, 1),
            (300, 7),
            (255, 64),
            (1000, 5000),
        ] {
            let (values, indices) = scatter_input(len, buckets, (len * 31 + buckets) as u64);
            scatters.push((
                format!("{len} values, {buckets} buckets"),
                values,
                indices,
                buckets,
            ));
        }
        let planted: Vec<(u32, f32)> = vec![
            (1, -0.0),
            (2, -0.0),
            (2, -0.0),
            (3, -0.0),
            (3, 0.0),
            (4, 1.0),
            (4, f32::from_bits(0xffc0_1234)),
            (4, 2.0),
            (5, f32::INFINITY),
            (5, f32::NEG_INFINITY),
            (6, 1.0e30),
            (6, 1.0),
            (6, -1.0e30),
            (7, 0.0),
            (7, -0.0),
            (1, 0.0), // after bucket 1's -0.0: +0.0 only when added
        ];
        let (indices, values): (Vec<u32>, Vec<f32>) = planted.into_iter().unzip();
        scatters.push(("planted buckets".into(), values.clone(), indices.clone(), 9));
        // -0.0 alone, as the only bucket.
        scatters.push(("-0.0 alone".into(), vec![-0.0], vec![0], 1));
        scatters
    }

    /// `detcheck_segmented_sum_f32` on the host against `segmented_sum_f32`, bit for bit, at
    /// three launch configurations and block orders.
    #[test]
    fn the_segmented_sum_gives_the_cpus_bits_on_the_host() {
        let Some(kernels) = host_kernels(
            HOST,
            &[],
            "run detcheck_segmented_sum_f32 on the CPU and compare its bits with \
             value/scatter.rs's segmented_sum_f32",
        ) else {
            return;
        };
        let scatters = host_scatters();
        let mut cases = Cases::default();
        for (_, values, indices, buckets) in &scatters {
            let segments = segments(indices, *buckets).unwrap();
            for (grid, block, seed) in LAUNCHES {
                cases.words(&[7, *buckets as u64, values.len() as u64, grid, block, seed]);
                cases.f32s(values);
                cases.u32s(segments.order());
                cases.u32s(segments.offsets());
            }
        }
        let mut results = run(&kernels, &cases);
        for (name, values, indices, buckets) in &scatters {
            let want: Vec<u32> = segmented_sum_f32(values, indices, *buckets)
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            for (grid, block, _) in LAUNCHES {
                let got = results.f32s(*buckets);
                for (b, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g, w,
                        "{name}, {grid}×{block}: bucket {b}: {g:#x}, cpu {w:#x}"
                    );
                }
            }
        }
        results.assert_done();
        assert_eq!(
            segmented_sum_f32(&[-0.0], &[0], 1).unwrap()[0].to_bits(),
            (-0.0f32).to_bits(),
            "the reference keeps a lone -0.0"
        );
    }

    /// `detcheck_scatter_atomic_f32` on the host, the nondeterministic control with the shim's
    /// atomics: with one thread per block the adds land in a known order (the blocks' order, the
    /// driver's to say, each block's values in increasing position), and the buckets are that
    /// order's fold, bit for bit; with many threads per block, whatever order the threads took,
    /// each bucket is a fold of its values within the rounding of `m` adds. That the bits change
    /// from launch to launch is for a GPU (`the_atomic_scatter_changes_its_bits_between_launches`);
    /// the CPU's threads need not race.
    #[test]
    fn the_atomic_scatter_is_some_orders_fold_on_the_host() {
        let Some(kernels) = host_kernels(
            HOST,
            &[],
            "run detcheck_scatter_atomic_f32 on the CPU and check that it is a fold of each \
             bucket's values in some order",
        ) else {
            return;
        };
        let launches = [
            (1, 1, 1),
            (4, 1, 2),
            (7, 1, 3),
            (3, 32, 4),
            (2, 64, 5),
            (5, 7, 6),
        ];
        let mut scatters = host_scatters();
        let (values, indices) = scatter_input(4000, 3, 77);
        scatters.push(("4000 values, 3 buckets".into(), values, indices, 3));
        let mut cases = Cases::default();
        for (_, values, indices, buckets) in &scatters {
            for (grid, block, seed) in launches {
                cases.words(&[8, *buckets as u64, values.len() as u64, grid, block, seed]);
                cases.f32s(values);
                cases.u32s(indices);
            }
        }
        let mut results = run(&kernels, &cases);
        let (mut exact, mut bounded) = (0, 0);
        for (name, values, indices, buckets) in &scatters {
            let mut sum = vec![0.0f64; *buckets];
            let mut magnitude = vec![0.0f64; *buckets];
            let mut terms = vec![0usize; *buckets];
            for (&v, &b) in values.iter().zip(indices) {
                sum[b as usize] += f64::from(v);
                magnitude[b as usize] += f64::from(v.abs());
                terms[b as usize] += 1;
            }
            for (grid, block, _) in launches {
                let got = results.f32s(*buckets);
                let order = results.elements(grid as usize, 8);
                let what = format!("{name}, {grid}×{block}");
                if block == 1 {
                    // Block `b` adds positions b, b + grid, ... in turn; blocks in `order`.
                    let mut want = vec![0.0f32; *buckets];
                    for &b in &order {
                        for i in (b as usize..values.len()).step_by(grid as usize) {
                            want[indices[i] as usize] += values[i];
                        }
                    }
                    for (b, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            *g,
                            w.to_bits(),
                            "{what}: bucket {b}: {g:#x}, the fold in block order {order:?}: {:#x}",
                            w.to_bits()
                        );
                    }
                    exact += 1;
                } else {
                    for b in 0..*buckets {
                        let g = f64::from(f32::from_bits(got[b]));
                        if !sum[b].is_finite() {
                            // A NaN, or infinities of both signs, in every order; one infinity.
                            let same = if sum[b].is_nan() {
                                g.is_nan()
                            } else {
                                g == sum[b]
                            };
                            assert!(same, "{what}: bucket {b}: {g}, every order: {}", sum[b]);
                            continue;
                        }
                        // Any order's fold of m values errs by at most (m - 1)·u/(1 - (m - 1)·u)
                        // of their magnitudes, u = 2^-24, below (m + 1)·u.
                        let bound = (terms[b] + 1) as f64 * 2f64.powi(-24) * magnitude[b];
                        assert!(
                            (g - sum[b]).abs() <= bound,
                            "{what}: bucket {b}: {g} against an exact {} (bound {bound})",
                            sum[b]
                        );
                    }
                    bounded += 1;
                }
            }
        }
        results.assert_done();
        println!(
            "{exact} launches gave their block order's fold, {bounded} a fold within rounding"
        );
    }
}
