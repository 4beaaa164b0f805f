//! One GPU and the code that runs on it (feature `nccl`): CUDA's libraries, detcheck's kernels
//! and GPU operators. Collectives between ranks on GPUs are `comm`'s (`GpuThreadComm`,
//! `NcclComm`), built on this layer.
//!
//! The main type is `Gpu`: one device's context and stream, with detcheck's kernels compiled at
//! first use, and `DeviceTensor`, a tensor's bytes on the device. Below it, CUDA's libraries are
//! found before cudarc loads them (`locate_library`, `count_devices`; a missing one is a
//! `CudaError` naming it and how to get it, never cudarc's panic), and NVRTC compiles CUDA C
//! (`compile_ptx`, `compile_cubin`, always with `NVRTC_OPTIONS`). The kernels:
//! `value/reduce.rs`'s reductions (`REDUCE_SOURCE`, `compile_reduce_kernels`),
//! `value/reprosum.rs`'s reproducible sums (`REPROSUM_SOURCE`, `compile_reprosum_kernels`) and
//! the GPU operators (`OPS_SOURCE`: scatter-add, an `atomicAdd` negative control and its
//! deterministic twin, `Gpu::scatter_add_atomic`, `Gpu::segmented_sum`).
//!
//! Determinism: every kernel but two gives the bits of its CPU reference in `value/` (each names
//! it): the CPU's operations, compiled with `--fmad=false` and without fast-math, each element
//! folded in a fixed order (or summed exactly as integers), so the bits depend neither on the
//! launch configuration nor on the order in which blocks and threads run. The two are
//! nondeterministic by design (float atomics): the atomic scatter, a negative control, and the
//! plain sum, the reproducible sum's benchmark baseline. Uploads and downloads keep a tensor's
//! bits.
//!
//! Limits: without the `nccl` feature this module is empty. CUDA 13 (cudarc's `cuda-13000`),
//! Linux library names, one stream per device. Without a GPU (CI), the kernels' tests run their
//! very source on the CPU (`host_emulation.rs`: g++, `host_shim.h`, `host_driver.cpp`), and the
//! tests that need a GPU say what they would check.

#[cfg(feature = "nccl")]
mod cuda;
#[cfg(feature = "nccl")]
pub(crate) mod gpu;
#[cfg(all(test, feature = "nccl"))]
mod host_emulation;
#[cfg(feature = "nccl")]
mod kernels;
#[cfg(feature = "nccl")]
mod ops;
#[cfg(feature = "nccl")]
mod reprosum;

#[cfg(feature = "nccl")]
pub use cuda::{
    compile_cubin, compile_ptx, count_devices, locate_library, nvrtc_version, CudaError,
    CudaLibrary, LocatedLibrary, NVRTC_OPTIONS,
};
#[cfg(feature = "nccl")]
pub use gpu::{DeviceChunk, DeviceTensor, Gpu};
#[cfg(feature = "nccl")]
pub use kernels::{
    compile_reduce_kernels, reduce_kernel, KernelForm, ReduceKernel, ReduceModules, CUBIN_ARCH,
    PTX_ARCH, REDUCE_KERNELS, REDUCE_PROGRAM, REDUCE_SOURCE,
};
#[cfg(feature = "nccl")]
pub use ops::{DeviceIndices, DeviceSegments, OpsKernel, OPS_KERNELS, OPS_PROGRAM, OPS_SOURCE};
#[cfg(feature = "nccl")]
pub use reprosum::{
    compile_reprosum_kernels, reprosum_scratch_bytes, reprosum_tiles, KernelArgument,
    ReprosumKernel, ReprosumLaunch, REPROSUM_CANDIDATES, REPROSUM_HEADER_BYTES, REPROSUM_KERNELS,
    REPROSUM_LAST_BLOCK_REREADS, REPROSUM_PENDING, REPROSUM_PROGRAM, REPROSUM_RECORD_WORDS,
    REPROSUM_SOURCE, REPROSUM_TILE_ELEMENTS, REPROSUM_TILE_ITEMS, REPROSUM_TILE_THREADS,
};
