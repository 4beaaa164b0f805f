"""Turning what a program records into a buffer the native writer reads in place.

``normalize(obj, name)`` is called by the native ``TraceWriter.record`` only when ``obj`` has
no C-contiguous, little-endian buffer of a supported dtype (the fast path reads numpy arrays,
``memoryview`` and ``bytes`` directly). It returns ``(dtype_name, array)``: a numpy array that
is C-contiguous and little-endian, whose bytes are the canonical bytes of the record, copied
only where needed (a strided view, big-endian data, a torch tensor on a GPU). torch is never
imported here: a torch tensor is recognised only when the program has imported torch itself.

Dtypes without a numpy dtype travel as their raw bytes under their own name: bfloat16 as int16
(or ml_dtypes' as uint16), the 8-bit floats ``float8_e4m3fn`` and ``float8_e5m2`` (torch's, or
ml_dtypes') as uint8. torch's uint16 goes through int16, whose bytes are the same. A complex
tensor's bytes are (real, imaginary) pairs, as numpy's complex64 and complex128. A meta tensor
(no values) and a nested tensor (no single row-major layout) are refused with a TypeError.
"""

import sys

from .._detcheck import supported_dtypes

#: The dtype names detcheck records (numpy's, and torch's and ml_dtypes' bfloat16 and 8-bit
#: floats): the native module's one table.
SUPPORTED = tuple(supported_dtypes())

_NUMPY_KINDS = {
    ("f", 2): "float16",
    ("f", 4): "float32",
    ("f", 8): "float64",
    ("i", 1): "int8",
    ("i", 2): "int16",
    ("i", 4): "int32",
    ("i", 8): "int64",
    ("u", 1): "uint8",
    ("u", 2): "uint16",
    ("b", 1): "bool",
    ("c", 8): "complex64",
    ("c", 16): "complex128",
}

#: Dtypes numpy lacks (ml_dtypes' names, which are torch's): recorded as their raw bytes.
_RAW_NAMED = {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def _unsupported(name, dtype):
    return TypeError(
        f"cannot record `{name}`: dtype {dtype} is not supported "
        f"(detcheck records {', '.join(SUPPORTED)})"
    )


_TORCH_DTYPES = None


def _torch_dtypes(torch):
    global _TORCH_DTYPES
    if _TORCH_DTYPES is None:
        _TORCH_DTYPES = _torch_dtype_names(torch)
    return _TORCH_DTYPES


def _torch_dtype_names(torch):
    # getattr: an older torch without uint16 or the 8-bit floats simply does not list them.
    return {getattr(torch, n): n for n in SUPPORTED if hasattr(torch, n)}


def torch_dtype_name(dtype):
    """The name the writer knows ``dtype`` by (``record_digested``'s ``dtype``): ``float32``,
    ``bfloat16`` ...; a ``TypeError`` for a dtype detcheck does not record."""
    import torch

    name = _torch_dtypes(torch).get(dtype)
    if name is None:
        raise TypeError(f"dtype {dtype} is not supported (detcheck records {', '.join(SUPPORTED)})")
    return name


#: torch dtypes numpy lacks, and the dtype of the same bytes that numpy has.
TORCH_RAW = {
    "bfloat16": "int16",
    "uint16": "int16",
    "float8_e4m3fn": "uint8",
    "float8_e5m2": "uint8",
}


def _from_torch(torch, tensor, name):
    # Before anything else reads the tensor: torch's own errors for these say nothing useful.
    if tensor.is_nested:
        raise TypeError(f"cannot record `{name}`: it is a nested tensor (record its components)")
    if tensor.is_meta or tensor.device.type == "meta":
        raise TypeError(f"cannot record `{name}`: it is a meta tensor (no values)")
    dtype = _torch_dtypes(torch).get(tensor.dtype)
    if dtype is None:
        raise _unsupported(name, tensor.dtype)
    if tensor.layout != torch.strided:
        raise TypeError(f"cannot record `{name}`: a {tensor.layout} tensor (make it dense first)")
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    # The values the tensor shows: a lazily conjugated or negated view is resolved (a copy).
    tensor = tensor.resolve_conj().resolve_neg().contiguous()
    raw = TORCH_RAW.get(dtype)
    if raw is not None:
        # numpy has no such dtype: the same bytes, as an integer dtype it has.
        tensor = tensor.view(getattr(torch, raw))
    return dtype, _little_endian(tensor.numpy())


def _little_endian(array):
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and sys.byteorder == "big"):
        array = array.astype(array.dtype.newbyteorder("<"))
    if not array.flags.c_contiguous:
        array = array.copy(order="C")
    return array


def normalize(obj, name):
    """``(dtype_name, C-contiguous little-endian numpy array)`` of ``obj``, or a TypeError."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _from_torch(torch, obj, name)
    import numpy as np

    if isinstance(obj, (bool, int, float)):
        array = np.asarray(obj)  # bool, int64, float64
        if array.dtype.kind == "i":
            array = array.astype(np.int64)
    elif hasattr(obj, "__array__") or _has_buffer(obj):
        array = np.asarray(obj)
    else:
        raise TypeError(
            f"cannot record `{name}`: expected an array (an object with the buffer protocol or "
            f"__array__, a torch tensor, or a Python scalar), got {type(obj).__name__}"
        )
    raw_size = _RAW_NAMED.get(array.dtype.name)
    if raw_size is not None and array.dtype.itemsize == raw_size:
        # ml_dtypes' bfloat16 and 8-bit floats (JAX): the same bytes, as uint16 or uint8.
        same_bytes = np.uint16 if raw_size == 2 else np.uint8
        return array.dtype.name, _little_endian(array.view(same_bytes))
    dtype = _NUMPY_KINDS.get((array.dtype.kind, array.dtype.itemsize))
    if dtype is None:
        raise _unsupported(name, array.dtype)
    return dtype, _little_endian(array)


def _has_buffer(obj):
    try:
        memoryview(obj).release()
    except TypeError:
        return False
    return True
