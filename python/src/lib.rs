//! detcheck for Python: the native module `detcheck._detcheck`, whose `TraceWriter` writes one
//! rank's trace file with detcheck's own writer (`detcheck::file::TraceWriter`), so a Python
//! program's dump is read, compared and checked by the `detcheck` binary like any other.
//!
//! An array reaches the writer as a `TensorView` of its canonical bytes: read in place from the
//! buffer protocol when the object gives a C-contiguous, little-endian buffer of a supported
//! dtype (numpy arrays, `memoryview`, `bytes`); anything else (torch tensors, strided or
//! big-endian arrays, `__array__` objects, Python scalars) goes through `detcheck/_core/arrays.py`,
//! which makes such a buffer (a copy only where one is needed). `record` checks it, copies its
//! bytes (with the GIL released from 256 KiB up) and hands them, in batches, to the writer's own
//! thread (`worker`), which computes the statistics and the md5 (several arrays at once in SIMD
//! lanes, the library's `detcheck::value::Md5Lanes`) and writes the records in order, while the
//! program goes on. `_record_lent` takes a torch copy-on-write snapshot instead, read in place by
//! that thread with no copy at all (`buffer::Lent`).
//!
//! Determinism: a record's md5 and statistics are those of the Rust writer for the same dtype,
//! shape and bytes (`hashlib.md5(arr.tobytes())` for a little-endian array), and the records,
//! their order and sequence numbers those of the Rust writer called in the same order.
//!
//! Errors (documented in python/README.md): `ValueError` for bad arguments and closed writers,
//! `TypeError` for objects and dtypes that cannot be recorded, `OSError` for files, and
//! `detcheck.DetcheckError` (a `RuntimeError`) for everything else detcheck refuses (records out
//! of step order, a launch environment that cannot be read). A failure to write the file, on the
//! writer's thread, is raised by the next `record`, `flush` or `close`.
//!
//! `unsafe`: denied here and allowed only in `buffer`, the buffer protocol (see that module for
//! why); PyO3's macros generate their own.

#![deny(unsafe_code)]

mod buffer;
mod worker;

use buffer::{Buffer, Lent};
use detcheck::file::{DumpError, DumpMode, EnvironmentHandle, TraceWriter as RustWriter};
use detcheck::launch::capture::read_window_inputs;
use detcheck::launch::{
    setting_names, Capture, InsideRequest, Launch, RankFiles, RecorderPlan, ERROR_FILE_MAGIC,
};
use detcheck::record::hints::Subject;
use detcheck::value::{tree_digest, DType, Placement, Stats, TensorView, Totals, ViewError};
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use worker::{Background, Failure, Job, JobDigest, RecordBytes};

pyo3::create_exception!(
    detcheck,
    DetcheckError,
    PyRuntimeError,
    "An error of detcheck itself: records out of step order, a launch environment that cannot \
     be read, a trace that cannot be finished."
);

/// Arrays at least this large are copied with the GIL released; below it, releasing and taking
/// the GIL back costs more than it frees (and may wait a switch interval for another thread).
const DETACH_BYTES: usize = 256 << 10;

/// The dtype of a buffer's struct format and item size, when detcheck records it as it is:
/// little-endian (or one byte per item) and of one of the supported dtypes. Complex numbers are
/// numpy's `Zf` (complex64) and `Zd` (complex128); numpy has no 8-bit float format.
fn buffer_dtype(format: &str, itemsize: usize) -> Option<DType> {
    let (order, code) = match format.as_bytes() {
        [order @ (b'@' | b'=' | b'<' | b'>' | b'!'), code @ ..] => (*order, code),
        code => (b'@', code),
    };
    let little = match order {
        b'<' => true,
        b'>' | b'!' => false,
        _ => cfg!(target_endian = "little"),
    };
    if !little && itemsize > 1 {
        return None;
    }
    match (code, itemsize) {
        ([b'e'], 2) => Some(DType::F16),
        ([b'f'], 4) => Some(DType::F32),
        ([b'd'], 8) => Some(DType::F64),
        ([b'Z', b'f'], 8) => Some(DType::C64),
        ([b'Z', b'd'], 16) => Some(DType::C128),
        ([b'b' | b'h' | b'i' | b'l' | b'q' | b'n'], 1) => Some(DType::I8),
        ([b'b' | b'h' | b'i' | b'l' | b'q' | b'n'], 2) => Some(DType::I16),
        ([b'b' | b'h' | b'i' | b'l' | b'q' | b'n'], 4) => Some(DType::I32),
        ([b'b' | b'h' | b'i' | b'l' | b'q' | b'n'], 8) => Some(DType::I64),
        ([b'B' | b'H' | b'I' | b'L' | b'Q' | b'N' | b'c'], 1) => Some(DType::U8),
        ([b'B' | b'H' | b'I' | b'L' | b'Q' | b'N'], 2) => Some(DType::U16),
        ([b'?'], 1) => Some(DType::Bool),
        _ => None,
    }
}

/// The name Python knows `dtype` by: numpy's names, and torch's `bfloat16`, `float8_e4m3fn`
/// and `float8_e5m2`, which are also ml_dtypes' names. The package's one dtype table: Python
/// reads it through `supported_dtypes()`.
fn python_dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
        DType::Bool => "bool",
        DType::I8 => "int8",
        DType::I16 => "int16",
        DType::U16 => "uint16",
        DType::F8E4M3 => "float8_e4m3fn",
        DType::F8E5M2 => "float8_e5m2",
        DType::C64 => "complex64",
        DType::C128 => "complex128",
    }
}

/// The dtype `_core.arrays.normalize` names (`python_dtype_name`'s inverse).
fn dtype_named(name: &str) -> Option<DType> {
    DType::ALL
        .into_iter()
        .find(|&dtype| python_dtype_name(dtype) == name)
}

