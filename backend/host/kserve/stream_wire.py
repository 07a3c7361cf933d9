"""A streamed response as the bytes gRPC sends, built on the model's sending thread.

The host's event loop is the thread every stream, health check and request of
the process shares; in the engine's process it also takes the GIL from the
engine thread. So a ModelStreamInfer response is finished where the model sends
it (its respond thread): the loop only writes bytes (the method's serializer
passes bytes through, raw_requests.py).

Protobuf parses concatenated messages as one merged message, and repeated fields
append. So the wire form is two parts:

    ModelStreamInferResponse{infer_response: header}   model name/version, the output
                                                       specs: serialised once per layout
  + ModelStreamInferResponse{infer_response: {id, parameters[final], raw_output_contents}}

The second part's framing (tag, length) is written here, the only hand-made
protobuf in the host; its field numbers come from the generated descriptors,
and tests/backend/host/test_stream_wire.py parses the bytes back against the
message the slow path builds.
"""
from __future__ import annotations

from typing import Any

from tritonclient.grpc import service_pb2 as pb

from ..pb_utils.response import InferenceResponse
from .codec import encode_response, output_payloads, response_header

FINAL_PARAM = "triton_final_response"
_LEN = 2  # wire type of strings, bytes and messages


def _tag(message: Any, field: str) -> bytes:
    return _varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | _LEN)


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes((n,)) for n in range(0x80)]
_INFER_RESPONSE = _tag(pb.ModelStreamInferResponse, "infer_response")
_ID = _tag(pb.ModelInferResponse, "id")
_RAW = _tag(pb.ModelInferResponse, "raw_output_contents")


def _final_parameter(final: bool) -> bytes:
    message = pb.ModelInferResponse()
    message.parameters[FINAL_PARAM].bool_param = final
    return message.SerializeToString()


_FINAL = {False: _final_parameter(False), True: _final_parameter(True)}
_HEADERS: dict[tuple[Any, ...], bytes] = {}
_HEADERS_MAX = 512


def _header(key: tuple[Any, ...]) -> bytes:
    wire = _HEADERS.get(key)
    if wire is None:
        wire = pb.ModelStreamInferResponse(infer_response=response_header(key)).SerializeToString()
        if len(_HEADERS) >= _HEADERS_MAX:  # many distinct shapes: start over rather than grow
            _HEADERS.clear()
        _HEADERS[key] = wire
    return wire


def id_field(request_id: str) -> bytes:
    """The response's `id` field, once per request."""
    data = request_id.encode("utf-8")
    return _ID + _varint(len(data)) + data


def encode_stream_response(response: InferenceResponse, *, model_name: str, model_version: str, request_id: str,
                           id_wire: bytes, requested_outputs: frozenset[str] | None, final: bool) -> bytes:
    """What codec.encode_response, the stream's FINAL parameter and SerializeToString give, without
    building the messages. `id_wire` is id_field(request_id). Raises TypeError or ValueError for
    tensors encode_response refuses."""
    if response.parameters() != "{}":  # parameters to carry: the general path (no llm response has them)
        message = encode_response(response, model_name=model_name, model_version=model_version,
                                  request_id=request_id, requested_outputs=requested_outputs)
        message.parameters[FINAL_PARAM].bool_param = final
        return pb.ModelStreamInferResponse(infer_response=message).SerializeToString()
    specs, parts = [], [id_wire, _FINAL[final]]
    for name, dtype, shape, data in output_payloads(response, requested_outputs):
        specs.append((name, dtype, shape))
        parts.append(_RAW + _varint(len(data)) + data)
    body = b"".join(parts)
    return _header((model_name, model_version, tuple(specs))) + _INFER_RESPONSE + _varint(len(body)) + body
