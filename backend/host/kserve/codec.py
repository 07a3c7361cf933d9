"""Tensors between KServe v2 protobuf messages and pb_utils.Tensor.

Inputs arrive either as `raw_input_contents` (one buffer per input, BYTES as
<uint32 LE length><bytes> elements) or as typed `contents`; outputs always go
out as `raw_output_contents`, the form tritonserver uses.
"""
from __future__ import annotations

import json
import math
import struct
from typing import Any, Sequence

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from ..infer_errors import InferError
from ..pb_utils.dtypes import WIRE_TO_NUMPY, serialize_byte_tensor, wire_dtype_of
from ..pb_utils.triton_errors import TritonError
from ..pb_utils.response import InferenceResponse
from ..pb_utils.tensor import Tensor

_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
    "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
    "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def _element_count(shape: Sequence[int]) -> int:
    return int(math.prod(shape)) if shape else 1


def _decode_one(tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None, rid: str) -> np.ndarray:
    dtype = tensor.datatype
    shape = [int(d) for d in tensor.shape]
    if any(d < 0 for d in shape):
        raise InferError(TritonError.INVALID_ARG, f"[request id: {rid}] input '{tensor.name}' has a negative dimension")
    count = _element_count(shape)
    if dtype not in WIRE_TO_NUMPY:
        raise InferError(TritonError.INVALID_ARG,
                         f"[request id: {rid}] input '{tensor.name}' has unsupported data-type '{dtype}'")
    if raw is not None:
        if dtype == "BYTES":
            # At least 4 bytes (a length) per element: a count the buffer cannot hold is refused
            # before reading it, and no more than `count` elements are ever read.
            if count * 4 > len(raw):
                raise InferError(TritonError.INVALID_ARG,
                                 f"[request id: {rid}] expected {count} string elements for inference input "
                                 f"'{tensor.name}', the buffer holds fewer")
            try:
                flat = _read_bytes_elements(raw, count)
            except ValueError as exc:
                raise InferError(TritonError.INVALID_ARG,
                                 f"[request id: {rid}] input '{tensor.name}': {exc}") from None
            return flat.reshape(shape)
        np_type = np.dtype(WIRE_TO_NUMPY[dtype])
        if len(raw) != count * np_type.itemsize:
            raise InferError(TritonError.INVALID_ARG,
                             f"[request id: {rid}] unexpected total byte size {len(raw)} for input "
                             f"'{tensor.name}', expecting {count * np_type.itemsize}")
        # A copy: models may modify inputs in place, which a buffer-backed view forbids.
        return np.frombuffer(raw, dtype=np_type).reshape(shape).copy()
    field = _CONTENTS_FIELD.get(dtype)
    repeated = getattr(tensor.contents, field) if field else ()
    if len(repeated) != count:  # counted before anything is copied out of the message
        raise InferError(TritonError.INVALID_ARG,
                         f"[request id: {rid}] unexpected number of elements {len(repeated)} in contents of input "
                         f"'{tensor.name}', expecting {count}")
    values = list(repeated)
    if dtype == "BYTES":
        out = np.empty(count, dtype=np.object_)
        out[:] = [bytes(v) for v in values]
        return out.reshape(shape)
    return np.array(values, dtype=WIRE_TO_NUMPY[dtype]).reshape(shape)


def _read_bytes_elements(raw: bytes, count: int) -> np.ndarray:
    """`count` <uint32 LE length><bytes> elements that fill `raw` exactly."""
    view = memoryview(raw)
    out = np.empty(count, dtype=np.object_)
    offset, unpack = 0, struct.Struct("<I").unpack_from
    for i in range(count):
        if offset + 4 > len(view):
            raise ValueError("truncated BYTES element length prefix")
        (length,) = unpack(view, offset)
        offset += 4
        if offset + length > len(view):
            raise ValueError("BYTES element runs past the end of the buffer")
        out[i] = bytes(view[offset:offset + length])
        offset += length
    if offset != len(view):
        raise ValueError(f"more data than its {count} BYTES elements")
    return out


def decode_inputs(request: pb.ModelInferRequest, rid: str) -> list[Tensor]:
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InferError(TritonError.INVALID_ARG,
                         f"[request id: {rid}] expected {len(request.inputs)} raw input contents, got {len(raw)}")
    tensors = []
    for index, tensor in enumerate(request.inputs):
        if raw and tensor.HasField("contents"):
            raise InferError(TritonError.INVALID_ARG,
                             f"[request id: {rid}] contents field must not be specified when using "
                             f"raw_input_contents for '{tensor.name}' for model '{request.model_name}'")
        tensors.append(Tensor(tensor.name, _decode_one(tensor, raw[index] if raw else None, rid)))
    return tensors


def _set_parameter(param: pb.InferParameter, value: Any) -> None:
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    else:
        param.string_param = str(value)


# A streamed request sends the same output tensors with the same shapes for every
# token. Building each output's name/datatype/shape in protobuf costs ~1.7 us per
# tensor; copying a cached message that already has them costs ~0.3 us.
_HEADER_CACHE: dict[tuple[Any, ...], pb.ModelInferResponse] = {}
_HEADER_CACHE_MAX = 512


def response_header(key: tuple[Any, ...]) -> pb.ModelInferResponse:
    """A response with model name/version and the output specs of `key`, no data."""
    header = _HEADER_CACHE.get(key)
    if header is None:
        model_name, model_version, specs = key
        header = pb.ModelInferResponse(model_name=model_name, model_version=model_version)
        for name, datatype, shape in specs:
            header.outputs.add(name=name, datatype=datatype, shape=shape)
        if len(_HEADER_CACHE) >= _HEADER_CACHE_MAX:  # many distinct shapes: start over rather than grow
            _HEADER_CACHE.clear()
        _HEADER_CACHE[key] = header
    return header


def output_payloads(response: InferenceResponse, requested_outputs: frozenset[str] | None):
    """Each requested output tensor as (name, wire dtype, shape, raw bytes), in the response's order:
    what both the message path and the streamed wire path (stream_wire.py) put on the wire."""
    for tensor in response.output_tensors():
        name = tensor.name()
        if requested_outputs is not None and name not in requested_outputs:
            continue
        array = tensor.as_numpy()
        dtype = wire_dtype_of(array)
        if dtype == "BYTES":
            data = serialize_byte_tensor(array)
            data = data if isinstance(data, bytes) else b""
        else:
            data = array.tobytes(order="C")
        yield name, dtype, array.shape, data


def encode_response(
    response: InferenceResponse, *, model_name: str, model_version: str, request_id: str,
    requested_outputs: frozenset[str] | None,
) -> pb.ModelInferResponse:
    """Serialise now: like Triton's send, later edits to the arrays are not seen."""
    specs, payloads = [], []
    for name, dtype, shape, data in output_payloads(response, requested_outputs):
        specs.append((name, dtype, shape))
        payloads.append(data)
    out = pb.ModelInferResponse()
    out.CopyFrom(response_header((model_name, model_version, tuple(specs))))
    out.id = request_id
    out.raw_output_contents.extend(payloads)
    parameters = response.parameters()
    if parameters != "{}":  # the usual case, once per streamed token: skip the JSON parse
        for key, value in json.loads(parameters).items():
            _set_parameter(out.parameters[key], value)
    return out


def parameter_value(param: pb.InferParameter) -> Any:
    which = param.WhichOneof("parameter_choice")
    return getattr(param, which) if which else None
