//! Memory read in place: the buffer protocol (PEP 3118), and a torch tensor's memory lent to the
//! writer's thread. The one module of the package with `unsafe`.
//!
//! [`Buffer::c_contiguous`] asks an object (a numpy array, a `memoryview`, `bytes`) for a
//! read-only, C-contiguous view of its memory with its struct format and shape, and holds it
//! until dropped, so the memory stays alive and cannot be resized (the exporter refuses while a
//! view is out). [`Buffer::bytes`] borrows that memory as `&[u8]` without copying it.
//!
//! [`Lent::of_snapshot`] holds a torch copy-on-write snapshot (`torch._lazy_clone`, made by
//! `detcheck._torch.tensors.lendable`) and the address of its memory (`const_data_ptr`, which does
//! not materialize it): the writer's thread reads those bytes with no copy, while the program goes
//! on. Torch never writes memory that a copy-on-write tensor shares: a write through the
//! program's tensor first gives that tensor memory of its own (a copy then, on the program's
//! thread), and nobody but detcheck holds the snapshot. What bypasses torch (a pointer or numpy
//! view taken of the tensor before the snapshot) is outside that promise: which is why only
//! fresh results of autograd's operators, and gradients and parameters whose storage no one
//! holds but the tensors the recorder sees, are lent (`lendable`'s two rules).
//!
//! Why by hand: PyO3 exposes `PyObject_GetBuffer` under the stable ABI only for Python 3.11 and
//! later (where it joined the limited API), and this package is one abi3 wheel for 3.9 and later.
//! The function and the `Py_buffer` layout are the same in every CPython 3 (3.11 added them to
//! the limited API unchanged), so they are declared here. Turning the exporter's pointer into a
//! slice is `unsafe` whatever the binding: PyO3's own `PyBuffer` hands out `ReadOnlyCell`s.
//!
//! Limits: the slice is read while the GIL is released (hashing a large array); another Python
//! thread that writes into the same array at that moment races with the read, as it would with
//! numpy's own GIL-free operations. Recording an array while another thread writes into it is
//! unsupported (the digest would be of a mixture anyway).

#![allow(unsafe_code)]

use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::marker::PhantomData;
use std::ptr;

/// `Py_buffer` (Include/pybuffer.h), unchanged since Python 3.3.
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

/// `PyBUF_FORMAT`: fill in the struct format.
const PYBUF_FORMAT: c_int = 0x0004;
/// `PyBUF_C_CONTIGUOUS`: shape and strides, and fail unless the memory is C-contiguous.
const PYBUF_C_CONTIGUOUS: c_int = 0x0020 | 0x0010 | 0x0008;

/// A read-only, C-contiguous view of an object's memory, released when dropped.
///
/// It holds the attached-interpreter token's lifetime, so it is dropped (and released) while
/// the thread is attached: it cannot move into [`Python::detach`], only its [`Buffer::bytes`] can.
pub(crate) struct Buffer<'py> {
    // Boxed: the exporter may keep the view's address until it is released.
    raw: Box<RawBuffer>,
    _py: PhantomData<Python<'py>>,
}

impl<'py> Buffer<'py> {
    /// The C-contiguous buffer of `obj`, or `None` (with the Python error cleared) when `obj`
    /// has no buffer or cannot give a C-contiguous one (a strided numpy view, a torch tensor).
    pub(crate) fn c_contiguous(obj: &Bound<'py, PyAny>) -> Option<Self> {
        let mut raw = Box::new(RawBuffer {
            buf: ptr::null_mut(),
            obj: ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: ptr::null_mut(),
            shape: ptr::null_mut(),
            strides: ptr::null_mut(),
            suboffsets: ptr::null_mut(),
            internal: ptr::null_mut(),
        });
        // SAFETY: `obj` is a live object (borrowed for 'py, the thread is attached) and `raw`
        // is writable memory of `Py_buffer`'s layout; on success the exporter filled it in and
        // holds a reference to itself in `raw.obj` until `PyBuffer_Release`.
        let rc = unsafe {
            PyObject_GetBuffer(obj.as_ptr(), &mut *raw, PYBUF_C_CONTIGUOUS | PYBUF_FORMAT)
        };
        if rc != 0 {
            // Not an error of ours: the caller falls back to converting the object.
            drop(PyErr::take(obj.py()));
            return None;
        }
        let buffer = Buffer {
            raw,
            _py: PhantomData,
        };
        // A C-contiguous request never gives suboffsets; refuse rather than misread one.
        if !buffer.raw.suboffsets.is_null() || buffer.raw.len < 0 || buffer.raw.ndim < 0 {
            return None;
        }
        Some(buffer)
    }