/// The names of the dtypes detcheck records, as Python knows them (`float32`, `bfloat16` ...),
/// in the trace format's order: the one table `_core.arrays`, the torch front end and the device
/// kernels read.
#[pyfunction]
fn supported_dtypes() -> Vec<&'static str> {
    DType::ALL.into_iter().map(python_dtype_name).collect()
}

/// The name of one record of the operator trace (`detcheck/_torch/ops.py`), by the grammar the
/// drill-down reads (`detcheck::compare::operator_record_name`): `port` is `"in"` or `"out"`;
/// an input's `source` is `None` (untraced), `("scalar", None, None)`, `("op", call, output)`,
/// `("in", m, None)` or `("grad_out", m, None)`.
#[pyfunction]
#[pyo3(signature = (call, module, operator, port, index, source=None))]
fn operator_record_name(
    call: u32,
    module: &str,
    operator: &str,
    port: &str,
    index: u32,
    source: Option<(String, Option<u32>, Option<u32>)>,
) -> PyResult<String> {
    use detcheck::compare::{InputSource, Port};
    let source = match source {
        None => InputSource::Untraced,
        Some((kind, a, b)) => match (kind.as_str(), a, b) {
            ("scalar", None, None) => InputSource::Scalar,
            ("op", Some(call), Some(output)) => InputSource::ChangedAfter { call, output },
            ("in" | "grad_out", Some(index), None) => InputSource::WindowInput { kind, index },
            _ => {
                return Err(PyValueError::new_err(format!(
                    "operator_record_name: source ({kind:?}, {a:?}, {b:?}) is none of \
                     ('scalar', None, None), ('op', call, output), ('in', m, None), \
                     ('grad_out', m, None)"
                )))
            }
        },
    };
    let port = match port {
        "in" => Port::Input { index, source },
        "out" if source == InputSource::Untraced => Port::Output(index),
        "out" => {
            return Err(PyValueError::new_err(
                "operator_record_name: an output has no source",
            ))
        }
        other => {
            return Err(PyValueError::new_err(format!(
                "operator_record_name: port {other:?} is neither 'in' nor 'out'"
            )))
        }
    };
    Ok(detcheck::compare::operator_record_name(
        call, module, operator, &port,
    ))
}

/// `window/in{index}`, `window/grad_out{index}` or `window/out{index}` (`kind`): the operator
/// trace's window inputs, and its outputs (`detcheck run --inside`).
#[pyfunction]
fn window_record_name(kind: &str, index: u32) -> PyResult<String> {
    detcheck::compare::window_record_name(kind, index).ok_or_else(|| {
        PyValueError::new_err(format!(
            "window_record_name: kind {kind:?} is none of 'in', 'grad_out' and 'out'"
        ))
    })
}

/// `detcheck._core.arrays.normalize`, imported once.
fn normalize<'py>(py: Python<'py>) -> PyResult<&'py Bound<'py, PyAny>> {
    static NORMALIZE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    NORMALIZE.import(py, "detcheck._core.arrays", "normalize")
}

/// The Python exception of a detcheck error.
fn dump_error(e: DumpError) -> PyErr {
    match &e {
        DumpError::Io { source, .. } => match source.raw_os_error() {
            // OSError(errno, message) picks the subclass (FileNotFoundError, PermissionError ...).
            Some(errno) => PyOSError::new_err((errno, e.to_string())),
            None => PyOSError::new_err(e.to_string()),
        },
        _ => DetcheckError::new_err(e.to_string()),
    }
}

/// The Python exception of a failure of the writer's thread.
fn failure_error(f: Failure) -> PyErr {
    match (f.io, f.errno) {
        (true, Some(errno)) => PyOSError::new_err((errno, f.message)),
        (true, None) => PyOSError::new_err(f.message),
        _ => DetcheckError::new_err(f.message),
    }
}

/// A shard's placement checked against the shape recorded (`record_sharded`, `_record_lent`):
/// a placement that does not fit is the record's error, naming it.
fn check_placement(name: &str, placement: Option<&Placement>, shape: &[usize]) -> PyResult<()> {
    match placement {
        Some(p) => p.check(shape).map_err(|source| {
            dump_error(DumpError::Placement {
                name: name.to_owned(),
                source,
            })
        }),
        None => Ok(()),
    }
}

fn view_error(name: &str, e: ViewError) -> PyErr {
    PyValueError::new_err(format!("cannot record `{name}`: {e}"))
}

/// One rank's trace file: `TraceWriter(dir, rank, world_size, mode="stats")`.
///
/// Records go in step order (`record(step, name, array)`); `close()` writes the footer, syncs
/// and renames the file to `dir/rank{rank}.dctrace`. Until then nothing is under the final
/// name, and a writer that is dropped, or left by an exception in a `with` block, removes its
/// temporary file: a program that crashed leaves no trace that reads as complete.
#[pyclass(module = "detcheck", name = "TraceWriter")]
struct PyTraceWriter {
    /// The writer's thread (it owns the Rust writer); `None` once closed or aborted.
    inner: Option<Background>,
    path: PathBuf,
    rank: u32,
    world_size: u32,
    mode: DumpMode,
    num_records: u64,
    /// The (step, seq) of the last record handed over.
    last: Option<(u64, u32)>,
    /// The writer's environment snapshot (the writer itself is the thread's).
    environment: EnvironmentHandle,
    /// The capture a re-run asks of this rank (`DETCHECK_CAPTURE`), if any.
    capture: Option<Capture>,
    /// Called before `flush` and `close` (`_add_drain`).
    drains: Vec<Py<PyAny>>,
    /// The records `_record_later` holds places for: token -> (name, dtype, elements).
    unfilled: BTreeMap<u64, (String, DType, usize)>,
}

