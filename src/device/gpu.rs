//! One GPU as detcheck uses it (feature `nccl`): a context, one stream, the kernels loaded, and
//! tensors on the device as bytes.
//!
//! [`Gpu::open`] finds the driver and NVRTC first (`device/cuda.rs`: a missing library is an
//! error, never cudarc's panic), creates the device's primary context and one stream, and
//! compiles detcheck's kernels with NVRTC at first use (once per process, then loaded once per
//! context). A [`DeviceTensor`] is a tensor's canonical little-endian bytes in device memory with
//! its dtype and shape, so every dtype moves (broadcast, allgather) and the reduction kernels
//! read the bytes as their element type. [`Gpu::reduce`] folds chunks of several device tensors
//! into one with the kernel the CPU's `reduce_chunk` stands for (`device/kernels.rs`,
//! `device/reprosum.rs`).
//!
//! Ordering: everything a `Gpu` does goes to its one stream, in the order it is called. Thread
//! ranks sharing the GPU (`comm/gpu_threads.rs`) order their calls by their rounds, so a kernel
//! that reads another rank's buffer is enqueued after that rank's upload, and a buffer is freed
//! (stream-ordered, by cudarc's drop) after every kernel enqueued before the free. Downloads
//! wait for the stream.
//!
//! Determinism: the kernels' bits depend on their inputs and the inputs' order only (see the
//! kernels' modules); the launch configuration decides which thread computes an element, never
//! how. Streams of random numbers are drawn on the host, so uploaded tensors have the CPU's bits.
//!
//! Limits: one stream per device; a tensor's bytes are at most what the device can allocate.
//! Nothing here runs without a GPU: the tests that need one say what they would check and pass
//! (`DETCHECK_REQUIRE_GPU=1` makes them fail instead: the GPU self-test sets it).

// cudarc's kernel launch is `unsafe` (the arguments must match the kernel's parameters), and so
// are raw device pointers in an argument array. Every `unsafe` block says why it holds.
#![allow(unsafe_code)]

use super::cuda::{compile_ptx, count_devices, locate_library, CudaError, CudaLibrary};
use super::kernels::{reduce_kernel, KernelForm, PTX_ARCH, REDUCE_PROGRAM, REDUCE_SOURCE};
use super::reprosum::{
    reprosum_scratch_bytes, reprosum_tiles, REPROSUM_PENDING, REPROSUM_PROGRAM, REPROSUM_SOURCE,
    REPROSUM_TILE_THREADS,
};
use crate::value::reduce::{ReduceOp, ReductionMode};
use crate::value::tensor::{DType, Tensor, TensorView};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DriverError,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

/// Threads per block of the elementwise kernels (their grid-stride loops make any size correct).
const BLOCK_THREADS: u32 = 256;
/// The most blocks an elementwise launch uses; more elements are strided over.
const MAX_BLOCKS: u64 = 8192;

/// A CUDA C program of detcheck's: its name (NVRTC's messages use it) and source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Program {
    pub(crate) name: &'static str,
    pub(crate) source: &'static str,
}

/// The reduction kernels' program.
pub(crate) const REDUCE: Program = Program {
    name: REDUCE_PROGRAM,
    source: REDUCE_SOURCE,
};

/// The reproducible sums' program.
pub(crate) const REPROSUM: Program = Program {
    name: REPROSUM_PROGRAM,
    source: REPROSUM_SOURCE,
};

/// One GPU: its primary context, the stream every call uses, and the modules and kernels loaded
/// so far (each collective launches one: looked up once, not per call).
pub struct Gpu {
    ordinal: usize,
    name: String,
    multiprocessors: u32,
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: Mutex<BTreeMap<&'static str, Arc<CudaModule>>>,
    functions: Mutex<BTreeMap<(&'static str, String), CudaFunction>>,
    /// The one-buffer sums' device memory, kept from sum to sum (`None` until the first, and
    /// after a sum that failed part way: its header may not be zero).
    sum_scratch: Mutex<Option<SumScratch>>,
    /// The plain sum's result, kept like the one-buffer sum's memory (so the benchmark compares
    /// kernels, not allocations).
    plain_out: Mutex<Option<CudaSlice<f32>>>,
}

/// What a one-buffer sum writes on the device: the scratch array (its header zero between sums,
/// `reprosum_scratch_bytes`) and the two result words (`detcheck_reprosum_f32`'s `out`).
struct SumScratch {
    scratch: CudaSlice<u8>,
    out: CudaSlice<u32>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({} {})", self.ordinal, self.name)
    }
}

