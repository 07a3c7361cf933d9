"""config.pbtxt declares exactly the tensors both codecs write and read, with the
types they write (kvserve.seam.tensors names them once)."""
from __future__ import annotations

import types

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2, service_pb2

from kvserve.backend.engine.config import EngineConfig
from kvserve.backend.engine.outputs import CompletionOutput, TokenLogprob
from kvserve.backend.triton import model_tensors as backend_codec
from kvserve.frontend.backend_client import grpc_codec as gateway_codec
from kvserve.frontend.backend_client.protocol import GenerateRequest
from kvserve.seam import tensors as T
from tests.contract.import_graph import ROOT

_NP_TO_TRITON = {np.dtype(np.int32): "TYPE_INT32", np.dtype(np.float32): "TYPE_FP32",
                 np.dtype(np.bool_): "TYPE_BOOL", np.dtype(np.object_): "TYPE_STRING"}
_WIRE_TO_TRITON = {"INT32": "TYPE_INT32", "FP32": "TYPE_FP32", "BOOL": "TYPE_BOOL", "BYTES": "TYPE_STRING"}


def _config() -> model_config_pb2.ModelConfig:
    text = (ROOT / "model_repository/llm/config.pbtxt").read_text(encoding="utf-8")
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _declared(kind: str) -> dict[str, str]:
    return {t.name: model_config_pb2.DataType.Name(t.data_type) for t in getattr(_config(), kind)}


class _Tensor:
    def __init__(self, name, array):
        self.name, self.array = name, np.asarray(array)

    def as_numpy(self):
        return self.array


def _fake_pb_utils(inputs: dict[str, np.ndarray] | None = None, asked: list[str] | None = None):
    def get_input_tensor_by_name(request, name):
        if asked is not None:
            asked.append(name)
        value = (inputs or {}).get(name)
        return None if value is None else _Tensor(name, value)
    return types.SimpleNamespace(Tensor=_Tensor, get_input_tensor_by_name=get_input_tensor_by_name)


def test_config_declares_the_seam_tensors() -> None:
    assert sorted(_declared("input")) == sorted(T.INPUTS)
    assert sorted(_declared("output")) == sorted(T.OUTPUTS)


def test_the_backend_writes_every_declared_output_with_its_type() -> None:
    choice = CompletionOutput(0, "hi", [5, 6], "stop", logprobs=[TokenLogprob(5, -0.5, [(7, -1.0)])])
    written = backend_codec.choice_tensors(_fake_pb_utils(), choice, backend_codec.ChoiceTotals(2), 3, 0, logprobs=1)
    written += backend_codec.prompt_logprob_tensors(_fake_pb_utils(), [3, 4], [None, TokenLogprob(4, -2.0, [(9, -1.5)])],
                                                    1)
    declared = _declared("output")
    assert sorted(t.name for t in written) == sorted(declared)
    for tensor in written:
        assert _NP_TO_TRITON[tensor.array.dtype] == declared[tensor.name], tensor.name


def test_the_backend_reads_exactly_the_declared_inputs() -> None:
    asked: list[str] = []
    request = types.SimpleNamespace(parameters=lambda: "{}")
    pb = _fake_pb_utils({T.TEXT_INPUT: np.array([b"hi"], dtype=np.object_)}, asked)
    backend_codec.parse_request(pb, request)
    pb = _fake_pb_utils({T.INPUT_IDS: np.array([1, 2], dtype=np.int32)}, asked)
    backend_codec.parse_request(pb, request)
    assert set(asked) == set(_declared("input"))


@pytest.mark.parametrize("prompt", ["hi", [1, 2, 3]], ids=["text", "ids"])
def test_the_gateway_writes_declared_inputs_with_their_types(prompt) -> None:
    msg = gateway_codec.build_request("llm", GenerateRequest("r", prompt, {"n": 1}))
    declared = _declared("input")
    for tensor in msg.inputs:
        assert tensor.name in declared and _WIRE_TO_TRITON[tensor.datatype] == declared[tensor.name], tensor.name
    assert {T.SAMPLING_PARAMETERS, T.STREAM} <= {t.name for t in msg.inputs}