    /// The struct format (`"<f"`, `"d"`, `"?"`, ...); `"B"` when the exporter gives none.
    pub(crate) fn format(&self) -> &str {
        if self.raw.format.is_null() {
            return "B";
        }
        // SAFETY: a non-null format is a NUL-terminated string owned by the exporter and valid
        // until the buffer is released, which `&self` outlives.
        let format = unsafe { CStr::from_ptr(self.raw.format) };
        format.to_str().unwrap_or("")
    }

    /// The size of one item in bytes.
    pub(crate) fn itemsize(&self) -> usize {
        usize::try_from(self.raw.itemsize).unwrap_or(0)
    }

    /// The shape (empty for a scalar); `[len / itemsize]` when the exporter gives none.
    pub(crate) fn shape(&self) -> Vec<usize> {
        let ndim = usize::try_from(self.raw.ndim).unwrap_or(0);
        if self.raw.shape.is_null() {
            let items = self.bytes().len().checked_div(self.itemsize()).unwrap_or(0);
            return if ndim == 0 { Vec::new() } else { vec![items] };
        }
        // SAFETY: with PyBUF_ND requested, a non-null `shape` holds `ndim` lengths, valid until
        // the buffer is released.
        let dims = unsafe { std::slice::from_raw_parts(self.raw.shape, ndim) };
        dims.iter()
            .map(|&d| usize::try_from(d).unwrap_or(0))
            .collect()
    }

    /// The memory, borrowed in place.
    pub(crate) fn bytes(&self) -> &[u8] {
        let len = usize::try_from(self.raw.len).unwrap_or(0);
        if len == 0 || self.raw.buf.is_null() {
            return &[];
        }
        // SAFETY: the exporter guarantees `len` readable bytes at `buf`, C-contiguous (asked
        // for), alive and not resized until the view is released, which `&self` outlives. Bytes
        // have no alignment or validity requirement. Writes by other threads while the GIL is
        // released are the limit documented at the top of this module.
        unsafe { std::slice::from_raw_parts(self.raw.buf.cast::<u8>(), len) }
    }
}

impl Drop for Buffer<'_> {
    fn drop(&mut self) {
        // SAFETY: the view was filled in by a successful `PyObject_GetBuffer` and is released
        // once; the thread is attached (a `Buffer` never leaves its 'py scope).
        unsafe { PyBuffer_Release(&mut *self.raw) }
    }
}

/// A torch copy-on-write snapshot's memory, lent to the writer's thread (module doc): `len`
/// bytes at `address`, alive and unchanged while `_owner` lives.
pub(crate) struct Lent {
    /// Held only to keep the memory alive; dropped with the `Lent`.
    _owner: Py<PyAny>,
    address: *const u8,
    len: usize,
}

// SAFETY: the memory is only read, from any thread, while `_owner` keeps it alive (module doc);
// `_owner` itself is `Send` and `Sync`.
unsafe impl Send for Lent {}
// SAFETY: as for `Send`: shared reads of immutable memory.
unsafe impl Sync for Lent {}

impl Lent {
    /// The memory of `snapshot`, a contiguous torch tensor made by `torch._lazy_clone` that no
    /// one else holds, of `len` bytes (the record's dtype and shape, checked against the
    /// tensor's own `nbytes`).
    pub(crate) fn of_snapshot(snapshot: &Bound<'_, PyAny>, len: usize) -> PyResult<Self> {
        let contiguous: bool = snapshot.call_method0("is_contiguous")?.extract()?;
        let nbytes: usize = snapshot.getattr("nbytes")?.extract()?;
        if !contiguous || nbytes != len {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "a lent tensor must be contiguous and of {len} bytes, not {nbytes} \
                 (contiguous: {contiguous})"
            )));
        }
        // The read-only pointer: `data_ptr()` would materialize a copy-on-write tensor.
        let address: usize = snapshot.call_method0("const_data_ptr")?.extract()?;
        if address == 0 && len > 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "a lent tensor has no memory",
            ));
        }
        Ok(Lent {
            _owner: snapshot.clone().unbind(),
            address: std::ptr::with_exposed_provenance(address),
            len,
        })
    }

    /// The lent bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `address` is the snapshot's `const_data_ptr`, `len` its `nbytes` and the
        // tensor contiguous (checked by `of_snapshot`); the memory lives and does not change
        // while `_owner` lives (module doc), which `&self` outlives. Bytes have no alignment or
        // validity requirement.
        unsafe { std::slice::from_raw_parts(self.address, self.len) }
    }
}