impl PyTraceWriter {
    fn wrap(writer: RustWriter, rank: u32, world_size: u32, mode: DumpMode) -> PyResult<Self> {
        let path = writer.path().to_owned();
        let environment = writer.environment_handle();
        let inner = Background::start(writer, rank, mode)?;
        let capture = Capture::from_env()
            .map(|(capture, _)| capture)
            .filter(|c| c.rank == rank);
        Ok(PyTraceWriter {
            capture,
            drains: Vec::new(),
            unfilled: BTreeMap::new(),
            path,
            inner: Some(inner),
            rank,
            world_size,
            mode,
            num_records: 0,
            last: None,
            environment,
        })
    }

    /// The writer of this process's rank in the launch's folder and mode (`from_env`).
    fn launch_writer(py: Python<'_>) -> PyResult<Option<Self>> {
        let Some(launch) = Launch::from_env().map_err(dump_error)? else {
            return Ok(None);
        };
        let writer = py.detach(RustWriter::from_env).map_err(dump_error)?;
        // `from_env` found a rank (or failed): the launch's, read from the same variables.
        let rank = launch.rank.unwrap_or_default();
        writer
            .map(|w| Self::wrap(w, rank, launch.world_size, launch.mode))
            .transpose()
    }

    fn open(&mut self, name: &str) -> PyResult<&mut Background> {
        let rank = self.rank;
        let inner = self.inner.as_mut().ok_or_else(|| {
            PyValueError::new_err(format!(
                "cannot record `{name}`: the trace writer of rank {rank} is closed"
            ))
        })?;
        match inner.failure(false) {
            Some(f) => Err(failure_error(f)),
            None => Ok(inner),
        }
    }

    fn record_any(
        &mut self,
        step: u64,
        name: &str,
        array: &Bound<'_, PyAny>,
        replicated: bool,
        placement: Option<Placement>,
    ) -> PyResult<()> {
        let py = array.py();
        self.open(name)?;
        // The fast path: the object's own buffer, in place.
        let direct = Buffer::c_contiguous(array).and_then(|buffer| {
            let dtype = buffer_dtype(buffer.format(), buffer.itemsize())?;
            Some((dtype, buffer))
        });
        let converted;
        let (dtype, buffer) = match direct {
            Some(found) => found,
            None => {
                converted = normalize(py)?.call1((array, name))?;
                let pair = converted.cast::<PyTuple>()?;
                let dtype_name: String = pair.get_item(0)?.extract()?;
                let dtype = known_dtype(name, &dtype_name)?;
                let array = pair.get_item(1)?;
                let buffer = Buffer::c_contiguous(&array).ok_or_else(|| {
                    PyTypeError::new_err(format!(
                        "cannot record `{name}`: its conversion gave no contiguous buffer"
                    ))
                })?;
                (dtype, buffer)
            }
        };
        let shape = buffer.shape();
        let view =
            TensorView::new(dtype, &shape, buffer.bytes()).map_err(|e| view_error(name, e))?;
        check_placement(name, placement.as_ref(), &shape)?;
        self.next_seq(step, name)?; // out of order: refused before the copy
        let bytes = view.bytes();
        let inner = self.open(name)?;
        let mut data = inner.buffer(bytes.len());
        if bytes.len() >= DETACH_BYTES || inner.must_wait(bytes.len()) {
            py.detach(|| {
                inner.wait_room(bytes.len());
                data.extend_from_slice(bytes);
            });
        } else {
            data.extend_from_slice(bytes);
        }
        let record = (dtype, shape.clone(), replicated);
        let data = RecordBytes::Copied(data);
        self.submit_record(step, name, record, data, JobDigest::Compute, placement)?;
        Ok(())
    }

    /// Calls the drains (outside any borrow: they record into this writer).
    fn drain(slf: &Bound<'_, Self>) -> PyResult<()> {
        let drains: Vec<Py<PyAny>> = {
            let this = slf.borrow();
            if this.inner.is_none() {
                return Ok(());
            }
            this.drains.iter().map(|d| d.clone_ref(slf.py())).collect()
        };
        for drain in drains {
            drain.call0(slf.py())?;
        }
        Ok(())
    }

    /// Hands the thread a record: (dtype, shape, replicated), its bytes (empty when its digest
    /// is given or to come: `digest`); returns its index among this writer's records (`_fill`'s
    /// token).
    fn submit_record(
        &mut self,
        step: u64,
        name: &str,
        (dtype, shape, replicated): (DType, Vec<usize>, bool),
        data: RecordBytes,
        digest: JobDigest,
        placement: Option<Placement>,
    ) -> PyResult<u64> {
        let seq = self.next_seq(step, name)?;
        let token = self.num_records;
        self.open(name)?
            .submit(Job {
                step,
                seq,
                name: name.to_owned(),
                replicated,
                dtype,
                shape,
                data,
                digest,
                placement,
            })
            .map_err(failure_error)?;
        self.last = Some((step, seq));
        self.num_records += 1;
        Ok(token)
    }

    /// The seq of the next record of `step`; records must come in step order.
    fn next_seq(&self, step: u64, name: &str) -> PyResult<u32> {
        match self.last {
            Some((last, seq)) if last == step => Ok(seq + 1),
            Some((last, _)) if last > step => Err(dump_error(DumpError::OutOfOrder {
                name: name.to_owned(),
                step,
                last,
            })),
            _ => Ok(0),
        }
    }
}

/// What a GPU kernel sums for a record's statistics (`detcheck/_torch/device.py`): max, min, sum
/// and sum of squares of the finite values, and the counts of NaN, +Inf and -Inf.
type TotalsTuple = (f64, f64, f64, f64, u64, u64, u64);

/// The dtype a record names (as `record` names them: `float32`, `bfloat16` ...).
fn known_dtype(name: &str, dtype: &str) -> PyResult<DType> {
    dtype_named(dtype).ok_or_else(|| {
        PyTypeError::new_err(format!("cannot record `{name}`: unsupported dtype {dtype}"))
    })
}

