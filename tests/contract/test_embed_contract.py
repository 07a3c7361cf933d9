"""model_repository/embed/config.pbtxt declares exactly the tensors both sides of
the embed model write and read (kvserve.seam.embed_tensors names them once), and
its errors cross with their kind and field."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2, service_pb2

from kvserve.backend.embed.embed_codec import embed_tensors
from kvserve.backend.embed.embedder import EmbedderConfig
from kvserve.frontend.backend_client.embed_client import build_embed_request, classify_embed_error, parse_embed_response
from kvserve.frontend.backend_client.protocol import BackendRejected, EmbedRequest
from kvserve.seam import embed_tensors as T
from kvserve.seam.error_wire import ErrorKind, WireError
from tests.contract.import_graph import ROOT, imports_of

_NP_TO_TRITON = {np.dtype(np.int32): "TYPE_INT32", np.dtype(np.float32): "TYPE_FP32"}
_WIRE_TO_TRITON = {"INT32": "TYPE_INT32", "FP32": "TYPE_FP32", "BYTES": "TYPE_STRING"}


def _config() -> model_config_pb2.ModelConfig:
    text = (ROOT / "model_repository/embed/config.pbtxt").read_text(encoding="utf-8")
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _declared(kind: str) -> dict[str, str]:
    return {t.name: model_config_pb2.DataType.Name(t.data_type) for t in getattr(_config(), kind)}


class _Tensor:
    def __init__(self, name, array):
        self.name, self.array = name, np.asarray(array)


def test_config_declares_the_seam_tensors() -> None:
    assert sorted(_declared("input")) == sorted(T.INPUTS)
    assert sorted(_declared("output")) == sorted(T.OUTPUTS)
    assert _config().model_transaction_policy.decoupled  # the batching is the model's own


def test_the_backend_writes_every_declared_output_with_its_type() -> None:
    pb = type("pb", (), {"Tensor": _Tensor})
    written = embed_tensors(pb, np.zeros((2, 4), dtype=np.float32), [3, 5])
    declared = _declared("output")
    assert sorted(t.name for t in written) == sorted(declared)
    for tensor in written:
        assert _NP_TO_TRITON[tensor.array.dtype] == declared[tensor.name], tensor.name


@pytest.mark.parametrize("inputs", [["a", "b"], [[1, 2], [3]]], ids=["texts", "ids"])
def test_the_gateway_writes_declared_inputs_with_their_types(inputs) -> None:
    msg = build_embed_request("embed", EmbedRequest("r", inputs, {"normalize": False}))
    declared = _declared("input")
    for tensor in msg.inputs:
        assert tensor.name in declared and _WIRE_TO_TRITON[tensor.datatype] == declared[tensor.name], tensor.name


def test_the_gateway_reads_the_backend_s_outputs() -> None:
    resp = service_pb2.ModelInferResponse(model_name="embed", id="r")
    vectors = np.arange(8, dtype="<f4").reshape(2, 4)
    for name, array, wire in ((T.EMBEDDING, vectors, "FP32"), (T.PROMPT_TOKENS, np.array([3, 5], "<i4"), "INT32")):
        out = resp.outputs.add(name=name, datatype=wire)
        out.shape.extend(array.shape)
        resp.raw_output_contents.append(array.tobytes())
    result = parse_embed_response(resp)
    assert result.prompt_tokens == [3, 5] and result.vectors == [vectors[0].tobytes(), vectors[1].tobytes()]


def test_config_parameters_are_embedder_config_fields() -> None:
    assert set(_config().parameters) <= {f.name for f in dataclasses.fields(EmbedderConfig)}


@pytest.mark.parametrize("wire, param", [
    (WireError(ErrorKind.INVALID, "input_lengths: bad", T.INPUT_LENGTHS), "input"),
    (WireError(ErrorKind.INVALID, "text_input: bad", T.TEXT_INPUT), "input"),
    (WireError(ErrorKind.INVALID, "pooling_parameters: bad", T.POOLING_PARAMETERS), None),
    (WireError(ErrorKind.INVALID, "dimensions: no", "dimensions"), "dimensions"),
    (WireError(ErrorKind.CONTEXT_LENGTH, "input 0 has 600 tokens", "input"), "input"),
])
def test_errors_cross_with_kind_and_the_client_s_field(wire, param) -> None:
    error = classify_embed_error("wrapped by the server: " + wire.format())
    assert isinstance(error, BackendRejected) and error.kind is wire.kind and error.param == param


def test_embed_model_py_uses_only_what_tritonserver_provides() -> None:
    allowed = {"os", "triton_python_backend_utils"}
    bad = {m for m in imports_of(ROOT / "model_repository/embed/1/model.py")
           if m not in allowed and not m.startswith("kvserve.backend")}
    assert not bad, f"model.py imports {bad}"
