"""Response encoding: output specs come from a cache of headers, so shapes,
types and data must still be those of each response, and no response may
change what the next one gets."""
from __future__ import annotations

import numpy as np

from kvserve.backend.host import pb_utils
from kvserve.backend.host.kserve.codec import encode_response
from kvserve.backend.host.pb_utils.dtypes import deserialize_bytes_tensor


def _encode(*tensors: pb_utils.Tensor, requested: frozenset[str] | None = None, rid: str = "r1",
            parameters: dict | None = None):
    response = pb_utils.InferenceResponse(output_tensors=list(tensors), parameters=parameters)
    return encode_response(response, model_name="llm", model_version="1", request_id=rid,
                           requested_outputs=requested)


def _outputs(msg) -> dict[str, tuple[str, list[int], bytes]]:
    return {o.name: (o.datatype, list(o.shape), raw) for o, raw in zip(msg.outputs, msg.raw_output_contents)}


def test_each_response_keeps_its_own_shapes_and_data() -> None:
    text = pb_utils.Tensor("text_output", np.array([b"hi"], dtype=np.object_))
    one = _encode(text, pb_utils.Tensor("output_ids", np.array([7], dtype=np.int32)), rid="a")
    three = _encode(text, pb_utils.Tensor("output_ids", np.array([[1, 2, 3]], dtype=np.int32)), rid="b")
    again = _encode(text, pb_utils.Tensor("output_ids", np.array([9], dtype=np.int32)), rid="c",
                    parameters={"k": 2})
    assert (one.model_name, one.model_version, one.id) == ("llm", "1", "a")
    assert _outputs(one)["output_ids"] == ("INT32", [1], np.array([7], "<i4").tobytes())
    assert _outputs(three)["output_ids"] == ("INT32", [1, 3], np.array([1, 2, 3], "<i4").tobytes())
    assert _outputs(again)["output_ids"] == ("INT32", [1], np.array([9], "<i4").tobytes())
    assert list(deserialize_bytes_tensor(_outputs(again)["text_output"][2])) == [b"hi"]
    assert again.id == "c" and again.parameters["k"].int64_param == 2 and "k" not in one.parameters
    # A caller editing its message must not reach the next response.
    one.outputs[0].name = "changed"
    one.outputs.add(name="extra")
    later = _encode(text, pb_utils.Tensor("output_ids", np.array([5], dtype=np.int32)))
    assert [o.name for o in later.outputs] == ["text_output", "output_ids"]


def test_requested_outputs_filter_and_types() -> None:
    msg = _encode(pb_utils.Tensor("a", np.array([1.5], dtype=np.float32)),
                  pb_utils.Tensor("b", np.array([b"x", b"yz"], dtype=np.object_)),
                  pb_utils.Tensor("c", np.array([True])), requested=frozenset({"b", "c"}))
    outs = _outputs(msg)
    assert list(outs) == ["b", "c"]
    assert outs["b"][:2] == ("BYTES", [2]) and list(deserialize_bytes_tensor(outs["b"][2])) == [b"x", b"yz"]
    assert outs["c"] == ("BOOL", [1], b"\x01")


def test_single_element_bytes_tensors_serialise_like_longer_ones() -> None:
    for value in (b"a\x00b", "caf\u00e9", b""):
        single = pb_utils.serialize_byte_tensor(np.array([value], dtype=np.object_))
        pair = pb_utils.serialize_byte_tensor(np.array([value, value], dtype=np.object_))
        assert pair == single + single
    fixed = pb_utils.serialize_byte_tensor(np.array([[b"ab"]], dtype="S2"))
    assert fixed == b"\x02\x00\x00\x00ab"