/// The number of elements of `shape`, when its bytes fit this machine.
fn checked_len(name: &str, dtype: DType, shape: &[usize]) -> PyResult<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|n| n.checked_mul(dtype.size_of()).is_some())
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "cannot record `{name}`: shape {shape:?} of {dtype} is too large"
            ))
        })
}

/// A digest given from Python: 16 bytes.
fn digest_bytes(name: &str, digest: &[u8]) -> PyResult<[u8; 16]> {
    digest.try_into().map_err(|_| {
        PyValueError::new_err(format!(
            "cannot record `{name}`: a digest is 16 bytes, not {}",
            digest.len()
        ))
    })
}

/// The statistics of `len` elements of `dtype` from a device's totals (none: empty statistics);
/// a complex tensor's totals are over its 2 `len` parts, as the CPU's statistics are.
fn stats_of_totals(dtype: DType, len: usize, totals: Option<TotalsTuple>) -> Stats {
    let parts = if dtype.is_complex() { 2 * len } else { len };
    let stats = totals.map_or_else(
        Stats::default,
        |(max, min, sum, sum_sq, nan, pos_inf, neg_inf)| {
            Stats::from_totals(
                parts as u64,
                Totals {
                    max,
                    min,
                    sum,
                    sum_sq,
                    nan,
                    pos_inf,
                    neg_inf,
                },
            )
        },
    );
    if dtype.is_complex() && totals.is_some() {
        Stats::of_complex_parts(stats)
    } else {
        stats
    }
}

fn parse_mode(mode: &str) -> PyResult<DumpMode> {
    mode.parse().map_err(PyValueError::new_err)
}

#[pymethods]
impl PyTraceWriter {
    /// What this writer takes beyond `record` and `record_replicated`, declared rather than
    /// probed (`detcheck._core.contract.capabilities` reads it): `sharded` (`record_sharded`),
    /// `digested` (`record_digested`, `_record_later`/`_fill`, `needs_tensor`), `lent`
    /// (`_record_lent`) and `environment` (`add_environment`). A writer of the user's own
    /// declares none unless it says so.
    #[classattr]
    #[allow(non_snake_case)]
    fn CAPABILITIES() -> (&'static str, &'static str, &'static str, &'static str) {
        ("digested", "environment", "lent", "sharded")
    }

    /// Starts the trace of `rank` (of `world_size`) in `dir`, creating the folder if needed.
    #[new]
    #[pyo3(signature = (dir, rank, world_size, mode = "stats"))]
    fn new(dir: PathBuf, rank: u32, world_size: u32, mode: &str) -> PyResult<Self> {
        let mode = parse_mode(mode)?;
        if rank >= world_size {
            return Err(PyValueError::new_err(format!(
                "rank {rank} does not fit world size {world_size}"
            )));
        }
        let writer = RustWriter::create(&dir, rank, world_size, mode).map_err(dump_error)?;
        Self::wrap(writer, rank, world_size, mode)
    }

    /// The writer of this process's rank when detcheck launched it (`DETCHECK_TRACE_DIR` set),
    /// in the launch's folder and mode, after waiting for the rank's start slot; `None` outside
    /// detcheck.
    #[staticmethod]
    fn from_env(py: Python<'_>) -> PyResult<Option<Self>> {
        _program_records(py, "the program opened its own trace writer")?;
        Self::launch_writer(py)
    }

    /// `from_env` for detcheck's zero-change recorder (`detcheck/_torch/auto.py`): the same writer,
    /// without telling the recorder that the program opened one.
    #[staticmethod]
    fn _for_recorder(py: Python<'_>) -> PyResult<Option<Self>> {
        Self::launch_writer(py)
    }

    /// The writer of rank `rank` of the launch, for a program that writes every rank itself
    /// (the `none` launcher); `None` outside detcheck.
    #[staticmethod]
    fn from_env_for_rank(py: Python<'_>, rank: u32) -> PyResult<Option<Self>> {
        _program_records(py, "the program opened its own trace writer")?;
        let Some(launch) = Launch::from_env().map_err(dump_error)? else {
            return Ok(None);
        };
        if rank >= launch.world_size {
            return Err(PyValueError::new_err(format!(
                "rank {rank} does not fit the launch's world size {}",
                launch.world_size
            )));
        }
        let writer = py
            .detach(|| RustWriter::from_env_for_rank(rank))
            .map_err(dump_error)?;
        writer
            .map(|w| Self::wrap(w, rank, launch.world_size, launch.mode))
            .transpose()
    }

    /// Records `array` as `name` at `step`: its md5, and its statistics unless the mode is md5
    /// (and the whole tensor in full mode).
    fn record(&mut self, step: u64, name: &str, array: &Bound<'_, PyAny>) -> PyResult<()> {
        self.record_any(step, name, array, false, None)
    }

    /// Records an array that every rank must hold with identical bits (the `replicas` check
    /// compares them across ranks).
    fn record_replicated(
        &mut self,
        step: u64,
        name: &str,
        array: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.record_any(step, name, array, true, None)
    }

    /// Records `array` as this rank's shard of a larger tensor (a DTensor's local shard,
    /// FSDP's flat parameter): its record, and the shard's placement (`global_shape`, and per
    /// dimension the `offset` of its first element and the `extent` it holds, which may be
    /// smaller than the array: FSDP1's padding) with the position digest of its elements,
    /// computed on the writer's thread. The `world_sizes` check adds up the shards of every
    /// rank to compare the global tensor. Never replicated.
    fn record_sharded(
        &mut self,
        step: u64,
        name: &str,
        array: &Bound<'_, PyAny>,
        global_shape: Vec<u64>,
        offset: Vec<u64>,
        extent: Vec<u64>,
    ) -> PyResult<()> {
        let placement = Placement {
            global_shape,
            offset,
            extent,
        };
        self.record_any(step, name, array, false, Some(placement))
    }

