"""Turns a GenerateRequest into a KServe v2 `ModelInferRequest` and the llm
model's responses back into `ChoiceDelta`s. Pure functions over protobufs, so
they are unit-tested without a server.

The tensor names and the error format are kvserve.seam's (config.pbtxt
declares the same tensors; tests/contract checks both).
"""
from __future__ import annotations

import json
import struct
from typing import Any

from tritonclient.grpc import service_pb2

from kvserve.frontend.backend_client.protocol import (
    BackendError,
    BackendFailed,
    BackendRejected,
    ChoiceDelta,
    GenerateRequest,
    LoRAAdapterInfo,
    ModelFacts,
    TokenLogprob,
    TopLogprob,
)
from kvserve.seam import tensors as T
from kvserve.seam.error_wire import ErrorKind, WireError

FINAL_PARAM = "triton_final_response"
EMPTY_FINAL_PARAM = "triton_enable_empty_final_response"


def _bytes_tensor(values: list[bytes]) -> bytes:
    # KServe BYTES raw layout: each element is a little-endian uint32 length + the bytes.
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def build_request(model_name: str, req: GenerateRequest) -> service_pb2.ModelInferRequest:
    msg = service_pb2.ModelInferRequest(model_name=model_name, id=req.request_id)
    if isinstance(req.prompt, str):
        _add_input(msg, T.TEXT_INPUT, "BYTES", [1], _bytes_tensor([req.prompt.encode("utf-8")]))
    else:
        ids = req.prompt
        _add_input(msg, T.INPUT_IDS, "INT32", [len(ids)], struct.pack(f"<{len(ids)}i", *ids))
    sampling = json.dumps(req.sampling, separators=(",", ":")).encode("utf-8")
    _add_input(msg, T.SAMPLING_PARAMETERS, "BYTES", [1], _bytes_tensor([sampling]))
    _add_input(msg, T.STREAM, "BOOL", [1], b"\x01" if req.stream else b"\x00")
    # Without this, a model that ends a request with a flags-only FINAL response
    # (no tensors) would leave the client waiting for an end it never sees.
    msg.parameters[EMPTY_FINAL_PARAM].bool_param = True
    if req.traceparent:
        msg.parameters[T.TRACEPARENT_PARAM].string_param = req.traceparent
    if req.lora_name is not None:
        msg.parameters[T.LORA_NAME_PARAM].string_param = req.lora_name
    return msg


def build_describe_request(model_name: str) -> service_pb2.ModelInferRequest:
    """Ask the model what it serves (seam.tensors.DESCRIBE_PARAM): no inputs, one FINAL answer."""
    msg = service_pb2.ModelInferRequest(model_name=model_name, id="kvserve-describe")
    msg.parameters[T.DESCRIBE_PARAM].bool_param = True
    msg.parameters[EMPTY_FINAL_PARAM].bool_param = True
    return msg


def build_lora_control_request(model_name: str, action: str, lora_name: str | None = None,
                               lora_path: str | None = None) -> service_pb2.ModelInferRequest:
    """List, load or unload LoRA adapters (seam.tensors.LORA_CONTROL_PARAM): no inputs, one FINAL answer."""
    order: dict[str, str] = {"action": action}
    if lora_name is not None:
        order["lora_name"] = lora_name
    if lora_path is not None:
        order["lora_path"] = lora_path
    msg = service_pb2.ModelInferRequest(model_name=model_name, id=f"kvserve-lora-{action}")
    msg.parameters[T.LORA_CONTROL_PARAM].string_param = json.dumps(order)
    msg.parameters[EMPTY_FINAL_PARAM].bool_param = True
    return msg


def build_engine_control_request(model_name: str, action: str) -> service_pb2.ModelInferRequest:
    """Act on the engine (seam.tensors.ENGINE_CONTROL_PARAM): no inputs, one FINAL answer."""
    msg = service_pb2.ModelInferRequest(model_name=model_name, id=f"kvserve-engine-{action}")
    msg.parameters[T.ENGINE_CONTROL_PARAM].string_param = action
    msg.parameters[EMPTY_FINAL_PARAM].bool_param = True
    return msg


def parse_engine_answer(resp: service_pb2.ModelInferResponse) -> dict[str, Any] | None:
    """An engine control answer ({"action", "forgotten_blocks"}); None when the answer is not one."""
    answer = _json_answer(resp)
    if not isinstance(answer, dict) or not isinstance(answer.get("action"), str):
        return None
    return answer


