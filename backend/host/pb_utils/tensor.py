"""pb_utils.Tensor: a named numpy array (CPU only in the embedded host)."""
from __future__ import annotations

from typing import Any

import numpy as np

from .dtypes import numpy_to_triton_type
from .triton_errors import TritonModelException


class _CapsuleHolder:
    # numpy.from_dlpack wants an object with __dlpack__; a bare capsule (what
    # torch.utils.dlpack.to_dlpack returns) is wrapped so both forms work.
    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


def _as_tensor_array(array: Any) -> np.ndarray:
    if not isinstance(array, np.ndarray):
        raise TritonModelException("Tensor expects a numpy.ndarray")
    if array.dtype.kind == "U":
        # Triton rejects numpy unicode arrays: BYTES tensors are object arrays.
        raise TritonModelException(
            "Tensor dtype used for numpy_array is not support by Python backend. "
            "Please use np.object_ instead."
        )
    if array.dtype.kind == "V":
        raise TritonModelException("Tensor dtype used for numpy_array is not support by Python backend.")
    if array.dtype.kind == "S":
        # Fixed-width bytes would lose trailing NULs; keep each element as bytes.
        out = np.empty(array.shape, dtype=np.object_)
        out[...] = [bytes(x) for x in array.reshape(-1)] if array.size else []
        return out
    if numpy_to_triton_type(array.dtype) is None:
        raise TritonModelException(f"Tensor dtype {array.dtype} is not supported by Python backend.")
    # Like Triton, keep a reference (no copy); the bytes are taken at send time.
    return array


class Tensor:
    __slots__ = ("_name", "_array")

    def __init__(self, name: str, numpy_array: np.ndarray) -> None:
        self._name = str(name)
        self._array = _as_tensor_array(numpy_array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def triton_dtype(self) -> int:
        return int(numpy_to_triton_type(self._array.dtype))  # type: ignore[arg-type]

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._array.dtype == np.object_:
            raise TritonModelException("DLPack does not support BYTES tensors")
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    @staticmethod
    def from_dlpack(name: str, dlpack: Any) -> "Tensor":
        source = dlpack if hasattr(dlpack, "__dlpack__") else _CapsuleHolder(dlpack)
        if hasattr(source, "__dlpack_device__") and source.__dlpack_device__()[0] != 1:
            raise TritonModelException("the embedded host only supports CPU DLPack tensors")
        try:
            array = np.from_dlpack(source)
        except (TypeError, RuntimeError, BufferError) as exc:
            raise TritonModelException(f"unable to read DLPack tensor: {exc}") from exc
        if not array.flags.c_contiguous:
            raise TritonModelException("DLPack tensor must be contiguous in C order")
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={list(self._array.shape)}, dtype={self._array.dtype})"