    /// Records a torch tensor's copy-on-write snapshot (`detcheck._torch.tensors.lendable`: made by
    /// `torch._lazy_clone`, contiguous, on the CPU, held by no one else) of `dtype` (as
    /// `record` names it) and `shape`, as `record` would record the tensor (as
    /// `record_replicated` with `replicated`, as `record_sharded` with `placement`, its
    /// `(global_shape, offset, extent)`), but without a copy: the writer's thread reads the
    /// snapshot's memory in place and lets it go when it is written. Private: the promise that
    /// the memory does not change is torch's for such a snapshot only (`buffer::Lent`).
    #[pyo3(signature = (step, name, snapshot, dtype, shape, replicated = false, placement = None))]
    #[allow(clippy::too_many_arguments)]
    fn _record_lent(
        &mut self,
        step: u64,
        name: &str,
        snapshot: &Bound<'_, PyAny>,
        dtype: &str,
        shape: Vec<usize>,
        replicated: bool,
        placement: Option<(Vec<u64>, Vec<u64>, Vec<u64>)>,
    ) -> PyResult<()> {
        let dtype = known_dtype(name, dtype)?;
        let len = checked_len(name, dtype, &shape)? * dtype.size_of();
        let lent = Lent::of_snapshot(snapshot, len)?;
        TensorView::new(dtype, &shape, lent.bytes()).map_err(|e| view_error(name, e))?;
        let placement = placement.map(|(global_shape, offset, extent)| Placement {
            global_shape,
            offset,
            extent,
        });
        if replicated && placement.is_some() {
            return Err(PyValueError::new_err(format!(
                "cannot record `{name}`: a shard (a placement) is never replicated"
            )));
        }
        check_placement(name, placement.as_ref(), &shape)?;
        let inner = self.open(name)?;
        if inner.must_wait(len) {
            snapshot.py().detach(|| inner.wait_room(len));
        }
        let record = (dtype, shape, replicated);
        let data = RecordBytes::Lent(lent);
        self.submit_record(step, name, record, data, JobDigest::Compute, placement)?;
        Ok(())
    }

    /// Records a tensor whose digest (and statistics) were computed elsewhere, on a GPU by
    /// `detcheck/_torch/device.py`: `dtype` as `record` names it (`float32`, `bfloat16` ...), the
    /// 16-byte tree digest of its canonical bytes, and `totals` = (max, min, sum, sum of squares
    /// of the finite values, NaN, +Inf and -Inf counts) or `None`. No bytes are read. A record
    /// that must come with its tensor (`needs_tensor`) is refused by the writer's thread.
    #[pyo3(signature = (step, name, dtype, shape, digest, totals = None, replicated = false))]
    #[allow(clippy::too_many_arguments)]
    fn record_digested(
        &mut self,
        step: u64,
        name: &str,
        dtype: &str,
        shape: Vec<usize>,
        digest: &[u8],
        totals: Option<TotalsTuple>,
        replicated: bool,
    ) -> PyResult<()> {
        let dtype = known_dtype(name, dtype)?;
        let len = checked_len(name, dtype, &shape)?;
        let digest = digest_bytes(name, digest)?;
        let stats = stats_of_totals(dtype, len, totals);
        let given = JobDigest::Given(digest, stats);
        self.submit_record(
            step,
            name,
            (dtype, shape, replicated),
            RecordBytes::default(),
            given,
            None,
        )?;
        Ok(())
    }

    /// Holds the place of a record whose digest a device is still computing, and returns its
    /// token for `_fill`: records given after it are written after it, once it is filled
    /// (`detcheck._torch.device_records`). `flush` and `close` call the drains first, which fill
    /// every place; a place never filled fails the file.
    #[pyo3(signature = (step, name, dtype, shape, replicated = false))]
    fn _record_later(
        &mut self,
        step: u64,
        name: &str,
        dtype: &str,
        shape: Vec<usize>,
        replicated: bool,
    ) -> PyResult<u64> {
        let dtype = known_dtype(name, dtype)?;
        let len = checked_len(name, dtype, &shape)?;
        let record = (dtype, shape, replicated);
        let token = self.submit_record(
            step,
            name,
            record,
            RecordBytes::default(),
            JobDigest::Later,
            None,
        )?;
        self.unfilled.insert(token, (name.to_owned(), dtype, len));
        Ok(token)
    }

    /// Gives the record of `token` (`_record_later`) its 16-byte digest and its totals (as
    /// `record_digested` takes them).
    #[pyo3(signature = (token, digest, totals = None))]
    fn _fill(&mut self, token: u64, digest: &[u8], totals: Option<TotalsTuple>) -> PyResult<()> {
        let Some((name, dtype, len)) = self.unfilled.get(&token).cloned() else {
            return Err(PyValueError::new_err(format!(
                "no record waits for its digest under token {token}"
            )));
        };
        let digest = digest_bytes(&name, digest)?;
        self.unfilled.remove(&token);
        let stats = stats_of_totals(dtype, len, totals);
        let inner = self.open(&name)?;
        inner.fill(token, digest, stats).map_err(failure_error)
    }

    /// `True` when the record (`step`, `name`) must be given with its tensor (`record`), not
    /// only its digest: every record in full mode, and the record a re-run captures.
    fn needs_tensor(&self, step: u64, name: &str) -> bool {
        self.mode == DumpMode::Full
            || self
                .capture
                .as_ref()
                .is_some_and(|c| c.step == step && c.name == name)
    }

