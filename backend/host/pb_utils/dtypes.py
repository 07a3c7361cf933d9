"""Data-type tables and BYTES (de)serialisation, as Triton's Python backend has them.

Three spellings of one data type meet here: the config's `TYPE_FP32`, the wire's
`FP32` (KServe v2) and the C API enum `TRITONSERVER_TYPE_FP32 == 11` that
`Tensor.triton_dtype()` and `numpy_to_triton_type` return.
"""
from __future__ import annotations

import struct
from typing import Any

import numpy as np

# TRITONSERVER_DataType values (tritonserver.h); models compare against these ints.
TRITONSERVER_TYPE_INVALID = 0
TRITONSERVER_TYPE_BOOL = 1
TRITONSERVER_TYPE_UINT8 = 2
TRITONSERVER_TYPE_UINT16 = 3
TRITONSERVER_TYPE_UINT32 = 4
TRITONSERVER_TYPE_UINT64 = 5
TRITONSERVER_TYPE_INT8 = 6
TRITONSERVER_TYPE_INT16 = 7
TRITONSERVER_TYPE_INT32 = 8
TRITONSERVER_TYPE_INT64 = 9
TRITONSERVER_TYPE_FP16 = 10
TRITONSERVER_TYPE_FP32 = 11
TRITONSERVER_TYPE_FP64 = 12
TRITONSERVER_TYPE_BYTES = 13
TRITONSERVER_TYPE_BF16 = 14

# (config name, wire name, C enum, numpy type). BF16 has no numpy type.
_TABLE: tuple[tuple[str, str, int, Any], ...] = (
    ("TYPE_BOOL", "BOOL", TRITONSERVER_TYPE_BOOL, np.bool_),
    ("TYPE_UINT8", "UINT8", TRITONSERVER_TYPE_UINT8, np.uint8),
    ("TYPE_UINT16", "UINT16", TRITONSERVER_TYPE_UINT16, np.uint16),
    ("TYPE_UINT32", "UINT32", TRITONSERVER_TYPE_UINT32, np.uint32),
    ("TYPE_UINT64", "UINT64", TRITONSERVER_TYPE_UINT64, np.uint64),
    ("TYPE_INT8", "INT8", TRITONSERVER_TYPE_INT8, np.int8),
    ("TYPE_INT16", "INT16", TRITONSERVER_TYPE_INT16, np.int16),
    ("TYPE_INT32", "INT32", TRITONSERVER_TYPE_INT32, np.int32),
    ("TYPE_INT64", "INT64", TRITONSERVER_TYPE_INT64, np.int64),
    ("TYPE_FP16", "FP16", TRITONSERVER_TYPE_FP16, np.float16),
    ("TYPE_FP32", "FP32", TRITONSERVER_TYPE_FP32, np.float32),
    ("TYPE_FP64", "FP64", TRITONSERVER_TYPE_FP64, np.float64),
    ("TYPE_STRING", "BYTES", TRITONSERVER_TYPE_BYTES, np.object_),
    ("TYPE_BF16", "BF16", TRITONSERVER_TYPE_BF16, None),
)

CONFIG_TO_WIRE: dict[str, str] = {c: w for c, w, _, _ in _TABLE}
WIRE_TO_CONFIG: dict[str, str] = {w: c for c, w, _, _ in _TABLE}
WIRE_TO_ENUM: dict[str, int] = {w: e for _, w, e, _ in _TABLE}
ENUM_TO_WIRE: dict[int, str] = {e: w for _, w, e, _ in _TABLE}
WIRE_TO_NUMPY: dict[str, Any] = {w: n for _, w, _, n in _TABLE if n is not None}

# Public in pb_utils under this name; Triton maps TYPE_BOOL to the builtin `bool`.
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    c: (bool if c == "TYPE_BOOL" else n) for c, _, _, n in _TABLE if n is not None
}


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    """C enum -> numpy type; None for unknown values (Triton's behaviour)."""
    wire = ENUM_TO_WIRE.get(data_type)
    return WIRE_TO_NUMPY.get(wire) if wire is not None else None


# Keyed by numpy dtype (native byte order, as np.dtype(type) gives): every
# response tensor is looked up here, twice, so no scan of _TABLE per call.
_DTYPE_TO_ENUM: dict[np.dtype, int] = {np.dtype(n): e for _, _, e, n in _TABLE if n is not None and n is not np.object_}


# The same by the dtype objects themselves (np.object_'s too): a response tensor's dtype is one of
# them, and the lookup costs a dict probe where np.dtype() and .kind cost a few microseconds.
_FAST_ENUM: dict[Any, int] = {**_DTYPE_TO_ENUM, np.dtype(np.object_): TRITONSERVER_TYPE_BYTES}


def numpy_to_triton_type(data_type: Any) -> int | None:
    """numpy dtype or type -> C enum; bytes and object both mean BYTES."""
    try:
        enum = _FAST_ENUM.get(data_type)
    except TypeError:  # unhashable: not a dtype
        enum = None
    if enum is not None:
        return enum
    try:
        dt = np.dtype(data_type)
    except TypeError:
        return None
    if dt.kind in ("O", "S"):
        return TRITONSERVER_TYPE_BYTES
    return _DTYPE_TO_ENUM.get(dt)


def wire_dtype_of(array: np.ndarray) -> str:
    """The wire name for a numpy array a model hands back; raises for unsupported ones."""
    enum = numpy_to_triton_type(array.dtype)
    if enum is None:
        raise TypeError(f"numpy dtype {array.dtype} has no Triton data type")
    return ENUM_TO_WIRE[enum]


def _element_bytes(item: Any) -> bytes:
    # Triton keeps bytes as they are and str()-encodes anything else.
    if isinstance(item, bytes):
        return item
    if isinstance(item, np.bytes_):
        return bytes(item)
    return str(item).encode("utf-8")


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple[()] | None:
    """BYTES tensor -> concatenated <uint32 LE length><bytes> elements in C order."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype.kind not in ("O", "S"):
        return None
    if input_tensor.size == 1:  # the usual response tensor: one string
        data = _element_bytes(input_tensor.reshape(-1)[0])
        return struct.pack("<I", len(data)) + data
    parts: list[bytes] = []
    for item in input_tensor.reshape(-1, order="C"):
        data = _element_bytes(item)
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """Inverse of serialize_byte_tensor: a flat object array of bytes."""
    view = memoryview(encoded_tensor)
    items: list[bytes] = []
    offset = 0
    while offset < len(view):
        if offset + 4 > len(view):
            raise ValueError("truncated BYTES element length prefix")
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + length > len(view):
            raise ValueError("BYTES element runs past the end of the buffer")
        items.append(bytes(view[offset : offset + length]))
        offset += length
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out