/// A tensor in device memory: its canonical little-endian bytes, dtype and shape.
#[derive(Debug)]
pub struct DeviceTensor {
    dtype: DType,
    shape: Vec<usize>,
    bytes: CudaSlice<u8>,
}

impl DeviceTensor {
    /// The element type.
    #[must_use]
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    #[must_use]
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of elements.
    #[must_use]
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size_of()
    }

    /// `true` without elements.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The size in bytes.
    #[must_use]
    pub(crate) fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    /// The device address of element `index` (at most `len`), as a kernel argument or an NCCL
    /// buffer (`comm/nccl.rs`).
    pub(crate) fn address(&self, stream: &CudaStream, index: usize) -> u64 {
        let (base, _sync) = self.bytes.device_ptr(stream);
        base + (index * self.dtype.size_of()) as u64
    }
}

/// `what` failed in the driver: [`CudaError::Driver`].
pub(crate) fn driver(call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        message: format!("{e:?}"),
    }
}

/// The PTX of each program, compiled once per process (NVRTC takes about a second).
fn compiled(program: Program) -> Result<String, CudaError> {
    static PTX: OnceLock<Mutex<BTreeMap<Program, String>>> = OnceLock::new();
    let cache = PTX.get_or_init(|| Mutex::new(BTreeMap::new()));
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(ptx) = cache.get(&program) {
        return Ok(ptx.clone());
    }
    let ptx = compile_ptx(program.name, program.source, PTX_ARCH)?;
    cache.insert(program, ptx.clone());
    Ok(ptx)
}

/// The launch configuration of an elementwise kernel over `len` elements.
pub(crate) fn elementwise(len: usize) -> LaunchConfig {
    let blocks = (len as u64)
        .div_ceil(u64::from(BLOCK_THREADS))
        .clamp(1, MAX_BLOCKS);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Where a reduction reads: `len` elements of `tensor` from element `start`.
#[derive(Debug, Clone, Copy)]
pub struct DeviceChunk<'a> {
    /// The tensor.
    pub tensor: &'a DeviceTensor,
    /// The first element read.
    pub start: usize,
}