def _json_answer(resp: service_pb2.ModelInferResponse) -> Any:
    if not resp.outputs:
        return None
    try:
        return json.loads(_ResponseTensors(resp).first_str(T.TEXT_OUTPUT))
    except (ValueError, KeyError, IndexError, struct.error):
        return None


def parse_lora_listing(resp: service_pb2.ModelInferResponse) -> list[LoRAAdapterInfo] | None:
    """A LoRA control answer: the adapters served; None when the answer is not one."""
    answer = _json_answer(resp)
    if not isinstance(answer, dict) or not isinstance(answer.get("adapters"), list):
        return None
    adapters = []
    for item in answer["adapters"]:
        if isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("path"), str):
            parent = item.get("parent")
            adapters.append(LoRAAdapterInfo(item["name"], item["path"], parent if isinstance(parent, str) else None))
    return adapters


def parse_model_facts(resp: service_pb2.ModelInferResponse) -> ModelFacts | None:
    """The describe answer; None when it is not one (a model that predates it answers otherwise)."""
    facts = _json_answer(resp)
    if not isinstance(facts, dict):
        return None
    length, name, lora = facts.get("max_model_len"), facts.get("served_model_name"), facts.get("enable_lora")
    if not (isinstance(length, int) and not isinstance(length, bool) and length > 0):
        length = None
    if not (isinstance(name, str) and 0 < len(name) <= 256):
        name = None
    return ModelFacts(length, name, lora if isinstance(lora, bool) else None)


def _add_input(msg: service_pb2.ModelInferRequest, name: str, dtype: str, shape: list[int], raw: bytes) -> None:
    tensor = msg.inputs.add()
    tensor.name = name
    tensor.datatype = dtype
    tensor.shape.extend(shape)
    msg.raw_input_contents.append(raw)


def is_final(resp: service_pb2.ModelInferResponse) -> bool:
    return FINAL_PARAM in resp.parameters and resp.parameters[FINAL_PARAM].bool_param


def parse_response(resp: service_pb2.ModelInferResponse) -> ChoiceDelta | None:
    """One model response -> one choice's delta; None for an empty (flags-only) response."""
    if not resp.outputs:
        return None
    result = _ResponseTensors(resp)
    finish = result.first_str(T.FINISH_REASON)
    delta = ChoiceDelta(
        index=result.first_int(T.INDEX),
        text=result.first_str(T.TEXT_OUTPUT),
        token_ids=result.ints(T.OUTPUT_IDS),
        finish_reason=finish or None,
        prompt_tokens=result.first_int(T.PROMPT_TOKENS),
        completion_tokens=result.first_int(T.COMPLETION_TOKENS),
        cached_tokens=result.first_int(T.CACHED_TOKENS),
    )
    if result.has(T.LOGPROB_IDS):
        delta.logprobs = result.logprobs(T.LOGPROB_IDS, T.LOGPROB_VALUES)
    if result.has(T.PROMPT_LOGPROB_IDS):
        delta.prompt_logprobs = _prompt_logprobs(result)
    return delta


def _prompt_logprobs(result: "_ResponseTensors") -> list[TokenLogprob]:
    entries = result.logprobs(T.PROMPT_LOGPROB_IDS, T.PROMPT_LOGPROB_VALUES)
    ranks = result.ints(T.PROMPT_LOGPROB_RANKS)
    if len(ranks) != len(entries):
        raise BackendFailed("backend prompt logprobs tensors disagree in shape")
    # The first prompt token has no logprob (NaN on the wire) and no rank.
    return [TokenLogprob(e.token_id, None if i == 0 else e.logprob, e.top_logprobs if i else [], rank or None)
            for i, (e, rank) in enumerate(zip(entries, ranks))]


# Raw little-endian layouts of the fixed-size types, and where each type's typed `contents` live.
_STRUCT_CODES = {"BOOL": "?", "INT8": "b", "INT16": "h", "INT32": "i", "INT64": "q", "UINT8": "B", "UINT16": "H",
                 "UINT32": "I", "UINT64": "Q", "FP32": "f", "FP64": "d"}
_CONTENTS_FIELDS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
                    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
                    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
                    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}


# One element of each fixed-size type, and a BYTES element's length prefix: the scalars of a
# response are read without building a list.
_FIRST = {dtype: struct.Struct("<" + code) for dtype, code in _STRUCT_CODES.items()}
_LENGTH = struct.Struct("<I")
_INT_TYPES = frozenset(("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"))


