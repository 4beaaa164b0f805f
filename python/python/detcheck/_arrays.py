"""Turning what a program records into a buffer the native writer reads in place.

``normalize(obj, name)`` is called by the native ``TraceWriter.record`` only when ``obj`` has
no C-contiguous, little-endian buffer of a supported dtype (the fast path reads numpy arrays,
``memoryview`` and ``bytes`` directly). It returns ``(dtype_name, array)``: a numpy array that
is C-contiguous and little-endian, whose bytes are the canonical bytes of the record, copied
only where needed (a strided view, big-endian data, a torch tensor on a GPU). torch is never
imported here: a torch tensor is recognised only when the program has imported torch itself.
"""

import sys

#: numpy dtype names detcheck records (torch adds bfloat16).
SUPPORTED = ("float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8", "bool")

_NUMPY_KINDS = {
    ("f", 2): "float16",
    ("f", 4): "float32",
    ("f", 8): "float64",
    ("i", 4): "int32",
    ("i", 8): "int64",
    ("u", 1): "uint8",
    ("b", 1): "bool",
}


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
    return {
        torch.float16: "float16",
        torch.bfloat16: "bfloat16",
        torch.float32: "float32",
        torch.float64: "float64",
        torch.int32: "int32",
        torch.int64: "int64",
        torch.uint8: "uint8",
        torch.bool: "bool",
    }


def _from_torch(torch, tensor, name):
    dtype = _torch_dtypes(torch).get(tensor.dtype)
    if dtype is None:
        raise _unsupported(name, tensor.dtype)
    if tensor.layout != torch.strided:
        raise TypeError(f"cannot record `{name}`: a {tensor.layout} tensor (make it dense first)")
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.contiguous()
    if dtype == "bfloat16":
        # numpy has no bfloat16: the same 2-byte patterns, as int16.
        tensor = tensor.view(torch.int16)
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
    if array.dtype.name == "bfloat16" and array.dtype.itemsize == 2:
        # ml_dtypes' bfloat16 (JAX): the same 2-byte patterns, as uint16.
        return "bfloat16", _little_endian(array.view(np.uint16))
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