    /// Adds `key = value` to the trace's environment snapshot (replacing an earlier value of
    /// `key`): what could change bits that detcheck cannot see, such as a framework's version.
    /// `detcheck compare` and failed checks print the entries that differ between two runs.
    /// Allowed until `close()`.
    fn add_environment(&mut self, key: &str, value: &str) -> PyResult<()> {
        if self.inner.is_none() {
            return Err(PyValueError::new_err(format!(
                "cannot add `{key}` to the environment: the trace writer of rank {} is closed",
                self.rank
            )));
        }
        self.environment
            .set(key, value)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Waits until every record given so far is hashed and written to the file (its buffer),
    /// and raises the writer thread's failure if it had one. Recording goes on afterwards.
    /// Records whose digests are still on a device (`detcheck.torch.watch`'s) are handed over
    /// first.
    fn flush(slf: &Bound<'_, Self>) -> PyResult<()> {
        Self::drain(slf)?;
        let mut this = slf.borrow_mut();
        if let Some(inner) = this.inner.as_mut() {
            slf.py().detach(|| inner.flush()).map_err(failure_error)?;
        }
        Ok(())
    }

    /// Finishes the file: the records still on a device or being hashed, the footer, fsync,
    /// rename to its final name. Closing again does nothing.
    fn close(slf: &Bound<'_, Self>) -> PyResult<()> {
        Self::drain(slf)?;
        let mut this = slf.borrow_mut();
        if let Some(inner) = this.inner.take() {
            slf.py().detach(|| inner.finish()).map_err(failure_error)?;
        }
        Ok(())
    }

    /// Calls `drain` (no arguments) before every `flush` and `close`: a recorder that holds
    /// records back (device digests read once per step) hands them over then, so a file is
    /// never finished without them. The same callable once.
    fn _add_drain(&mut self, drain: Py<PyAny>) {
        self.drains.push(drain);
    }

    /// Stops calling `drain` (compared by identity).
    fn _remove_drain(&mut self, drain: &Bound<'_, PyAny>) {
        self.drains.retain(|d| !d.bind(drain.py()).is(drain));
    }

    /// Drops the file unfinished: its temporary file is removed and no trace is left.
    fn abort(&mut self, py: Python<'_>) {
        if let Some(inner) = self.inner.take() {
            py.detach(|| inner.abort());
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Closes the file when the block ends normally; aborts it when it ends with an exception,
    /// so a crashed program leaves no trace that reads as complete. Never swallows the exception.
    #[pyo3(signature = (exc_type, _exc_value, _traceback))]
    fn __exit__(
        slf: Bound<'_, Self>,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc_value: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if exc_type.is_some_and(|t| !t.is_none()) {
            slf.borrow_mut().abort(py);
        } else {
            Self::close(&slf)?;
        }
        Ok(false)
    }

    /// This writer's rank.
    #[getter]
    fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks.
    #[getter]
    fn world_size(&self) -> u32 {
        self.world_size
    }

    /// `"md5"`, `"stats"` or `"full"`.
    #[getter]
    fn mode(&self) -> &'static str {
        self.mode.name()
    }

    /// The number of records given so far (the writer's thread writes them in that order).
    #[getter]
    fn num_records(&self) -> u64 {
        self.num_records
    }

    /// The final path of the trace file, `dir/rank{rank}.dctrace` (there once closed).
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// `True` once `close()` or `abort()` was called (or the `with` block ended).
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_none()
    }

    fn __repr__(&self) -> String {
        format!(
            "TraceWriter(rank={}, world_size={}, mode='{}', num_records={}, path='{}'{})",
            self.rank,
            self.world_size,
            self.mode.name(),
            self.num_records,
            self.path.display(),
            if self.inner.is_none() { ", closed" } else { "" }
        )
    }
}

/// Whether the program records itself: it opened a launch writer of its own (`from_env`,
/// `from_env_for_rank`) or called a recording API of the package (`detcheck.torch.watch`, a
/// framework callback). Then the zero-change recorder records nothing.
static PROGRAM_RECORDS: AtomicBool = AtomicBool::new(false);
/// What to call, with the reason, when the program starts recording itself: the zero-change
/// recorder's `stand_down`, which drops the writer it opened (the program's is the rank's trace).
static ON_PROGRAM_RECORDS: Mutex<Option<Py<PyAny>>> = Mutex::new(None);

/// The package's one stand-down channel: the program records itself (`why` says how). The flag
/// is set, and the recorder's callback (if any) called once with `why`, before the program's
/// own file is created.
#[pyfunction]
fn _program_records(py: Python<'_>, why: &str) -> PyResult<()> {
    PROGRAM_RECORDS.store(true, Ordering::SeqCst);
    let callback = ON_PROGRAM_RECORDS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    if let Some(callback) = callback {
        callback.call1(py, (why,))?;
    }
    Ok(())
}

/// Whether the program records itself in this process (`_program_records` was called).
#[pyfunction]
fn _program_records_itself() -> bool {
    PROGRAM_RECORDS.load(Ordering::SeqCst)
}

/// Calls `callback(why)` once, when the program starts recording itself (replaces an earlier
/// one; `None` clears it).
#[pyfunction]
fn _on_program_records(callback: Option<Py<PyAny>>) {
    *ON_PROGRAM_RECORDS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = callback;
}

/// `launch_info()`'s tuple: `(rank, world_size, seed, files)`.
type LaunchInfo = (
    Option<u32>,
    u32,
    u64,
    Option<BTreeMap<&'static str, PathBuf>>,
);

/// The launch this process belongs to, as the zero-change recorder needs it: `(rank or None,
/// world_size, seed, files)`, where `files` maps `note`, `error`, `pid`, `stacks` and `started` to
/// the paths of the rank's files in the trace folder (`detcheck::launch::RankFiles`; `None` without
/// a rank), or `None` outside detcheck.
#[pyfunction]
fn launch_info() -> PyResult<Option<LaunchInfo>> {
    let launch = Launch::from_env().map_err(dump_error)?;
    Ok(launch.map(|l| {
        let files = l.rank.map(|r| {
            let f = RankFiles::new(&l.trace_dir, r);
            BTreeMap::from([
                ("note", f.note),
                ("error", f.error),
                ("pid", f.pid),
                ("stacks", f.stacks),
                ("started", f.started),
            ])
        });
        (l.rank, l.world_size, l.seed, files)
    }))
}