class _ResponseTensors:
    """The named outputs of one response as flat lists, read with `struct` from
    `raw_output_contents` (what tritonserver and the embedded host send) or from
    typed `contents` (another KServe server). This runs once per streamed token:
    tritonclient's InferResult builds a numpy array per lookup, which cost more
    than the rest of the gateway's per-token work (and fails on typed contents
    under numpy 2). The outputs are walked once, here: each access to a
    protobuf field builds a wrapper object, and seven lookups by name cost
    more than the unpacking."""

    __slots__ = ("_raw", "_typed", "_outputs")

    def __init__(self, resp: service_pb2.ModelInferResponse) -> None:
        outputs = resp.outputs
        raw = resp.raw_output_contents
        self._outputs = outputs
        self._raw: dict[str, tuple[str, bytes]] = {}
        self._typed: dict[str, Any] = {}
        if len(raw) == len(outputs):
            self._raw = {out.name: (out.datatype, data) for out, data in zip(outputs, raw)}
        else:
            self._typed = {out.name: out for out in outputs}

    def has(self, name: str) -> bool:
        return name in self._raw or name in self._typed

    def logprobs(self, ids_name: str, values_name: str) -> list[TokenLogprob]:
        """[tokens, 1 + k] ids and logprobs -> one entry per token: the token, then its top k."""
        shape = next((list(out.shape) for out in self._outputs if out.name == ids_name), [])
        ids, values = self.ints(ids_name), self.values(values_name)
        width = shape[1] if len(shape) == 2 else 1
        if width < 1 or len(ids) != len(values) or len(ids) % width:
            raise BackendFailed("backend logprobs tensors disagree in shape")
        entries = []
        for row in range(0, len(ids), width):
            top = [TopLogprob(ids[i], float(values[i])) for i in range(row + 1, row + width) if ids[i] >= 0]
            entries.append(TokenLogprob(ids[row], float(values[row]), top))
        return entries

    def _named(self, name: str) -> tuple[str, bytes] | None:
        """Every read of an output starts here (tests/contract checks which names are read)."""
        return self._raw.get(name)

    def values(self, name: str) -> list[Any]:
        found = self._named(name)
        if found is None:
            out = self._typed.get(name)
            if out is None:
                return []
            field = _CONTENTS_FIELDS.get(out.datatype)
            return list(getattr(out.contents, field)) if field else []
        datatype, data = found
        if datatype == "BYTES":
            return _split_bytes(data)
        code = _STRUCT_CODES.get(datatype)
        if code is None:
            raise BackendFailed(f"backend output {name!r} has unsupported data type {datatype}")
        return list(struct.unpack(f"<{len(data) // struct.calcsize(code)}{code}", data))

    def first_str(self, name: str) -> str:
        found = self._named(name)
        if found is not None and found[0] == "BYTES":  # the usual case: one element, read in place
            data = found[1]
            if len(data) < 4:
                return ""
            (length,) = _LENGTH.unpack_from(data)
            return data[4:4 + length].decode("utf-8", errors="replace")
        values = self.values(name)
        if not values:
            return ""
        value = values[0]
        return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)

    def first_int(self, name: str) -> int:
        found = self._named(name)
        if found is not None:  # the usual case: unpack the first element only
            one = _FIRST.get(found[0])
            if one is not None and len(found[1]) >= one.size:
                return int(one.unpack_from(found[1])[0])
        values = self.values(name)
        return int(values[0]) if values else 0

    def ints(self, name: str) -> list[int]:
        found = self._named(name)
        if found is not None and found[0] in _INT_TYPES:  # struct gives ints already
            return self.values(name)
        return [int(v) for v in self.values(name)]


def _split_bytes(data: bytes) -> list[bytes]:
    """KServe raw BYTES: <uint32 LE length><bytes> per element."""
    items, offset = [], 0
    while offset + 4 <= len(data):
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        items.append(data[offset:offset + length])
        offset += length
    return items


def classify_error(message: str) -> BackendError:
    """A backend's error message -> the gateway's error: the engine's own errors
    carry their kind and field (kvserve.seam.error_wire); anything else came from
    the server itself and is a failure."""
    error = WireError.parse(message)
    if error is None or error.kind is ErrorKind.INTERNAL:
        return BackendFailed(message if error is None else error.message)
    return BackendRejected(error.message, kind=error.kind, param=error.param)
