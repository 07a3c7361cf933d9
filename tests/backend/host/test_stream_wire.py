"""A streamed response's bytes, built without messages (stream_wire.py), parse to exactly the
message the general path builds: codec.encode_response, the FINAL parameter, wrapped."""
from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from kvserve.backend.host import pb_utils
from kvserve.backend.host.kserve.codec import encode_response
from kvserve.backend.host.kserve.stream_wire import FINAL_PARAM, encode_stream_response, id_field


def _both(tensors, *, rid="chatcmpl-1-0", final=False, requested=None, parameters=None):
    response = pb_utils.InferenceResponse(output_tensors=tensors, parameters=parameters)
    slow = encode_response(response, model_name="llm", model_version="1", request_id=rid,
                           requested_outputs=requested)
    slow.parameters[FINAL_PARAM].bool_param = final
    fast = encode_stream_response(response, model_name="llm", model_version="1", request_id=rid,
                                  id_wire=id_field(rid), requested_outputs=requested, final=final)
    return pb.ModelStreamInferResponse(infer_response=slow), pb.ModelStreamInferResponse.FromString(fast)


def _token(text: bytes, ids: list[int], finish: bytes = b"") -> list:
    return [pb_utils.Tensor("text_output", np.array([text], dtype=np.object_)),
            pb_utils.Tensor("output_ids", np.array(ids, dtype=np.int32)),
            pb_utils.Tensor("finish_reason", np.array([finish], dtype=np.object_)),
            pb_utils.Tensor("completion_tokens", np.array([len(ids)], dtype=np.int32))]


@pytest.mark.parametrize("final", [False, True])
def test_a_token_parses_to_the_general_paths_message(final: bool) -> None:
    slow, fast = _both(_token(" héllo".encode(), [1234], b"length" if final else b""), final=final)
    assert fast == slow
    assert fast.infer_response.parameters[FINAL_PARAM].bool_param is final
    assert list(fast.infer_response.raw_output_contents)[1] == np.array([1234], "<i4").tobytes()


def test_shapes_types_filters_and_long_payloads() -> None:
    logprobs = np.arange(2 * 6, dtype=np.float32).reshape(2, 6)  # [tokens, 1 + k]
    big = np.arange(300, dtype=np.int32)  # a payload past one varint byte of length
    tensors = [*_token(b"x" * 200, list(range(70))), pb_utils.Tensor("logprob_values", logprobs),
               pb_utils.Tensor("output_ids_big", big), pb_utils.Tensor("empty", np.array([], dtype=np.object_))]
    slow, fast = _both(tensors, rid="")
    assert fast == slow
    slow, fast = _both(tensors, requested=frozenset({"output_ids", "logprob_values"}))
    assert fast == slow and [o.name for o in fast.infer_response.outputs] == ["output_ids", "logprob_values"]
    assert list(fast.infer_response.outputs[1].shape) == [2, 6]


def test_responses_do_not_share_state() -> None:
    # The header is cached per layout: a later response with another shape or id must not see it.
    _, one = _both(_token(b"a", [1]), rid="a")
    _, three = _both(_token(b"b", [1, 2, 3]), rid="b")
    _, again = _both(_token(b"c", [9]), rid="c")
    assert (one.infer_response.id, three.infer_response.id, again.infer_response.id) == ("a", "b", "c")
    assert list(three.infer_response.outputs[1].shape) == [3]
    assert list(again.infer_response.outputs[1].shape) == [1]


def test_parameters_take_the_general_path() -> None:
    slow, fast = _both(_token(b"a", [1]), parameters={"k": 2, "s": "v"}, final=True)
    assert fast == slow and fast.infer_response.parameters["k"].int64_param == 2
    assert fast.infer_response.parameters[FINAL_PARAM].bool_param is True