/// Under detcheck's `srun` launcher, the variables of this task's rank (`RANK`, `WORLD_SIZE`,
/// `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `DETCHECK_RANK`) from Slurm's
/// (`detcheck::launch::srun_rank_variables`); empty elsewhere.
#[pyfunction]
fn srun_rank_variables() -> PyResult<Vec<(&'static str, String)>> {
    detcheck::launch::srun_rank_variables().map_err(dump_error)
}

/// The launch's variables that make this process rank `rank` of `world_size`
/// (`DETCHECK_RANK`, `DETCHECK_WORLD_SIZE`): set by a process a rank started when it joins a
/// process group as a rank of its own, and by a rank whose group is larger than the launch's
/// world (`detcheck/_launch/startup.py`).
#[pyfunction]
fn launch_variables(rank: u32, world_size: u32) -> Vec<(&'static str, String)> {
    use detcheck::launch::{RANK_VAR, WORLD_SIZE_VAR};
    vec![
        (RANK_VAR, rank.to_string()),
        (WORLD_SIZE_VAR, world_size.to_string()),
    ]
}

/// The first line of a rank's error file (`detcheck::launch::ERROR_FILE_MAGIC`).
#[pyfunction]
fn error_file_magic() -> &'static str {
    ERROR_FILE_MAGIC
}

/// How many seconds this rank waits before its first point-to-point send
/// (`detcheck::launch::Launch::first_send_delay`; 0 outside a check's launch).
#[pyfunction]
fn first_send_delay() -> PyResult<f64> {
    let launch = Launch::from_env().map_err(dump_error)?;
    Ok(launch
        .and_then(|l| Some(l.first_send_delay(l.rank?).as_secs_f64()))
        .unwrap_or(0.0))
}

/// What the launch asks of the zero-change recorder (`detcheck::launch::RecorderPlan`):
/// `(stop_after or None, the names of the deterministic settings to apply (none: an empty
/// list), what it records: `"all"`, `"end"` (the end state only) or `"flow"` (with module
/// inputs))`.
#[pyfunction]
fn recorder_plan() -> PyResult<(Option<u64>, Vec<&'static str>, &'static str)> {
    let plan = RecorderPlan::from_env().map_err(dump_error)?;
    Ok((
        plan.stop_after,
        setting_names(plan.deterministic),
        plan.record.as_str(),
    ))
}

/// `deterministic_settings()`'s rows: `(kind, name, value, statement, why, reference)`.
type SettingRow = (
    &'static str,
    &'static str,
    &'static str,
    String,
    &'static str,
    &'static str,
);

/// The deterministic settings (`detcheck::record::hints::deterministic`), in order, as
/// `(kind, name, value, statement, why, reference)`: `kind` is `"launch"` for a variable the
/// launch sets, `"startup"` for a call the program makes; `SEED` stands for the seed.
#[pyfunction]
fn deterministic_settings() -> Vec<SettingRow> {
    detcheck::record::hints::deterministic()
        .map(|h| {
            let launch = h.subject == Subject::Setting;
            (
                if launch { "launch" } else { "startup" },
                h.name,
                h.value,
                h.statement(None),
                h.why,
                h.reference,
            )
        })
        .collect()
}

/// A capture request as Python sees it: `(rank, step, occurrence, name, dir)`.
type CaptureRequest = (u32, u64, u32, String, PathBuf);

/// The capture a re-run is asked for (`DETCHECK_CAPTURE` = `RANK:STEP:OCCURRENCE:NAME` and
/// `DETCHECK_CAPTURE_DIR`, read by `detcheck::launch::Capture::from_env`): `(rank, step,
/// occurrence, name, dir)`, or `None` when there is none or the value cannot be read (a capture
/// is a diagnosis aid, never a reason to fail a program). `detcheck.torch.watch` reads it to
/// trace the operators of the captured record (`detcheck/_torch/ops.py`).
#[pyfunction]
fn capture_request() -> PyResult<Option<CaptureRequest>> {
    Ok(Capture::from_env().map(|(capture, dir)| {
        (
            capture.rank,
            capture.step,
            capture.occurrence,
            capture.name,
            dir,
        )
    }))
}

/// What `detcheck run --inside` asks of the operator trace (`DETCHECK_CAPTURE_OPS`, read by
/// `detcheck::launch::InsideRequest::from_env`): `None` for the check's drill-down (statistics
/// only), else `(replay_from,)`: the folder whose window inputs replace the module's (`None`:
/// its own inputs).
#[pyfunction]
fn inside_request() -> Option<(Option<PathBuf>,)> {
    InsideRequest::from_env().map(|inside| (inside.replay_from,))
}