def test_the_gateway_reads_exactly_the_declared_outputs(monkeypatch) -> None:
    asked: list[str] = []
    original = gateway_codec._ResponseTensors._named  # every read of an output goes through it

    def named(self, name):
        asked.append(name)
        return original(self, name)

    monkeypatch.setattr(gateway_codec._ResponseTensors, "_named", named)
    resp = service_pb2.ModelInferResponse(model_name="llm", id="r")
    for name, wire in _declared("output").items():
        out = resp.outputs.add(name=name, datatype={v: k for k, v in _WIRE_TO_TRITON.items()}[wire])
        out.shape.extend([0, 1] if name in (T.LOGPROB_IDS, T.LOGPROB_VALUES, T.PROMPT_LOGPROB_IDS,
                                            T.PROMPT_LOGPROB_VALUES) else [0])
        resp.raw_output_contents.append(b"")
    gateway_codec.parse_response(resp)
    assert set(asked) == set(_declared("output"))


def test_config_parameters_are_engine_config_fields() -> None:
    """A misspelt engine argument in config.pbtxt would be dropped without a word (the Triton
    model's own LoRA parameters are read by backend/triton/lora_adapters.py)."""
    from kvserve.backend.triton.lora_adapters import MODEL_PARAMETERS

    assert not set(MODEL_PARAMETERS) & set(EngineConfig.field_names())
    assert set(_config().parameters) <= set(EngineConfig.field_names()) | set(MODEL_PARAMETERS)


def test_logprobs_cross_as_numbers_and_come_back_whole() -> None:
    """The backend's [tokens, 1 + k] arrays, serialised by the embedded host, read back as the same entries."""
    from kvserve.backend.host.kserve.codec import encode_response
    from kvserve.backend.host.pb_utils import InferenceResponse, Tensor

    entries = [TokenLogprob(5, -0.5, [(7, -1.25), (5, -0.5)]), TokenLogprob(9, -2.0, [(1, -0.75), (9, -2.0)])]
    choice = CompletionOutput(0, "hi", [5, 9], None, logprobs=entries)
    pb = types.SimpleNamespace(Tensor=Tensor)
    tensors = backend_codec.choice_tensors(pb, choice, backend_codec.ChoiceTotals(2), 3, 0, logprobs=2)
    resp = encode_response(InferenceResponse(output_tensors=tensors), model_name="llm", model_version="1",
                           request_id="r", requested_outputs=None)
    delta = gateway_codec.parse_response(resp)
    got = [(e.token_id, e.logprob, [(t.token_id, t.logprob) for t in e.top_logprobs]) for e in delta.logprobs]
    assert got == [(e.token_id, e.logprob, e.top) for e in entries]


def test_a_describe_request_is_recognised_and_its_answer_read_back() -> None:
    """The gateway's describe request is one the backend recognises (by its parameter), and
    the backend's answer, serialised by the embedded host, reads back as the same facts."""
    import json

    from kvserve.backend.host.kserve.codec import encode_response
    from kvserve.backend.host.pb_utils import InferenceResponse, Tensor

    msg = gateway_codec.build_describe_request("llm")
    params = {k: v.bool_param for k, v in msg.parameters.items()}
    request = types.SimpleNamespace(parameters=lambda: json.dumps(params))
    assert backend_codec.is_describe_request(request) and not msg.inputs
    prompt = types.SimpleNamespace(parameters=lambda: json.dumps({T.TRACEPARENT_PARAM: "00-x"}))
    assert not backend_codec.is_describe_request(prompt)
    facts = {"max_model_len": 4096, "served_model_name": "m", "enable_lora": True}
    tensors = backend_codec.describe_tensors(types.SimpleNamespace(Tensor=Tensor), facts)
    resp = encode_response(InferenceResponse(output_tensors=tensors), model_name="llm", model_version="1",
                           request_id="r", requested_outputs=None)
    got = gateway_codec.parse_model_facts(resp)
    assert (got.max_model_len, got.served_model_name, got.enable_lora) == (4096, "m", True)
