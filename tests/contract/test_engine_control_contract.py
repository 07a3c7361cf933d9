"""Engine control across the seam: the gateway's request is the one the Triton model recognises
(and no other request is), and the model's answer reads back on the gateway."""
from __future__ import annotations

import json
import types

from kvserve.backend.host.kserve.codec import encode_response
from kvserve.backend.host.pb_utils import InferenceResponse, Tensor
from kvserve.backend.triton import model_tensors as backend_codec
from kvserve.backend.triton.lora_adapters import lora_control_text
from kvserve.frontend.backend_client import grpc_codec as gateway_codec
from kvserve.frontend.backend_client.protocol import GenerateRequest
from kvserve.seam import tensors as T
from seam_requests import as_backend_request


def test_the_reset_request_is_recognised_and_its_answer_read_back() -> None:
    msg = gateway_codec.build_engine_control_request("llm", "reset_prefix_cache")
    assert not msg.inputs
    request = as_backend_request(msg)
    assert backend_codec.engine_control_action(request) == "reset_prefix_cache" in T.ENGINE_ACTIONS
    assert not backend_codec.is_describe_request(request) and lora_control_text(request) is None
    text = json.dumps({"action": "reset_prefix_cache", "forgotten_blocks": 7})  # what the model answers
    tensors = backend_codec.text_tensors(types.SimpleNamespace(Tensor=Tensor), text)
    resp = encode_response(InferenceResponse(output_tensors=tensors), model_name="llm", model_version="1",
                           request_id="r", requested_outputs=None)
    assert gateway_codec.parse_engine_answer(resp) == {"action": "reset_prefix_cache", "forgotten_blocks": 7}


def test_other_requests_are_not_engine_control() -> None:
    for msg in (gateway_codec.build_request("llm", GenerateRequest("r", "hi", {})),
                gateway_codec.build_lora_control_request("llm", "list"), gateway_codec.build_describe_request("llm")):
        assert backend_codec.engine_control_action(as_backend_request(msg)) is None