/// One replayed input as Python sees it: `(j, dtype, shape, bytes)`.
type ReplayInput = (u32, &'static str, Vec<usize>, Vec<u8>);

/// The window inputs of step `step` of another run's `--inside` trace in `folder`
/// (`detcheck::launch::capture::read_window_inputs`), by `j`: `(j, dtype, shape, bytes)`, the
/// dtype as `supported_dtypes` names it, the bytes little-endian; a `DetcheckError` naming the
/// file when they cannot be read.
#[pyfunction]
fn replay_inputs(folder: PathBuf, step: u64) -> PyResult<Vec<ReplayInput>> {
    let inputs =
        read_window_inputs(&folder, step).map_err(|e| DetcheckError::new_err(e.to_string()))?;
    Ok(inputs
        .into_iter()
        .map(|(j, tensor)| {
            let bytes = tensor.with_view(|v| v.bytes().to_vec());
            (
                j,
                python_dtype_name(tensor.dtype()),
                tensor.shape().to_vec(),
                bytes,
            )
        })
        .collect())
}

/// The tree digest of `data`'s bytes (any object with a buffer: `bytes`, a numpy array): the
/// digest every record carries (`detcheck::value::tree_digest`; plain md5 up to 4 KiB), which
/// `detcheck/_torch/device.py` computes on a GPU.
#[pyfunction]
fn tensor_digest(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let buffer = Buffer::c_contiguous(data).ok_or_else(|| {
        PyTypeError::new_err("tensor_digest needs a C-contiguous buffer (bytes, a numpy array)")
    })?;
    let bytes = buffer.bytes();
    Ok(py.detach(|| tree_digest(bytes)).0.to_vec())
}

/// Runs detcheck's command line (`detcheck check ...`, the same implementation as the cargo
/// binary: `detcheck::cli::run`) with `argv`, the program's name first, in this process, and
/// returns its exit code. The `detcheck` console script and `python -m detcheck` call it
/// (`detcheck/__main__.py`); the GIL is released while it runs.
#[pyfunction]
fn cli(py: Python<'_>, argv: Vec<std::ffi::OsString>) -> u8 {
    py.detach(|| detcheck::cli::run(argv))
}

/// Counts a fork in the child (`os.register_at_fork`): a trace writer made before it belongs to
/// the parent (`worker::note_fork`).
#[pyfunction]
fn _after_fork_in_child() {
    worker::note_fork();
}

/// The native part of the `detcheck` package (re-exported by `detcheck/__init__.py`).
#[pymodule]
#[pyo3(name = "_detcheck")]
fn detcheck_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTraceWriter>()?;
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    m.add_function(wrap_pyfunction!(tensor_digest, m)?)?;
    m.add_function(wrap_pyfunction!(capture_request, m)?)?;
    m.add_function(wrap_pyfunction!(inside_request, m)?)?;
    m.add_function(wrap_pyfunction!(replay_inputs, m)?)?;
    m.add_function(wrap_pyfunction!(supported_dtypes, m)?)?;
    m.add_function(wrap_pyfunction!(operator_record_name, m)?)?;
    m.add_function(wrap_pyfunction!(window_record_name, m)?)?;
    m.add_function(wrap_pyfunction!(launch_info, m)?)?;
    m.add_function(wrap_pyfunction!(srun_rank_variables, m)?)?;
    m.add_function(wrap_pyfunction!(launch_variables, m)?)?;
    m.add_function(wrap_pyfunction!(error_file_magic, m)?)?;
    m.add_function(wrap_pyfunction!(recorder_plan, m)?)?;
    m.add_function(wrap_pyfunction!(first_send_delay, m)?)?;
    m.add_function(wrap_pyfunction!(deterministic_settings, m)?)?;
    m.add_function(wrap_pyfunction!(_program_records, m)?)?;
    m.add_function(wrap_pyfunction!(_program_records_itself, m)?)?;
    m.add_function(wrap_pyfunction!(_on_program_records, m)?)?;
    // Where Python forks (POSIX): the count `worker::Background` reads at every record.
    if let Ok(register) = m.py().import("os")?.getattr("register_at_fork") {
        let at_fork = pyo3::types::PyDict::new(m.py());
        at_fork.set_item("after_in_child", wrap_pyfunction!(_after_fork_in_child, m)?)?;
        register.call((), Some(&at_fork))?;
    }
    m.add("DetcheckError", m.py().get_type::<DetcheckError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_formats() {
        let check = |format: &str, itemsize: usize, expected: Option<DType>| {
            assert_eq!(
                buffer_dtype(format, itemsize),
                expected,
                "{format} {itemsize}"
            );
        };
        check("<f", 4, Some(DType::F32));
        check("f", 4, Some(DType::F32));
        check("=d", 8, Some(DType::F64));
        check("<e", 2, Some(DType::F16));
        check("l", 8, Some(DType::I64));
        check("q", 8, Some(DType::I64));
        check("i", 4, Some(DType::I32));
        check("l", 4, Some(DType::I32));
        check("B", 1, Some(DType::U8));
        check(">B", 1, Some(DType::U8));
        check("?", 1, Some(DType::Bool));
        check("b", 1, Some(DType::I8));
        check(">b", 1, Some(DType::I8));
        check("h", 2, Some(DType::I16));
        check("<h", 2, Some(DType::I16));
        check("H", 2, Some(DType::U16));
        check("Zf", 8, Some(DType::C64));
        check("<Zf", 8, Some(DType::C64));
        check("Zd", 16, Some(DType::C128));
        check(">f", 4, None);
        check("!d", 8, None);
        check(">h", 2, None);
        check(">Zf", 8, None);
        check("Zf", 16, None);
        check("Ze", 4, None);
        check("Z", 8, None);
        check("B", 2, Some(DType::U16));
        check("c", 2, None);
        check("T{f:x:}", 4, None);
        check("", 1, None);
    }

    #[test]
    fn dtype_names() {
        // Pinned: Python code and users' files name dtypes by these strings.
        assert_eq!(
            supported_dtypes(),
            [
                "float32",
                "float64",
                "int64",
                "uint8",
                "float16",
                "bfloat16",
                "int32",
                "bool",
                "int8",
                "int16",
                "uint16",
                "float8_e4m3fn",
                "float8_e5m2",
                "complex64",
                "complex128"
            ]
        );
        for dtype in DType::ALL {
            assert_eq!(dtype_named(python_dtype_name(dtype)), Some(dtype));
        }
        assert_eq!(dtype_named("uint32"), None);
        assert_eq!(dtype_named("float8_e4m3fnuz"), None);
        assert_eq!(dtype_named("i8"), None);
    }
}
