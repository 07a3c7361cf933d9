"""LoRA across the seam: the adapter name the gateway sends is the one the Triton model reads,
the gateway's control requests are the ones the model recognises, and the model's answers (and
refusals) read back on the gateway as the same adapters (and kinds); names written once in
kvserve.seam.tensors."""
from __future__ import annotations

import json
import types

import pytest

from kvserve.backend.host.kserve.codec import encode_response
from kvserve.backend.host.pb_utils import InferenceResponse, Tensor
from kvserve.backend.lora import LoRAError, LoRARequest
from kvserve.backend.triton import model_tensors as backend_codec
from kvserve.backend.triton.lora_adapters import (LoRAAdapters, LoRAModule, LoRASettings, listing_text,
                                                  lora_control_text)
from kvserve.frontend.backend_client import grpc_codec as gateway_codec
from kvserve.frontend.backend_client.protocol import GenerateRequest
from kvserve.seam import tensors as T
from kvserve.seam.error_wire import ErrorKind, RequestError
from seam_requests import as_backend_request



class _Engine:
    """The engine's adapter API (AsyncEngine's names), in memory."""

    def __init__(self) -> None:
        self.loras: dict[str, LoRARequest] = {}

    def add_lora(self, lora: LoRARequest) -> None:
        if "bad" in lora.lora_path:
            raise LoRAError(f"{lora.lora_path}/adapter_model.safetensors: rank 64 exceeds max_lora_rank 16")
        self.loras[lora.lora_name] = lora

    def remove_lora(self, name: str) -> None:
        if self.loras.pop(name, None) is None:
            raise LoRAError(f"adapter {name!r} is not loaded", not_found=True)

    def list_loras(self) -> list[LoRARequest]:
        return list(self.loras.values())

    def resolve_lora(self, name: str) -> LoRARequest:
        if name not in self.loras:
            raise LoRAError(f"adapter {name!r} is not loaded", not_found=True)
        return self.loras[name]


def _adapters(allow: bool = True) -> LoRAAdapters:
    settings = LoRASettings((LoRAModule("sql", "/a/sql", "base"),), allow)
    adapters = LoRAAdapters(_Engine(), settings, enabled=True, base_model_name="base")
    adapters.load_startup_modules()
    return adapters


def test_the_adapter_name_crosses_as_the_parameter_both_sides_name() -> None:
    msg = gateway_codec.build_request("llm", GenerateRequest("r", "hi", {}, lora_name="sql"))
    assert msg.parameters[T.LORA_NAME_PARAM].string_param == "sql"
    pb = types.SimpleNamespace(get_input_tensor_by_name=lambda request, name: (
        types.SimpleNamespace(as_numpy=lambda: __import__("numpy").array([b"hi"], dtype=object))
        if name == T.TEXT_INPUT else None))
    parsed = backend_codec.parse_request(pb, as_backend_request(msg))
    assert parsed.lora_name == "sql"
    base = backend_codec.parse_request(pb, as_backend_request(
        gateway_codec.build_request("llm", GenerateRequest("r", "hi", {}))))
    assert base.lora_name is None


@pytest.mark.parametrize(("action", "name", "path"), [("list", None, None), ("load", "new", "/a/new"),
                                                      ("unload", "sql", None)])
def test_control_requests_are_recognised_and_answers_read_back(action, name, path) -> None:
    adapters = _adapters()
    msg = gateway_codec.build_lora_control_request("llm", action, name, path)
    assert not msg.inputs
    request = as_backend_request(msg)
    assert not backend_codec.is_describe_request(request)
    order = lora_control_text(request)
    assert order is not None
    listing = adapters.control(order)
    assert all(tuple(entry) == T.LORA_ADAPTER_KEYS for entry in listing)
    tensors = backend_codec.text_tensors(types.SimpleNamespace(Tensor=Tensor), listing_text(listing))
    resp = encode_response(InferenceResponse(output_tensors=tensors), model_name="llm", model_version="1",
                           request_id="r", requested_outputs=None)
    got = gateway_codec.parse_lora_listing(resp)
    assert [(a.name, a.path, a.parent) for a in got] == [(e["name"], e["path"], e["parent"]) for e in listing]
    expected = {"list": {"sql"}, "load": {"sql", "new"}, "unload": set()}[action]
    assert {a.name for a in got} == expected
    if action == "list":
        assert got[0].parent == "base"  # --lora-modules' base_model_name


def test_a_generate_request_is_not_a_control_request() -> None:
    msg = gateway_codec.build_request("llm", GenerateRequest("r", "hi", {}, lora_name="sql"))
    assert lora_control_text(as_backend_request(msg)) is None


def _refusal(adapters: LoRAAdapters, order: dict) -> tuple[ErrorKind, str]:
    with pytest.raises(RequestError) as err:
        adapters.control(json.dumps(order))
    error = gateway_codec.classify_error(err.value.wire().format())  # as the gateway reads it back
    return error.kind, str(error)


def test_refusals_cross_with_their_kind() -> None:
    adapters = _adapters()
    assert _refusal(adapters, {"action": "unload", "lora_name": "nope"})[0] is ErrorKind.NOT_FOUND
    kind, message = _refusal(adapters, {"action": "load", "lora_name": "x", "lora_path": "/bad"})
    assert kind is ErrorKind.INVALID and "rank 64 exceeds max_lora_rank" in message
    kind, message = _refusal(adapters, {"action": "load", "lora_name": "sql", "lora_path": "/a/other"})
    assert kind is ErrorKind.INVALID and "already loaded" in message
    assert _refusal(adapters, {"action": "load", "lora_name": "base", "lora_path": "/a/x"})[0] is ErrorKind.INVALID
    assert _refusal(adapters, {"action": "drop"})[0] is ErrorKind.INVALID
    assert "run time is off" in _refusal(_adapters(allow=False), {"action": "unload", "lora_name": "sql"})[1]
    with pytest.raises(RequestError) as err:
        adapters.resolve("nope")
    assert (err.value.kind, err.value.param) == (ErrorKind.NOT_FOUND, "model")
    assert adapters.resolve("sql").lora_path == "/a/sql"


def test_ids_are_unique_and_never_reused() -> None:
    adapters = _adapters()
    first = adapters.resolve("sql").lora_int_id
    adapters.control(json.dumps({"action": "unload", "lora_name": "sql"}))
    adapters.control(json.dumps({"action": "load", "lora_name": "sql", "lora_path": "/a/sql"}))
    assert adapters.resolve("sql").lora_int_id > first  # the prefix cache keys on it: an old block never matches


def test_without_lora_every_adapter_is_unknown_and_modules_are_refused() -> None:
    off = LoRAAdapters(_Engine(), LoRASettings(), enabled=False, base_model_name="base")
    with pytest.raises(RequestError) as err:
        off.resolve("sql")
    assert err.value.kind is ErrorKind.NOT_FOUND
    assert off.control(json.dumps({"action": "list"})) == []
    with pytest.raises(ValueError, match="enable_lora"):
        LoRAAdapters(_Engine(), LoRASettings((LoRAModule("a", "/a"),)), enabled=False,
                     base_model_name="base").load_startup_modules()
    bad = LoRAAdapters(_Engine(), LoRASettings((LoRAModule("a", "/bad"),)), enabled=True, base_model_name="base")
    with pytest.raises(ValueError, match="lora_modules: adapter 'a' \\(/bad\\): .*rank 64"):
        bad.load_startup_modules()