impl Gpu {
    /// Opens device `ordinal`: finds the driver and NVRTC, creates the device's primary context
    /// and a stream. Kernels are compiled when first used.
    ///
    /// # Errors
    /// [`CudaError::LibraryMissing`] without the driver or NVRTC, [`CudaError::NoDevice`]
    /// without a device (or without device `ordinal`), [`CudaError::Driver`] when the driver
    /// fails.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>, CudaError> {
        let count = count_devices()?;
        locate_library(CudaLibrary::Nvrtc)?;
        if ordinal >= count {
            return Err(CudaError::NoDevice {
                reason: format!("device {ordinal} asked for; the driver counts {count}"),
            });
        }
        let context = CudaContext::new(ordinal).map_err(driver("cuCtxCreate"))?;
        let name = context.name().map_err(driver("cuDeviceGetName"))?;
        let multiprocessors = context
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(driver("cuDeviceGetAttribute"))?;
        let stream = context.new_stream().map_err(driver("cuStreamCreate"))?;
        Ok(Arc::new(Gpu {
            ordinal,
            name,
            multiprocessors: u32::try_from(multiprocessors).unwrap_or(1).max(1),
            context,
            stream,
            modules: Mutex::new(BTreeMap::new()),
            functions: Mutex::new(BTreeMap::new()),
            sum_scratch: Mutex::new(None),
            plain_out: Mutex::new(None),
        }))
    }

    /// The device's number.
    #[must_use]
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name, as the driver gives it (`NVIDIA H100 80GB HBM3`).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The stream every call of this `Gpu` uses (NCCL's calls too: `comm/nccl.rs`).
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Kernel `kernel` of `program`, compiling and loading the program at its first use.
    pub(crate) fn function(
        &self,
        program: Program,
        kernel: &str,
    ) -> Result<CudaFunction, CudaError> {
        let mut functions = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        let key = (program.name, kernel.to_owned());
        if let Some(function) = functions.get(&key) {
            return Ok(function.clone());
        }
        let module = {
            let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
            match modules.get(program.name) {
                Some(module) => Arc::clone(module),
                None => {
                    let ptx = compiled(program)?;
                    let module = self
                        .context
                        .load_module(Ptx::from_src(ptx))
                        .map_err(driver("cuModuleLoadData"))?;
                    modules.insert(program.name, Arc::clone(&module));
                    module
                }
            }
        };
        let function = module
            .load_function(kernel)
            .map_err(driver("cuModuleGetFunction"))?;
        functions.insert(key, function.clone());
        Ok(function)
    }

    /// Copies `tensor` to the device.
    ///
    /// # Errors
    /// [`CudaError::Driver`] when the allocation or the copy fails.
    pub fn upload(&self, tensor: &Tensor) -> Result<DeviceTensor, CudaError> {
        let bytes = tensor.with_view(|view| {
            if view.bytes().is_empty() {
                self.stream.null::<u8>()
            } else {
                self.stream.clone_htod(view.bytes())
            }
        });
        Ok(DeviceTensor {
            dtype: tensor.dtype(),
            shape: tensor.shape().to_vec(),
            bytes: bytes.map_err(driver("cuMemcpyHtoD"))?,
        })
    }

    /// Copies `tensor` back to the host (waits for the stream).
    ///
    /// # Errors
    /// [`CudaError::Driver`] when the copy fails.
    pub fn download(&self, tensor: &DeviceTensor) -> Result<Tensor, CudaError> {
        let bytes = if tensor.bytes.is_empty() {
            Vec::new()
        } else {
            self.stream
                .clone_dtoh(&tensor.bytes)
                .map_err(driver("cuMemcpyDtoH"))?
        };
        let view = TensorView::new(tensor.dtype, &tensor.shape, &bytes)
            .expect("a device tensor's bytes match its dtype and shape");
        Ok(view.to_tensor())
    }

    /// A new device tensor of `dtype` and `shape`, every byte zero.
    ///
    /// # Errors
    /// [`CudaError::Driver`] when the allocation fails.
    pub fn zeros(&self, dtype: DType, shape: &[usize]) -> Result<DeviceTensor, CudaError> {
        let len = shape.iter().product::<usize>() * dtype.size_of();
        let bytes = if len == 0 {
            self.stream.null::<u8>()
        } else {
            self.stream.alloc_zeros::<u8>(len)
        };
        Ok(DeviceTensor {
            dtype,
            shape: shape.to_vec(),
            bytes: bytes.map_err(driver("cuMemAlloc"))?,
        })
    }

    /// Copies elements `from` of `src` into `dst` from element `at` (one dtype; a device copy).
    ///
    /// # Panics
    /// When the dtypes differ or a range is out of bounds (a caller's bug, not input).
    ///
    /// # Errors
    /// [`CudaError::Driver`] when the copy fails.
    pub fn copy(
        &self,
        src: &DeviceTensor,
        from: Range<usize>,
        dst: &mut DeviceTensor,
        at: usize,
    ) -> Result<(), CudaError> {
        assert_eq!(src.dtype, dst.dtype, "a device copy within one dtype");
        if from.is_empty() {
            return Ok(());
        }
        let size = src.dtype.size_of();
        let source = src.bytes.slice(from.start * size..from.end * size);
        let mut target = dst.bytes.slice_mut(at * size..(at + from.len()) * size);
        self.stream
            .memcpy_dtod(&source, &mut target)
            .map_err(driver("cuMemcpyDtoD"))
    }

    /// Reduces `len` elements of each chunk, element by element, into `out` from element
    /// `at`: with the bits of the CPU's `reduce_chunk` for `op` and `mode` when the chunks are
    /// given in the mode's summation order (`rank_ordered`, `ring`, `native`, `arrival_order`:
    /// folded in the chunks' order; `reproducible` sums of f32 and f64: on the integer grid,
    /// whatever the order).
    ///
    /// # Panics
    /// Without chunks, when dtypes differ, a chunk is out of bounds, or the dtype is one the
    /// CPU does not reduce (callers check `reduce::unreducible` first, as the CPU's
    /// communicators do).
    ///
    /// # Errors
    /// [`CudaError`] when a kernel cannot be compiled, loaded or launched.
    pub fn reduce(
        &self,
        op: ReduceOp,
        mode: ReductionMode,
        chunks: &[DeviceChunk<'_>],
        len: usize,
        out: &mut DeviceTensor,
        at: usize,
    ) -> Result<(), CudaError> {
        let dtype = out.dtype;
        assert!(!chunks.is_empty(), "a reduction of no chunks");
        for chunk in chunks {
            assert_eq!(chunk.tensor.dtype, dtype, "a reduction within one dtype");
            assert!(
                chunk.start + len <= chunk.tensor.len(),
                "a chunk out of bounds"
            );
        }
        assert!(at + len <= out.len(), "a reduction's output out of bounds");
        if len == 0 {
            return Ok(());
        }
        let (program, kernel) = combine_kernel(op, mode, dtype);
        let function = self.function(program, kernel)?;
        let addresses: Vec<u64> = chunks
            .iter()
            .map(|c| c.tensor.address(&self.stream, c.start))
            .collect();
        let inputs = self
            .stream
            .clone_htod(&addresses)
            .map_err(driver("cuMemcpyHtoD"))?;
        let out_address = out.address(&self.stream, at);
        let count = chunks.len() as u32;
        let len = len as u64;
        let mut launch = self.stream.launch_builder(&function);
        launch.arg(&out_address).arg(&inputs).arg(&count).arg(&len);
        // SAFETY: every combine kernel takes `(T* out, const T* const* inputs, unsigned int
        // count, unsigned long long len)` (`kernels.rs`, `reprosum.rs`): `out_address`
        // and each of `inputs`' `count` addresses point at `len` elements of the kernel's type
        // inside live allocations (checked above); the tensors and `inputs` are borrowed or owned
        // here until the launch is enqueued, and their frees are ordered after it on this one
        // stream.
        unsafe { launch.launch(elementwise(len as usize)) }.map_err(driver("cuLaunchKernel"))?;
        Ok(())
    }

    /// The reproducible sum of an f32 device tensor, with the bits of the CPU's
    /// `reproducible_sum_f32`: one launch of `detcheck_reprosum_f32` (`reprosum.rs`: the buffer
    /// is read once, and the last block re-reads the few tiles far below the largest term), and
    /// where it leaves the sum pending (many such tiles) the fixup and finish kernels. The
    /// scratch array is kept for the next sum. Waits for the result.
    ///
    /// # Panics
    /// When `values` is not f32 (a caller's bug).
    ///
    /// # Errors
    /// [`CudaError`] when a kernel cannot be compiled, loaded or launched.
    pub fn reproducible_sum_f32(&self, values: &DeviceTensor) -> Result<f32, CudaError> {
        assert_eq!(
            values.dtype,
            DType::F32,
            "reproducible_sum_f32 of {}",
            values.dtype
        );
        let n = values.len() as u64;
        let one_launch = self.function(REPROSUM, "detcheck_reprosum_f32")?;
        // Held until the result is read: one sum at a time uses the scratch array.
        let mut kept = self
            .sum_scratch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Taken out while in use, so a sum that fails part way leaves none to reuse.
        let mut memory = match kept.take() {
            Some(memory) if memory.scratch.len() as u64 >= reprosum_scratch_bytes(n) => memory,
            _ => SumScratch {
                // Zeroed: the header's state between sums.
                scratch: self
                    .stream
                    .alloc_zeros::<u8>(reprosum_scratch_bytes(n) as usize)
                    .map_err(driver("cuMemAlloc"))?,
                out: self
                    .stream
                    .alloc_zeros::<u32>(2)
                    .map_err(driver("cuMemAlloc"))?,
            },
        };
        let terms = values.address(&self.stream, 0);
        let blocks = reprosum_tiles(n).clamp(1, 8 * u64::from(self.multiprocessors)) as u32;
        let per_tile = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (REPROSUM_TILE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let SumScratch { scratch, out } = &mut memory;
        let mut launch = self.stream.launch_builder(&one_launch);
        launch.arg(&mut *out).arg(&mut *scratch).arg(&terms).arg(&n);
        // SAFETY: `(unsigned int* out, unsigned long long* scratch, const float* terms, unsigned
        // long long n)`: `out` holds two u32; `scratch` at least reprosum_scratch_bytes(n) bytes
        // with a zero header (zeroed when allocated, zeroed again by every sum that finished;
        // one that failed is not kept); `terms` points at `values`' n f32 (borrowed until the
        // launch is enqueued; its free is ordered after it on this stream); the block size is
        // REPROSUM_TILE_THREADS as the kernel requires.
        unsafe { launch.launch(per_tile) }.map_err(driver("cuLaunchKernel"))?;
        let mut result = self
            .stream
            .clone_dtoh(&*out)
            .map_err(driver("cuMemcpyDtoH"))?;
        if result[1] == REPROSUM_PENDING {
            let fixup = self.function(REPROSUM, "detcheck_reprosum_fixup_f32")?;
            let finish = self.function(REPROSUM, "detcheck_reprosum_finish_f32")?;
            let mut launch = self.stream.launch_builder(&fixup);
            launch.arg(&mut *scratch).arg(&terms).arg(&n);
            // SAFETY: `(unsigned long long* scratch, const float* terms, unsigned long long n)`:
            // the scratch the launch above filled and left pending, the same terms and n, blocks
            // of REPROSUM_TILE_THREADS.
            unsafe { launch.launch(per_tile) }.map_err(driver("cuLaunchKernel"))?;
            let mut launch = self.stream.launch_builder(&finish);
            launch.arg(&mut *out).arg(&mut *scratch).arg(&n);
            let one_block = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (REPROSUM_TILE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: `(unsigned int* out, unsigned long long* scratch, unsigned long long n)`:
            // two u32, the scratch the fixup kernel completed (same stream, so after it), one
            // block of REPROSUM_TILE_THREADS threads as the kernel requires.
            unsafe { launch.launch(one_block) }.map_err(driver("cuLaunchKernel"))?;
            result = self
                .stream
                .clone_dtoh(&*out)
                .map_err(driver("cuMemcpyDtoH"))?;
        }
        if result[1] != 0 {
            return Err(CudaError::Driver {
                call: "detcheck_reprosum_f32",
                message: format!("the sum was not finished (status {})", result[1]),
            });
        }
        *kept = Some(memory);
        Ok(f32::from_bits(result[0]))
    }

    /// A plain device sum of an f32 tensor (per-block partials, one float atomic per block): the
    /// benchmark's baseline for [`Gpu::reproducible_sum_f32`]. Not deterministic: the blocks'
    /// atomics land in any order. Waits for the result.
    ///
    /// # Panics
    /// When `values` is not f32.
    ///
    /// # Errors
    /// [`CudaError`] when the kernel cannot be compiled, loaded or launched.
    pub fn plain_sum_f32(&self, values: &DeviceTensor) -> Result<f32, CudaError> {
        assert_eq!(
            values.dtype,
            DType::F32,
            "plain_sum_f32 of {}",
            values.dtype
        );
        let n = values.len() as u64;
        let function = self.function(REPROSUM, "detcheck_plain_sum_f32")?;
        let mut kept = self
            .plain_out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = match kept.take() {
            Some(mut out) => {
                self.stream
                    .memset_zeros(&mut out)
                    .map_err(driver("cuMemsetD8"))?;
                out
            }
            None => self
                .stream
                .alloc_zeros::<f32>(1)
                .map_err(driver("cuMemAlloc"))?,
        };
        let terms = values.address(&self.stream, 0);
        let blocks = n
            .div_ceil(u64::from(BLOCK_THREADS))
            .clamp(1, 8 * u64::from(self.multiprocessors)) as u32;
        let mut launch = self.stream.launch_builder(&function);
        launch.arg(&mut out).arg(&terms).arg(&n);
        // SAFETY: `(float* out, const float* terms, unsigned long long n)`: `out` is one zeroed
        // float, `terms` points at `values`' n f32 (borrowed until enqueued), and the block size
        // is a power of two up to 1024 as the kernel requires.
        unsafe {
            launch.launch(LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (BLOCK_THREADS, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(driver("cuLaunchKernel"))?;
        let sum = self
            .stream
            .clone_dtoh(&out)
            .map_err(driver("cuMemcpyDtoH"))?;
        *kept = Some(out);
        Ok(sum[0])
    }

    /// Waits until everything enqueued so far has run.
    ///
    /// # Errors
    /// [`CudaError::Driver`] with the error of a kernel that failed.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))
    }
}

/// The program and kernel that combine chunks for `op` in `mode` on `dtype`.
fn combine_kernel(op: ReduceOp, mode: ReductionMode, dtype: DType) -> (Program, &'static str) {
    // As reduce_chunk: a reproducible sum of floats is on the integer grid, in any order.
    if mode == ReductionMode::Reproducible && op == ReduceOp::Sum {
        match dtype {
            DType::F32 => return (REPROSUM, "detcheck_reprosum_columns_f32"),
            DType::F64 => return (REPROSUM, "detcheck_reprosum_columns_f64"),
            _ => {}
        }
    }
    let kernel = reduce_kernel(op, dtype, KernelForm::Combine)
        .unwrap_or_else(|| panic!("{op} of {dtype} has no kernel: the CPU does not reduce it"));
    (REDUCE, kernel.name)
}

/// Whether a test that needs a GPU must fail without one: `DETCHECK_REQUIRE_GPU=1` (the GPU
/// self-test sets it); otherwise such a test says what it would check and passes.
#[cfg(test)]
pub(crate) fn gpu_required() -> bool {
    std::env::var_os("DETCHECK_REQUIRE_GPU").is_some_and(|v| v == "1")
}

/// The GPU for a test, or `None` after saying what the test would check (unless
/// [`gpu_required`]).
#[cfg(test)]
pub(crate) fn gpu_for_test(would_check: &str) -> Option<Arc<Gpu>> {
    match Gpu::open(0) {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            assert!(!gpu_required(), "DETCHECK_REQUIRE_GPU=1: {e}");
            println!("no GPU ({e}): would check that {would_check}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::reduce::{chunk_range, reduce_chunk, summation_order, unreducible};
    use crate::value::seed::{derive_stream, Stream};
    use crate::value::tensor::TensorData;

    /// A tensor of `dtype` with `len` seeded values: finite and special floats, any integers.
    pub(crate) fn seeded(dtype: DType, len: usize, seed: u64) -> Tensor {
        let mut rng = derive_stream(seed, Stream::User(7), 0, 0);
        let mut float = || -> f64 {
            match rng.below(100) {
                0 => f64::NAN,
                1 => f64::INFINITY,
                2 => f64::NEG_INFINITY,
                3 => -0.0,
                4 => f64::from(f32::MIN_POSITIVE) / 8.0,
                _ => (rng.uniform_f64() - 0.5) * 2f64.powi(rng.below(60) as i32 - 30),
            }
        };
        let data = match dtype {
            DType::F32 => TensorData::F32((0..len).map(|_| float() as f32).collect()),
            DType::F64 => TensorData::F64((0..len).map(|_| float()).collect()),
            DType::I32 => TensorData::I32((0..len).map(|_| rng.next_u64() as i32).collect()),
            DType::I64 => TensorData::I64((0..len).map(|_| rng.next_u64() as i64).collect()),
            DType::U8 => TensorData::U8((0..len).map(|_| rng.next_u64() as u8).collect()),
            other => panic!("no seeded {other}"),
        };
        Tensor::new(vec![len], data).unwrap()
    }

    #[test]
    fn a_missing_driver_is_an_error_naming_it_not_a_panic() {
        if locate_library(CudaLibrary::Driver).is_ok() {
            println!("a CUDA driver is here: the no-driver error is checked on machines without");
            return;
        }
        let err = Gpu::open(0).unwrap_err();
        assert!(
            matches!(
                err,
                CudaError::LibraryMissing {
                    library: CudaLibrary::Driver,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("libcuda.so.1"), "{err}");
    }

    /// Every reduction kernel, in every mode's order, against the CPU's `reduce_chunk`, bit for
    /// bit, for every reducible dtype, 1 to 8 contributions and lengths around block edges.
    #[test]
    fn the_gpu_reduces_with_the_cpus_bits() {
        let Some(gpu) = gpu_for_test(
            "every combine kernel (sum, max; f32, f64, i32, i64, u8; every mode's order, 1-8 \
             contributions, chunks at offsets) gives reduce_chunk's bits",
        ) else {
            return;
        };
        let mut checked = 0;
        for dtype in DType::ALL.into_iter().filter(|d| unreducible(*d).is_none()) {
            for size in [1usize, 2, 3, 5, 8] {
                for len in [1usize, 255, 256, 257, 10_000] {
                    let host: Vec<Tensor> = (0..size)
                        .map(|r| seeded(dtype, len + 3, (size * 1000 + len + r) as u64))
                        .collect();
                    let device: Vec<DeviceTensor> =
                        host.iter().map(|t| gpu.upload(t).unwrap()).collect();
                    let data: Vec<&TensorData> = host.iter().map(Tensor::data).collect();
                    for op in [ReduceOp::Sum, ReduceOp::Max] {
                        for mode in ReductionMode::ALL {
                            let arrival: Vec<usize> = (0..size).rev().collect();
                            let chunk = size / 2;
                            let order = summation_order(mode, size, chunk, &arrival);
                            let range = chunk_range(len + 3, 1, 0);
                            let range = range.start + 3..range.end;
                            let cpu = reduce_chunk(&data, range.clone(), &order, op, mode);
                            let chunks: Vec<DeviceChunk<'_>> = order
                                .iter()
                                .map(|&r| DeviceChunk {
                                    tensor: &device[r],
                                    start: 3,
                                })
                                .collect();
                            let mut out = gpu.zeros(dtype, &[len + 1]).unwrap();
                            gpu.reduce(op, mode, &chunks, len, &mut out, 1).unwrap();
                            let got = gpu.download(&out).unwrap();
                            let got = got.with_view(|v| v.bytes()[dtype.size_of()..].to_vec());
                            let want = Tensor::new(vec![len], cpu).unwrap();
                            let want = want.with_view(|v| v.bytes().to_vec());
                            assert!(got == want, "{op} {mode} {dtype} x{size} len {len}");
                            checked += 1;
                        }
                    }
                }
            }
        }
        println!(
            "{checked} reductions on {} equal the CPU's bits",
            gpu.name()
        );
    }

    /// The one-buffer reproducible sum on the GPU against the CPU's, bit for bit, on sizes
    /// around tiles and with scales that force the fixup; the plain sum close to it.
    #[test]
    fn the_gpus_reproducible_sum_has_the_cpus_bits() {
        let Some(gpu) = gpu_for_test(
            "the reproducible sum of f32 buffers (0 to 5M terms, mixed scales, specials) equals \
             reproducible_sum_f32 bit for bit",
        ) else {
            return;
        };
        for (len, seed) in [
            (0usize, 1u64),
            (1, 2),
            (4095, 3),
            (4097, 4),
            (1 << 20, 5),
            (5_000_001, 6),
            // Smaller after larger: the kept scratch array serves it.
            (4097, 7),
        ] {
            let tensor = seeded(DType::F32, len, seed);
            let mut values: Vec<f32> = tensor.values::<f32>().unwrap().to_vec();
            // Finite copies too: the specials decide most seeded sums on their own.
            for finite in [false, true] {
                if finite {
                    values
                        .iter_mut()
                        .filter(|v| !v.is_finite())
                        .for_each(|v| *v = 1.5);
                }
                let device = gpu.upload(&Tensor::from_vec(values.clone())).unwrap();
                let cpu = crate::value::reprosum::reproducible_sum_f32(&values);
                let got = gpu.reproducible_sum_f32(&device).unwrap();
                assert_eq!(
                    got.to_bits(),
                    cpu.to_bits(),
                    "{len} terms (finite: {finite})"
                );
                if finite && len > 0 {
                    let plain = gpu.plain_sum_f32(&device).unwrap();
                    assert!(
                        (plain - cpu).abs() <= 1e-3 * cpu.abs().max(1.0),
                        "{plain} vs {cpu}"
                    );
                }
            }
        }
        // Mixed scales: one tile of terms near 1 and 63 tiles 2^-30 below, more than the last
        // block re-reads, so the fixup and finish kernels run; then again on the same scratch.
        let tile = crate::device::REPROSUM_TILE_ELEMENTS as usize;
        let tensor = seeded(DType::F32, 64 * tile, 8);
        let values: Vec<f32> = tensor
            .values::<f32>()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let v = if v.is_finite() {
                    v.clamp(-4.0, 4.0)
                } else {
                    1.5
                };
                if i < tile {
                    v
                } else {
                    v * 2f32.powi(-30)
                }
            })
            .collect();
        let device = gpu.upload(&Tensor::from_vec(values.clone())).unwrap();
        let cpu = crate::value::reprosum::reproducible_sum_f32(&values);
        for round in 0..2 {
            let got = gpu.reproducible_sum_f32(&device).unwrap();
            assert_eq!(got.to_bits(), cpu.to_bits(), "mixed scales, round {round}");
        }
    }

    #[test]
    fn tensors_of_every_dtype_round_trip_and_copy_on_the_device() {
        let Some(gpu) = gpu_for_test("every dtype uploads, copies and downloads unchanged") else {
            return;
        };
        for dtype in DType::ALL {
            let len = 1000;
            // A bool is one byte, 0 or 1 (`TensorView::new` rejects any other byte).
            let modulus = if dtype == DType::Bool { 2 } else { 251 };
            let bytes: Vec<u8> = (0..len * dtype.size_of())
                .map(|i| (i % modulus) as u8)
                .collect();
            let tensor = TensorView::new(dtype, &[len], &bytes).unwrap().to_tensor();
            let device = gpu.upload(&tensor).unwrap();
            assert_eq!(
                gpu.download(&device)
                    .unwrap()
                    .with_view(|v| v.bytes().to_vec()),
                bytes
            );
            let mut copy = gpu.zeros(dtype, &[len]).unwrap();
            gpu.copy(&device, 10..len, &mut copy, 0).unwrap();
            let back = gpu.download(&copy).unwrap();
            let size = dtype.size_of();
            back.with_view(|v| {
                assert_eq!(&v.bytes()[..(len - 10) * size], &bytes[10 * size..]);
            });
        }
        let empty = gpu.upload(&Tensor::from_vec(Vec::<f32>::new())).unwrap();
        assert!(gpu.download(&empty).unwrap().is_empty());
    }
}
