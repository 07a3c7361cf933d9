"""A ModelInferRequest checked against the model config, as tritonserver checks it.

Reserved request parameters (sequence_*, priority, timeout, triton_*) are taken
out here; every other parameter is passed to the model through
`request.parameters()`.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from .codec import decode_inputs, parameter_value
from ..infer_errors import InferError
from ..pb_utils.dtypes import CONFIG_TO_WIRE
from ..pb_utils.triton_errors import TritonError
from ..pb_utils.inference_request import (TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
                                          TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
from ..pb_utils.tensor import Tensor

_LOG = logging.getLogger("kvserve.host")
EMPTY_FINAL_PARAM = "triton_enable_empty_final_response"
_IGNORED_RESERVED = frozenset({"priority", "headers", "binary_data_output"})


@dataclass(slots=True)
class ParsedRequest:
    request_id: str
    inputs: list[Tensor]
    requested_output_names: list[str]
    requested_filter: frozenset[str] | None  # None: the client asked for every output
    parameters: dict[str, Any] = field(default_factory=dict)
    correlation_id: int | str = 0
    flags: int = 0
    timeout: int = 0
    enable_empty_final_response: bool = False


def log_id(request: pb.ModelInferRequest) -> str:
    return request.id or "<id_unknown>"


def _parse_parameters(request: pb.ModelInferRequest, parsed: ParsedRequest, rid: str) -> None:
    for key, param in request.parameters.items():
        value = parameter_value(param)
        if key == "sequence_id":
            parsed.correlation_id = value if isinstance(value, (int, str)) else 0
        elif key == "sequence_start":
            parsed.flags |= TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if value else 0
        elif key == "sequence_end":
            parsed.flags |= TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if value else 0
        elif key == "timeout":
            # As tritonserver: an int64 of microseconds; the message never repeats the value.
            if param.WhichOneof("parameter_choice") != "int64_param" or value < 0:
                raise InferError(TritonError.INVALID_ARG,
                                 f"invalid value for '{key}' parameter, expected a non-negative int64_param.")
            parsed.timeout = value
        elif key == EMPTY_FINAL_PARAM:
            if param.WhichOneof("parameter_choice") != "bool_param":
                raise InferError(TritonError.INVALID_ARG,
                                 f"invalid value type for '{key}' parameter, expected bool_param.")
            parsed.enable_empty_final_response = bool(value)
        elif key in _IGNORED_RESERVED:
            continue
        elif key.startswith("triton_"):
            raise InferError(TritonError.INVALID_ARG,
                             f"[request id: {rid}] parameter '{key}' is reserved for Triton usage")
        else:
            parsed.parameters[key] = value


def _shape_ok(expected: list[int], got: list[int]) -> bool:
    return len(expected) == len(got) and all(e == -1 or e == g for e, g in zip(expected, got))


def _validate_inputs(config: mc.ModelConfig, tensors: Sequence[pb.ModelInferRequest.InferInputTensor],
                     rid: str) -> None:
    model = config.name
    specs = {i.name: i for i in config.input}
    seen: set[str] = set()
    for tensor in tensors:
        if tensor.name in seen:
            raise InferError(TritonError.INVALID_ARG,
                             f"[request id: {rid}] input '{tensor.name}' already exists in request")
        seen.add(tensor.name)
        spec = specs.get(tensor.name)
        if spec is None:
            raise InferError(TritonError.INVALID_ARG,
                             f"[request id: {rid}] unexpected inference input '{tensor.name}' for model '{model}'")
        expected_type = CONFIG_TO_WIRE.get(mc.DataType.Name(spec.data_type), "INVALID")
        if tensor.datatype != expected_type:
            raise InferError(TritonError.INVALID_ARG,
                             f"[request id: {rid}] inference input '{tensor.name}' data-type is "
                             f"'{tensor.datatype}', but model '{model}' expects '{expected_type}'")
        shape, dims = [int(d) for d in tensor.shape], [int(d) for d in spec.dims]
        if config.max_batch_size > 0:
            if not shape:
                raise InferError(TritonError.INVALID_ARG,
                                 f"[request id: {rid}] input '{tensor.name}' has no batch dimension")
            if shape[0] > config.max_batch_size:
                raise InferError(TritonError.INVALID_ARG,
                                 f"[request id: {rid}] inference request batch-size must be <= "
                                 f"{config.max_batch_size} for '{model}'")
            shape = shape[1:]
        reshaped = spec.HasField("reshape") and _shape_ok([int(d) for d in spec.reshape.shape], shape)
        if not _shape_ok(dims, shape) and not reshaped:
            raise InferError(TritonError.INVALID_ARG,
                             f"[request id: {rid}] unexpected shape for input '{tensor.name}' for model "
                             f"'{model}'. Expected {dims}, got {shape}")
    given = [t.name for t in tensors]
    missing = [i.name for i in config.input if not i.optional and i.name not in given]
    if missing:
        required = sum(1 for i in config.input if not i.optional)
        raise InferError(TritonError.INVALID_ARG,
                         f"[request id: {rid}] expected {required} inputs but got {len(given)} inputs for model "
                         f"'{model}'. Got input(s) {given}, but missing required input(s) {missing}. "
                         "Please provide all required input(s).")


def parse_request(request: pb.ModelInferRequest, config: mc.ModelConfig) -> ParsedRequest:
    rid = log_id(request)
    _validate_inputs(config, request.inputs, rid)
    inputs = decode_inputs(request, rid)
    outputs = [o.name for o in config.output]
    requested = [o.name for o in request.outputs]
    for name in requested:
        if name not in outputs:
            raise InferError(TritonError.INVALID_ARG,
                             f"[request id: {rid}] unexpected inference output '{name}' for model '{config.name}'")
    parsed = ParsedRequest(
        request_id=request.id,
        inputs=inputs,
        requested_output_names=requested or outputs,
        requested_filter=frozenset(requested) if requested else None,
    )
    _parse_parameters(request, parsed, rid)
    return parsed


async def parse_request_async(request: pb.ModelInferRequest, config: mc.ModelConfig) -> ParsedRequest:
    """parse_request off the event loop: turning MiB of BYTES elements into Python objects
    takes seconds, during which health checks and every other stream would stand still.
    Any failure is an InferError: a host bug reading a request costs that request an
    INTERNAL naming only the exception's type, never a message repeating its bytes."""
    try:
        # Always on a worker thread: how big a request is cannot be learnt on the loop for
        # free (ByteSize() serialises the message, reading raw_input_contents copies every
        # buffer: each ~100 ms for 16 MiB), and the hop costs tens of microseconds.
        return await asyncio.to_thread(parse_request, request, config)
    except InferError:
        raise
    except RecursionError:
        raise InferError(TritonError.INVALID_ARG, f"[request id: {log_id(request)}] request nested too deeply") from None
    except Exception as exc:
        _LOG.error("failed to read a request (%s)", type(exc).__name__)
        _LOG.debug("request parse failure", exc_info=True)
        raise InferError(TritonError.INTERNAL,
                         f"[request id: {log_id(request)}] failed to read the request ({type(exc).__name__})") from None
