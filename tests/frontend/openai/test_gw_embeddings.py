"""/v1/embeddings request validation (pure), and the route on a gateway without an embedding model."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from kvserve.frontend.openai.api_errors import ApiError
from kvserve.frontend.openai.handlers_embeddings import parse_embeddings


@pytest.mark.parametrize("value, expected", [
    ("hi", ["hi"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]), ([[1], [2, 3]], [[1], [2, 3]]),
])
def test_every_input_form(value, expected):
    assert parse_embeddings({"input": value}).inputs == expected


@pytest.mark.parametrize("body, param", [
    ({}, "input"), ({"input": ""}, "input"), ({"input": []}, "input"), ({"input": [[]]}, "input"),
    ({"input": ["a", [1]]}, "input"), ({"input": [True]}, "input"), ({"input": [-1]}, "input"),
    ({"input": {"a": 1}}, "input"), ({"input": ["x"] * 2049}, "input"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "dimensions": 0}, "dimensions"), ({"input": "x", "dimensions": True}, "dimensions"),
    ({"input": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"input": "x", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ({"input": "x", "normalize": "yes"}, "normalize"), ({"input": "x", "user": 5}, "user"),
])
def test_bad_bodies_name_the_field(body, param):
    with pytest.raises(ApiError) as info:
        parse_embeddings(body)
    assert info.value.status == 400 and info.value.param == param


def test_pooling_holds_only_what_the_client_set():
    assert parse_embeddings({"input": "x"}).pooling == {}
    req = parse_embeddings({"input": "x", "truncate_prompt_tokens": -1, "normalize": False, "dimensions": 8,
                            "encoding_format": "base64", "user": "u"})
    assert req.pooling == {"truncate_prompt_tokens": -1, "normalize": False, "dimensions": 8}
    assert req.encoding_format == "base64" and req.user == "u"


def test_without_an_embedding_model_the_route_is_400(server):
    req = urllib.request.Request(f"{server.url}/v1/embeddings", data=json.dumps({"input": "hi"}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=10)
    assert info.value.code == 400
    assert json.loads(info.value.read())["error"]["code"] == "model_not_supported"
